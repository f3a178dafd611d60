#!/usr/bin/env bash
# scripts/slow-cores.sh FACTOR COMMAND...: run COMMAND (and every process it starts, PostgreSQL
# included) on a machine FACTOR times slower, by giving it a CPU quota: this machine's cores
# together, divided by FACTOR, in every 10 ms. Root, and a cgroup cpu controller (v1 or v2).
#
#   scripts/slow-cores.sh 5 make bench-peers BENCH_ARGS="--rounds 3 --workloads w5,w5-fresh"
#
# The quota is shared by the whole group, so it stands for slower cores while they are all busy
# (a drain: every worker and the server at work); a process alone may use the group's quota on one
# core, so a lone process (a worker's start, one job's latency) runs less than FACTOR times slower.
# CPU time measured inside (a job's CPU) is this machine's, not the slower one's.
set -euo pipefail

factor=${1:?usage: scripts/slow-cores.sh FACTOR COMMAND...}
shift
[ $# -gt 0 ] || { echo "usage: scripts/slow-cores.sh FACTOR COMMAND..." >&2; exit 2; }
period=10000  # microseconds
quota=$(awk -v f="$factor" -v n="$(nproc)" -v p="$period" \
  'BEGIN { if (f + 0 < 1) exit 1; printf "%d", n * p / f }') \
  || { echo "FACTOR must be a number, 1 or more: $factor" >&2; exit 2; }

group="durable-slow-$$"
v1=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ { print $2; exit }' /proc/mounts)
v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
if [ -n "$v1" ]; then
  dir="$v1/$group"
  mkdir "$dir"
  echo "$period" > "$dir/cpu.cfs_period_us"
  echo "$quota" > "$dir/cpu.cfs_quota_us"
elif [ -n "$v2" ] && grep -qw cpu "$v2/cgroup.controllers" 2>/dev/null; then
  dir="$v2/$group"
  grep -qw cpu "$v2/cgroup.subtree_control" || echo "+cpu" > "$v2/cgroup.subtree_control"
  mkdir "$dir"
  echo "$quota $period" > "$dir/cpu.max"
else
  echo "no cgroup cpu controller here: cannot slow the cores" >&2
  exit 1
fi

cleanup() {
  # Whatever is left in the group (nothing, once COMMAND has stopped its servers) goes back to the
  # root group, so that the group can be removed.
  if [ -f "$dir/cgroup.procs" ]; then
    while read -r pid; do echo "$pid" > "$(dirname "$dir")/cgroup.procs" 2>/dev/null || true; done < "$dir/cgroup.procs"
  fi
  rmdir "$dir" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "slow-cores: $(nproc) cores at 1/$factor ($quota us of CPU in every $period us)" >&2
# COMMAND runs in a child moved into the group first; this shell stays outside to remove the group.
bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' slow-cores "$dir" "$@"
