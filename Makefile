# Entry points that work on a fresh machine: `make run`, `make test` and `make lint` (the checks CI makes first).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench venv clean

$(BIN)/gpucost: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint]'
	touch $@

venv: $(BIN)/gpucost

run: venv
	$(BIN)/gpucost run --overwrite $(ARGS)

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the lint rules, and mypy's files and strictness, are in pyproject.toml (docs/testing.md, "Static checks")
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: venv
	$(BIN)/python -m benchmarks.run $(ARGS)

clean:
	rm -rf $(VENV) gpucost-out .pytest_cache .hypothesis
