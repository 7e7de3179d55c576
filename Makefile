# Two entry points that work on a fresh machine: `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench venv clean

$(BIN)/gpucost: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/gpucost

run: venv
	$(BIN)/gpucost run --overwrite $(ARGS)

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/python -m benchmarks.run $(ARGS)

clean:
	rm -rf $(VENV) gpucost-out .pytest_cache .hypothesis
