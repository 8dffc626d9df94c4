"""What a shared prefix changes: TTFT and the async saving against the shared fraction of the
prompt (issue 27).

    python bench/prefix_whatif.py      # draws docs/img/prefix_whatif.png

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import simulate  # noqa: E402

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.97)
PROMPT = 1024


def cell(fraction: float, mode: str, caching: bool, rate: float, n: int) -> dict:
    prefix = round(fraction * PROMPT)
    spec = f"prefix_repetition:prefix_len={prefix}:suffix_len={PROMPT - prefix}:num_prefixes=10"
    cfg = SimConfig(workload=spec, num_prompts=n, output_len=256, gpu="h100", k=3, mode=mode,
                    cpu_scale=2.42, request_rate=rate, max_num_batched_tokens=2048,
                    enable_prefix_caching=caching, seed=0)
    res, _ = simulate(cfg)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--request-rate", type=float, default=12.0)
    ap.add_argument("--num-prompts", type=int, default=400)
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "prefix_whatif.png")
    args = ap.parse_args(argv)
    rows = []
    print("| shared fraction | mean TTFT ms sync / async | mean TPOT ms sync / async | async "
          "saving (TPOT) | prefix hits | TTFT, caching off (async) |")
    print("|---|---|---|---|---|---|")
    for f in FRACTIONS:
        s, a = (cell(f, m, True, args.request_rate, args.num_prompts) for m in ("sync", "async"))
        off = cell(f, "async", False, args.request_rate, args.num_prompts)
        pc = a["config"]["resolved"]["prefix_cache"]
        saving = 100 * (s["mean_tpot_ms"] - a["mean_tpot_ms"]) / s["mean_tpot_ms"]
        rows.append((f, s, a, off, saving, pc))
        print(f"| {f:.2f} | {s['mean_ttft_ms']:.1f} / {a['mean_ttft_ms']:.1f} | "
              f"{s['mean_tpot_ms']:.2f} / {a['mean_tpot_ms']:.2f} | {saving:.1f} % | "
              f"{100 * pc['hits'] / max(pc['queries'], 1):.0f} % of prompt tokens | "
              f"{off['mean_ttft_ms']:.1f} |")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    fs = [r[0] for r in rows]
    ax1.plot(fs, [r[1]["mean_ttft_ms"] for r in rows], "o-", label="sync, caching on")
    ax1.plot(fs, [r[2]["mean_ttft_ms"] for r in rows], "o-", label="async, caching on")
    ax1.plot(fs, [r[3]["mean_ttft_ms"] for r in rows], "o:", label="async, caching off")
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
