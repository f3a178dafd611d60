#!/usr/bin/env bash
# Run the whole suite on SQLite, then on PostgreSQL, then build the docs site; fail if any fails.
#
# PostgreSQL: DURABLE_TEST_DATABASE_URL if set, else a throwaway server in a temporary
# directory, stopped and removed at the end whatever happens. Extra arguments go to pytest.
# DURABLE_DOCS=0 leaves the docs site out (test-latest: it does not depend on Django's version).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# Each pass has a limit of its own on top of pytest-timeout's per-test limit (pyproject.toml), so
# that nothing, not even a wedged interpreter, outlives CI's 90 minutes. CI's four passes and the
# docs site add up to 87 minutes (.ci/run sets the newest Django's lower ones). On this 2-core
# machine the SQLite pass takes about 16 minutes (its browser tests start the demo twice) and the
# PostgreSQL pass about 39 (its failover, partition, chaos and 10,000-run tests are a third of
# it); the docs site builds in seconds.
SQLITE_LIMIT=${DURABLE_SQLITE_LIMIT:-17m}
POSTGRES_LIMIT=${DURABLE_POSTGRES_LIMIT:-42m}
DOCS_LIMIT=3m

pg_dir=""
cleanup() {
  if [ -n "$pg_dir" ]; then scripts/pg-server.sh stop "$pg_dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

scripts/ensure-chromium.sh

status=0
# The contracts' type check (pyproject.toml's [tool.mypy]): the workpool's backends against
# workpool/backend.py, the workflow context and its stand-ins against engine/contract.py.
echo "=== the contracts' type check (mypy) ==="
"$PY" -m mypy || status=$?

started=$SECONDS
echo "=== django-durable tests on SQLite (limit $SQLITE_LIMIT) ==="
env -u DURABLE_TEST_DATABASE_URL timeout -k 60 "$SQLITE_LIMIT" "$PY" -m pytest --durations=25 "$@" || status=$?
echo "=== SQLite: $((SECONDS - started)) s ==="

url=${DURABLE_TEST_DATABASE_URL:-}
if [ -z "$url" ]; then
  pg_dir=$(mktemp -d /tmp/durable-pg.XXXXXX)
  url=$(scripts/pg-server.sh start "$pg_dir") || { echo "could not start PostgreSQL" >&2; exit 1; }
fi
started=$SECONDS
echo "=== django-durable tests on PostgreSQL ($url, limit $POSTGRES_LIMIT) ==="
DURABLE_TEST_DATABASE_URL=$url timeout -k 60 "$POSTGRES_LIMIT" "$PY" -m pytest --durations=25 "$@" || status=$?
echo "=== PostgreSQL: $((SECONDS - started)) s ==="

if [ "${DURABLE_DOCS:-1}" != 0 ]; then
  echo "=== the documentation site (mkdocs build --strict) ==="
  timeout -k 30 "$DOCS_LIMIT" scripts/build-docs.sh || status=$?
fi

if [ "$status" -ne 0 ]; then
  echo "=== FAILED (exit $status) ===" >&2
fi
exit "$status"
