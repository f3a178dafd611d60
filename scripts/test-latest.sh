#!/usr/bin/env bash
# The whole suite on the newest Django release, which needs Python 3.12 or later.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/newest-python.sh) || exit 1
if [ ! -x .venv-latest/bin/python ]; then
  "$python" -m venv .venv-latest
  .venv-latest/bin/pip install --quiet --upgrade pip
fi
.venv-latest/bin/pip install --quiet --upgrade "django>=6" -e '.[postgres]' --group test
.venv-latest/bin/python -c 'import django, sys; print(f"Django {django.get_version()} on Python {sys.version.split()[0]}")'
PY=.venv-latest/bin/python scripts/run-tests.sh "$@"
