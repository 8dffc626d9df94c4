"""The simulator's results over scenarios that cover its code paths, written to compare checkouts.

A change meant to make the simulator faster must not change what it computes. This writes the
run result (with every request's chunks, ITLs and step gaps) and a digest of the timeline of
each scenario to OUT/NAME.json and OUT/NAME.spans; run it from two checkouts and compare the
folders byte for byte (docs/reports/2026-12-03-advise-speed.md):

    python bench/sim_results.py --out /tmp/before      # in the old checkout
    python bench/sim_results.py --out /tmp/after       # in the new one
    diff -r /tmp/before /tmp/after && echo identical

Scenarios, each in sync, async and zero-bubble: the seed (inline, process with a timeline, a
few requests with a timeline), ShareGPT-like at concurrency 64 (inline and process), the CPU
device with the committed profile and its jitter (process and inline), vLLM's topology (CPU and
GPU), TP 2, preemption, chunked prefill, output latency, Poisson arrivals, ngram, ngram_gpu,
draft_model, k = 0, a speed level, concurrency 1, no concurrency cap; and the 10,000-request
ShareGPT-like run in sync and async. About 15 s on one core.

`--replay` simulates each scenario first at other CPU costs and device speed, keeping its steps
(sim/loop.py `Recording`), then the scenario itself from that recording, where it can replay
them: its folder must be identical to a plain run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.common.fileio import jsonable  # noqa: E402
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import Recording, simulate  # noqa: E402
from stepgap.sim.presets import get_preset  # noqa: E402

PAIR = "checkpoints/pystdlib"
PROFILE = "traces/measured/cpu/profile.json"
VLLM_TERMS = {"rpc_mid": [30, 1, 0.01], "rpc_drafts": [40, 0.5, 0],
              "process_outputs": [50, 3, 0.1], "add_request": [80, 0, 0.05]}


def scenarios() -> dict[str, dict]:
    seed = get_preset("seed-l20").settings
    share = {**get_preset("sharegpt-h100").settings, "num_prompts": 1200}
    pair = dict(model=f"{PAIR}/target", draft=f"{PAIR}/eagle3", gpu="cpu", device="cpu",
                workload=f"{PAIR}/heldout.jsonl")
    no_draft = {"draft": None}
    out = {}
    for m in ("sync", "async", "zero-bubble"):
        out |= {
            f"seed-{m}": {**seed, "mode": m},
            f"share-{m}": {**share, "mode": m},
            f"share-proc-{m}": {**share, "mode": m, "executor": "process"},
            f"seed-proc-{m}": {**seed, "mode": m, "executor": "process", "timeline": True},
            f"cpuprof-{m}": {**pair, "mode": m, "k": 4, "executor": "process",
                             "profile": PROFILE, "max_concurrency": 4, "timeline": True},
            f"cpuprof-inline-{m}": {**pair, "mode": m, "k": 2, "executor": "inline",
                                    "profile": PROFILE, "max_concurrency": 2},
            f"vllm-{m}": {**pair, "mode": m, "k": 2, "executor": "process", "topology": "vllm",
                          "cpu_costs": VLLM_TERMS, "max_num_seqs": 8, "max_model_len": 256,
                          "block_size": 128, "max_concurrency": 4, "timeline": True,
                          "jitter": False},
            f"vllm-cuda-{m}": {**share, "num_prompts": 200, "mode": m, "topology": "vllm",
                               "cpu_costs": VLLM_TERMS},
            f"tp2-{m}": {**share, "num_prompts": 300, "mode": m, "tensor_parallel_size": 2},
            f"preempt-{m}": {**share, "num_prompts": 400, "mode": m,
                             "num_gpu_blocks_override": 300, "max_concurrency": 96},
            f"chunked-{m}": {**share, "num_prompts": 300, "mode": m,
                             "max_num_batched_tokens": 256, "max_num_seqs": 32,
                             "max_concurrency": None, "timeline": True},
            f"outlat-{m}": {**share, "num_prompts": 300, "mode": m, "output_latency_ms": 3.0},
            f"poisson-{m}": {**share, "num_prompts": 400, "mode": m, "request_rate": 20.0,
                             "max_concurrency": None},
            f"ngram-{m}": {**share, **no_draft, "num_prompts": 200, "mode": m,
                           "method": "ngram", "k": 3},
            f"ngramgpu-{m}": {**share, **no_draft, "num_prompts": 200, "mode": m,
                              "method": "ngram_gpu", "k": 3},
            f"draftmodel-{m}": {**share, **no_draft, "num_prompts": 200, "mode": m,
                                "method": "draft_model", "k": 3},
            f"k0-{m}": {**share, "num_prompts": 400, "mode": m, "k": 0},
            f"seed-tl-{m}": {**seed, "mode": m, "timeline": True, "num_prompts": 10},
            f"speed-{m}": {**share, "num_prompts": 200, "mode": m, "speed": 1.3},
            f"c1share-{m}": {**share, "num_prompts": 50, "mode": m, "max_concurrency": 1,
                             "timeline": True},
            f"nomax-{m}": {**share, "num_prompts": 300, "mode": m, "max_concurrency": None,
                           "max_num_seqs": 64},
        }
    out["share10k-async"] = {**share, "num_prompts": 10000}
    out["share10k-sync"] = {**share, "num_prompts": 10000, "mode": "sync"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "sim-results")
    ap.add_argument("only", nargs="*", help="scenario names (default: all)")
    ap.add_argument("--replay", action="store_true",
                    help="each scenario from the recorded steps of a run at other CPU costs "
                         "and device speed, where it can replay them")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)   # the scenarios name files relative to the checkout, as results record them
    for name, settings in scenarios().items():
        if args.only and name not in args.only:
            continue
        settings = {k: v for k, v in settings.items() if not (k == "draft" and v is None)}
        cfg, steps = SimConfig(**settings, detailed=True), None
        if args.replay:
            steps = Recording()
            simulate(SimConfig(**{**settings, "cpu_scale": 1.7 * settings.get("cpu_scale", 1.0),
                                  "speed": 0.9 * settings.get("speed", 1.0)}), recording=steps)
        res, spans = simulate(cfg, recording=steps)
        doc = res if isinstance(res, dict) else res.to_dict()   # a RunResult, or (before) its dict
        text = json.dumps(jsonable(doc), sort_keys=True)
        digest = hashlib.sha256(repr([(s.lane, s.op, s.step, s.start_us, s.end_us, s.args)
                                      for s in spans]).encode()).hexdigest()[:16]
        (out / f"{name}.json").write_text(text)
        (out / f"{name}.spans").write_text(f"{len(spans)} {digest}\n")
        print(f"{name:28s} {hashlib.sha256(text.encode()).hexdigest()[:16]} "
              f"spans {len(spans)} {digest}"
              f"{'' if steps is None else ' replayed' if steps.totals else ' in full'}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
