# The two commands of the README: `make demo` and `make test`. Both create .venv and install on first
# use; `make test` lints (ruff) before it runs the suite, so CI holds the code to the same standard.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench mutate clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch is installed by its exact version first: that takes the CPU build where one is on hand (pip's
# find-links) instead of the registry's newest build with its CUDA packages; the `[torch]` extra's
# range then accepts it as it is.
TORCH_PIN ?= torch==2.13.0

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet '$(TORCH_PIN)'
	$(PY) -m pip install --quiet -e '.[dev,tensorflow,torch]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/distributed_overhead.py
	$(PY) benchmarks/keras_overhead.py
	$(PY) benchmarks/torch_overhead.py
	$(PY) benchmarks/torch_distributed_overhead.py
	$(PY) benchmarks/migrate_speed.py

# Mutation testing (benchmarks/mutation.py, cosmic-ray): not part of `make test`; about an hour.
mutate: $(STAMP)
	$(PY) benchmarks/mutation.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
