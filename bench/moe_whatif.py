"""What the MoE and MTP tables, data parallelism and expert parallelism change.

    python bench/moe_whatif.py                      # 21 runs, one markdown table

DeepSeek-V3's shapes (`--model deepseek-v3`: 61 layers, MLA, 256 experts of 2048 + 1 shared,
top-8, FP8, one MTP layer; DeepSeek-V3.2-Exp has the same, plus its sparse-attention indexer,
which is not modelled) on eight RTX PRO 6000s, priced with DeepSeek-V3.2-Exp's measured MoE
block and MTP module on that GPU (traces/peers/llmservingsim/profiler/perf/RTXPRO6000/
deepseek-ai/DeepSeek-V3.2-Exp/fp8: moe.csv by EP degree 1-32, mtp.csv) and the roofline for
the rest, or with the roofline alone. The load: 600 ShareGPT-like requests at 20 requests/s
(Poisson, seed 0), async scheduling, MTP with k = 1 (acceptance: vLLM's DeepSeek-V3 MTP
measurement, 0.882), vLLM's --max-num-batched-tokens 2048 per engine core. The weights do not
fit the cards (about 97 GB a GPU at DP 8 + EP 8): every run takes --num-gpu-blocks-override
8000 (128,000 tokens of KV per engine core), so this is a study of the step loop's costs, not
of a deployment. The last two runs take two of the GPUs (DP 2 + EP 2), their MoE layers'
dispatch and combine priced from the pair's measured collectives (LLMServingSim's
profiler/perf/RTXPRO6000/hardware.yaml, found beside the bundle) or, with the bundle copied
away from it, from the interconnect model. Prints one markdown table: mean TPOT and TTFT,
median ITL, output tokens/s, the share of the MoE tables' lookups past their 2,048-token grid,
and the dummy forwards.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import simulate  # noqa: E402

TABLES = ROOT / "traces/peers/llmservingsim/profiler/perf/RTXPRO6000/deepseek-ai/" \
    "DeepSeek-V3.2-Exp/fp8"
BASE = dict(model="deepseek-v3", gpu="rtxpro6000", method="mtp", k=1, mode="async",
            workload="sharegpt", num_prompts=600, request_rate=20.0, seed=0,
            max_num_batched_tokens=2048, num_gpu_blocks_override=8000)


def scenarios(no_mtp: Path, unmeasured: Path) -> list[tuple[str, dict]]:
    t = str(TABLES)
    ep8 = dict(data_parallel_size=8, enable_expert_parallel=True)
    ep2 = dict(data_parallel_size=2, enable_expert_parallel=True)
    return [
        ("DP 8 + EP 8, MoE and MTP from tables", {**ep8, "device_profile": t}),
        ("DP 8 + EP 8, roofline", ep8),
        ("DP 8 + EP 8, MoE from tables, MTP roofline", {**ep8, "device_profile": str(no_mtp)}),
        ("DP 8, no EP, tables (no TP-8 moe.csv: MoE roofline)",
         {"data_parallel_size": 8, "device_profile": t}),
        ("DP 8, no EP, roofline", {"data_parallel_size": 8}),
        ("DP 2 x TP 4 + EP 8, tables", {"data_parallel_size": 2, "tensor_parallel_size": 4,
                                        "enable_expert_parallel": True, "device_profile": t}),
        ("DP 1 x TP 8 + EP 8, tables", {"tensor_parallel_size": 8,
                                        "enable_expert_parallel": True, "device_profile": t}),
        ("DP 2 x TP 4 + EP 8, roofline", {"data_parallel_size": 2, "tensor_parallel_size": 4,
                                          "enable_expert_parallel": True}),
        ("DP 1 x TP 8 + EP 8, roofline", {"tensor_parallel_size": 8,
                                          "enable_expert_parallel": True}),
        *[(f"DP 8 + EP 8, tables, {mode}, k={k}",
           {**ep8, "device_profile": t, "mode": mode, "k": k})
          for k in (0, 1, 2) for mode in ("sync", "async", "zero-bubble")],
        ("DP 8 + EP 8, roofline, sync, k=1", {**ep8, "mode": "sync"}),
        # two of the eight GPUs: the pair's measured collectives (hardware.yaml beside the
        # bundle, over 2 GPUs) price the dispatch and combine, or the interconnect model does
        ("DP 2 + EP 2, tables, collectives measured", {**ep2, "device_profile": t}),
        ("DP 2 + EP 2, tables, collectives modelled", {**ep2, "device_profile": str(unmeasured)}),
    ]


def row(name: str, res: dict) -> str:
    r, m = res.plan, res.metrics
    cov = (r.get("device_costs") or {}).get("moe_coverage")
    past = f"{cov['past_grid']}/{cov['row_counts']}" if cov else "-"
    dp = r.get("data_parallel")
    dummies = sum(dp["dummy_forwards"]) if dp else 0
    return (f"| {name} | {m['mean_tpot_ms']:.2f} | {m['mean_ttft_ms']:.1f} | "
            f"{m['median_itl_ms']:.2f} | {m['output_throughput']:.0f} | {past} | "
            f"{dummies} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("only", nargs="*", help="scenario numbers (default: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        no_mtp = Path(tmp) / "fp8"   # the same bundle without its mtp.csv
        shutil.copytree(TABLES, no_mtp)
        (no_mtp / "tp1" / "mtp.csv").unlink()
        unmeasured = Path(tmp) / "whole" / "fp8"   # the same bundle away from hardware.yaml
        shutil.copytree(TABLES, unmeasured)
        print("| scenario | mean TPOT ms | mean TTFT ms | median ITL ms | output tok/s | "
              "MoE row counts past the grid | dummy forwards |")
        print("|---|---|---|---|---|---|---|")
        for i, (name, settings) in enumerate(scenarios(no_mtp, unmeasured)):
            if args.only and str(i) not in args.only:
                continue
            res, _ = simulate(SimConfig(**{**BASE, **settings}))
            print(row(name, res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
