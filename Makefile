# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0
RUN    ?= runs/demo

.PHONY: install browser demo test bench lint clean

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -c constraints-cpu.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP) browser

# Headless Chromium for the HTML walkthrough's browser tests (Debian's package; no download of
# its own). Without root or apt the browser tests are skipped, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1) || \
	  echo "note: chromium could not be installed; the browser tests will be skipped"

demo: $(STAMP)
	$(VENV)/bin/minitransformer train --data shakespeare --preset cpu-small-modern --out $(RUN) --force
	$(VENV)/bin/minitransformer sample $(RUN) --prompt "ROMEO:" --max-new-tokens 400 --seed 1

test: $(STAMP) browser
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check minitransformer tests bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
