#!/usr/bin/env bash
# The whole suite on the newest Django release, which needs Python 3.12 or later.
set -euo pipefail
cd "$(dirname "$0")/.."
python=""
for candidate in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python3.13 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "No Python 3.12 or later found; Django 6 needs one." >&2
  exit 1
fi
if [ ! -x .venv-latest/bin/python ]; then
  "$python" -m venv .venv-latest
  .venv-latest/bin/pip install --quiet --upgrade pip
fi
.venv-latest/bin/pip install --quiet --upgrade "django>=6" -e '.[postgres]' --group test
.venv-latest/bin/python -c 'import django, sys; print(f"Django {django.get_version()} on Python {sys.version.split()[0]}")'
PY=.venv-latest/bin/python scripts/run-tests.sh "$@"
