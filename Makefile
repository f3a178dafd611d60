# The two commands of the README: `make demo` and `make test`. Both build .venv themselves.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-latest docs bench bench-peers bench-fairness bench-horizon chaos soak-tasks hosts partition failover pooler producers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[postgres]' --group test
	touch $(STAMP)

demo: $(STAMP)
	scripts/demo.sh

test: $(STAMP)
	scripts/run-tests.sh

# The edit loop (about a minute): SQLite, no worker processes or other programs, no browser.
# `make test` before you push; PYTEST_ARGS='-k ...' narrows it further.
test-fast: $(STAMP)
	env -u DURABLE_TEST_DATABASE_URL $(VENV)/bin/python -m pytest -q -m "not slow and not browser and not processes" $(PYTEST_ARGS)

# The documentation site (MkDocs with the Material theme) in site/, warnings as errors; its own
# .venv-docs. `make test` builds it too. DOCS_ARGS=serve to read it at http://127.0.0.1:8000/.
docs:
	scripts/build-docs.sh $(DOCS_ARGS)

# The suite on the newest Django (6.x needs Python 3.12 or later), in its own .venv-latest.
# PYTEST_ARGS='-m "not slow and (not processes or every_django)"' runs what CI runs there.
test-latest:
	scripts/test-latest.sh $(PYTEST_ARGS)

bench: $(STAMP)
	scripts/run-bench.sh

# W5 (one-step jobs) against Procrastinate, django-tasks-db and DBOS, each in its own venv under
# bench/.venvs/, interleaved rounds on one throwaway PostgreSQL (see bench/peers/rounds.py).
bench-peers: $(STAMP)
	scripts/bench-peers.sh $(BENCH_ARGS)

# A steady load at 70% of each system's drain rate for 10 minutes while a REPEATABLE READ
# snapshot is held for 5 of them, on a throwaway PostgreSQL (bench/horizon.py).
bench-horizon: $(STAMP)
	BENCH_SCRIPT=bench/horizon.py scripts/run-bench.sh $(BENCH_ARGS)

# Fair shares within a queue: a backlog of 10,000 runs of one key, then 10 of another, drained
# fair and first-come in alternating rounds on a throwaway PostgreSQL (bench/fairness.py).
bench-fairness: $(STAMP)
	BENCH_SCRIPT=bench/fairness.py scripts/run-bench.sh $(BENCH_ARGS)

# The chaos soak (about 10 minutes, PostgreSQL of its own): SIGKILLs, crash restarts, paused
# workers and random database errors, then every promise checked. CHAOS_SECONDS=... to change.
chaos: $(STAMP)
	$(VENV)/bin/python -m tests.harness.chaos --duration $${CHAOS_SECONDS:-600} --db-faults

# The tasks soak (about 7 minutes, PostgreSQL of its own): django.tasks tasks at a steady rate and
# in bursts while worker processes are SIGKILLed, then every task checked (tests/harness/tasks_soak.py).
# SOAK_SECONDS=... for the chaos part (after a quiet minute).
soak-tasks: $(STAMP)
	$(VENV)/bin/python -m tests.harness.tasks_soak --duration $${SOAK_SECONDS:-300}

# Two worker hosts and a PostgreSQL server in network namespaces of their own (needs root):
# runs shared, a host's link cut mid-step and restored, NOTIFY across hosts (tests/harness/hosts.py).
hosts: $(STAMP)
	$(VENV)/bin/python -m tests.harness.hosts

# A network partition (about 3 minutes, needs root; nftables installed with apt when missing): a
# worker host's packets to PostgreSQL dropped mid-step, mid-batch and while it stops, then healed
# (tests/harness/partition.py).
partition: $(STAMP)
	$(VENV)/bin/python -m tests.harness.partition

# A failover (about 4 minutes): pg_auto_failover's monitor and two nodes on 127.0.0.1 (installed
# with apt when missing), workers on a multi-host connection string, the primary killed under
# load, the standby promoted, the old primary back as the standby (tests/harness/failover.py).
# FAILOVERS=5 for five in a row, each new primary killed in its turn (about 1 minute each).
failover: $(STAMP)
	$(VENV)/bin/python -m tests.harness.failover --seconds $${FAILOVER_SECONDS:-20} --failovers $${FAILOVERS:-1}

# Through PgBouncer in transaction mode (installed with apt when missing): the worker checks of
# tests/harness/pooler.py, then the chaos soak through the pooler. CHAOS_SECONDS=... to change.
pooler: $(STAMP)
	$(VENV)/bin/python -m tests.harness.pooler
	$(VENV)/bin/python -m tests.harness.chaos --duration $${CHAOS_SECONDS:-60} --pooler

# Many producers (RELIABILITY T45): 16, 32 and 64 processes starting runs and enqueuing tasks while
# two workers drain, with NOTIFY and without (bench/producers.py), on a throwaway PostgreSQL.
producers: $(STAMP)
	BENCH_SCRIPT=bench/producers.py scripts/run-bench.sh $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-latest .venv-docs site dist build db.sqlite3 db.sqlite3-*
