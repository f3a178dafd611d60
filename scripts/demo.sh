#!/usr/bin/env bash
# The example project on SQLite: a worker, the development server and a few example runs.
# Ctrl-C stops everything this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-8000}
export DJANGO_SETTINGS_MODULE=example_project.settings
export DATABASE_URL=${DEMO_DATABASE_URL:-sqlite:///$(pwd)/db.sqlite3}

pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "Stopping the worker and the server..."
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "Stopped."
}
trap stop EXIT
trap 'exit 130' INT TERM

if ! "$PY" -c "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', $PORT))" 2>/dev/null; then
  echo "Port $PORT is already in use (another demo, or another server). Stop it, or choose another port: PORT=8001 make demo" >&2
  exit 1
fi

"$PY" manage.py migrate --noinput -v 0
if DJANGO_SUPERUSER_PASSWORD=demo "$PY" manage.py createsuperuser --noinput \
     --username demo --email demo@example.com >/dev/null 2>&1; then
  echo "Created the demo superuser."
fi

"$PY" manage.py durable_worker --concurrency 2 &
pids+=($!)
"$PY" manage.py runserver "127.0.0.1:$PORT" --noreload &
pids+=($!)

for _ in $(seq 1 100); do
  if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/', timeout=1)" 2>/dev/null; then
    break
  fi
  sleep 0.2
done

"$PY" manage.py start_examples

cat <<TXT

  django-durable demo is running: a small shop whose work is done by durable workflows.
  Log in as demo / demo, then:

  1. The shop:    http://127.0.0.1:$PORT/
     Place an order and watch its checkout live on the order's page (reserve, charge, ship,
     a receipt as a child workflow, its e-mail as a django.tasks task). Choose the declined
     card to see the saga undo the reservation.
  2. A refund:    on a shipped order's page, "Ask for a refund"; approve it on the home page
     (or in the admin's approval inbox: http://127.0.0.1:$PORT/admin/django_durable/approval/).
  3. A fan-out:   "Render product images" on the home page: nine branches shared by the workers.
     A support agent: on a shipped order's page, ask it for a refund; its answer streams to the
     ticket's page word by word once you approve the refund on the home page.
  4. The admin:   http://127.0.0.1:$PORT/admin/django_durable/overview/   (runs, steps, schedules:
     trigger the nightly report there)
  5. The API:     http://127.0.0.1:$PORT/api/durable/workflows/   (schema: .../api/durable/schema/)

  Start more example runs:  .venv/bin/python manage.py start_examples
  From a shell:             .venv/bin/python manage.py durable list   (or stats, status ID, cancel ID ...)
  Press Ctrl-C to stop the worker and the server.

TXT
wait
