#!/usr/bin/env bash
# make bench-peers: install each peer into a virtual environment of its own under bench/.venvs/
# (django-ox, django-tasks-db and django-absurd on Django 6, PGQueuer, Procrastinate, DBOS, Oban, and
# django-durable on Django 6; Python 3.12 or later), then run interleaved
# rounds on a throwaway PostgreSQL (bench/peers/rounds.py, through scripts/run-bench.sh).
# DURABLE_BENCH_DATABASE_URL: use that server instead. Extra arguments go to rounds.py.
set -uo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/newest-python.sh) || exit 1

peer() {  # [PEER_PYTHON=...] peer NAME PACKAGE...
  local venv="bench/.venvs/$1"
  shift
  if [ ! -x "$venv/bin/python" ]; then
    "${PEER_PYTHON:-$python}" -m venv "$venv" || return 1
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" || { echo "could not install $*" >&2; return 1; }
}
peer ox "django>=6,<6.2" "django-ox==1.9.*" "psycopg[binary]>=3.2" || exit 1
peer pgqueuer "pgqueuer==1.6.*" "psycopg[binary]>=3.2" "psycopg-pool>=3.2" "asyncpg>=0.30" || exit 1
# PGQueuer once more on this checkout's own Python (.venv's), where the django-durable rows without a
# suffix run: the two compared on one interpreter (bench/peers/calls.py counts them so).
PEER_PYTHON=.venv/bin/python peer pgqueuer-same-python "pgqueuer==1.6.*" "psycopg[binary]>=3.2" \
  "psycopg-pool>=3.2" "asyncpg>=0.30" || exit 1
peer procrastinate "procrastinate==3.10.*" "psycopg[binary]>=3.2" || exit 1
peer tasks-db "django>=6,<6.2" "django-tasks-db==0.13.*" "psycopg[binary]>=3.2" || exit 1
peer dbos "dbos==3.4.*" "psycopg[binary]>=3.2" || exit 1
peer oban "oban==0.7.*" || exit 1
peer absurd "django>=6,<6.2" "django-absurd==1.0.*" "psycopg[binary]>=3.2" || exit 1
# django-durable itself as a Django 6 project runs its tasks (django.tasks, not the backport), on
# the same Python as the peers; the rows without a suffix are this checkout's .venv.
peer durable-django6 "django>=6,<6.2" -e ".[postgres]" "django-environ>=0.11" || exit 1
BENCH_SCRIPT=bench/peers/rounds.py exec scripts/run-bench.sh "$@"
