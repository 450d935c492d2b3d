# `make serve` and `make test` work on a fresh machine with Python 3.11+,
# MariaDB on 127.0.0.1:3306 and Redis on 127.0.0.1:6379. `make serve` installs only
# the runtime (.venv of ~60 MB); `make test` adds the test tools (~216 MB in all) and,
# as root, Debian's chromium, prometheus and galera-4 with apt-get when missing.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: serve test test-fast check install install-test browser promtool galera constraints clean

# `make install` (and `make serve`): what serving needs, idpool and its client, no
# test tools. -c constraints.txt: the runtime dependencies at the versions the image
# pins, so the tests run against what the image ships (`make constraints` after an upgrade).
$(VENV)/.installed: pyproject.toml client/pyproject.toml client/idpool_client/_clockrun.c constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# One command: idpool declares idpool-client, which is on no index; pip takes it
	# from ./client only when it is named beside idpool.
	$(PY) -m pip install --quiet -c constraints.txt -e ./client -e .
	touch $@

# `make test` adds the test tools (pytest, mypy, ruff, schemathesis, build, ...:
# pyproject.toml's [test] extras), still within constraints.txt.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install --quiet -c constraints.txt -e ./client -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

HOST ?= 127.0.0.1
PORT ?= 8000

serve: install
	$(VENV)/bin/idpool serve --host $(HOST) --port $(PORT)

# The status-page test renders /status in headless Chromium (Debian's package).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# tests/test_alerts.py unit-tests ops/alerts.yml with promtool (Debian's prometheus
# package); it fails, never skips, when promtool is missing.
promtool:
	@command -v promtool >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

# tests/test_galera.py starts a 3-member MariaDB Galera cluster: the provider
# (Debian's galera-4), rsync for its SST, and ss (iproute2), which the SST script
# uses to see its rsync daemon listen.
galera:
	@{ test -e /usr/lib/galera/libgalera_smm.so && command -v rsync >/dev/null 2>&1 && \
		command -v ss >/dev/null 2>&1; } || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq galera-4 rsync iproute2 >/dev/null; }

# Lint, type-check, then the whole suite against the real MariaDB and Redis.
test: install-test browser promtool galera
	$(VENV)/bin/ruff check idpool pool service tests ops client
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

# The fast tier: only `pytest -m "not process"` (no ruff, no mypy): every test that
# starts no process or server of its own and injects no server fault (tests/conftest.py
# marks the others `process`), still against the real MariaDB and Redis; ~2 minutes.
test-fast: install-test
	$(PY) -m pytest -q -m "not process"

# constraints.txt (used by the Dockerfile and `make install`): the .venv's tested
# versions of idpool's runtime dependencies, found by installing idpool alone in a
# scratch venv. To upgrade: `.venv/bin/pip install -U -e .`, `make constraints`, `make test`.
constraints: install
	rm -rf $(VENV)-constraints && python3 -m venv $(VENV)-constraints
	$(PY) -m pip freeze --exclude-editable > $(VENV)-constraints/tested.txt
	$(VENV)-constraints/bin/pip install --quiet -c $(VENV)-constraints/tested.txt ./client .
	{ grep '^#' constraints.txt; $(VENV)-constraints/bin/pip freeze | grep -v '^idpool'; } \
		> constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf $(VENV)-constraints

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
