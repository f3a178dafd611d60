"""The engine's own CPU per step, in-process: drain ten-step workflows and count process time.

    DATABASE_URL=postgres://... python bench/cpu.py [--root DIR] [--runs 200] [--repeat 5] [--steps 10]

The harness's throughput figures move by about 10% with the machine; CPU time spent by the
process that replays and records steps moves far less, so two versions of the engine compare
here even on a busy machine. `--root` measures the checkout in DIR (a git worktree of an older
commit, say) with this script; it prints the best of --repeat drains, in microseconds per step.
"""

from __future__ import annotations

import time

import inprocess  # bench/, on the path as this script's folder


def main() -> None:
    parser = inprocess.parser(__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per workflow (1: the fixed cost of a run)")
    args = parser.parse_args()
    durable = inprocess.set_up(args.root)
    from django_durable.testing import drain

    best = float("inf")
    for _ in range(args.repeat):
        inprocess.empty()
        for _ in range(args.runs):
            durable.start("bench.ten_steps", n=args.steps)
        started = time.process_time()
        drain()
        best = min(best, time.process_time() - started)
    print(f"{1e6 * best / (args.runs * args.steps):.1f}")


if __name__ == "__main__":
    main()
