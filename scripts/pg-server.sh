#!/usr/bin/env bash
# Start or stop a throwaway PostgreSQL server for the test suite and the benchmarks.
#
#   scripts/pg-server.sh start DIR   initdb in DIR, start on 127.0.0.1 at a free port,
#                                    print the DATABASE_URL on stdout
#   scripts/pg-server.sh stop DIR    stop the server and remove DIR
#
# PostgreSQL refuses to run as root, so when we are root the server runs as the
# `postgres` user. It listens on 127.0.0.1 and on a socket inside DIR only.
set -euo pipefail

cmd=${1:?usage: pg-server.sh start|stop DIR}
dir=${2:?usage: pg-server.sh start|stop DIR}

bindir=""
for candidate in /usr/lib/postgresql/*/bin; do
  [ -x "$candidate/initdb" ] && bindir=$candidate
done
if [ -z "$bindir" ]; then
  if command -v initdb >/dev/null; then bindir=$(dirname "$(command -v initdb)"); fi
fi

# shellcheck source=scripts/postgres-user.sh
. "$(dirname "$0")/postgres-user.sh"

case "$cmd" in
start)
  if [ -z "$bindir" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "PostgreSQL is missing: installing it with apt-get" >&2
      "$(dirname "$0")/apt-install.sh" postgresql
      for candidate in /usr/lib/postgresql/*/bin; do bindir=$candidate; done
    else
      echo "PostgreSQL (initdb, pg_ctl) is not installed" >&2
      exit 1
    fi
  fi
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
  port=$(free_port)
  as_owner "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c shared_buffers=256MB -c max_prepared_transactions=10" \
    start >&2 || { cat "$dir/server.log" >&2; exit 1; }
  as_owner "$bindir/createdb" -h "$dir" -p "$port" -U postgres durable
  echo "postgres://postgres@127.0.0.1:$port/durable"
  ;;
stop)
  if [ -d "$dir/data" ] && [ -n "$bindir" ]; then
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: pg-server.sh start|stop DIR" >&2
  exit 2
  ;;
esac
