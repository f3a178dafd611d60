#!/usr/bin/env bash
# The admin's browser test drives Debian's chromium through chromium-driver, as installed: no
# browser is ever downloaded. Install both when missing (as root, with apt); otherwise say so.
set -uo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "chromium and chromium-driver are missing: install them (apt install chromium chromium-driver);" \
       "the browser test skips without them, and fails under CI." >&2
  exit 0
fi
echo "Installing chromium and chromium-driver for the browser test..."
"$(dirname "$0")/apt-install.sh" chromium chromium-driver >/dev/null 2>&1 \
  || echo "Could not install chromium; the browser test will not pass." >&2
