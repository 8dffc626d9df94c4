"""Which runs tell the host from the device: how a run's mean ITL moves with the host's CPU and
with the device (d log ITL / d log factor, at the nominal host), per mode, k and concurrency.

A pair of runs splits host from device as far as their shares differ (docs/explanation/
pinning.md, "What tells the host from the device"). Deterministic, seconds.

    python bench/host_share.py [--gpu h100] [--workload random:input_len=1024]
                               [--num-prompts 64] [--output-len 64]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.sim.bands import NOMINAL_CPU  # noqa: E402
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import simulate  # noqa: E402

STEP = 1.05


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--workload", default="random:input_len=1024")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    setup = dict(gpu=args.gpu, model="llama-3.1-8b", draft="llama-3.1-8b-eagle3",
                 workload=args.workload, num_prompts=args.num_prompts,
                 output_len=args.output_len, max_model_len=131072, jitter=False)
    print(f"{args.gpu}, {args.workload}, {args.num_prompts} prompts of {args.output_len} "
          f"output tokens; at CPU x {NOMINAL_CPU:g} of the defaults, the roofline's device")
    print(f"{'mode':<7}{'k':>3}{'conc':>6}{'mean ITL ms':>13}{'with host':>11}{'with device':>13}")
    for mode in ("sync", "async"):
        for k in (0, 4):
            for c in (1, 16, 64):
                if c > args.num_prompts:
                    continue

                def itl(s, e):
                    cfg = SimConfig(**setup, mode=mode, k=k, max_concurrency=c,
                                    cpu_scale=s / e, speed=e)
                    return simulate(cfg)[0]["mean_itl_ms"]
                b = itl(NOMINAL_CPU, 1.0)
                host = math.log(itl(NOMINAL_CPU * STEP, 1.0) / b) / math.log(STEP)
                device = math.log(itl(NOMINAL_CPU, STEP) / b) / math.log(STEP)
                print(f"{mode:<7}{k:>3}{c:>6}{b:>13.3f}{host:>11.3f}{device:>13.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
