"""Coverage for the mutation run's recording pass, started in every Python process of it.

benchmarks/mutation.py puts this folder on PYTHONPATH, so Python imports this module at start-up:
in the pytest process and in every CLI, training script and worker process a test starts. Only
when NPU_MUTATION_COVERAGE names a data file does it do anything: it then records which lines of
the area's modules run, under the id of the test that is running (NPU_MUTATION_TEST, set by the
mutation_order plugin before each test), so that a mutant's tests can be ordered by what they run.
Written for every Python a test may start, the stack venvs' 3.7 included, where coverage is not
installed and nothing is recorded.
"""

import atexit
import os

if os.environ.get("NPU_MUTATION_COVERAGE"):
    try:
        import coverage
    except ImportError:
        coverage = None
    if coverage is not None:
        _coverage = coverage.Coverage(
            data_file=os.environ["NPU_MUTATION_COVERAGE"],
            data_suffix=True,
            include=os.environ["NPU_MUTATION_INCLUDE"].split(os.pathsep),
            context=os.environ.get("NPU_MUTATION_TEST", ""),
            config_file=False,
        )
        # A test that compares a subprocess's stderr must not see coverage's own notes.
        _coverage.set_option(
            "run:disable_warnings",
            ["no-data-collected", "module-not-imported", "module-not-measured", "no-ctracer"],
        )
        _coverage.start()

        def _save() -> None:
            _coverage.stop()
            _coverage.save()

        atexit.register(_save)
