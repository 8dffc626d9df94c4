"""Fit the seed-l20 preset on the seed's sync row only, then predict its async row.

The seed is vLLM PR #25872's measurement (docs/explanation/design.md §6). Two numbers are fitted,
both on the sync row:

- cpu_scale: one factor on every default CPU cost and latency, so that the simulated sync mean
  ITL equals the measured 28.14 ms;
- the acceptance spread (std of each request's logit shift of the #26191 rates), so that the
  simulated sync P99 TPOT, averaged over --seeds seeds, equals the measured 14.94 ms.

Nothing else is fitted: the device is the roofline over the catalog's L20 entry, the rates are
vLLM #26191's. The async row is then a prediction. The script also shows how the predicted
async saving moves with the two device constants it hinges on (L20 bw_eff and kernel_us).

Usage: python bench/seed_calibration.py [--seeds 8] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.plan import resolve  # noqa: E402
from stepgap.sim.roofline import RooflineCosts
from stepgap.sim.loop import build_workload, simulate  # noqa: E402
from stepgap.sim.presets import SEED_COLUMNS, get_preset  # noqa: E402

PRESET = get_preset("seed-l20")
SYNC, ASYNC = PRESET.measured["sync"], PRESET.measured["async"]


def config(mode: str, **kw) -> SimConfig:
    return SimConfig(**{**PRESET.settings, "mode": mode, **kw})


def run(mode: str, device=None, **kw) -> dict:
    cfg = config(mode, **kw)
    return simulate(cfg, build_workload(cfg), device)[0]


def bisect(f, lo: float, hi: float, target: float, tol: float) -> float:
    """x in [lo, hi] with f(x) = target, f increasing."""
    for _ in range(40):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return (lo + hi) / 2


def fit_cpu_scale(spread: float, device=None) -> float:
    return bisect(lambda s: run("sync", device, cpu_scale=s, acceptance_spread=spread,
                                num_prompts=8)["mean_itl_ms"], 0.0, 10.0,
                  SYNC["mean_itl_ms"], 1e-4)


def fit_spread(cpu_scale: float, seeds: int) -> float:
    def p99(sigma):
        return statistics.mean(run("sync", cpu_scale=cpu_scale, acceptance_spread=sigma,
                                   seed=s)["p99_tpot_ms"] for s in range(seeds))
    return bisect(p99, 0.0, 1.5, SYNC["p99_tpot_ms"], 2e-3)


def row(label: str, res: dict, measured: dict) -> str:
    cells = "".join(f"{res[c]:>9.2f}{100 * (res[c] - measured[c]) / measured[c]:>+7.1f}%"
                    for c in SEED_COLUMNS)
    return f"{label:<22}{cells}"


def over_seeds(mode: str, cpu_scale: float, spread: float, seeds: int) -> dict:
    runs = [run(mode, cpu_scale=cpu_scale, acceptance_spread=spread, seed=s)
            for s in range(seeds)]
    return {c: statistics.mean(r[c] for r in runs) for c in SEED_COLUMNS} | {
        f"std_{c}": statistics.pstdev(r[c] for r in runs) for c in SEED_COLUMNS}


def sensitivity(spread: float) -> list[str]:
    """Refit cpu_scale for perturbed L20 constants; report the predicted async saving."""
    r = resolve(config("sync"))
    lines = []
    for bw_eff, kernel_us in ((0.80, 2.0), (0.79, 2.0), (0.81, 2.0), (0.80, 1.0), (0.80, 3.0)):
        hw = dataclasses.replace(r.hw, bw_eff=bw_eff, kernel_us=kernel_us)
        dev = RooflineCosts(r.target, r.draft, hw, 4)
        scale = fit_cpu_scale(spread, dev)
        sync = run("sync", dev, cpu_scale=scale, acceptance_spread=spread, num_prompts=8)
        async_ = run("async", dev, cpu_scale=scale, acceptance_spread=spread, num_prompts=8)
        saving = sync["mean_itl_ms"] - async_["mean_itl_ms"]
        lines.append(f"  bw_eff {bw_eff:.2f}  kernel_us {kernel_us:.1f}: cpu_scale {scale:5.2f}  "
                     f"async mean ITL {async_['mean_itl_ms']:6.2f} ms  saving {saving:5.2f} ms "
                     f"({100 * (saving - 0.97) / 0.97:+.0f}%)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=8, help="seeds averaged when fitting the spread")
    ap.add_argument("--quick", action="store_true", help="skip the sensitivity table")
    args = ap.parse_args()
    t0 = time.perf_counter()

    spread0 = PRESET.settings.get("acceptance_spread", 0.50)
    scale = fit_cpu_scale(spread0)
    spread = fit_spread(scale, args.seeds)
    scale = fit_cpu_scale(spread)
    print(f"fitted on the sync row: cpu_scale = {scale:.3f} (sync mean ITL {SYNC['mean_itl_ms']} "
          f"ms), acceptance spread = {spread:.3f} (sync P99 TPOT {SYNC['p99_tpot_ms']} ms, "
          f"mean of {args.seeds} seeds)")
    print(f"preset uses: cpu_scale = {PRESET.settings['cpu_scale']}, spread = "
          f"{PRESET.settings.get('acceptance_spread', 'profile default 0.50')}")

    head = "".join(f"{c[:-3]:>17}" for c in SEED_COLUMNS)
    print(f"\n{'':<22}{head}")
    results = {}
    for mode, measured in (("sync", SYNC), ("async", ASYNC)):
        res = run(mode)  # the preset as shipped, seed 0
        results[mode] = res
        print(row(f"{mode} (seed 0)", res, measured))
        avg = over_seeds(mode, PRESET.settings["cpu_scale"], spread, args.seeds)
        print(row(f"{mode} ({args.seeds}-seed mean)", avg, measured))
        print(f"{'':<22}" + "".join(f"{'+-' + format(avg['std_' + c], '.2f'):>17}"
                                    for c in SEED_COLUMNS))
        print(row(f"{mode} measured", measured, measured))
    saving = results["sync"]["mean_itl_ms"] - results["async"]["mean_itl_ms"]
    measured_saving = SYNC["mean_itl_ms"] - ASYNC["mean_itl_ms"]
    error = 100 * (saving - measured_saving) / measured_saving
    print(f"\npredicted async saving in mean ITL: {saving:.2f} ms (measured "
          f"{measured_saving:.2f} ms, error {error:+.0f}%)")
    gaps = {mode: res.step_gaps for mode, res in results.items()}
    print(f"simulated sync step gap: mean {gaps['sync']['mean_us']:.0f} us; async: "
          f"{gaps['async']['mean_us']:.0f} us")
    if not args.quick:
        print("\nsensitivity of the prediction to the L20 device constants (cpu_scale refitted):")
        print("\n".join(sensitivity(spread)))
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
