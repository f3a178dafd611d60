#!/usr/bin/env bash
# Start or stop a throwaway PgBouncer in transaction mode in front of a PostgreSQL server, for the
# tests and the benchmarks that go through a pooler (RELIABILITY T43).
#
#   scripts/pgbouncer.sh start DIR DATABASE_URL   a pooler on 127.0.0.1 at a free port in front of
#                                                 DATABASE_URL's server; print the pooler's URL
#                                                 (same user and database) on stdout
#   scripts/pgbouncer.sh stop DIR                 stop it and remove DIR
#
# Debian's pgbouncer (1.18 on bookworm) is installed with apt when it is missing and we are root.
# PgBouncer refuses to run as root, so when we are root it runs as the `postgres` user. The
# server's authentication is trusted (scripts/pg-server.sh), and so is the pooler's.
set -euo pipefail

cmd=${1:?usage: pgbouncer.sh start DIR DATABASE_URL | stop DIR}
dir=${2:?usage: pgbouncer.sh start DIR DATABASE_URL | stop DIR}

# shellcheck source=scripts/postgres-user.sh
. "$(dirname "$0")/postgres-user.sh"

case "$cmd" in
start)
  url=${3:?usage: pgbouncer.sh start DIR DATABASE_URL}
  if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "PgBouncer is missing: installing it with apt-get" >&2
      "$(dirname "$0")/apt-install.sh" pgbouncer || { echo "could not install pgbouncer" >&2; exit 1; }
    else
      echo "PgBouncer is not installed (apt-get install pgbouncer)" >&2
      exit 1
    fi
  fi
  bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  # postgres://user@host:port/db (no password: the test server trusts 127.0.0.1)
  rest=${url#*://}
  user=${rest%%@*}
  hostport=${rest#*@}; hostport=${hostport%%/*}
  host=${hostport%:*}; port=${hostport##*:}
  db=${rest##*/}; db=${db%%\?*}
  listen=$(free_port)
  mkdir -p "$dir"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$host port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir = $dir
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = ${DURABLE_POOL_SIZE:-20}
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  echo "\"$user\" \"\"" >"$dir/userlist.txt"
  if [ "$(id -u)" = 0 ]; then chown -R postgres: "$dir"; fi
  as_owner "$bin" -d "$dir/pgbouncer.ini" >&2 || { cat "$dir/pgbouncer.log" >&2; exit 1; }
  for _ in $(seq 100); do  # at most 10 s
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $listen), 0.2)" 2>/dev/null && break
    sleep 0.1
  done
  echo "postgres://$user@127.0.0.1:$listen/$db"
  ;;
stop)
  if [ -f "$dir/pgbouncer.pid" ]; then
    kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
    for _ in $(seq 50); do
      [ -f "$dir/pgbouncer.pid" ] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: pgbouncer.sh start DIR DATABASE_URL | stop DIR" >&2
  exit 2
  ;;
esac
