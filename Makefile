# Two entry points for a fresh machine (see README): `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# On the project's dev machines torch 2.13.0 is a CPU wheel on disk; elsewhere pick a CPU wheel with
#   make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" ...
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# The versions that reproduce the demo and sample_runs/ step for step (see constraints.txt)
CONSTRAINTS ?= constraints.txt

# verl 0.9.1 pins transformers<5.11 (and downgrades three more packages), so its tests run in a
# second environment, .venv-verl, beside the main one (see docs/verl.md).
VERL_VENV ?= .venv-verl
VERL_PY   := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.installed

.PHONY: venv verl-venv demo test test-core test-verl lint bench browser constraints

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[trl,test]'
	touch $(STAMP)

venv: $(STAMP)

$(VERL_STAMP): pyproject.toml
	test -x $(VERL_PY) || python3 -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install -q --upgrade pip
	$(VERL_PY) -m pip install -q $(TORCH_SPEC)
	# (the TRL the adapter is tested with: the package no longer pins it at install)
	$(VERL_PY) -m pip install -q -e '.[trl,test,verl]' 'trl>=1.16,<1.17' fastapi
	# verl's v1 trainer (main_ppo's default) imports these without declaring them; the live
	# monitor's trainer subclass (lld_monitor.integrations.verl_trainer) needs them to import
	$(VERL_PY) -m pip install -q TransferQueue==0.1.11 cachetools
	touch $(VERL_STAMP)

verl-venv: $(VERL_STAMP)

# After an upgrade of the main environment: write its versions (torch and lld_monitor aside) as
# the new constraints, then regenerate sample_runs/ (see sample_runs/README.md)
constraints: venv
	{ sed -n '/^#/p' $(CONSTRAINTS); $(PY) -m pip freeze --exclude-editable | \
	  grep -viE '^(torch|lld.monitor)=='; } > $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)

demo: venv
	HF_HUB_OFFLINE=1 $(VENV)/bin/lld-monitor demo

browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: browser tests will be skipped"

test: venv verl-venv browser
	$(MAKE) --no-print-directory test-core test-verl

test-core: venv browser
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q

test-verl: verl-venv
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VERL_PY) -m pytest -q -m verl tests/

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: venv
	HF_HUB_OFFLINE=1 $(PY) benchmarks/run_all.py
