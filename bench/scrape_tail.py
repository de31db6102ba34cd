"""/metrics when a scrape meets the rules' evaluation, against one that meets nothing.

A scrape at a random moment rarely meets the rules (at 64 GPUs the groups due every 15 s take
25-50 ms of each 15 s), so a 2-minute window of 5 s scrapes may or may not show what such a
meeting costs. This bench aims at it. It runs `gpuwatch run --simulate` on GPUS H100s serving
inference (as bench/side_by_side.py does), learns from /api/v1/rules when the groups due every
15 s are evaluated, and each round scrapes twice: 5 s before an evaluation (a whole page
written, no rule running: "alone"), and at an offset of 4 ms before to 16 ms after the
evaluation starts ("at the rules"). It prints the median and the largest of each.

The first scrape after the daemon starts writes every line of the page for the first time
(34-52 ms at 64 GPUs, once in a daemon's life); it is taken before the rounds and not counted.

Run it with another version's interpreter (a virtualenv with that version installed) to
compare versions: the daemon is started with the interpreter that runs this file, as
`python -m gpuwatch`, so run it from outside the checkout, whose own package would be found
first.

Usage: python bench/scrape_tail.py [--gpus 64] [--rounds 12]
       cd /tmp && /path/to/other/venv/bin/python /path/to/checkout/bench/scrape_tail.py
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import daemon_cost
import side_by_side
import simulated_daemon

INTERVAL_S = 15.0  # the shipped groups' most frequent interval past the cycle's own
OFFSETS_S = (-0.004, 0.0, 0.004, 0.008, 0.012, 0.016)
WARMUP_S = 20.0


def _last_evaluation(base: str) -> float:
    """When the groups due every INTERVAL_S were last evaluated (epoch seconds)."""
    _, body = daemon_cost._get(f"{base}/api/v1/rules")
    times = [
        datetime.fromisoformat(g["lastEvaluation"].replace("Z", "+00:00")).timestamp()
        for g in json.loads(body)["data"]["groups"]
        if g["interval"] == INTERVAL_S and g["lastEvaluation"]
    ]
    if not times:
        raise RuntimeError(f"no group due every {INTERVAL_S:g} s has been evaluated")
    return max(times)


def measure(gpus: int, rounds: int) -> tuple[list[float], list[float]]:
    """(alone, at the rules): scrape latencies in ms."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        scenario = side_by_side._scenario(directory, gpus)  # the node side_by_side runs
        proc, base, _ = simulated_daemon.start(directory, scenario)
        try:
            time.sleep(WARMUP_S)
            daemon_cost._get(f"{base}/metrics")  # the page's first writing, not counted
            due = _last_evaluation(base)
            alone: list[float] = []
            met: list[float] = []
            for i in range(rounds):
                due += INTERVAL_S
                while due < time.time() + 6:
                    due += INTERVAL_S
                time.sleep(max(0.0, due - 5 - time.time()))
                alone.append(1000 * daemon_cost._get(f"{base}/metrics")[0])
                time.sleep(max(0.0, due + OFFSETS_S[i % len(OFFSETS_S)] - time.time()))
                met.append(1000 * daemon_cost._get(f"{base}/metrics")[0])
            return alone, met
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, Python {platform.python_version()} ({sys.prefix}); "
        f"{args.gpus} GPUs, {args.rounds} rounds, 15 s apart"
    )
    alone, met = measure(args.gpus, args.rounds)
    print(f"{'':>14}  {'median ms':>9}  {'max ms':>6}")
    for name, values in (("alone", alone), ("at the rules", met)):
        print(f"{name:>14}  {statistics.median(values):9.1f}  {max(values):6.1f}")


if __name__ == "__main__":
    main()
