# Set-up and checks. Everything lives in .venv at the repository root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
FAIRSEQ_VERSION := 0.12.3.1
# fairseq-fixed's C++/Cython extensions are tied to the torch ABI and the numpy major version:
# its built wheel is cached under a key naming all of them (pip's own cache keys only the sdist).
WHEEL_CACHE ?= $(HOME)/.cache/fairseq_tying/wheels
PY_TAG := $(shell $(PYTHON) -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL_DIR := $(WHEEL_CACHE)/$(PY_TAG)-torch$(TORCH_VERSION)-numpy1-fairseq$(FAIRSEQ_VERSION)

.PHONY: setup test lint demo study gpu-check clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==$(TORCH_VERSION)" "numpy<2" cython setuptools wheel
	test -n "$$(ls $(WHEEL_DIR)/fairseq_fixed-*.whl 2>/dev/null)" || { \
	  rm -rf $(WHEEL_DIR).tmp && \
	  $(PIP) wheel -q --no-build-isolation --no-deps --no-cache-dir -w $(WHEEL_DIR).tmp \
	    "fairseq-fixed==$(FAIRSEQ_VERSION)" && \
	  rm -rf $(WHEEL_DIR) && mv $(WHEEL_DIR).tmp $(WHEEL_DIR); }
	$(PIP) install -q $(WHEEL_DIR)/fairseq_fixed-*.whl
	$(PIP) install -q -e ".[dev]"
	touch $@

test: setup
	$(PY) -m pytest -q

# Trains and evaluates two small models on the embedded Bible corpus (about 20 min on 2 cores).
demo: setup
	$(PY) -m fairseq_tying.demo --out work/demo

# The reproduction study of docs/results.md: 45 runs (about 2 h on 2 cores; resumable), then
# the records, tables and plots.
study: setup
	PYTHON=$(PY) scripts/run_bible_study.sh
	$(PY) -m fairseq_tying.evaluation study --runs work/study/runs \
	  --records docs/study/records --report docs/results.md --plots docs/study

# GPU acceptance on one CUDA GPU (docs/performance.md): per output layer, --fp16 training of
# transformer_twwt_iwslt_de_en on the Bible corpus (300 updates), fairseq-generate --fp16,
# CTranslate2 float16 decoding; then bench --device cuda --fp16. Summary: work/gpu_check/gpu_check.json.
gpu-check: setup
	$(PY) -m fairseq_tying.gpu_check --out work/gpu_check

lint: setup
	$(VENV)/bin/ruff check fairseq_tying scripts tests

clean:
	rm -rf $(VENV) build *.egg-info
