# Two commands for a fresh machine: `make run` and `make test` (see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8080
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: run test install install-dev compiled install-gpu gpu-wheels tools image lint corpus train tune evaluate bench adapt standin \
	masked-lm

# Python 3.11 or newer (transformers 5 and the pinned wheels need it). A .venv made by an older Python (a first try
# with Ubuntu 22.04's 3.10, say) is rebuilt with $(PYTHON) instead of being reused broken.
NEEDS_311 := import sys; sys.exit(sys.version_info < (3, 11))

$(VENV)/.installed: requirements.txt
	@$(PYTHON) -c '$(NEEDS_311)' 2>/dev/null || { echo "Python 3.11 or newer is needed, and $(PYTHON) is \
	$$($(PYTHON) --version 2>&1 || echo missing): install python3.11 and run make $(MAKECMDGOALS) PYTHON=python3.11" >&2; \
	exit 2; }
	@if test -x $(PY) && ! $(PY) -c '$(NEEDS_311)' 2>/dev/null; then \
	echo "$(VENV) was made by $$($(PY) --version 2>&1): rebuilding it with $(PYTHON)"; rm -rf $(VENV); fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt requirements.txt $(VENV)/.installed
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev compiled

## The model's hot modules compiled to C where their sources changed since (compiled.py); interpreted where no C
## compiler is.
compiled: install
	@$(PY) -m compiled

## The CUDA build of the pinned torch into .venv, replacing the CPU build (docs/deploy.md, "Running on a GPU"):
## make install-gpu [TORCH_INDEX=https://download.pytorch.org/whl/cu128]
## It fails, in one line saying why, unless the torch it leaves is a CUDA build (torch.version.cuda): pip also looks
## in its other sources (pip.conf's find-links, extra-index-url), which may hold the CPU build of the same version.
## A CUDA build on a machine without a GPU is a success (CUDA available: False).
TORCH_INDEX ?= https://download.pytorch.org/whl/cu128
define CUDA_BUILD_CHECK
import sys, urllib.request, torch
index = sys.argv[1]
if torch.version.cuda is None:
    try:
        urllib.request.urlopen(index, timeout=10).close()
        why = f"{index} offers none for this Python and platform"
    except OSError as exc:
        why = f"{index} is unreachable ({getattr(exc, 'reason', exc)})"
    sys.exit(f"make install-gpu: the CUDA build of torch could not be installed: {why}; pip installed torch "
             f"{torch.__version__}, a CPU build, from its other sources")
print("torch", torch.__version__, "CUDA", torch.version.cuda, "CUDA available:", torch.cuda.is_available())
endef
export CUDA_BUILD_CHECK
install-gpu: install
	@spec="$$(grep -m1 '^torch==' requirements.txt)"; \
	if ! out="$$($(PY) -m pip install -q --force-reinstall --no-deps "$$spec" --index-url $(TORCH_INDEX) 2>&1)"; then \
	echo "make install-gpu: the CUDA build of torch could not be installed: pip: \
	$$(grep -m1 '^ERROR' <<<"$$out" || tail -n1 <<<"$$out")" >&2; exit 1; fi
	@$(PY) -c "$$CUDA_BUILD_CHECK" $(TORCH_INDEX)

## Wheels for CPython 3.12 of what a GPU machine with torch and transformers but no network lacks, into .whl/ (for
## testing/gpu_check.sh there; docs/benchmarks.md, "GPU check").
gpu-wheels: install-dev
	bash testing/gpu_wheels.sh

## Serve the shipped corrector with gunicorn (gthread; a worker per two cores, WEB_WORKERS) on $(PORT).
run: compiled
	@PORT=$(PORT) $(VENV)/bin/gunicorn -c server/gunicorn_conf.py "api:create_app()"

## System tools the tests start: JMeter and newman (client tests), chromium (docs pages), redis-server and nginx
## (deployment test), podman, runc and mmdebstrap (the image's test; not where a docker daemon answers).
tools:
	bash testing/install_tools.sh
	bash deploy/install_tools.sh
	bash learn/install_irstlm.sh

## Install everything and run the whole test suite.
test: install-dev tools
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -rs

## Build the service's image with docker or podman (docs/deploy.md, "Docker"; podman installed from Debian where neither
## runs): make image [IMAGE=esun-asr] [BASE_IMAGE=...] [TORCH_INDEX=...] [WHEELS=DIR]. The settings are read from the
## command line or the environment by deploy/image.sh (install-gpu's default TORCH_INDEX, set in this file, is not).
image:
	bash deploy/image.sh

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

corpus: install-dev
	$(PY) -m learn.data.corpus

train: install-dev
	$(PY) -m learn.train

## Fit the second stage's weights (LM, network, rank prior) and margin on simulated dev lists.
tune: install-dev
	$(PY) -m learn.tune --variant full --write
	$(PY) -m learn.tune --variant lm --write

## Adapt the shipped corrector to your recogniser's labelled lists (README, "Your own labelled lists"):
## make adapt DATA=train_all.json [OUT=adapted/mine] [CKPT_DIR=checkpoints] [MLM_DIR=DIR]  (DATA may name several files,
## space-separated; a name holding spaces is quoted inside it: DATA="'my file.json' other.json"). adapted/ is a team's
## folders' home: git and the image's build leave it out (.gitignore, .dockerignore); WEIGHTS_DIR=adapted/mine serves one.
adapt: OUT ?= adapted/mine
adapt: export ADAPT_DATA = $(DATA)
adapt: export ADAPT_OUT = $(OUT)
adapt: export ADAPT_CKPT = $(CKPT_DIR)
adapt: export ADAPT_MLM = $(MLM_DIR)
adapt: install-dev
	@test -n "$$ADAPT_DATA" -a -n "$$ADAPT_OUT" || { echo "usage: make adapt DATA=FILE [OUT=DIR] [CKPT_DIR=DIR] [MLM_DIR=DIR]" >&2; exit 2; }
	bash learn/install_irstlm.sh
	$(PY) -m learn.adapt --data "$$ADAPT_DATA" --out "$$ADAPT_OUT" $(if $(CKPT_DIR),--ckpt-dir "$$ADAPT_CKPT") \
	$(if $(MLM_DIR),--mlm-dir "$$ADAPT_MLM")

## A small character masked LM of the corpus, saved as a Hugging Face folder (docs/model.md, "A team's masked LM"):
## make masked-lm OUT=DIR [MINUTES=25]. It proves the MLM_DIR path with a model made here; a team brings its own.
MINUTES ?= 25
masked-lm: install-dev
	@test -n "$(OUT)" || { echo "usage: make masked-lm OUT=DIR [MINUTES=25]" >&2; exit 2; }
	test -f data/corpus/train.txt || $(PY) -m learn.data.corpus
	$(PY) -m learn.masked_lm --out "$(OUT)" --minutes $(MINUTES)

## The stand-in labelled files adapt is measured on (docs/model.md): the one calibrated to real competition lists in
## data/standin-real/ (PROFILE=easy: the older, easier one, in data/standin/).
PROFILE ?= real
standin: install-dev
	$(PY) -m learn.data.standin --profile $(PROFILE)

evaluate: install-dev
	$(PY) -m learn.evaluate --stage all

bench: install-dev
	$(PY) -m testing.bench

