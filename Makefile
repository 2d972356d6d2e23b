# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRA ?= cpu
STAMP := $(VENV)/.installed-$(EXTRA)

.PHONY: demo test bench venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRA),test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/pipe all --config examples/digits.yaml --run runs/demo
	$(BIN)/pipe inspect runs/demo/export --verify

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/pipe bench --out bench/results.md

clean:
	rm -rf $(VENV) runs build *.egg-info
