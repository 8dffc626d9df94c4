"""The seed through a user's path: vLLM PR #25872's sync row, as the `vllm bench serve
--save-result` file a user would have (traces/seed/), calibrated by `stepgap calibrate` on it
alone, then its async row predicted by `stepgap simulate --profile`, with the band of what async
saves; and that band without the calibration, from stepgap's own ranges (sim/bands.py).

Targets: calibrated on the sync row, the async mean TPOT within 2 %, the ITL saving
within 25 % of the measured 0.97 ms and its band narrower than +-30 % of the saving;
uncalibrated, the band of the saving contains 0.97 ms. It also shows what else the sync row
could tell (its P99 ITL, its TPOT against its ITL) at the two ends of what one cell leaves open,
and the CPU range the bands rest on (sim/bands.py; bench/cpu_evidence.py has its evidence).

Usage: python bench/seed_user_path.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.common.vllm_bench import read_bench  # noqa: E402
from stepgap.sim.band_runs import difference_band  # noqa: E402
from stepgap.sim.bands import (CPU_HIGH, CPU_HIGH_SOURCE, CPU_LOW, CPU_LOW_SOURCE,  # noqa: E402
                                split_input)
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import simulate  # noqa: E402
from stepgap.sim.presets import get_preset  # noqa: E402

SYNC, ASYNC = ROOT / "traces/seed/vllm-pr25872-sync.json", ROOT / "traces/seed/vllm-pr25872-async.json"
CALIBRATE = ["calibrate", str(SYNC), "--gpu", "l20", "--model", "llama-3.1-8b", "--draft",
             "llama-3.1-8b-eagle3", "-k", "4", "--max-concurrency", "1",
             "--no-enable-prefix-caching", "--max-model-len", "2048"]
# The setup the calibrated profile is run with: what the user's vllm serve line had.
SETUP = dict(model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=4, max_concurrency=1,
             enable_prefix_caching=False, max_model_len=2048, workload="mtbench",
             num_prompts=80, output_len=256)


def band_text(b, measured: float) -> str:
    inside = b.low <= measured <= b.high
    return (f"{b.value:.3f} ms (band {b.low:.3f}-{b.high:.3f}, {100 * (b.low / b.value - 1):+.0f}"
            f"/{100 * (b.high / b.value - 1):+.0f} %; dominated by {', '.join(b.dominant)}; "
            f"the measured {measured:.2f} ms {'inside' if inside else 'OUTSIDE'})")


def split_ends(base: dict, profile: Path, sync: dict) -> None:
    """The sync row at the two ends of what the calibration left open (the most and the least
    host CPU that reproduce its mean ITL): whether its other numbers tell the ends apart."""
    from stepgap.sim.profile import load_profile
    split = load_profile(profile).notes["bands"]["split"]
    print("\n4. the sync row at the ends of the split (does anything besides its mean ITL tell "
          "host from device?):")
    keys = ("mean_itl_ms", "p99_itl_ms", "mean_tpot_ms", "p99_tpot_ms")
    print("   " + " " * 34 + "".join(f"{k:>14}" for k in keys))
    print(f"   {'measured':<34}" + "".join(f"{sync[k]:>14.2f}" for k in keys))
    inp = split_input(split)
    for end in ("low", "high"):
        r = simulate(SimConfig(**{**inp.settings(base, end), "mode": "sync"}))[0]
        what = f"{end}: CPU x {split[end]['cpu']:.3f}, device x {split[end]['device']:.3f}"
        print(f"   {what:<34}" + "".join(f"{r[k]:>14.2f}" for k in keys))


def main() -> int:
    from stepgap.cli import main as stepgap
    from stepgap.sim.config import profile_defaults
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="keep the profile here (default: a temp dir)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    sync, async_ = read_bench(SYNC), read_bench(ASYNC)
    saving = sync["mean_itl_ms"] - async_["mean_itl_ms"]

    print(f"the host CPU range of the bands: x {CPU_LOW:g} ({CPU_LOW_SOURCE}) to x {CPU_HIGH:g} "
          f"({CPU_HIGH_SOURCE})\n")
    print("1. uncalibrated: the seed's setup (docs/explanation/design.md §6), the L20's roofline, "
          "stepgap's ranges")
    seed = {**get_preset("seed-l20").settings}
    for scale, why in ((1.0, "stepgap's defaults"), (2.42, "the preset's 2.42, fitted on this "
                                                            "very row")):
        b, inputs = difference_band({**seed, "cpu_scale": scale, "mode": "sync"},
                                    {**seed, "cpu_scale": scale, "mode": "async"})
        print(f"   CPU x {scale:g} ({why}): async saves {band_text(b, saving)}")

    out = args.out or Path(tempfile.mkdtemp(prefix="seed-user-path-"))
    out.mkdir(parents=True, exist_ok=True)
    profile = out / "l20-profile.json"
    print(f"\n2. stepgap {' '.join(CALIBRATE)} --out {profile}")
    rc = stepgap(CALIBRATE + ["--out", str(profile)])
    if rc:
        return rc

    print(f"\n3. predicted with --profile {profile} (the L20 and the acceptance it measured):")
    base, _ = profile_defaults({**SETUP, "profile": str(profile)}, set())
    res = {m: simulate(SimConfig(**{**base, "mode": m}))[0] for m in ("sync", "async")}
    for m, measured in (("sync", sync), ("async", async_)):
        r = res[m]
        print(f"   {m:<6}" + "  ".join(
            f"{key} {r[key]:.2f} / {measured[key]:.2f} ({100 * (r[key] / measured[key] - 1):+.1f} %)"
            for key in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms")))
    b, _ = difference_band({**base, "mode": "sync"}, {**base, "mode": "async"})
    print(f"   async saves {band_text(b, saving)}")
    split_ends(base, profile, sync)
    tpot_err = res["async"]["mean_tpot_ms"] / async_["mean_tpot_ms"] - 1
    sav_err = b.value / saving - 1
    print("\ntargets:")
    print(f"   async mean TPOT within 2 %: {100 * tpot_err:+.1f} % "
          f"{'met' if abs(tpot_err) <= 0.02 else 'NOT met'}")
    print(f"   ITL saving within 25 % of {saving:.2f} ms: {b.value:.3f} ms, {100 * sav_err:+.1f} % "
          f"{'met' if abs(sav_err) <= 0.25 else 'NOT met'}")
    wide = max(b.high - b.value, b.value - b.low) / b.value
    print(f"   its band narrower than +-30 %: {b.low:.3f}-{b.high:.3f} ms, +-{100 * wide:.0f} % at "
          f"its widest {'met' if wide <= 0.30 else 'NOT met'}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
