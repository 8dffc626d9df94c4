"""How much of a run is steady: the steps whose batch is the step before's (no request joins,
prefills or finishes), which a simulator could compute in closed form instead of stepping
through them (issue 54). Skipping every steady step at no cost bounds the speed-up at
1 / (1 - their share).

Usage:
    python bench/steady_stretches.py                      # the sharegpt-h100 preset
    python bench/steady_stretches.py --preset seed-l20
    # the cells of advise's default question (Llama-3.1-8B + EAGLE-3 on one H100, its 80
    # MT-bench-like prompts) at k = 3, async, over its six loads
    python bench/steady_stretches.py --question --k 3 --mode async
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import Recording, build_workload, simulate  # noqa: E402
from stepgap.sim.presets import PRESETS, get_preset  # noqa: E402


def stretches(rec: Recording, k: int) -> tuple[list[int], int]:
    """The lengths of the runs of steady steps, and the number of steps."""
    runs, cur, before = [], 0, None   # before: the batch size of a step that finished nobody
    cols = rec.program.columns
    finishes = {us[-1] for us, _ in cols.chunks.values() if us}   # updates that finish one
    for i, (n, tokens) in enumerate(zip(cols.plan_reqs.tolist(), cols.plan_tokens.tolist())):
        if tokens == n * (1 + k) and n == before:
            cur += 1
        elif cur:
            runs.append(cur)
            cur = 0
        if i in finishes:   # the next step's batch is another
            before = None
            if cur:
                runs.append(cur)
                cur = 0
        else:
            before = n
    if cur:
        runs.append(cur)
    return runs, len(cols.plan_reqs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="sharegpt-h100", choices=sorted(PRESETS))
    ap.add_argument("--question", action="store_true",
                    help="advise's default question's cells instead, at --k and --mode, "
                         "concurrency 1 to 32")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--mode", default="async", choices=("sync", "async", "zero-bubble"))
    args = ap.parse_args()
    if not args.question:
        return report(args.preset, SimConfig(**get_preset(args.preset).settings))
    for c in (1, 2, 4, 8, 16, 32):
        report(f"concurrency {c}", SimConfig(model="llama-3.1-8b", gpu="h100",
                                             draft="llama-3.1-8b-eagle3", k=args.k,
                                             mode=args.mode, max_concurrency=c))
    return 0


def report(name: str, cfg: SimConfig) -> int:
    rec = Recording()
    simulate(cfg, build_workload(cfg), recording=rec)
    runs, steps = stretches(rec, cfg.k)
    steady = sum(runs)
    share = steady / steps
    mean, longest = steady / max(len(runs), 1), max(runs, default=0)
    print(f"{name}: {steps} steps, {steady} steady ({100 * share:.1f} %) in {len(runs)} "
          f"stretches, mean {mean:.2f} steps, longest {longest}; skipping every steady step "
          f"at no cost: at most {1 / (1 - share):.2f}x")
    print("stretch length: count  " + ", ".join(
        f"{n}: {c}" for n, c in sorted(collections.Counter(runs).items())[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
