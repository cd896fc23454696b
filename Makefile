# The two commands: `make run` brings the product up, `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint bench soak install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

# The Python client package (clients/python) is installed beside the app: its
# tests and the external-agent example run against the app.
$(VENV)/.installed-dev: pyproject.toml clients/python/pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]' -e clients/python
	touch $@ $(VENV)/.installed-run

install: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev

run: install
	$(PY) manage.py dev

# The preflight names every missing system package (and root) in one message
# before any test runs; see README "The two commands". Test files are spread
# over TEST_PROCESSES processes (pytest-xdist), each with its own test database
# and Redis database.
TEST_PROCESSES ?= 2
test: install-dev
	$(PY) tests/preflight.py
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

bench: install-dev
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench

# The fault harness (docs/soak.md): `make soak SOAK_ARGS="--runs-per-fault 20"`.
soak: install-dev
	$(PY) -m soak $(SOAK_ARGS)

clean:
	rm -rf .run db.sqlite3 db.sqlite3-wal db.sqlite3-shm
