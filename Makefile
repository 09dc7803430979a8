# Two commands: `make demo` and `make test`. Both create .venv if missing and install the project.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.install-stamp
PYTEST_ARGS ?= -n 2 -q

.PHONY: install demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m jaxformer.demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) tests

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxformer tests bench configs train.py

bench: $(STAMP)
	$(PY) bench/train_step.py

clean:
	rm -rf $(VENV) .pytest_cache
