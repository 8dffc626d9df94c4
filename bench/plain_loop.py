"""The engine loop in plain Python (sim/plain_loop.py) against SimPy's loop, side by side in one
process: advise's kind of cell (Llama-3.1-8B + EAGLE-3 on one H100, k 3, 80 MT-bench-like
prompts, the nominal host) at concurrency 1, 4 and 16, each mode, scheduled live and replayed
from a recording of the same steps, each the best of --repeat runs, alternating the loops. SimPy's
loop neither records nor replays, so its "replayed" row schedules every step: what a run that
takes it costs. Says whether the two results are the same bytes, and what every other process of
the machine used meanwhile. A benchmark for one quiet machine, not a test: docs/reports/2026-12-07-simulator-speed.md
reads it.

Usage: python bench/plain_loop.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared_core import busy_seconds  # noqa: E402
from stepgap.sim import plain_loop  # noqa: E402
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import Recording, build_workload, simulate  # noqa: E402

CELL = dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=3,
            workload="mtbench", num_prompts=80, cpu_scale=2.42)


def timed(cfg: SimConfig, reqs: list, recording: Recording | None, plain: bool) -> tuple:
    """CPU seconds of one run on the loop asked for, its result as text, its steps."""
    plain_loop.runs_plainly = REAL if plain else (lambda cfg, r: False)
    c0 = time.process_time()
    res = simulate(cfg, reqs, recording=recording)[0]
    cpu = time.process_time() - c0
    return cpu, json.dumps(res, sort_keys=True, default=str), res.plan.num_steps


REAL = plain_loop.runs_plainly


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    own0, (busy0, steal0), t0 = time.process_time(), busy_seconds(), time.perf_counter()
    print(f"{'concurrency':<12}{'mode':<13}{'how':<10}{'steps':>7}{'SimPy us/step':>15}"
          f"{'plain us/step':>15}{'ratio':>7}  same")
    for conc in (1, 4, 16):
        for mode in ("sync", "async", "zero-bubble"):
            cfg = SimConfig(**CELL, mode=mode, max_concurrency=conc)
            reqs = build_workload(cfg)
            rec = Recording()
            simulate(cfg, reqs, recording=rec)
            ends = SimConfig(**CELL, mode=mode, max_concurrency=conc, speed=0.9)
            for how, c, r in (("live", cfg, None), ("replayed", ends, rec)):
                best, text = {}, {}
                for _ in range(args.repeat):
                    for plain in (False, True):
                        cpu, text[plain], steps = timed(c, reqs, r, plain)
                        best[plain] = min(best.get(plain, cpu), cpu)
                print(f"{conc:<12}{mode:<13}{how:<10}{steps:>7}{1e6 * best[False] / steps:>15.1f}"
                      f"{1e6 * best[True] / steps:>15.1f}{best[False] / best[True]:>7.2f}  "
                      f"{'yes' if text[False] == text[True] else 'NO'}")
    plain_loop.runs_plainly = REAL
    busy, steal = (b - a for a, b in zip((busy0, steal0), busy_seconds()))
    own = time.process_time() - own0
    print(f"over {time.perf_counter() - t0:.0f} s: this process {own:.1f} s CPU, every other "
          f"process {max(0.0, busy - own):.2f} s, steal {steal:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
