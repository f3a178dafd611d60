"""The engine's own CPU per step, in-process: drain ten-step workflows and count process time.

    DATABASE_URL=postgres://... python bench/cpu.py [--root DIR] [--runs 200] [--repeat 5] [--steps 10] [--replay]

The harness's throughput figures move by about 10% with the machine; CPU time spent by the
process that replays and records steps moves far less, so two versions of the engine compare
here even on a busy machine. `--root` measures the checkout in DIR (a git worktree of an older
commit, say) with this script; it prints the best of --repeat drains, in microseconds per step.

With `--replay`, each run records its steps, then waits for a signal; what is timed is the
advance after the signal, which replays every recorded step from the journal (checking each one
against the code) and finishes the run: microseconds per replayed step.

With `--tasks`, each run is a one-step django.tasks task (bench.benchapp.tasks.one_step) enqueued
through the DurableBackend, and what is timed is its enqueue and its drain: microseconds per task.
"""

from __future__ import annotations

import time

import inprocess  # bench/, on the path as this script's folder


def main() -> None:
    parser = inprocess.parser(__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per workflow (1: the fixed cost of a run)")
    parser.add_argument("--replay", action="store_true", help="time the replay of recorded steps")
    parser.add_argument("--tasks", action="store_true", help="one-step django.tasks tasks, enqueue and drain")
    args = parser.parse_args()
    durable = inprocess.set_up(args.root)
    from django_durable.testing import drain

    if args.replay:
        @durable.workflow("bench.cpu.replayed")
        def replayed(ctx, n):
            for i in range(n):
                ctx.step(f"s{i}", _noop, i, {"order": i, "note": "a small argument"})
            ctx.wait_for_signal("go")
            return n

    best = float("inf")
    for _ in range(args.repeat):
        inprocess.empty()
        if args.tasks:
            from bench.benchapp.tasks import one_step

            started = time.process_time()
            for n in range(args.runs):
                one_step.enqueue(n)
            drain()
            best = min(best, time.process_time() - started)
            continue
        if args.replay:
            runs = [durable.start("bench.cpu.replayed", n=args.steps) for _ in range(args.runs)]
            drain()
            for run in runs:
                durable.signal(run.pk, "go")
        else:
            for _ in range(args.runs):
                durable.start("bench.ten_steps", n=args.steps)
        started = time.process_time()
        drain()
        best = min(best, time.process_time() - started)
    print(f"{1e6 * best / (args.runs * (1 if args.tasks else args.steps)):.1f}")


def _noop(i, data):
    return i


if __name__ == "__main__":
    main()
