#!/usr/bin/env bash
# Build the documentation site into site/ with warnings as errors (mkdocs.yml has strict: true),
# in a virtual environment of its own (.venv-docs, made on first use). `serve` serves it instead.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-docs
PYTHON=${PYTHON:-python3}
if [ ! -f "$VENV/.installed" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet --group docs
  touch "$VENV/.installed"
fi
export NO_MKDOCS_2_WARNING=1
if [ "${1:-}" = serve ]; then
  exec "$VENV/bin/mkdocs" serve --dev-addr 127.0.0.1:8000
fi
"$VENV/bin/mkdocs" build --strict --clean --site-dir site
"$VENV/bin/python" scripts/check-site-links.py site
echo "Open file://$PWD/site/index.html in a browser (search needs a server: make docs DOCS_ARGS=serve)."
