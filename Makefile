# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRA ?= cpu
STAMP := $(VENV)/.installed-$(EXTRA)
# The real Paddle Serving 0.9.0 client (cp36-cp39 wheels only) for the compatibility test: a Python 3.9
# venv when this machine has one (pyenv's shim answers even without 3.9, hence the version check);
# without it that one test is skipped and says why.
VENV39 := .venv39
PY39 ?= $(shell for p in $$HOME/.pyenv/versions/3.9.*/bin/python3.9 $$(command -v python3.9); do \
	  "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 9)' 2>/dev/null && { echo "$$p"; break; }; done)
STAMP39 := $(VENV39)/.installed-serving-client
# Two CJK fonts no part of pipe's data uses (WenQuanYi Micro Hei, Noto Sans CJK Bold), files only in .venv/fonts:
# the fine-tuning bench reads lines in them, styles neither training nor the guard saw (pipeline/bench/ocr_finetune.py).
# A real tritonserver (2.51, python backend only) for tests/stages/test_triton.py, from the nvidia-pytriton
# wheel: its files only, in .venv/pytriton, never imported (its own pins are not the venv's: --no-deps);
# without it that test is skipped and says why.

.PHONY: demo test quick bench venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRA),test,ray]'  # ray: --ray's tests (a 2-node cluster) run in make test
	$(BIN)/pip install --quiet --no-deps --upgrade --target $(VENV)/pytriton nvidia-pytriton==0.7.0 \
	  || echo "nvidia-pytriton did not install: the real-Triton test will be skipped"
	$(BIN)/pip install --quiet --no-deps --upgrade --target $(VENV)/fonts paperang-p2-fonts-cjk==0.1.0 \
	  cvttf-NotoSansCJK-Bold==1.0 || echo "the unseen-style fonts did not install: their bench rows will say so"
	$(BIN)/python -m pipeline.pretrained  # PaddleOCR's PP-OCRv4 exports (a pinned wheel), into the shared cache
	touch $(STAMP)

$(STAMP39):
	@if [ -n "$(PY39)" ]; then $(PY39) -m venv $(VENV39) && $(VENV39)/bin/pip install --quiet \
	  paddle-serving-client==0.9.0 numpy==2.0.2 protobuf==3.20.3 grpcio==1.33.2 grpcio-tools==1.33.2 \
	  requests==2.32.5 && touch $(STAMP39); else echo "no python3.9: the Paddle Serving client test will be skipped"; fi

venv: $(STAMP)

# A second `make demo` with nothing changed is served from pipe all's cache in seconds; it ends by serving the
# package on 127.0.0.1 for a moment (examples/serve_demo.py: /v1 and /v2 calls, then SIGTERM).
demo: $(STAMP)
	$(BIN)/pipe all --config examples/digits.yaml --run runs/demo
	$(BIN)/pipe inspect runs/demo/package --verify
	$(BIN)/python examples/serve_demo.py runs/demo/package

# Triton's load tool, perf_analyzer, for the bench's rows against tritonserver (pipeline/bench/perf.py) and
# tests/stages/test_serve_grpc.py: it ships in the tritonclient 2.45.0 wheel (later ones on the index have
# none), in its own venv .venv/perf; it links libcudart even on a CPU (the nvidia-cuda-runtime-cu12 wheel, put
# on its library path by perf.binary) and libb64 (Debian's libb64-0d). Without them that test is skipped.
PERF_STAMP := $(VENV)/perf/.installed
$(PERF_STAMP): $(STAMP)
	$(PY) -m venv $(VENV)/perf
	$(VENV)/perf/bin/pip install --quiet tritonclient==2.45.0 nvidia-cuda-runtime-cu12==12.9.79 \
	  && { dpkg -s libb64-0d >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libb64-0d >/dev/null; } \
	       || echo "libb64-0d did not install (apt-get install libb64-0d as root)"; } && touch $(PERF_STAMP) \
	  || echo "tritonclient 2.45.0 did not install: the bench's perf_analyzer rows will say so"

# Two pytest workers, one test module each at a time (module fixtures stay shared within a module): on 2 cores
# the suite spends much of its time waiting on servers, launchers and child processes, which the second worker
# fills (measured on 6 modules: 218 s in one process, 159 s in two; docs/verified.md has the whole suite).
test: $(STAMP) $(STAMP39) $(PERF_STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# The quick tier, a developer's loop after each change: every module's fast tests, `-m "not slow"` (the marker in
# pyproject.toml: the real pretrained models, launchers, servers, the wheel build and long runs stay in `make test`,
# which still runs everything). Needs only the venv; two workers as above (docs/verified.md has its time).
quick: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow"

# The serving benchmark's Python peer (pipeline/bench/kserve_peer.py): KServe's ModelServer in its own venv
# (its pins are not pipe's); without it those rows say so.
KSERVE_STAMP := $(VENV)/kserve/.installed
$(KSERVE_STAMP): $(STAMP)
	$(PY) -m venv $(VENV)/kserve
	$(VENV)/kserve/bin/pip install --quiet kserve==0.21.0 onnxruntime==1.31.1 && touch $(KSERVE_STAMP) \
	  || echo "kserve did not install: the serving benchmark's KServe rows will say so"

# The OCR benchmark's peer (pipeline/bench/rapidocr_peer.py): RapidOCR in its own venv (numpy 2, opencv 5).
RAPIDOCR_STAMP := $(VENV)/rapidocr/.installed
$(RAPIDOCR_STAMP): $(STAMP)
	$(PY) -m venv $(VENV)/rapidocr
	$(VENV)/rapidocr/bin/pip install --quiet rapidocr-onnxruntime==1.4.4 && touch $(RAPIDOCR_STAMP) \
	  || echo "rapidocr-onnxruntime did not install: the OCR benchmark's RapidOCR rows will say so"

# The predict benchmark's peer (pipeline/bench/paddleocr_peer.py): PaddleOCR 3.7's own OCR pipeline (it brings
# paddlex 3.7.2) in its own venv, run offline on the pinned wheel's PP-OCRv4 models; without it those rows say so.
PADDLEOCR_STAMP := $(VENV)/paddleocr/.installed
$(PADDLEOCR_STAMP): $(STAMP)
	$(PY) -m venv $(VENV)/paddleocr
	$(VENV)/paddleocr/bin/pip install --quiet paddleocr==3.7.0 paddlepaddle==3.3.1 && touch $(PADDLEOCR_STAMP) \
	  || echo "paddleocr did not install: the predict benchmark's PaddleOCR rows will say so"

bench: $(STAMP) $(KSERVE_STAMP) $(RAPIDOCR_STAMP) $(PERF_STAMP) $(PADDLEOCR_STAMP)
	$(BIN)/pipe bench --out bench/RESULTS.md

clean:
	rm -rf $(VENV) $(VENV39) runs build *.egg-info
