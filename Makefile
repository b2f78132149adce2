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

.PHONY: setup test test-fast lint demo study study-equal study-one-epoch lm-study reproduce gpu-check \
  gpu-fused clean fairseq-wheel-dir
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
	$(PIP) install -q -e ".[all,dev]"
	touch $@

# The folder of the cached fairseq-fixed wheel (tests/test_install.py installs it into a fresh
# virtual environment beside the package's own wheel).
fairseq-wheel-dir:
	@echo $(WHEEL_DIR)

# One pytest-xdist worker a core (auto: the cores this process may use); TEST_WORKERS=0 runs
# the tests one at a time in one process.
TEST_WORKERS ?= auto
# The tests of the one loopback SLURM cluster are an xdist group: one worker runs them in turn
# while the others run the rest.
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15

# The unit tests only (formulas, properties, configs, errors): the edit-test loop.
test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow"

# Trains and evaluates two small models on the embedded Bible corpus (time: README, from its record).
demo: setup
	$(PY) -m fairseq_tying.demo --out work/demo

# The studies of slurm/studies.yaml (docs/results*.md, docs/language_models.md), each one command:
# prepare its data, train and evaluate its sweep's runs without a record (two side by side;
# resumable after any stop), export the new runs' records, rebuild its report blocks and plots.
# Runs live outside git (the sweep's output_dir, or RUNS=DIR); the records are committed.
# REPORT_ONLY=1 rebuilds the reports from the committed records alone.
WORKERS ?= 2
RUN_STUDY = PYTHONWARNINGS=ignore $(PY) -m fairseq_tying.launch study
STUDY_FLAGS = $(if $(REPORT_ONLY),--report-only,--workers $(WORKERS) \
  $(if $(NO_START_AFTER),--no-start-after $(NO_START_AFTER)) $(if $(ONLY),--only '$(ONLY)') \
  $(if $(RUNS),--runs $(RUNS)))

# The converged study: every run trained to a validation plateau, grids in priority order
# (P1: 21 runs, 18 h of the 2 cores as run; its records are committed, so it trains P2, P3).
study: setup
	$(RUN_STUDY) converged $(STUDY_FLAGS)

# The equal-training study: E1 (three-way x every output layer), E2 (DynamicConv three-way x
# {dot, l2norm}), E3 (untied and decoder-tied dot), 3 seeds each, then F1-F5 (seeds 4 and 5 of
# the headline cells, fixnorm, every DynamicConv layer); every run trained exactly 40 epochs
# (50 runs; slurm/bible_equal.yaml).
study-equal: setup
	$(RUN_STUDY) equal $(STUDY_FLAGS)

# The one-epoch study (600 updates a run, 45 runs, about 2 h on 2 cores).
study-one-epoch: setup
	$(RUN_STUDY) one_epoch $(STUDY_FLAGS)

# The perplexity study (docs/language_models.md): a word-level Transformer LM of the Bible's
# English side, untied vs decoder-tied x every output layer and tied+L, 3 seeds (21 runs), each
# trained to a validation plateau.
lm-study: setup
	$(RUN_STUDY) lm $(STUDY_FLAGS)

# One run (or all of a study's: ONLY left out) trained afresh beside its committed record:
# make reproduce STUDY=equal ONLY='bible.transformer_twwt.three_way.dot.s1' trains it into
# work/reproduce/equal (REPRO=DIR for another folder) and writes comparison.md and .json there.
REPRO ?= work/reproduce/$(STUDY)
reproduce: setup
	$(RUN_STUDY) $(STUDY) --reproduce $(REPRO) --workers $(WORKERS) $(if $(ONLY),--only '$(ONLY)')

# GPU acceptance on one CUDA GPU (docs/performance.md): per output layer, --fp16 training of
# transformer_twwt_iwslt_de_en on the Bible corpus (300 updates), fairseq-generate --fp16,
# CTranslate2 float16 decoding, the five layers side by side (--jobs); then bench --device cuda --fp16.
# Summary: work/gpu_check/gpu_check.json.
gpu-check: setup
	$(PY) -m fairseq_tying.bench --mode gpu-check --out work/gpu_check

# The fused chunked loss on one CUDA GPU (docs/performance.md): a preflight (one kernel launch,
# the half products' probe), every output layer's loss and gradients in fp16 and bf16, the fused
# step's phases, then time and memory against fairseq's formula and the eager chunked path, and
# the fastest chunk budget; at most 8 minutes. It needs torch and Triton only
# (no fairseq, no make setup): .venv's Python if there is one, else FUSED_PYTHON.
FUSED_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-fused:
	$(FUSED_PYTHON) scripts/gpu_fused_loss.py --out work/gpu_fused/gpu_fused_loss.json

lint: setup
	$(VENV)/bin/ruff check fairseq_tying scripts tests

clean:
	rm -rf $(VENV) build *.egg-info
