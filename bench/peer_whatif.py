"""What the GPUs' own tables change for the question stepgap exists for.

    python bench/peer_whatif.py --out out/peer-whatif        # 6 sweeps of 98 cells

Llama-3.1-8B with an EAGLE-3 head on the RTX 4090 and the RTX PRO 6000 Blackwell, and
Qwen3-32B with an EAGLE-3 head at TP 2 on two RTX PRO 6000s over PCIe, k 0..6 x
max-concurrency 1..64, sync against async, each priced twice: from the GPU's measured
operator tables (traces/peers/llmservingsim, --device-profile) and from the roofline of its
datasheet entry. The TP 2 pair's collectives are the ones its real run shows, LLMServingSim's
hardware.yaml of 2026-09-08 (--gpu FILE.yaml; bench/peer_tp.py), in both. Everything else is
the seed scenario (`--preset seed-l20`: MT-bench-like prompts, 256 output tokens, its CPU cost
scale 2.42 fitted on the L20 host), with vLLM's --max-num-batched-tokens 2048 of the peer runs.
No EAGLE-3 acceptance was measured on these GPUs. Llama: the seed's profile, vLLM #26191
(Llama-3.1-8B + EAGLE-3 on MT-bench, k = 7). Qwen3-32B: `vllm-qwen3-8b-eagle3` (vLLM's
acceptance test, Qwen3-8B + RedHatAI's EAGLE-3 head on MT-bench, k = 3; past k = 3 its last
conditional rate carries on), the only published Qwen3 EAGLE-3 profile stepgap holds; its head
is shaped from the target (one decoder layer of Qwen3-32B's shapes, which the tables price).
Prints, per scenario and cost model, the best k of each mode by mean TPOT and what async saves
at it, and draws docs/img/peer_whatif.png (--figure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "traces/peers/llmservingsim/profiler/perf"
PAIR = ROOT / "traces/peers/llmservingsim/at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml"
# key, label, --gpu, the tables, the scenario's own settings
GPUS = (("rtx4090", "RTX 4090", "rtx4090", TABLES / "RTX4090/meta-llama/Llama-3.1-8B/bf16", ()),
        ("rtxpro6000", "RTX PRO 6000", "rtxpro6000",
         TABLES / "RTXPRO6000/meta-llama/Llama-3.1-8B/bf16", ()),
        ("qwen3-32b-tp2", "Qwen3-32B, TP 2 on two RTX PRO 6000", str(PAIR),
         TABLES / "RTXPRO6000/Qwen/Qwen3-32B/bf16",
         ("model=qwen3-32b", "tensor_parallel_size=2", "draft=eagle3",
          "acceptance=vllm-qwen3-8b-eagle3")))
CONCS = (1, 2, 4, 8, 16, 32, 64)


def sweep(gpu: str, tables: Path | None, sets: tuple, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "stepgap", "sweep", "--preset", "seed-l20", "--set",
           f"gpu={gpu}", "--set", "max_num_batched_tokens=2048", "--grid", "mode=sync,async",
           "--grid", "k=0..6", "--grid", "max_concurrency=1..64:x2", "--out", str(out)]
    for kv in sets:
        cmd += ["--set", kv]
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
        color = {"rtx4090": "tab:green", "rtxpro6000": "tab:purple",
                 "qwen3-32b-tp2": "tab:red"}[gpu]
        label = f"{dict((g, n) for g, n, *_ in GPUS)[gpu]}, {model}"
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
    fig.suptitle("+ EAGLE-3: Llama-3.1-8B (acceptance vLLM #26191, MT-bench) and Qwen3-32B at "
                 "TP 2 (vllm-qwen3-8b-eagle3): measured tables against the roofline",
                 fontsize=10)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "peer-whatif")
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "peer_whatif.png")
    args = ap.parse_args(argv)
    results = {}
    for key, name, gpu, tables, sets in GPUS:
        for model, t in (("tables", tables), ("roofline", None)):
            results[(key, model)] = best(sweep(gpu, t, sets, args.out / f"{key}-{model}"))
    print("| concurrency | " + " | ".join(f"{n} {m}" for _, n, *_ in GPUS
                                        for m in ("tables", "roofline")) + " |")
    print("|---|" + "---|" * 2 * len(GPUS))
    for c in CONCS:
        cells = []
        for gpu, *_ in GPUS:
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
