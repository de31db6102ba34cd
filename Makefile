# Every target that needs Python sets up .venv itself, so a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LISTEN ?= 0.0.0.0:10040
STATE_DIR ?= .state

.PHONY: run demo test unit integration lint typecheck format bench system-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: $(STAMP)
	$(BIN)/gpuwatch run --listen $(LISTEN) --state-dir $(STATE_DIR)

demo: $(STAMP)
	$(BIN)/gpuwatch demo

# Integration tests need promtool and prometheus (Debian's `prometheus` package); installed when root.
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null \
			|| ! command -v prometheus-alertmanager >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				prometheus prometheus-alertmanager >/dev/null; \
		else \
			echo "promtool, prometheus or alertmanager missing: install Debian's 'prometheus' and 'prometheus-alertmanager' packages (integration tests need them)" >&2; exit 1; \
		fi; \
	fi

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

test: $(STAMP) system-deps lint
	GPUWATCH_REQUIRE_TOOLS=1 $(BIN)/pytest -q tests

bench: $(STAMP)
	$(BIN)/python bench/daemon_cost.py

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .mypy_cache .ruff_cache build *.egg-info
