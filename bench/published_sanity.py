"""The simulator's roofline against published GPU figures, each with its source and the error.

1. SpecDecode-Bench's fit of vLLM on one H100 with Llama-3.1-8B (arXiv:2601.11580,
   github.com/SpecDecode-Bench/simulator predictor.py `Llama8BH100`, "fitted with instructcoder
   bs=1,8,16,32,64"): target forward = 3.93e-8·kv_tokens + 2.10e-5·batched_tokens + 5.89e-3 s,
   EAGLE-3 draft (one call per step) = 2.38e-9·kv + 8.41e-7·spec_tokens + 2.14e-3 s, and a
   per-step overhead of 1.21 ms, against the simulator's target_forward, its k draft passes
   and its sync step gap, at a context of 1024 tokens per request.
2. One published tensor-parallel decode of a 70B Llama: SGLang PR #4716, Llama-3.3-70B-Instruct
   on 8 H100s (TP 8, fp16, CUDA graphs at batch 1), MT-bench 80 questions one at a time without
   speculation: 88.61 tokens/s.
3. vLLM PR #20759's baseline: Llama-3.1-70B-Instruct on 4 B200s (TP 4), `vllm bench serve`
   on the sonnet dataset (550 input, 150 output tokens) at 1 request/s for 60 s: mean TPOT
   12.880 ms.

Not a test: it prints the figures docs/explanation/past-one-gpu.md quotes. Usage: python
bench/published_sanity.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepgap.common.formats import TraceRequest  # noqa: E402
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.plan import resolve  # noqa: E402
from stepgap.sim.costs import Batch
from stepgap.sim.loop import simulate  # noqa: E402

TARGET = (3.92645679e-08, 2.10103129e-05, 5.88590713e-03)   # kv, batched tokens, fixed (s)
DRAFT = (2.37768493e-09, 8.41429603e-07, 2.13526175e-03)    # kv, spec tokens, fixed (s)
OVERHEAD_MS = 1.20683946
CTX = 1024


def err(sim: float, ref: float) -> str:
    return f"{100 * (sim - ref) / ref:+.1f} %"


def specdecode_bench() -> None:
    r = resolve(SimConfig(gpu="h100", model="llama-3.1-8b", k=3, draft="llama-3.1-8b-eagle3"))
    costs = r.device_costs
    print("1. SpecDecode-Bench H100 Llama-3.1-8B fit vs the roofline (ms; context 1024/request)")
    print(f"{'batch':>5} {'k':>2} {'target fit':>11} {'sim':>7} {'error':>8}   "
          f"{'draft fit':>9} {'sim':>6} {'error':>8}")
    for bs in (1, 8, 16, 32, 64):
        for k in (0, 3):
            tokens, kv = bs * (1 + k), bs * (CTX + 1 + k)
            b = Batch(tokens, bs, bs, tokens, bs * k, kv, bs * (1 + k) * (CTX + (k + 2) / 2),
                      1 + k, CTX // 16 + 1)
            fit = (TARGET[0] * kv + TARGET[1] * tokens + TARGET[2]) * 1e3
            sim = costs.target_forward(b) / 1e3
            line = f"{bs:>5} {k:>2} {fit:>11.2f} {sim:>7.2f} {err(sim, fit):>8}"
            if k:
                dfit = (DRAFT[0] * kv + DRAFT[1] * (k + 1) + DRAFT[2]) * 1e3
                dsim = sum(costs.draft_forward(b, i) for i in range(k)) / 1e3
                line += f"   {dfit:>9.2f} {dsim:>6.2f} {err(dsim, dfit):>8}"
            print(line)
    for scale in (1.0, 2.42):
        res, _ = simulate(SimConfig(gpu="h100", model="llama-3.1-8b", k=3, mode="sync",
                                    draft="llama-3.1-8b-eagle3", cpu_scale=scale,
                                    num_prompts=16, max_concurrency=1))
        gap = res.step_gaps["mean_us"] / 1e3
        print(f"per-step overhead: fit {OVERHEAD_MS:.2f} ms; sim's sync step gap at cpu_scale "
              f"{scale:g}: {gap:.2f} ms ({err(gap, OVERHEAD_MS)})")


def tp_breakdown() -> None:
    print("\n0. One decode token of Llama-3.3-70B on H100s (k=0, context 512): where it goes")
    for tp in (4, 8):
        r = resolve(SimConfig(gpu="h100", model="llama-3.3-70b", k=0, tensor_parallel_size=tp))
        c, t = r.device_costs, r.target
        b = Batch(1, 1, 1, 1, 0, 513, 513.0, 1, 33)
        total = (c.target_forward(b) + c.rejection_sample(b)) / 1e3   # with its sampling
        weights = (t.weight_bytes_per_rank(tp) - 2 * t.vocab_size * t.hidden_size / tp) \
            / r.hw.bw * 1e3
        coll = ((2 * t.num_layers + 1) * c.all_reduce(1, t.hidden_size)
                + c.gather_logits(1, t.vocab_size)) / 1e3
        print(f"  TP {tp}: target_forward + sampling {total:.2f} ms = weights {weights:.2f} + "
              f"collectives {coll:.2f} ({2 * t.num_layers + 1} all-reduces + the logits' gather) + "
              f"kernels, attention and activations {total - weights - coll:.2f}")


def sglang_tp8() -> None:
    print("\n2. SGLang #4716: Llama-3.3-70B, 8 H100 (TP 8), MT-bench at batch 1, 88.61 tok/s")
    for mode in ("sync", "async"):
        for alpha in (None, 20.0):
            res, _ = simulate(SimConfig(gpu="h100", model="llama-3.3-70b", k=0, mode=mode,
                                        tensor_parallel_size=8, all_reduce_latency_us=alpha,
                                        workload="mtbench", max_concurrency=1))
            tps = res["output_throughput"]
            a = "catalog (6 us)" if alpha is None else f"{alpha:g} us"
            print(f"  {mode:<5} all-reduce latency {a:<15} {tps:7.2f} tok/s ({err(tps, 88.61)}),"
                  f" mean TPOT {res['mean_tpot_ms']:.2f} ms")


def vllm_b200_tp4() -> None:
    print("\n3. vLLM #20759: Llama-3.1-70B, 4 B200 (TP 4), sonnet 550/150 at 1 req/s, "
          "mean TPOT 12.880 ms")
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1.0, 60))
    reqs = [TraceRequest(f"r{i}", float(t), 550, 150) for i, t in enumerate(arrivals)]
    for mode in ("sync", "async"):
        res, _ = simulate(SimConfig(gpu="b200", model="llama-3.3-70b", k=0, mode=mode,
                                    tensor_parallel_size=4), reqs)
        t = res["mean_tpot_ms"]
        print(f"  {mode:<5} mean TPOT {t:.2f} ms ({err(t, 12.880)})")


if __name__ == "__main__":
    specdecode_bench()
    tp_breakdown()
    sglang_tp8()
    vllm_b200_tp4()
