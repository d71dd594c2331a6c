# numformer: `make run` trains the default character-level GPT and prints a sample;
# `make test` runs the test suite. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_DIR ?= runs/shakespeare_char
# Datasets: the shared folder beside the checkout when there is one (else the cache / downloads).
SHARED_DATA := $(abspath ../shared/data)
ifeq ($(NUMFORMER_DATA),)
ifneq ($(wildcard $(SHARED_DATA)/.),)
export NUMFORMER_DATA := $(SHARED_DATA)
endif
endif

.PHONY: run test test-slow bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[nlp,data]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[nlp,data,test]"
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/numformer train configs/shakespeare_char.toml --out $(RUN_DIR) --overwrite
	$(BIN)/numformer generate $(RUN_DIR) --prompt "ROMEO:" --max-new-tokens 500 --seed 0
	@echo
	@echo "numformer is installed in $(VENV); to type its commands (numformer --help), run:"
	@echo "    source $(VENV)/bin/activate"

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 -m "not slow" -q

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m slow -q

bench: $(VENV)/.installed-test
	$(BIN)/numformer bench all

# The documentation site (MkDocs + Material, API pages from the docstrings) into site/.
$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[nlp,docs]"
	touch $@ $(VENV)/.installed-run

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache
