"""Made-up but well-formed `vllm bench serve --save-result` files of a new user's H100 runs
(tests/data/new-user/): what a user has after benching Llama-3.1-8B-Instruct with its EAGLE-3
head on one H100, 200 prompts of vLLM's random dataset (1,024 input tokens, 128 output tokens),
and what `stepgap calibrate` is judged on (docs/reports/2026-12-07-pinning.md).

Nobody ran these on an H100: the simulator made them, at a host and device that are not
stepgap's nominal ones (TRUTH), so that a calibration has something to find, and with the
offsets a real run has that the simulator does not model:

- the host's CPU at x 2.0 of stepgap's default costs per step and x 3.0 per request and token
  (a structure the one-factor fit cannot reproduce exactly: two runs at concurrency 1 and 16
  are each a few percent off any one factor), the device 4 % slower than the H100's roofline;
- the acceptance the published Llama-3.1-8B profile (vLLM #26191) shifted by -0.3 on the logit
  scale (random prompts are harder to draft for than MT-bench);
- 1.5 ms more TTFT than the engine's (the API server's tokenizing of 1,024 tokens and the
  HTTP path), and each run's times x (1 + e), e drawn per file with a 0.4 % spread (the run to
  run noise of a GPU bench's mean), seeded by the file's name.

The files keep vLLM 0.32's layout and key order; `--save-detailed` ones have the per-request
lists (and vLLM 0.32's spec_decode_* counters), the others not (as `vllm bench serve` without
--save-detailed writes them). All but the first carry `--metadata mode=MODE
num_speculative_tokens=K`, as docs/explanation/vllm.md's workflow asks; the first (sync-k4-c1.json, the
file of issue 51) has none, as a new user's would. `date` is made up. Deterministic: the same
files every time.

    python bench/new_user_files.py [--out tests/data/new-user]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.calibrate.bench_fit import Host  # noqa: E402
from stepgap.common.acceptance import get_profile  # noqa: E402
from stepgap.common.run_result import bench_result  # noqa: E402
from stepgap.sim.bands import shifted  # noqa: E402
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import simulate  # noqa: E402

TRUTH = {"cpu": 2.0, "per": 3.0, "device": 1.04, "acceptance_shift": -0.3,
         "ttft_offset_ms": 1.5, "noise": 0.004}
SETUP = dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3",
             workload="random:input_len=1024", num_prompts=200, output_len=128,
             max_model_len=131072, jitter=False)
# (file, mode, k, concurrency, --save-detailed)
FILES = (("sync-k4-c1.json", "sync", 4, 1, False),
         ("sync-k4-c1-detailed.json", "sync", 4, 1, True),
         ("sync-k4-c16.json", "sync", 4, 16, False),
         ("sync-k0-c4.json", "sync", 0, 4, False),
         ("async-k4-c1.json", "async", 4, 1, False),
         ("async-k4-c16.json", "async", 4, 16, False))
HEAD = {"date": "20261203-101500", "endpoint_type": "openai", "backend": "openai",
        "label": None, "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct"}
METRICS = ("ttft", "tpot", "itl", "e2el")


def truth_settings(mode: str, k: int, conc: int) -> dict:
    prof = get_profile("mtbench")
    host = Host(TRUTH["cpu"], TRUTH["device"], TRUTH["per"])
    acc = {"acceptance_rates": shifted(prof, TRUTH["acceptance_shift"], max(k, 1)),
           "acceptance_spread": prof.spread} if k else {}
    return {**SETUP, **host.settings(), **acc, "mode": mode, "k": k, "max_concurrency": conc,
            "detailed": True}


def bench_doc(name: str, mode: str, k: int, conc: int, detailed: bool) -> dict:
    """One file: the truth simulated, its offsets added, laid out as vLLM 0.32 writes it."""
    res = simulate(SimConfig(**truth_settings(mode, k, conc)))[0]
    rng = random.Random(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
    f = 1 + rng.gauss(0.0, TRUTH["noise"])
    ttfts = [round(f * t + TRUTH["ttft_offset_ms"] / 1e3, 6) for t in res["ttfts"]]
    itls = [[round(f * x, 6) for x in row] for row in res["itls"]]
    lists = {"input_lens": res["input_lens"], "output_lens": res["output_lens"],
             "ttfts": ttfts, "itls": itls, "errors": [""] * len(ttfts)}
    duration = round(f * res["duration"] + TRUTH["ttft_offset_ms"] / 1e3 * len(ttfts)
                     / conc, 6)
    doc = {**HEAD, "num_prompts": SETUP["num_prompts"], "request_rate": "inf",
           "burstiness": 1.0, "max_concurrency": conc, "duration": duration,
           "completed": len(ttfts), "failed": 0, **lists}
    metrics = bench_result(doc, name)
    # `--metadata mode=... num_speculative_tokens=...` as stepgap's workflow asks (docs/explanation/vllm.md;
    # vLLM writes each as a top-level string), except on the first file, as a user had it
    meta = {} if name == FILES[0][0] else {"mode": mode, "num_speculative_tokens": str(k)}
    out = {**HEAD, **meta, "num_prompts": SETUP["num_prompts"], "request_rate": "inf",
           "burstiness": 1.0, "max_concurrency": conc, "duration": duration,
           "completed": len(ttfts), "failed": 0,
           "total_input_tokens": sum(lists["input_lens"]),
           "total_output_tokens": sum(lists["output_lens"]),
           **{key: metrics[key] for key in ("request_throughput", "output_throughput",
                                            "total_token_throughput")}}
    if detailed:
        out.update(lists)
        spec = res.get("spec_decode")
        if k and spec:
            out.update({
                "spec_decode_acceptance_rate": 100 * spec["acceptance_rate"],
                "spec_decode_acceptance_length": spec["acceptance_length"],
                "spec_decode_num_drafts": spec["num_drafts"],
                "spec_decode_draft_tokens": spec["num_draft_tokens"],
                "spec_decode_accepted_tokens": spec["num_accepted_tokens"],
                "spec_decode_per_position_acceptance_rates": spec["acceptance_rate_per_pos"]})
    for m in METRICS:
        for stat in ("mean", "median", "std", "p99"):
            key = f"{stat}_{m}_ms"
            if key in metrics:
                out[key] = metrics[key]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/new-user")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, mode, k, conc, detailed in FILES:
        doc = bench_doc(name, mode, k, conc, detailed)
        (args.out / name).write_text(json.dumps(doc, indent=None if detailed else 1) + "\n")
        print(f"{args.out / name}: {mode} k={k} c={conc}: mean TTFT {doc['mean_ttft_ms']:.2f} "
              f"ms, mean TPOT {doc['mean_tpot_ms']:.3f}, mean ITL {doc['mean_itl_ms']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
