# Sourced by the scripts that start PostgreSQL's programs (pg-server.sh, pgbouncer.sh).
#
# as_owner COMMAND...   run COMMAND as the `postgres` user when we are root (PostgreSQL and
#                       PgBouncer refuse to run as root), as ourselves otherwise
# free_port             print a TCP port free on 127.0.0.1 now

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
