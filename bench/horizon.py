"""A queue through a held snapshot (make bench-horizon): a steady load at about 70% of what each
system drains, while one REPEATABLE READ session holds its snapshot open, so that VACUUM removes
nothing the load writes meanwhile; then the recovery after the session commits.

    DATABASE_URL=postgres://... python bench/horizon.py [--minutes 10] [--hold-at 2] [--hold-for 5]
        [--share 0.7 | --rate JOBS_A_SECOND] [--processes 2] [--systems django-durable,django-durable-mix,pgqueuer-asyncpg]
        [--json FILE]

For each system, on a fresh database: its W5 drain rate first (3,000 one-step jobs; for the mix
of tasks and ten-step workflows, W5 and W1 weighted 9 to 1), then what it finishes while its
producer enqueues beside it (that rate offered for 45 s: on two cores the producer takes a share
of the CPU), then `--share` of that offered as a steady load for `--minutes`, the snapshot held from minute `--hold-at` for `--hold-for` minutes
(bench/peers/common.py's steady()). Printed per system: every 10 s, jobs finished, the claim
latency p50/p99 of the jobs claimed (enqueued to claimed), the backlog, and the dead and live row
versions and sizes of its hot tables; then the verdict against the goals: throughput while held
at least 70% of the clean, claim p99 at most 3x the clean, clean again within 60 s of the release.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))

from rounds import SYSTEMS, run_one, stop_on_sigterm  # noqa: E402

MIX = "django-durable-mix"  # tasks, and every tenth job a ten-step workflow


def drain_rate(system: str, base: str, processes: int) -> float:
    """Jobs a second the system drains (W5 on 3,000 jobs; the mix's from W5 and W1)."""
    by_name = {entry[0]: entry for entry in SYSTEMS}
    tasks = run_one(by_name["django-durable" if system == MIX else system], "w5", base, 3000, processes)["drain_per_s"]
    if system != MIX:
        return tasks
    workflows = run_one(by_name["django-durable"], "w1", base, 300, processes)["steps_per_s"] / 10
    return 1 / (0.9 / tasks + 0.1 / workflows)


def capacity(system: str, base: str, processes: int) -> float:
    """Jobs a second the system finishes while its producer enqueues on the same machine: offered
    its drain rate (which it reaches only with nobody enqueuing) for 45 s, no snapshot held, the
    mean of the windows after the first 20 s. On a machine of two cores the producer's commits
    take a share of the CPU the drain had alone."""
    drains = drain_rate(system, base, processes)
    probe = argparse.Namespace(minutes=0.75, hold_at=60.0, hold_for=0.0, processes=processes)  # (no hold)
    windows = [w for w in steady(system, base, drains, probe)["windows"] if 20 <= w["t"] and w["t"] + 10 <= 45]
    return min(drains, statistics.mean(w["finished"] for w in windows) / 10)


def steady(system: str, base: str, rate: float, args) -> dict:
    by_name = {entry[0]: entry for entry in SYSTEMS}
    name, python, driver, extra, scheme, workloads, *root = by_name["django-durable" if system == MIX else system]
    extra = [*extra, "--rate", f"{rate:.1f}", "--seconds", str(args.minutes * 60), "--hold-at",
             str(args.hold_at * 60), "--hold-for", str(args.hold_for * 60), *(["--mix"] if system == MIX else [])]
    return run_one((name, python, driver, extra, scheme, workloads, *root), "steady", base, 0, args.processes)


def verdict(result: dict) -> dict:
    """Clean (before the hold), held and after: throughput, claim p99, and the seconds from the
    release to the first window as fast as clean (95% of its throughput, p99 within 1.5x)."""
    start, end = result["hold"]
    windows = [w for w in result["windows"] if w["t"] + 10 <= result["seconds"]]
    warm = 30 if start >= 60 else 0  # the first 30 s warm up
    clean = [w for w in windows if warm <= w["t"] and w["t"] + 10 <= start]
    held = [w for w in windows if start <= w["t"] and w["t"] + 10 <= end]
    after = [w for w in windows if w["t"] >= end]

    def rate(group):
        return statistics.mean(w["finished"] for w in group) / 10 if group else None

    def p99(group):
        values = [w["claim_p99_ms"] for w in group if w["claim_p99_ms"] is not None]
        return statistics.median(values) if values else None

    clean_rate, clean_p99 = rate(clean), p99(clean)
    if not clean_rate or not clean_p99 or not held:
        raise SystemExit(f"too short to judge: {len(clean)} clean and {len(held)} held windows of 10 s")
    recovered = next((w["t"] + 10 - end for w in after
                      if w["finished"] / 10 >= 0.95 * clean_rate and (w["claim_p99_ms"] or 0) <= 1.5 * clean_p99), None)
    held_rate, held_p99 = rate(held), p99(held)
    return {"clean_per_s": clean_rate, "held_per_s": held_rate, "held_share": held_rate / clean_rate,
            "clean_p99_ms": clean_p99, "held_p99_ms": held_p99, "p99_ratio": held_p99 / clean_p99,
            "worst_p99_ms": max((w["claim_p99_ms"] or 0) for w in held), "recovered_s": recovered,
            "max_backlog": max(w["backlog"] for w in windows),
            "met": held_rate >= 0.7 * clean_rate and held_p99 <= 3 * clean_p99
            and recovered is not None and recovered <= 60}


def table(system: str, result: dict) -> str:
    hot = sorted({name for w in result["windows"] for name in w["tables"]})
    head = ["t (s)", "finished/s", "claim p50 ms", "claim p99 ms", "backlog",
            *[f"{name} dead / live" for name in hot], *[f"{name} table+index MB" for name in hot]]
    lines = [f"### {system}: {result['rate']:.0f} jobs/s offered, snapshot held {result['hold'][0]:.0f}–"
             f"{result['hold'][1]:.0f} s", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for w in result["windows"]:
        cells = [f"{w['t']:.0f}", f"{w['finished'] / 10:.0f}",
                 "" if w["claim_p50_ms"] is None else f"{w['claim_p50_ms']:.0f}",
                 "" if w["claim_p99_ms"] is None else f"{w['claim_p99_ms']:.0f}", str(w["backlog"])]
        cells += [f"{w['tables'].get(n, {}).get('dead', '')} / {w['tables'].get(n, {}).get('live', '')}" for n in hot]
        cells += [f"{(w['tables'].get(n, {}).get('table_kb', 0) + w['tables'].get(n, {}).get('index_kb', 0)) / 1024:.1f}"
                  for n in hot]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    import os

    stop_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--hold-at", type=float, default=2, help="the minute the snapshot is taken")
    parser.add_argument("--hold-for", type=float, default=5, help="minutes it is held")
    parser.add_argument("--share", type=float, default=0.7, help="of the drain rate, offered")
    parser.add_argument("--rate", type=float, help="offer this many jobs a second to every system instead")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--systems", default=f"django-durable,{MIX},pgqueuer-asyncpg")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = os.environ["DATABASE_URL"]
    found = {}
    for system in args.systems.split(","):
        if args.rate:
            rate = args.rate
            print(f"{system}: offering {rate:.0f}/s for {args.minutes:g} min", file=sys.stderr, flush=True)
        else:
            rate = args.share * capacity(system, base, args.processes)
            print(f"{system}: finishes {rate / args.share:.0f}/s while enqueuing; offering {rate:.0f}/s for "
                  f"{args.minutes:g} min", file=sys.stderr, flush=True)
        result = steady(system, base, rate, args)
        result["verdict"] = verdict(result)
        found[system] = result
        print(table(system, result) + "\n", flush=True)
        print(f"{system}: {json.dumps(result['verdict'])}", file=sys.stderr, flush=True)
    print("| system | clean jobs/s | held jobs/s (share) | clean claim p99 | held claim p99 (ratio, worst) | "
          "back to clean after release | largest backlog | goals met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for system, result in found.items():
        v = result["verdict"]
        recovered = "not within the run" if v["recovered_s"] is None else f"{v['recovered_s']:.0f} s"
        print(f"| {system} | {v['clean_per_s']:.0f} | {v['held_per_s']:.0f} ({v['held_share']:.0%}) | "
              f"{v['clean_p99_ms']:.0f} ms | {v['held_p99_ms']:.0f} ms ({v['p99_ratio']:.1f}x, {v['worst_p99_ms']:.0f}) | "
              f"{recovered} | {v['max_backlog']} | {'yes' if v['met'] else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
