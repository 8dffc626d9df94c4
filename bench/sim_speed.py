"""How fast the simulator runs: simulated steps and requests per second of CPU time, one core.

Scenarios: the seed (seed-l20: 80 MT-bench requests at concurrency 1, k=4) in sync and async, and
10,000 ShareGPT-like requests at max-concurrency 64, k=4, async (sharegpt-h100). Each is run
--repeat times and the best is kept (the machine may be shared). Not a test: it prints figures
for docs/explanation/speed.md.

Usage: python bench/sim_speed.py [--repeat 3] [--num-prompts 10000] [--max-concurrency 64]
                                 [--replay] [--profile [N]]

--replay times each scenario once more replayed from a recording of its steps (sim/steps.py
`Recording`: the scheduler's outputs and the tokens each step gave read back): the time of
what the steps cost to time alone (the engine loop, the device lane, the chunks to the client),
and so, by difference, of scheduling them and drawing their acceptance.

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
from stepgap.sim.loop import Recording, Run, build_workload, simulate  # noqa: E402
from stepgap.sim.presets import get_preset  # noqa: E402


def measure(cfg: SimConfig, repeat: int, recording: Recording | None = None
            ) -> tuple[int, int, float, float]:
    reqs = build_workload(cfg)
    best_cpu = best_wall = float("inf")
    for _ in range(repeat):
        sim = Run(cfg, reqs, recording=recording)
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
    ap.add_argument("--max-concurrency", type=int, default=64,
                    help="the ShareGPT-like scenario's client concurrency")
    ap.add_argument("--replay", action="store_true",
                    help="also time each scenario replayed from a recording of its steps")
    ap.add_argument("--profile", type=int, nargs="?", const=25, default=0, metavar="N",
                    help="then profile the ShareGPT-like scenario, print the top N (25)")
    args = ap.parse_args()
    seed, share = get_preset("seed-l20").settings, get_preset("sharegpt-h100").settings
    scenarios = [
        ("seed-l20 sync", SimConfig(**{**seed, "mode": "sync"})),
        ("seed-l20 async", SimConfig(**{**seed, "mode": "async"})),
        (f"sharegpt {args.num_prompts} c{args.max_concurrency} k4 async",
         SimConfig(**{**share, "num_prompts": args.num_prompts,
                      "max_concurrency": args.max_concurrency})),
    ]
    print(f"{'scenario':<32}{'steps':>8}{'requests':>10}{'cpu s':>8}{'steps/s':>10}{'req/s':>9}"
          + (f"{'replayed s':>12}{'share':>7}" if args.replay else ""))
    for name, cfg in scenarios:
        steps, reqs, cpu, _ = measure(cfg, args.repeat)
        row = f"{name:<32}{steps:>8}{reqs:>10}{cpu:>8.2f}{steps / cpu:>10.0f}{reqs / cpu:>9.0f}"
        if args.replay:
            rec = Recording()
            simulate(cfg, build_workload(cfg), recording=rec)
            replayed = measure(cfg, args.repeat, rec)[2]
            row += f"{replayed:>12.2f}{100 * replayed / cpu:>6.0f}%"
        print(row)
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
