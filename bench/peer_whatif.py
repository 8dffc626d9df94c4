"""What the GPUs' own tables change for the question stepgap exists for (issue 22, item 5).

    python bench/peer_whatif.py --out out/peer-whatif        # 4 sweeps, ~2 min on 2 cores

Llama-3.1-8B with an EAGLE-3 head on the RTX 4090 and the RTX PRO 6000 Blackwell, k 0..6 x
max-concurrency 1..64, sync against async, each priced twice: from the GPU's measured
operator tables (traces/peers/llmservingsim, --device-profile) and from the roofline of its
datasheet entry. Everything else is the seed scenario (`--preset seed-l20`: MT-bench-like
prompts, 256 output tokens, its CPU cost scale 2.42 fitted on the L20 host), with vLLM's
--max-num-batched-tokens 2048 of the peer runs. No EAGLE-3 acceptance was measured on these
GPUs: the acceptance is the seed's profile, vLLM #26191 (Llama-3.1-8B + EAGLE-3 on MT-bench,
k = 7). Prints, per GPU and cost model, the best k of each mode by mean TPOT and what async
saves at it, and draws docs/img/peer_whatif.png (--figure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "traces/peers/llmservingsim/profiler/perf"
GPUS = (("rtx4090", "RTX 4090", TABLES / "RTX4090/meta-llama/Llama-3.1-8B/bf16"),
        ("rtxpro6000", "RTX PRO 6000", TABLES / "RTXPRO6000/meta-llama/Llama-3.1-8B/bf16"))
CONCS = (1, 2, 4, 8, 16, 32, 64)


def sweep(gpu: str, tables: Path | None, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "stepgap", "sweep", "--preset", "seed-l20", "--set",
           f"gpu={gpu}", "--set", "max_num_batched_tokens=2048", "--grid", "mode=sync,async",
           "--grid", "k=0..6", "--grid", "max_concurrency=1..64:x2", "--out", str(out)]
    if tables is not None:
        cmd += ["--set", f"device_profile={tables}"]
    subprocess.run(cmd, check=True, cwd=ROOT, stderr=subprocess.DEVNULL)
    return json.loads((out / "sweep.json").read_text())["rows"]


def best(rows: list[dict]) -> dict:
    """(mode, concurrency) -> (best k, its mean TPOT), and what async saves at each mode's
    best k, % of sync's."""
    out = {}
    for mode in ("sync", "async"):
        for c in CONCS:
            cells = [r for r in rows if r["mode"] == mode and r["max_concurrency"] == c]
            b = min(cells, key=lambda r: r["mean_tpot_ms"])
            out[(mode, c)] = (b["k"], b["mean_tpot_ms"])
    for c in CONCS:
        s, a = out[("sync", c)][1], out[("async", c)][1]
        out[("saving", c)] = 100 * (s - a) / s
    return out


def figure(results: dict, path: Path) -> None:
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    for (gpu, model), b in results.items():
        style = {"tables": "-", "roofline": ":"}[model]
        color = {"rtx4090": "tab:green", "rtxpro6000": "tab:purple"}[gpu]
        label = f"{dict((g, n) for g, n, _ in GPUS)[gpu]}, {model}"
        ax1.plot(CONCS, [b[("saving", c)] for c in CONCS], style, color=color, marker="o",
                 label=label)
        ax2.plot(CONCS, [b[("async", c)][0] for c in CONCS], style, color=color, marker="o",
                 label=label)
    ax1.set(xscale="log", xlabel="max concurrency", ylabel="async saving, % of sync mean TPOT",
            title="What async saves (each mode at its best k)")
    ax2.set(xscale="log", xlabel="max concurrency", ylabel="best k (async, by mean TPOT)",
            title="The best speculation depth")
    for ax in (ax1, ax2):
        ax.set_xticks(CONCS, [str(c) for c in CONCS])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Llama-3.1-8B + EAGLE-3 (acceptance: vLLM #26191, MT-bench): measured tables "
                 "against the datasheet roofline", fontsize=10)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "peer-whatif")
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "peer_whatif.png")
    args = ap.parse_args(argv)
    results = {}
    for gpu, name, tables in GPUS:
        for model, t in (("tables", tables), ("roofline", None)):
            results[(gpu, model)] = best(sweep(gpu, t, args.out / f"{gpu}-{model}"))
    print("| concurrency | " + " | ".join(f"{n} {m}" for _, n, _ in GPUS
                                        for m in ("tables", "roofline")) + " |")
    print("|---|" + "---|" * 4)
    for c in CONCS:
        cells = []
        for gpu, _, _ in GPUS:
            for model in ("tables", "roofline"):
                b = results[(gpu, model)]
                (ks, ts), (ka, ta) = b[("sync", c)], b[("async", c)]
                cells.append(f"k={ks} {ts:.2f} / k={ka} {ta:.2f} ({b[('saving', c)]:.1f} %)")
        print(f"| {c} | " + " | ".join(cells) + " |")
    print("(each cell: sync best k and mean TPOT ms / async best k and mean TPOT ms (what "
          "async saves, % of sync))")
    figure(results, args.figure)
    print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
