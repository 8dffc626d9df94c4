"""What a shared prefix changes: TTFT and the async saving against the shared fraction of the
prompt, as a `stepgap sweep` over its `shared_fraction` axis.

    python bench/prefix_whatif.py      # draws docs/img/prefix_whatif.png (about 5 s)

The same sweep from the command line (its table in out/prefix-whatif/sweep.csv):

    stepgap sweep --set workload=prefix_repetition:num_prefixes=10:prefix_len=0:suffix_len=1024 \\
        --set num_prompts=400 --set output_len=256 --set gpu=h100 --set k=3 --set cpu_scale=2.42 \\
        --set request_rate=12 --set max_num_batched_tokens=2048 \\
        --grid shared_fraction=0,0.25,0.5,0.75,0.9,0.97 --grid mode=sync,async \\
        --grid enable_prefix_caching=true,false --out out/prefix-whatif

vLLM's prefix_repetition workload (common/workloads.py): 10 prefixes, each shared by a tenth of
the prompts, of 1024-token prompts whose first FRACTION are the shared prefix; 256 output
tokens; Poisson arrivals at --request-rate; Llama-3.1-8B with its EAGLE-3 head at k = 3 on an
H100 (the roofline; the seed's CPU cost scale 2.42), sync and async, with prefix caching on (and,
for reference, off). Prints TTFT and mean TPOT and what async saves, per fraction, and draws
docs/img/prefix_whatif.png.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.sim.sweep import run_sweep  # noqa: E402
from stepgap.sim.sweep_grid import Grid  # noqa: E402

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.97)
PROMPT = 1024


def grid(rate: float, n: int) -> Grid:
    return Grid({"shared_fraction": list(FRACTIONS), "mode": ["sync", "async"],
                 "enable_prefix_caching": [True, False]},
                base={"workload": f"prefix_repetition:num_prefixes=10:prefix_len=0:"
                                  f"suffix_len={PROMPT}",
                      "num_prompts": n, "output_len": 256, "gpu": "h100", "k": 3,
                      "cpu_scale": 2.42, "request_rate": rate, "max_num_batched_tokens": 2048,
                      "seed": 0})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--request-rate", type=float, default=12.0)
    ap.add_argument("--num-prompts", type=int, default=400)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None,
                    help="the sweep's folder (default: a temporary one)")
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "prefix_whatif.png")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        table = run_sweep(grid(args.request_rate, args.num_prompts), args.out or tmp,
                          jobs=args.jobs).table

    def get(metric, f, mode, caching=True):
        return table.value(metric, shared_fraction=f, mode=mode, enable_prefix_caching=caching)

    rows = []
    print("| shared fraction | mean TTFT ms sync / async | mean TPOT ms sync / async | async "
          "saving (TPOT) | prefix hits | TTFT, caching off (async) |")
    print("|---|---|---|---|---|---|")
    for f in FRACTIONS:
        s, a = (get("mean_ttft_ms", f, m) for m in ("sync", "async"))
        ts, ta = (get("mean_tpot_ms", f, m) for m in ("sync", "async"))
        off = get("mean_ttft_ms", f, "async", False)
        saving = 100 * (ts - ta) / ts
        hit = get("prefix_cache_hit_rate", f, "async")
        rows.append((f, s, a, off, saving))
        print(f"| {f:.2f} | {s:.1f} / {a:.1f} | {ts:.2f} / {ta:.2f} | {saving:.1f} % | "
              f"{100 * hit:.0f} % of prompt tokens | {off:.1f} |")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    fs = [r[0] for r in rows]
    ax1.plot(fs, [r[1] for r in rows], "o-", label="sync, caching on")
    ax1.plot(fs, [r[2] for r in rows], "o-", label="async, caching on")
    ax1.plot(fs, [r[3] for r in rows], "o:", label="async, caching off")
    ax1.set(xlabel="shared fraction of the prompt", ylabel="mean TTFT (ms)",
            title=f"TTFT, {args.request_rate:g} requests/s")
    ax2.plot(fs, [r[4] for r in rows], "o-", color="tab:green")
    ax2.set(xlabel="shared fraction of the prompt", ylabel="async saving, % of sync mean TPOT",
            title="What async saves")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle("Llama-3.1-8B + EAGLE-3 (k = 3) on an H100, prefix_repetition (1024-token "
                 "prompts, 10 prefixes)", fontsize=10)
    from stepgap.common.timeline_plots import save
    save(fig, args.figure)
    print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
