"""How fast the simulator runs: simulated steps and requests per second of CPU time, one core.

Scenarios: the seed (seed-l20: 80 MT-bench requests at concurrency 1, k=4) in sync and async, and
10,000 ShareGPT-like requests at max-concurrency 64, k=4, async (sharegpt-h100). Each is run
--repeat times and the best is kept (the machine may be shared). Not a test: it prints figures
for docs/explanation/speed.md.

Usage: python bench/sim_speed.py [--repeat 3] [--num-prompts 10000] [--profile [N]]

--profile runs the ShareGPT-like scenario once more under cProfile and prints its N functions
with the most time of their own (what docs/explanation/speed.md's profile is taken from; cProfile's
own cost inflates the small functions, so read it for where the time goes, not for how much).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import Run, build_workload  # noqa: E402
from stepgap.sim.presets import get_preset  # noqa: E402


def measure(cfg: SimConfig, repeat: int) -> tuple[int, int, float, float]:
    reqs = build_workload(cfg)
    best_cpu = best_wall = float("inf")
    for _ in range(repeat):
        sim = Run(cfg, reqs)
        c0, w0 = time.process_time(), time.perf_counter()
        sim.run()
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return sim.num_steps, len(reqs), best_cpu, best_wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=10000,
                    help="requests of the ShareGPT-like scenario")
    ap.add_argument("--profile", type=int, nargs="?", const=25, default=0, metavar="N",
                    help="then profile the ShareGPT-like scenario, print the top N (25)")
    args = ap.parse_args()
    seed, share = get_preset("seed-l20").settings, get_preset("sharegpt-h100").settings
    scenarios = [
        ("seed-l20 sync", SimConfig(**{**seed, "mode": "sync"})),
        ("seed-l20 async", SimConfig(**{**seed, "mode": "async"})),
        (f"sharegpt {args.num_prompts} c64 k4 async",
         SimConfig(**{**share, "num_prompts": args.num_prompts})),
    ]
    print(f"{'scenario':<32}{'steps':>8}{'requests':>10}{'cpu s':>8}{'steps/s':>10}{'req/s':>9}")
    for name, cfg in scenarios:
        steps, reqs, cpu, _ = measure(cfg, args.repeat)
        print(f"{name:<32}{steps:>8}{reqs:>10}{cpu:>8.2f}{steps / cpu:>10.0f}{reqs / cpu:>9.0f}")
    if args.profile:
        import cProfile
        import pstats
        cfg = scenarios[-1][1]
        sim = Run(cfg, build_workload(cfg))
        prof = cProfile.Profile()
        prof.runcall(sim.run)
        print(f"\n{scenarios[-1][0]}, under cProfile ({sim.num_steps} steps):")
        pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
