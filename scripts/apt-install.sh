#!/usr/bin/env bash
# Install Debian packages for the scripts and tests that need them (as root):
#
#   scripts/apt-install.sh PACKAGE...
#
# A fresh machine often has another apt running at boot (unattended upgrades), holding the
# package manager's lock: apt waits for it (DPkg::Lock::Timeout, DURABLE_APT_LOCK_SECONDS, 600 by
# default) instead of failing at once. If the package lists are too old to find a package, they are
# updated once and the install tried again. Exits non-zero if the packages could not be installed.
set -uo pipefail
wait_s=${DURABLE_APT_LOCK_SECONDS:-600}
export DEBIAN_FRONTEND=noninteractive
apt=(apt-get -o "DPkg::Lock::Timeout=$wait_s" -y -q)
"${apt[@]}" install --no-install-recommends "$@" >&2 && exit 0
"${apt[@]}" update >&2 && "${apt[@]}" install --no-install-recommends "$@" >&2
