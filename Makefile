# Two commands for a fresh machine: `make run` and `make test` (see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8080
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: run test install install-dev tools lint corpus train tune evaluate bench soak adapt standin

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt requirements.txt $(VENV)/.installed
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

## Serve the shipped corrector with gunicorn (one process, gthread) on $(PORT).
run: install
	@PORT=$(PORT) $(VENV)/bin/gunicorn -c api/gunicorn_conf.py "api:create_app()"

## System tools the tests start: JMeter and newman (client tests), chromium (docs pages), redis-server and nginx
## (deployment test).
tools:
	bash testing/install_tools.sh
	bash deploy/install_tools.sh
	bash model/install_irstlm.sh

## Install everything and run the whole test suite.
test: install-dev tools
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: install-dev
	$(VENV)/bin/ruff check .

corpus: install-dev
	$(PY) -m preprocess.corpus

train: install-dev
	$(PY) -m model.train

## Fit the second stage's weights (LM, network, rank prior) and margin on simulated dev lists.
tune: install-dev
	$(PY) -m model.tune --variant full --write
	$(PY) -m model.tune --variant lm --write

## Adapt the shipped corrector to your recogniser's labelled lists (README, "Train on your own labelled lists"):
## make adapt DATA=train_all.json OUT=weights-mine  (DATA may name several files, space-separated)
adapt: install-dev
	@test -n "$(DATA)" -a -n "$(OUT)" || { echo "usage: make adapt DATA=FILE OUT=DIR" >&2; exit 2; }
	bash model/install_irstlm.sh
	$(PY) -m model.adapt $(foreach f,$(DATA),--data $(f)) --out $(OUT)

## The stand-in labelled files adapt is measured on (docs/model.md), in data/standin/.
standin: install-dev
	$(PY) -m preprocess.standin

evaluate: install-dev
	$(PY) -m model.evaluate --stage all

bench: install-dev
	$(PY) -m testing.bench

soak: install-dev
	$(PY) -m testing.soak
