# Entry points that work on a fresh machine: `make run`, `make test` (the inner loop), `make test-all` (everything,
# as CI runs it) and `make lint` (the checks CI makes first).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-all lint bench venv clean injection

$(BIN)/gpucost: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint]'
	touch $@

venv: $(BIN)/gpucost

run: venv
	$(BIN)/gpucost run --overwrite $(ARGS)

# the inner loop: the tests not marked slow (pyproject's addopts), hypothesis's dev profile
test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# everything, as CI runs it
test-all: venv
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -m "slow or not slow" $(PYTEST_ARGS)

# the lint rules, and mypy's files and strictness, are in pyproject.toml (docs/testing.md, "Static checks")
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python scripts/module_sizes.py

# the CUDA injection library for `gpucost collect-kernels -- ./program` (docs/collecting.md): needs a C compiler
# and the `native` extra's headers (installed by `venv` through the `test` extra)
injection: venv
	$(BIN)/python -m gpucost.producers.cupti_injection build/libgpucost_inject.so

bench: venv
	$(BIN)/python -m benchmarks.run $(ARGS)

clean:
	rm -rf $(VENV) gpucost-out .pytest_cache .hypothesis build
