"""`python -m migrator` is the same command as `npu-migrate`."""

from migrator.cli import main

if __name__ == "__main__":
    main()
