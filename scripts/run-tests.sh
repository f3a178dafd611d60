#!/usr/bin/env bash
# Run the whole suite on SQLite, then on PostgreSQL; fail if either fails.
#
# PostgreSQL: DURABLE_TEST_DATABASE_URL if set, else a throwaway server in a temporary
# directory, stopped and removed at the end whatever happens. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# Each database's run has a limit of its own on top of pytest-timeout's per-test limit
# (pyproject.toml), so that nothing, not even a wedged interpreter, outlives CI's 90 minutes.
SUITE_LIMIT=${DURABLE_SUITE_LIMIT:-35m}

pg_dir=""
cleanup() {
  if [ -n "$pg_dir" ]; then scripts/pg-server.sh stop "$pg_dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

scripts/ensure-chromium.sh

status=0
echo "=== django-durable tests on SQLite ==="
env -u DURABLE_TEST_DATABASE_URL timeout -k 60 "$SUITE_LIMIT" "$PY" -m pytest --durations=25 "$@" || status=$?

url=${DURABLE_TEST_DATABASE_URL:-}
if [ -z "$url" ]; then
  pg_dir=$(mktemp -d /tmp/durable-pg.XXXXXX)
  url=$(scripts/pg-server.sh start "$pg_dir") || { echo "could not start PostgreSQL" >&2; exit 1; }
fi
echo "=== django-durable tests on PostgreSQL ($url) ==="
DURABLE_TEST_DATABASE_URL=$url timeout -k 60 "$SUITE_LIMIT" "$PY" -m pytest --durations=25 "$@" || status=$?

echo "=== the documentation site (mkdocs build --strict) ==="
scripts/build-docs.sh || status=$?

if [ "$status" -ne 0 ]; then
  echo "=== FAILED (exit $status) ===" >&2
fi
exit "$status"
