# Every target that needs Python sets up .venv itself, so a fresh clone needs only `make demo` or `make test`.
# The newest supported Python (3.10 to 3.13) on the PATH, unless PYTHON names one.
SUPPORTED := (3, 10) <= sys.version_info[:2] <= (3, 13)
ifndef PYTHON
PYTHON := $(shell for p in python3.13 python3.12 python3.11 python3.10 python3; do \
	$$p -c 'import sys; sys.exit(not ($(SUPPORTED)))' 2>/dev/null && { echo $$p; break; }; done)
endif
# Said before anything is installed: which Python to install where none fits.
define CHECK_PYTHON
	@test -n "$(PYTHON)" || { echo "gpuwatch needs Python 3.10 to 3.13; the PATH has none \
	($$(python3 --version 2>&1 || echo no python3)). Install one (Ubuntu 22.04: \
	apt install python3-venv; Ubuntu 24.04: apt install python3.12-venv; RHEL 9: \
	dnf install python3.11), then run make again, or make PYTHON=/path/to/python3.X" >&2; \
	exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(not ($(SUPPORTED)))' || { echo "$(PYTHON) is \
	$$($(PYTHON) --version 2>&1); gpuwatch needs 3.10 to 3.13" >&2; exit 1; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { echo "$(PYTHON) cannot make a \
	virtualenv: install its venv module (Debian, Ubuntu: apt install python3-venv, or \
	python3.X-venv for $(PYTHON))" >&2; exit 1; }
endef
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LISTEN ?= 0.0.0.0:10040
STATE_DIR ?= .state
# `make install` on a GPU host: gpuwatch in a virtualenv at PREFIX, its config in CONFDIR.
PREFIX ?= /opt/gpuwatch
CONFDIR ?= /etc/gpuwatch
UNITDIR ?= /etc/systemd/system
# The Slurm health check and prolog go to LIBEXECDIR, with Slurm's commands and, where they are
# not where gpuwatch and scontrol look, the daemon's state directory and slurm.conf.
LIBEXECDIR ?= $(PREFIX)/libexec
GPUWATCH_STATE_DIR ?=
SCONTROL ?= $(or $(shell command -v scontrol),/usr/bin/scontrol)
SINFO ?= $(or $(shell command -v sinfo),/usr/bin/sinfo)
SLURM_CONF_FILE ?=

# The NVML tests run a second time on the lowest nvidia-ml-py pyproject.toml allows.
PYNVML_LOWEST := $(shell sed -n 's/.*"nvidia-ml-py>=\([0-9.]*\)".*/\1/p' pyproject.toml)
LOWEST_PIN := .venv/pins/nvidia-ml-py-$(PYNVML_LOWEST)
NVML_TESTS := tests/integration/test_nvml_drivers.py tests/integration/test_nvml_source.py tests/unit/test_sim.py tests/unit/test_sim_faults.py tests/unit/test_daemon.py

.PHONY: run demo image test test-pythons unit integration lint typecheck format bench system-deps install systemd-unit slurm-files wheel clean test-lowest-pin xid-catalog

# What the daemon needs (`make demo`, `make run`), then the tests' and linters' tools on top
# (`make test`). PYTHONWARNINGS: setuptools' banner about editable installs is for packagers.
RUNTIME := $(VENV)/.runtime
$(RUNTIME): pyproject.toml
	$(CHECK_PYTHON)
	$(PYTHON) -m venv $(VENV)
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet -e .
	touch $@

$(STAMP): $(RUNTIME)
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: $(RUNTIME)
	$(BIN)/gpuwatch run --listen $(LISTEN) --state-dir $(STATE_DIR)

demo: $(RUNTIME)
	@echo "gpuwatch is installed in .venv: in another terminal, .venv/bin/gpuwatch status"
	@echo "(or source .venv/bin/activate first). If port 10040 was taken, give status the"
	@echo "address the dashboard's top line shows: .venv/bin/gpuwatch status 127.0.0.1:PORT"
	$(BIN)/gpuwatch demo

# Integration tests need promtool, prometheus and alertmanager (Debian's `prometheus` and
# `prometheus-alertmanager`), systemd-analyze (`systemd`) and a Slurm to drain nodes in
# (`slurmctld`, `slurmd`, `slurm-client`, `munge`); installed when root.
SYSTEM_PACKAGES := prometheus prometheus-alertmanager systemd slurmctld slurmd slurm-client munge
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null \
			|| ! command -v prometheus-alertmanager >/dev/null \
			|| ! command -v systemd-analyze >/dev/null || ! command -v scontrol >/dev/null \
			|| ! test -x /usr/sbin/slurmctld || ! test -x /usr/sbin/slurmd \
			|| ! test -x /usr/sbin/munged; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				$(SYSTEM_PACKAGES) >/dev/null; \
		else \
			echo "missing: install Debian's $(SYSTEM_PACKAGES) (integration tests need them)" >&2; exit 1; \
		fi; \
	fi

# On a GPU host, as root (docs/install.md). Keeps an existing config; run it again to upgrade.
install:
	$(CHECK_PYTHON)
	$(PYTHON) -m venv $(PREFIX)
	$(PREFIX)/bin/pip install --quiet --upgrade pip
	rm -rf build  # a stale build/ would put deleted modules in the wheel
	$(PREFIX)/bin/pip install --quiet .
	install -d -m 0755 $(PREFIX)/share/doc/gpuwatch  # the unit's Documentation= points here
	install -m 0644 README.md docs/*.md $(PREFIX)/share/doc/gpuwatch/
	install -d -m 0755 $(CONFDIR)
	test -e $(CONFDIR)/gpuwatch.yaml || install -m 0644 systemd/gpuwatch.yaml $(CONFDIR)/gpuwatch.yaml
	$(MAKE) --no-print-directory systemd-unit slurm-files
	-systemctl daemon-reload
	@echo "installed; start it with: systemctl enable --now gpuwatch"

# The unit with this install's paths: gpuwatch from PREFIX, its config from CONFDIR.
systemd-unit:
	install -d $(UNITDIR)
	sed -e 's|/opt/gpuwatch/|$(PREFIX)/|' \
		-e 's|$${CONFIGURATION_DIRECTORY}/gpuwatch.yaml|$(CONFDIR)/gpuwatch.yaml|' \
		systemd/gpuwatch.service > $(UNITDIR)/gpuwatch.service
	chmod 0644 $(UNITDIR)/gpuwatch.service

# Slurm runs these with no PATH: each names gpuwatch, scontrol and sinfo by absolute path.
slurm-files:
	install -d $(LIBEXECDIR)
	for f in gpuwatch-healthcheck gpuwatch-prolog; do \
		sed -e 's|^GPUWATCH=.*|GPUWATCH=$(PREFIX)/bin/gpuwatch|' \
			-e 's|^STATE_DIR=.*|STATE_DIR=$(GPUWATCH_STATE_DIR)|' \
			-e 's|^SCONTROL=.*|SCONTROL=$(SCONTROL)|' -e 's|^SINFO=.*|SINFO=$(SINFO)|' \
			-e 's|^SLURM_CONF_FILE=.*|SLURM_CONF_FILE=$(SLURM_CONF_FILE)|' \
			deploy/slurm/$$f > $(LIBEXECDIR)/$$f && chmod 0755 $(LIBEXECDIR)/$$f || exit 1; \
	done

# A wheel for hosts without PyPI: pip wheel fetches the dependencies' wheels too, into dist/.
wheel: $(STAMP)
	$(BIN)/pip wheel --quiet --wheel-dir dist .

lint: $(STAMP) typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy cannot follow setuptools' editable finder for the folders mapped into the gpuwatch
# namespace, so it checks a symlinked tree laid out as the installed package is.
typecheck: $(STAMP)
	rm -rf .typecheck && mkdir -p .typecheck
	cp -rs $(CURDIR)/gpuwatch .typecheck/gpuwatch
	ln -s $(CURDIR)/exporters .typecheck/gpuwatch/exporters
	ln -s $(CURDIR)/tui .typecheck/gpuwatch/tui
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml -p gpuwatch

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: $(STAMP) system-deps
	GPUWATCH_REQUIRE_TOOLS=1 $(BIN)/pytest -q tests/integration

# The integration tests spend most of their time waiting on real daemons and servers, so the
# other tests (and the lowest pin's) run beside them; their report follows the others'.
test: $(STAMP) system-deps lint $(LOWEST_PIN)
	@# Its own temporary root: each pytest run keeps only the newest three of a root's
	@# directories, and would delete the other's under its running daemons.
	@root=$$(mktemp -d /tmp/gwi.XXXXXX); \
	PYTEST_DEBUG_TEMPROOT=$$root GPUWATCH_REQUIRE_TOOLS=1 \
		$(BIN)/pytest -q -p no:cacheprovider tests/integration > .integration.log 2>&1 & \
	integration=$$!; \
	GPUWATCH_REQUIRE_TOOLS=1 $(BIN)/pytest -q tests --ignore=tests/integration; rest=$$?; \
	$(MAKE) --no-print-directory test-lowest-pin; pin=$$?; \
	$(MAKE) --no-print-directory test-pythons; pythons=$$?; \
	wait $$integration; status=$$?; \
	echo "== tests/integration"; cat .integration.log; \
	test $$rest = 0 && test $$pin = 0 && test $$pythons = 0 && test $$status = 0

# The unit and fault tests again on the oldest and newest Python gpuwatch supports, each in
# a virtualenv of its own, where the host has it (on the PATH, or installed by pyenv).
EDGE_PYTHONS := 3.10 3.13
PYENV_PYTHONS = $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(1).*/bin/python$(1))
test-pythons:
	@for v in $(EDGE_PYTHONS); do \
		$(MAKE) --no-print-directory .venv-$$v/.installed || exit 1; \
		test -e .venv-$$v/.installed || continue; \
		echo "== Python $$v: tests/unit tests/faults"; \
		.venv-$$v/bin/pytest -q -p no:cacheprovider tests/unit tests/faults || exit 1; \
	done

.venv-%/.installed: pyproject.toml
	@py=; for c in $$(command -v python$*) $(call PYENV_PYTHONS,$*); do \
		$$c -c 'import sys' 2>/dev/null && { py=$$c; break; }; done; \
	if [ -z "$$py" ]; then echo "== Python $*: not on this host; its tests are not run"; exit 0; fi; \
	$$py -m venv .venv-$* && PYTHONWARNINGS=ignore .venv-$*/bin/pip install --quiet -e '.[dev]' \
		&& touch $@

$(LOWEST_PIN): pyproject.toml
	$(BIN)/pip install --quiet --no-deps --target $@ nvidia-ml-py==$(PYNVML_LOWEST)

# pynvml from $(LOWEST_PIN) comes first on the path; a test checks it is the one imported.
test-lowest-pin: $(STAMP) $(LOWEST_PIN)
	PYTHONPATH=$(LOWEST_PIN) GPUWATCH_EXPECT_PYNVML=$(PYNVML_LOWEST) $(BIN)/pytest -q $(NVML_TESTS)

# The container image the Kubernetes DaemonSet names (deploy/container/Containerfile).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= registry.example.com/gpuwatch:$(VERSION)
CONTAINER ?= $(or $(shell command -v podman),docker)
image:
	$(CONTAINER) build -f deploy/container/Containerfile -t $(IMAGE) .

# After editing gpuwatch/xid/catalog.tsv: the catalog module and the hardware pack's XID
# matchers are written from it (a unit test fails while they differ).
xid-catalog: $(RUNTIME)
	$(BIN)/python -m gpuwatch.xid.generate

bench: $(STAMP)
	$(BIN)/python bench/daemon_cost.py

clean:
	rm -rf $(VENV) .venv-3.* .typecheck .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
