#!/usr/bin/env bash
# Run the benchmark harness on PostgreSQL: DURABLE_BENCH_DATABASE_URL if set, else a
# throwaway server in a temporary directory (fsync on, as in production). Extra arguments
# go to bench/run.py (see --help), or to BENCH_SCRIPT (make bench-peers: bench/peers/rounds.py).
set -uo pipefail
cd "$(dirname "$0")/.."

pg_dir=""
cleanup() {
  if [ -n "$pg_dir" ]; then scripts/pg-server.sh stop "$pg_dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

url=${DURABLE_BENCH_DATABASE_URL:-}
if [ -z "$url" ]; then
  pg_dir=$(mktemp -d /tmp/durable-bench.XXXXXX)
  url=$(scripts/pg-server.sh start "$pg_dir") || { echo "could not start PostgreSQL" >&2; exit 1; }
fi
DATABASE_URL=$url .venv/bin/python "${BENCH_SCRIPT:-bench/run.py}" "$@"
