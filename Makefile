# The two commands of the README: `make demo` and `make test`. Both create .venv and install on first
# use; `make test` lints (ruff) before it runs the suite, so CI holds the code to the same standard.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench mutate clean stack-venvs test-stacks test-tf115 test-tf265 test-py313

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch is installed by its exact version first: that takes the CPU build where one is on hand (pip's
# find-links) instead of the registry's newest build with its CUDA packages; the `[torch]` extra's
# range then accepts it as it is.
TORCH_PIN ?= torch==2.13.0
TF_KERAS_PIN ?= tf_keras~=2.21.0

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet '$(TORCH_PIN)'
	$(PY) -m pip install --quiet -e '.[dev,tensorflow,torch]'
	@# Keras 2 on TF 2.21 for the Keras 2 front-end's tests: without its dependencies, which name
	@# the full `tensorflow` package (CUDA build) where tensorflow-cpu is already there.
	$(PY) -m pip install --quiet --no-deps '$(TF_KERAS_PIN)'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# The stack venvs are built first: tests of the main suite also run scripts on TF 1.15 (the
# unported and ported BERT-style LAMB on reference variables) where .venv-tf115 exists.
# The main suite runs in TEST_WORKERS pytest-xdist workers, each test file's tests in one worker
# (`--dist loadfile`), so a module's shared process and fixtures are built once.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(MAKE) --no-print-directory stack-venvs
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile
	$(MAKE) --no-print-directory test-stacks

# The older stacks Ascend's TensorFlow adapter runs on, each in its own venv built from the
# machine's pyenv interpreter and cached like .venv: TF 1.15 on Python 3.7, TF 2.6.5 on 3.9.
# TensorFlow and its pins go in first, then the checkout as the README installs it (editable here,
# so that test subprocesses import the work tree); the pins are repeated so that the test tools'
# own dependencies (pytest's typing-extensions) cannot move them either. Only the tests marked `stacks` run there (what differs per stack).
# A missing interpreter skips that stack with one line saying what to install, never silently.
PYTHON_tf115 ?= 3.7.16
PINS_tf115 ?= tensorflow==1.15.5 'protobuf<3.21' 'h5py<3'
PYTHON_tf265 ?= 3.9.18
PINS_tf265 ?= tensorflow-cpu==2.6.5 'protobuf<3.21'
pyenv_python = $(firstword $(wildcard $(addsuffix /bin/python3, \
	$(shell pyenv prefix $(1) 2>/dev/null) $(HOME)/.pyenv/versions/$(1))))

.venv-%/.installed: pyproject.toml
	rm -rf .venv-$*
	$(call pyenv_python,$(PYTHON_$*)) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-$*/bin/python -m pip install --quiet $(PINS_$*)
	.venv-$*/bin/python -m pip install --quiet $(PINS_$*) -e '.[test]'
	@# npu-migrate must refuse the TF stacks' Pythons with exit 2 and one sentence, not crash on
	@# an import; on the newest it runs.
	.venv-$*/bin/npu-migrate --help >/dev/null 2>&1; test $$? -eq $(HELP_EXIT_$*)
	touch $@
HELP_EXIT_tf115 = 2
HELP_EXIT_tf265 = 2

# The migrator on the newest Python the machine has: from 3.12 the standard library's tokenizer
# is the compiler's (other tokens, other errors) and the collector starts collections at other
# moments, and the migrator leans on both. The tests of what reads a file's tokens, lines and
# statements there (no framework is needed for them) run in a venv of their own.
PYTHON_py313 ?= 3.13.0
PINS_py313 ?= libcst==1.9.0
HELP_EXIT_py313 = 0
NEWEST_PYTHON_TESTS ?= $(addprefix tests/migrator/test_, faults.py collector.py lines.py \
	spans.py splice.py slicing.py triage.py outline.py cst_parse.py trivia.py parents.py \
	cli_files.py cli_report.py)

test-stacks: test-tf115 test-tf265 test-py313

stack-venvs:
	@for stack in tf115 tf265 py313; do \
		if [ -n "$$($(MAKE) --no-print-directory -s pyenv-python-$$stack)" ]; then \
			$(MAKE) --no-print-directory .venv-$$stack/.installed || exit 1; \
		fi; \
	done

pyenv-python-%:
	@echo $(call pyenv_python,$(PYTHON_$*))

STACK_TESTS_tf115 = -m stacks tests/library
STACK_TESTS_tf265 = -m stacks tests/library
STACK_TESTS_py313 = $(NEWEST_PYTHON_TESTS)

test-tf115 test-tf265 test-py313: test-%:
	@if [ -z "$(call pyenv_python,$(PYTHON_$*))" ]; then \
		echo "SKIPPED $* stack tests: no Python $(PYTHON_$*) (install it: pyenv install $(PYTHON_$*))"; \
	else \
		$(MAKE) --no-print-directory .venv-$*/.installed && \
		.venv-$*/bin/python -m pytest $(STACK_TESTS_$*); \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/distributed_overhead.py
	$(PY) benchmarks/keras_overhead.py
	$(PY) benchmarks/torch_overhead.py
	$(PY) benchmarks/torch_distributed_overhead.py
	$(PY) benchmarks/migrate_speed.py

# Mutation testing (benchmarks/mutation.py, cosmic-ray): not part of `make test`; about 40 min.
mutate: $(STAMP)
	$(PY) benchmarks/mutation.py

clean:
	rm -rf $(VENV) .venv-tf115 .venv-tf265 .venv-py313 build *.egg-info .pytest_cache
