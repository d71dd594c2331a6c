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

.PHONY: run test test-floors test-newest test-slow bench docs clean browser

# Wheels of the run and docs dependencies, for tests/test_documented_commands.py, which runs the pages' commands
# (make run, make docs, ...) in a new user's shell with pip offline: downloaded once per pyproject.toml change.
WHEELS ?= $(HOME)/.cache/numformer-test-wheels

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

test: $(VENV)/.installed-test browser test-floors test-newest $(WHEELS)/.filled
	NUMFORMER_WHEELS=$(WHEELS) $(BIN)/python -m pytest -n 2 -m "not slow" -q

# A browser for the explorer's tests (tests/test_explorer_browser.py drives a headless chromium; it skips without
# one): Debian's chromium, installed with apt-get when no chromium is found and this runs as root where apt-get
# exists (35 s on a Debian 12 machine with a nearby mirror). Otherwise, and once it is there, nothing happens.
BROWSERS := chromium chromium-browser google-chrome google-chrome-stable
browser:
	@found=; for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && found=$$b; done; \
	if [ -z "$$found" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "browser: installing Debian's chromium with apt-get, for the explorer's browser tests"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
			|| echo "browser: apt-get could not install chromium; the explorer's browser tests will skip"; \
	fi

$(WHEELS)/.filled: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip download -q -d $(WHEELS) ".[nlp,data,docs]" "setuptools>=77" pip wheel
	touch $@

# The declared minimum versions, exactly (pyproject.toml's lower bounds, tests/floors.py), in a venv of their
# own: the core tests and a short train + generate run there. `make test` runs this first.
FLOORS := .venv-floors
FLOOR_TESTS := tests/test_ops.py tests/test_nn.py tests/test_models.py tests/test_optim.py tests/test_generate.py \
               tests/test_train.py tests/test_data_tokenizers.py tests/test_data_fetch.py
TINY := --set model.n_layers=1 --set model.d_model=32 --set data.block_size=32 --set train.batch_size=8 \
        --set train.max_steps=30 --set train.eval_every=15 --set train.eval_batches=1 --set train.warmup_steps=3

$(FLOORS)/.installed: pyproject.toml tests/floors.py
	rm -rf $(FLOORS)
	$(PYTHON) -m venv $(FLOORS)
	$(PYTHON) tests/floors.py constraints > $(FLOORS)/floors.txt
	$(FLOORS)/bin/python -m pip install -q -c $(FLOORS)/floors.txt -e ".[nlp,data,hf]" torch pytest pytest-xdist
	$(FLOORS)/bin/python tests/floors.py check nlp data hf torch pytest pytest-xdist
	touch $@

test-floors: $(FLOORS)/.installed
	$(FLOORS)/bin/python -m pytest -n 2 -q -p no:cacheprovider -k "not _gradients" $(FLOOR_TESTS)
	$(FLOORS)/bin/numformer train configs/shakespeare_char.toml --out $(FLOORS)/run --overwrite $(TINY)
	$(FLOORS)/bin/numformer generate $(FLOORS)/run --prompt "ROMEO:" --max-new-tokens 60 --seed 0

# The newest Python the machine has (CPython 3.13: on PATH, or pyenv's) with the newest releases of the
# dependencies, no torch (the torch parity tests skip): the same core tests, so that requires-python's open upper
# end is tested too. Skipped, saying so, where no Python 3.13 is found.
NEWEST := .venv-newest
NEWEST_PYTHON ?= $(or $(shell python3.13 -c 'import sys; print(sys.executable)' 2>/dev/null),$(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13)))

$(NEWEST)/.installed: pyproject.toml
	rm -rf $(NEWEST)
	$(NEWEST_PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q --upgrade -e ".[nlp,data]" pytest pytest-xdist
	touch $@

ifeq ($(NEWEST_PYTHON),)
test-newest:
	@echo "test-newest: no Python 3.13 found (python3.13 on PATH, or pyenv's); skipped"
else
test-newest: $(NEWEST)/.installed
	$(NEWEST)/bin/python -c "import sys, numpy; print('test-newest: Python', sys.version.split()[0], 'NumPy', numpy.__version__)"
	$(NEWEST)/bin/python -m pytest -n 2 -q -p no:cacheprovider -k "not _gradients" $(FLOOR_TESTS)
endif

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m slow -q

bench: $(VENV)/.installed-test
	$(BIN)/numformer bench all

# The documentation site (MkDocs + Material, API pages from the docstrings) into site/.
$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[nlp,data,docs]"
	touch $@ $(VENV)/.installed-run

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(FLOORS) $(NEWEST) build site src/*.egg-info .pytest_cache
