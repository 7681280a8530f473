"""`python -m migrator` is the same command as `npu-migrate` (the Python check first)."""

from migrator._python_check import main

if __name__ == "__main__":
    main()
