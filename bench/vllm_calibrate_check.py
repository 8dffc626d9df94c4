"""`stepgap calibrate` on the shared profiled vLLM run, judged on every sync cell of the shared
vLLM measurement (../shared/vllm-cpu: vLLM 0.32 serving the trained pair on a 2-core CPU).

The inputs are a vLLM user's command line: the profiled run (profiles/sync-k2-c1: its bench file
and the worker's torch-profiler trace) and the sync runs at k = 0 and 2 (results/sync-k0-*,
sync-k2-*). The profile is then used on every sync cell (k 0, 2, 4 x concurrency 1, 4; three
repeats each), each repeat re-simulated with its own prompts and acceptance (its bench file's);
a cell's mean TPOT and mean ITL are the means over its repeats, measured against simulated.
k = 4 is the cell the calibration never saw. Deterministic (no timing): a few seconds.

    python bench/vllm_calibrate_check.py [--shared ../shared/vllm-cpu] [--out profile.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.calibrate.vllm_fit import (bench_acceptance, calibrate_runs, load_runs,  # noqa: E402
                                        resimulate_run)
from stepgap.common.vllm_bench import read_bench  # noqa: E402
from stepgap.sim.profile import save_profile  # noqa: E402

PAIR = ROOT / "checkpoints" / "pystdlib"
METRICS = ("mean_tpot_ms", "mean_itl_ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "vllm-cpu"))
    ap.add_argument("--out", help="also write the profile here")
    args = ap.parse_args()
    shared = Path(args.shared)
    prof = shared / "profiles" / "sync-k2-c1"
    inputs = [prof / "profiled-bench.json", *sorted((prof / "raw").glob("rank0.*.pt.trace.json.gz")),
              *sorted((shared / "results").glob("sync-k0-c*-r*.json")),
              *sorted((shared / "results").glob("sync-k2-c*-r*.json"))]
    runs, _ = load_runs(inputs)
    meta = {"model": {"target": str(PAIR / "target"), "draft": str(PAIR / "eagle3")}}
    profile = calibrate_runs(runs, meta)
    if args.out:
        save_profile(args.out, profile)
    level = {k: v for k, v in profile.notes["level"].items() if "why" not in k}
    print(f"calibrated on {len(runs)} runs ({', '.join(r.name for r in runs)}); {level}")
    print(f"{'cell':<10} {'in cal.':<8} " + " ".join(
        f"{m + ' meas':>17} {'sim':>7} {'err':>7}" for m in METRICS))
    worst = 0.0
    for k in (0, 2, 4):
        for c in (1, 4):
            paths = sorted((shared / "results").glob(f"sync-k{k}-c{c}-r*.json"))
            meas = {m: [] for m in METRICS}
            sim = {m: [] for m in METRICS}
            for p in paths:
                doc = read_bench(p)
                run = next((r for r in runs if r.path == p), None)
                if run is None:   # a cell calibrate never saw: the run as load_runs reads it
                    run = type(runs[0])(p.stem, p, doc, k, None, c, (0.0, 0.0))
                    run.acceptance = bench_acceptance(doc, p) if k else None
                res = resimulate_run(profile, run, model=meta["model"]["target"],
                                     draft=meta["model"]["draft"])
                for m in METRICS:
                    meas[m].append(doc[m])
                    sim[m].append(res.metrics[m])
            row = f"sync-k{k}-c{c:<3} {'yes' if k in (0, 2) else 'no':<8} "
            for m in METRICS:
                a, b = statistics.fmean(meas[m]), statistics.fmean(sim[m])
                err = (b - a) / a
                worst = max(worst, abs(err)) if k == 4 else worst
                row += f"{a:>17.3f} {b:>7.3f} {100 * err:>+6.1f}%"
            print(row)
    print(f"worst error on the cells calibration never saw (k=4): {100 * worst:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
