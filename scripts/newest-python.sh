#!/usr/bin/env bash
# Print the path of a Python 3.12 or later (Django 6 needs one), or fail saying so.
for candidate in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python3.13 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    command -v "$candidate"
    exit 0
  fi
done
echo "No Python 3.12 or later found; Django 6 needs one." >&2
exit 1
