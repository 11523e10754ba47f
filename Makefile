# The README's two commands: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Three stamps, each newer than what it was installed from: torch in a fresh .venv; the `cli`
# extra on top (all `make demo` needs); the `dev` extra on top (`make test`: tests, linters,
# ONNX, Triton, Keras...). A .venv made by `make demo` is completed by `make test`, and
# `make demo` after `make test` only checks that the `cli` extra is there (it is: dev has it).
TORCH_STAMP := $(VENV)/.installed-torch
CLI_STAMP := $(VENV)/.installed-cli
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv mutate test-keras-jax test-keras-tensorflow

venv: $(STAMP)

$(TORCH_STAMP): constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	touch $@

$(CLI_STAMP): $(TORCH_STAMP) pyproject.toml constraints.txt
	$(PIP) install --quiet -c constraints.txt -e ".[cli]"
	touch $@

$(STAMP): $(TORCH_STAMP) pyproject.toml constraints.txt
	$(PIP) install --quiet -c constraints.txt -e ".[dev]"
	$(PIP) install --quiet --no-deps facenet-pytorch==2.6.0
	touch $@

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/python -m pytest -n 2 -q

# The Keras frontend's tests (parity with the PyTorch losses) on other Keras backends; make test
# runs them on the torch backend. See docs/keras.md for the recorded results.
test-keras-jax: $(STAMP)
	$(PIP) install --quiet -c constraints.txt "jax[cpu]"
	KERAS_BACKEND=jax $(BIN)/python -m pytest tests/keras -q

# TensorFlow goes to a folder of its own (~1.5 GB), put on the path for this target only.
TF_SITE := $(VENV)/tensorflow-site
test-keras-tensorflow: $(STAMP)
	test -d $(TF_SITE) || $(PIP) install --quiet --target $(TF_SITE) -c constraints.txt tensorflow-cpu
	KERAS_BACKEND=tensorflow PYTHONPATH=$(TF_SITE) $(BIN)/python -m pytest tests/keras -q

demo: $(CLI_STAMP)
	$(BIN)/marginface demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools

# Mutation testing (not part of `make test`): ~86 sampled mutants of the margins, executors,
# verification and resume paths, each against its fast tests; see docs/mutation.md.
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
