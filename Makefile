# Every target runs inside .venv, which is (re)built when pyproject.toml changes, with $(PYTHON) (3.11, as
# pyproject.toml requires). A failed install removes .venv, so the next make starts over instead of using half of it.
PYTHON ?= python3
PY := .venv/bin/python
# DATA: sim (the simulator) or a public dataset of assets/sources/ (douban, kuairand, taobao, aliccp, mind, mind_full,
# aliccp_full),
# each in a GEM_HOME of its own so worlds never mix: `make demo DATA=douban`.
DATA ?= sim
# $(call matches,VALUE,REGEX): VALUE when the whole of it matches REGEX, else empty. The shell gets VALUE in single
# quotes, so a value with a quote in it is refused before any shell sees it.
matches = $(shell printf '%s' '$(1)' | grep -xE '$(2)')
$(foreach v,DATA GEM_SIMULATOR DAYS UI_PORT,$(if $(findstring ',$($(v))),$(error $(v) must not contain a quote)))
ifneq ($(call matches,$(DATA),[a-z0-9_]+),$(DATA))
$(error DATA must match [a-z0-9_]+ (sim or a folder of assets/sources/), got '$(DATA)')
endif
export GEM_DATA := $(DATA)
# GEM_SIMULATOR=<name> (assets/simulator_<name>.yaml, e.g. eval) is another world: a home of its own, .gem/sim_<name>/
ifneq ($(call matches,$(GEM_SIMULATOR),[a-z0-9_]*),$(GEM_SIMULATOR))
$(error GEM_SIMULATOR must match [a-z0-9_]+, got '$(GEM_SIMULATOR)')
endif
ifeq ($(DATA),sim)
export GEM_HOME ?= $(CURDIR)/.gem$(if $(GEM_SIMULATOR),/sim_$(GEM_SIMULATOR))
else
export GEM_HOME ?= $(CURDIR)/.gem/$(DATA)
endif
export DAGSTER_HOME := $(GEM_HOME)/dagster
export DAGSTER_DISABLE_TELEMETRY := 1
export WANDB_MODE ?= offline
export WANDB_SILENT := true
# pytest's "no tests collected" exit code (5) is a failure here, not a pass. Two xdist workers for CI's two
# cores, a test file per worker at a time (tests/conftest.py schedules them); PYTEST_ARGS="-n 0" runs serially.
# A worker that crashes (a native fault) ends the run naming its test: replaced, it could leave the scope scheduler
# waiting for good (seen once on a clean clone: both workers idle until killed).
PYTEST_ARGS ?= -n 2 --max-worker-restart=0

.PHONY: demo next-day week test chromium ui bench eval lint clean

.venv: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else \
	    f"$(PYTHON) is Python {sys.version.split()[0]}; pyproject.toml needs 3.11: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip || { rm -rf .venv; exit 1; }
	$(PY) -m pip install --quiet -e '.[dev]' || { rm -rf .venv; exit 1; }
	touch .venv

demo: .venv
	$(PY) -m gem_pipelines.demo

# One more simulated day (DAYS more), handled by the automation alone (stop `make ui` first: its daemon
# would too); each day's report: $(GEM_HOME)/reports/days_in_the_life.md and .png.
DAYS ?= 1
ifneq ($(call matches,$(DAYS),[1-9][0-9]*),$(DAYS))
$(error DAYS must be a positive integer, got '$(DAYS)')
endif
next-day: .venv
	$(PY) -m gem_pipelines.next_day --days $(DAYS)

# A week in the life: seven simulated days through the automation, after `make demo`.
week: .venv
	$(MAKE) next-day DAYS=7

test: .venv chromium
	@$(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: treating as a failure"; exit 1; fi; exit $$rc

# The browser test drives Debian's chromium (Playwright's own download needs the network): installed here when it
# is missing and apt can (root); otherwise tests/pipelines/test_browser.py is reported as not run, naming
# `apt-get install chromium`.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@if [ ! -x "$(CHROMIUM)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test (apt-get install chromium, quietly)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    { apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }; } \
	        >/dev/null 2>&1 || echo "apt-get install chromium failed: the browser test will be reported as not run"; \
	fi

UI_PORT ?= 3000
PORT_RE := [0-9]{1,5}
ifneq ($(call matches,$(UI_PORT),$(PORT_RE)),$(UI_PORT))
$(error UI_PORT must be a port number, got '$(UI_PORT)')
endif
ui: .venv
	$(PY) -c "from gem_pipelines.instance import dagster_home; dagster_home()"
	$(PY) -m gem_pipelines.reports & trap 'kill $$!' EXIT; .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(UI_PORT)

bench: .venv
	$(PY) bench/ingest.py
	$(PY) bench/kernels.py
	$(PY) bench/train.py
	$(PY) bench/students.py

eval: .venv
	$(PY) -m gem_pipelines.evaluate --seeds 0 1 2

lint: .venv
	.venv/bin/ruff check .

clean:
	rm -rf $(GEM_HOME)
