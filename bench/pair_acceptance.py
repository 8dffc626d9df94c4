"""Acceptance of the trained pair (checkpoints/pystdlib) on its held-out trace, k = 1..6.

Runs the sync inline engine, greedy, on the CPU over every request of the held-out trace, once per
k, and prints a markdown table: acceptance length, and the per-position acceptance rates (vLLM's
definition: the fraction of drafts whose position i was accepted). docs/explanation/training.md
holds the table this printed.

    python bench/pair_acceptance.py [--pair DIR] [--ks 1,2,3,4,5,6] [--num-prompts N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepgap.calibrate.demo import run_engine  # noqa: E402
from stepgap.calibrate.pair import PAIR, load_heldout  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default=str(PAIR))
    p.add_argument("--ks", default="1,2,3,4,5,6")
    p.add_argument("--num-prompts", type=int, default=None)
    args = p.parse_args()
    reqs = load_heldout(args.pair, args.num_prompts)
    ks = [int(k) for k in args.ks.split(",")]
    width = max(ks)
    head = " | ".join(f"pos {i + 1}" for i in range(width))
    print(f"| k | acceptance length | {head} | drafts |")
    print("|---:|---:|" + "---:|" * width + "---:|")
    for k in ks:
        t = time.perf_counter()
        spec = run_engine(args.pair, reqs, k, max_concurrency=8).result.spec_decode
        rates = [f"{100 * r:.1f}" for r in spec["acceptance_rate_per_pos"]]
        rates += [""] * (width - k)
        print(f"| {k} | {spec['acceptance_length']:.2f} | " + " | ".join(rates)
              + f" | {spec['num_drafts']} |", flush=True)
        print(f"k={k}: {time.perf_counter() - t:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
