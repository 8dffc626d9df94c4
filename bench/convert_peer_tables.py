"""Public GPU measurements converted into stepgap's table layouts (docs/reference/gpus.md).

    python bench/convert_peer_tables.py --vidur VIDUR_GIT_DIR \\
        --llmservingsim LLMSERVINGSIM_GIT_DIR

reads two peers' published measurements out of their git repositories (`git show COMMIT:PATH`:
a clone, or the search tool's `fetch` snapshot) and writes them, as data, beside their licences:

- **Vidur** (github.com/microsoft/vidur at VIDUR_COMMIT, MIT) -> traces/peers/vidur/:
  - `data/profiling/compute/{a100,h100}/<model>/mlp.csv`: one decoder layer's kernels, timed by
    Vidur's profiler (sarathi's kernels, fp16, CUDA times in ms, per token count and TP degree)
    -> `profiler/perf/<GPU>/<model>/fp16/tp<N>/dense.csv` of LLMServingSim's perf-bundle layout
    (sim/tables.py), in microseconds, the median of Vidur's repeats (two rows of one shot: the
    median of both). Vidur's names map to the bundle's: emb -> embedding, input_layernorm ->
    layernorm, attn_pre_proj -> qkv_proj, attn_rope -> rotary_emb, attn_post_proj -> o_proj,
    mlp_up_proj -> gate_up_proj, mlp_act -> act_fn, mlp_down_proj -> down_proj; its
    post_attention_layernorm and add (the residual add, which vLLM fuses into the norm) keep
    their names. Vidur timed no final norm, lm_head, sampler or attention in these files (its
    attention.csv files are not in the repository's history as stored), so the bundles hold
    none: what prices those is said in each run's sources.
  - `data/profiling/network/<node>/all_reduce.csv`: NCCL all-reduces (fp16, in a CUDA graph)
    over 2 to 8 GPUs of a node -> `network/<node>/tp<N>.yaml`, LLMServingSim's hardware.yaml
    layout (`measured.interconnect`: npus, samples of collective, bytes, us_graphed), rank 0's
    median per size. send_recv.csv (pipeline parallelism's hop) is not converted: stepgap
    models no pipeline parallelism.
- **LLMServingSim's older H100 performance models** (github.com/casys-kaist/LLMServingSim at
  LSS_COMMIT, MIT) -> traces/peers/llmservingsim/at-9e3f0ec/: `llm_profile/perf_models/H100/
  <model>/tp<N>/layers.csv` (Hugging Face transformers' modules timed with the PyTorch profiler,
  ns, by input tokens) -> `profiler/perf/H100/<model>/bf16/tp<N>/dense.csv` and
  `per_sequence.csv` (lm_head by rows); `attention.csv` (FlashAttention through Vidur's
  attention profiler: decodes by batch and KV length, prefills by chunk and KV) -> the bundle's
  attention_unsplit_kv.csv (FlashAttention as Vidur's profiler calls it, without split-KV, which
  vLLM's decode does not run: kept as data under a name stepgap's tables do not read). A module
  that vLLM runs as the same kernel keeps the bundle's name (embedding, o_proj, down_proj, lm_head);
  one that vLLM fuses or runs otherwise is LLMServingSim's name behind `hf_`, so that nothing
  prices a vLLM kernel from it: hf_q_proj, hf_k_proj and hf_v_proj (vLLM: one qkv_proj GEMM),
  hf_gate_proj and hf_up_proj (one gate_up_proj), Hugging Face's unfused norms, rotary and SiLU
  (hf_input_layernorm, hf_post_layernorm, hf_final_layernorm, hf_rope, hf_act_fn), and
  Mixtral's router and per-expert loop (hf_gate, hf_expert.w1/w2/w3). They are kept as data:
  the GEMMs are fit data of the H100's roofline (bench/fit_gpu_roofline.py).

Each folder's `source.json` names the repository, the commit, the licence and every file
converted with the sha256 of the source blob. Only the data is taken; no code of either peer.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import statistics
import subprocess
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
LSS_COMMIT = "9e3f0ece7cab1393f176a74d38601ef07103f2d3"
GPU_NAMES = {"a100": ("A100", "NVIDIA A100-SXM4-80GB"), "h100": ("H100", "NVIDIA H100 80GB HBM3")}
# Vidur's model folders converted (phi-2's ungated MLP is no family stepgap reads from tables)
VIDUR_MODELS = {
    "a100": ("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-70B",
             "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf",
             "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b", "Qwen/Qwen-72B"),
    "h100": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf",
             "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b", "Qwen/Qwen-72B"),
}
VIDUR_OPS = {"emb": "embedding", "input_layernorm": "layernorm", "attn_pre_proj": "qkv_proj",
             "attn_rope": "rotary_emb", "attn_post_proj": "o_proj",
             "post_attention_layernorm": "post_attention_layernorm",
             "mlp_up_proj": "gate_up_proj", "mlp_act": "act_fn", "mlp_down_proj": "down_proj",
             "add": "add"}
VIDUR_NODES = {"a100_dgx": ("a100", "DGX A100: 8 A100-SXM4-80GB, NVLink 3 through NVSwitch"),
               "a100_pairwise_nvlink": ("a100", "A100 pairs joined by NVLink (no NVSwitch)"),
               "h100_dgx": ("h100", "DGX H100: 8 H100 SXM5, NVLink 4 through NVSwitch"),
               "h100_pairwise_nvlink": ("h100", "H100 pairs joined by NVLink (no NVSwitch)")}
LSS_MODELS = {"meta-llama/Llama-3.1-8B": (1, 2), "meta-llama/Llama-3.1-70B": (1, 2, 4),
              "mistralai/Mixtral-8x7B-v0.1": (1, 2, 4)}
# LLMServingSim's module -> the bundle's kernel, where vLLM runs the same kernel
LSS_SAME = {"embedding": "embedding", "o_proj": "o_proj", "down_proj": "down_proj"}
# Their attention shots run FlashAttention as Vidur's profiler calls it, a decode batch without
# split-KV: one sequence of 32512 tokens takes 864 us at TP 4 (38 GB/s), where vLLM's decode
# splits the KV. Kept under a name stepgap's tables do not read (sim/tables.py reads
# attention.csv), as data.
ATTENTION = "attention_unsplit_kv.csv"
LSS_SHAPES = {  # the models' config.json fields the bundle's hf_overrides give (per rank at tp)
    "meta-llama/Llama-3.1-8B": dict(heads=32, kv=8, inter=14336, vocab=128256, hidden=4096),
    "meta-llama/Llama-3.1-70B": dict(heads=64, kv=8, inter=28672, vocab=128256, hidden=8192),
    "mistralai/Mixtral-8x7B-v0.1": dict(heads=32, kv=8, inter=14336, vocab=32000, hidden=4096),
}


def git_show(repo: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout


def blob_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_csv(path: Path, header: tuple, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    path.write_text(buf.getvalue())


def us(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".")


def write_meta(folder: Path, meta: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


def per_rank(heads: int, kv: int, inter: int, vocab: int, hidden: int, tp: int) -> dict:
    """The model's shapes on one of tp ranks, as the profilers wrote them (sim/bundle_match.py
    per_rank: heads, MLP and the vocabulary padded to 64 split; KV heads at least 1)."""
    padded = -(-vocab // 64) * 64
    return {"num_attention_heads": heads // tp, "num_key_value_heads": max(1, kv // tp),
            "intermediate_size": inter // tp, "vocab_size": padded // tp,
            "head_dim": hidden // heads, "hidden_size": hidden}


# ---------------------------------------------------------------------------------------------
# Vidur


def convert_vidur(repo: Path, out: Path) -> dict:
    files = {}
    for gpu, models in VIDUR_MODELS.items():
        label, device = GPU_NAMES[gpu]
        for model in models:
            src = f"data/profiling/compute/{gpu}/{model}/mlp.csv"
            data = git_show(repo, VIDUR_COMMIT, src)
            rows = list(csv.DictReader(io.StringIO(data.decode())))
            shots: dict[int, dict[str, dict[int, list]]] = defaultdict(
                lambda: defaultdict(lambda: defaultdict(list)))
            for r in rows:
                tp, m = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
                for op, name in VIDUR_OPS.items():
                    v = r.get(f"time_stats.{op}.median", "")
                    if v:
                        shots[tp][name][m].append(1000 * float(v))
            r0 = rows[0]
            heads, kv = int(r0["n_head"]), int(r0["n_kv_head"])
            hidden, inter = int(r0["n_embd"]), int(r0["n_expanded_embd"])
            vocab = int(r0["vocab_size"])
            tps = sorted(shots)
            folder = out / "profiler" / "perf" / label / model / "fp16"
            for tp in tps:
                write_csv(folder / f"tp{tp}" / "dense.csv", ("layer", "tokens", "time_us"),
                          [(name, m, us(statistics.median(ts)))
                           for name, by_m in shots[tp].items() for m, ts in sorted(by_m.items())])
            write_meta(folder, {
                "gpu": device, "hardware": label, "model": model, "variant": "fp16",
                "architecture": "llama", "dtype": "float16",
                "source": f"Vidur {src} at {VIDUR_COMMIT[:7]} (MIT), converted by "
                          "bench/convert_peer_tables.py",
                "timed": "Vidur's profiler: sarathi's kernels (vLLM's RMSNorm, SiluAndMul, "
                         "rotary), CUDA kernel time per op, median of its repeats, one layer",
                "not_measured": ["final_layernorm", "lm_head", "sampler", "attention"],
                "not_measured_why": "Vidur times no final norm, lm_head or sampler in mlp.csv; "
                                    "its attention.csv files are not in the repository as "
                                    "stored",
                "tp_degrees": tps,
                "engine_effective": {"hf_overrides": {
                    "num_hidden_layers": 1,
                    **per_rank(heads, kv, inter, vocab, hidden, max(tps))}},
                "model_shapes": {"hidden_size": hidden, "num_attention_heads": heads,
                                 "num_key_value_heads": kv, "intermediate_size": inter,
                                 "vocab_size": vocab},
            })
            files[src] = {"to": str(folder.relative_to(out)), "sha256": blob_sha(data)}
    for node, (gpu, what) in VIDUR_NODES.items():
        src = f"data/profiling/network/{node}/all_reduce.csv"
        data = git_show(repo, VIDUR_COMMIT, src)
        by_n: dict[int, dict[int, float]] = defaultdict(dict)
        for r in csv.DictReader(io.StringIO(data.decode())):
            if int(r["rank"]) != 0 or r["devices_per_node"] != r["num_workers"]:
                continue   # one node's GPUs only (a100_dgx also times 2 nodes)
            by_n[int(r["num_workers"])][2 * int(r["size"])] = \
                1000 * float(r["time_stats.all_reduce.median"])
        label, device = GPU_NAMES[gpu]
        for n, samples in sorted(by_n.items()):
            doc = {"hardware": label, "spec": {"gpu_name": device},
                   "source": f"Vidur {src} at {VIDUR_COMMIT[:7]} (MIT): {what}; rank 0's "
                             "median per size; converted by bench/convert_peer_tables.py",
                   "measured": {"at": "2024 (Vidur's profiling data)", "interconnect": {
                       "npus": n, "communicator": "NCCL all_reduce in a CUDA graph (fp16)",
                       "samples": [{"collective": "all_reduce", "bytes": b,
                                    "us_graphed": round(t, 3)}
                                   for b, t in sorted(samples.items())]}}}
            path = out / "network" / node / f"tp{n}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
        files[src] = {"to": f"network/{node}/", "sha256": blob_sha(data)}
    licence = git_show(repo, VIDUR_COMMIT, "LICENSE")
    files["LICENSE"] = {"to": "LICENSE", "sha256": blob_sha(licence)}
    (out / "LICENSE").write_bytes(licence)
    return {"repository": "github.com/microsoft/vidur", "commit": VIDUR_COMMIT,
            "licence": "MIT (LICENSE, which travels with these files)",
            "converted_by": "bench/convert_peer_tables.py", "files": files}


# ---------------------------------------------------------------------------------------------
# LLMServingSim's older H100 performance models


def convert_lss(repo: Path, out: Path) -> dict:
    files = {}
    for model, tps in LSS_MODELS.items():
        shape = LSS_SHAPES[model]
        folder = out / "profiler" / "perf" / "H100" / model / "bf16"
        have = []
        for tp in tps:
            base = f"llm_profile/perf_models/H100/{model}/tp{tp}"
            data = git_show(repo, LSS_COMMIT, f"{base}/layers.csv")
            dense, seq = defaultdict(dict), {}
            for r in csv.DictReader(io.StringIO(data.decode())):
                name, m, t = r["layer_name"], int(r["input"]), float(r["latency(ns)"]) / 1000
                if name == "lm_head":
                    seq[m] = t
                else:
                    dense[LSS_SAME.get(name, f"hf_{name}")][m] = t
            write_csv(folder / f"tp{tp}" / "dense.csv", ("layer", "tokens", "time_us"),
                      [(name, m, us(t)) for name, by_m in dense.items()
                       for m, t in sorted(by_m.items())])
            write_csv(folder / f"tp{tp}" / "per_sequence.csv", ("layer", "sequences", "time_us"),
                      [("lm_head", m, us(t)) for m, t in sorted(seq.items())])
            files[f"{base}/layers.csv"] = {"to": str((folder / f"tp{tp}").relative_to(out)),
                                           "sha256": blob_sha(data)}
            try:
                att = git_show(repo, LSS_COMMIT, f"{base}/attention.csv")
            except subprocess.CalledProcessError:
                att = None
            if att is not None:
                write_csv(folder / f"tp{tp}" / ATTENTION,
                          ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"),
                          attention_rows(att))
                files[f"{base}/attention.csv"] = {
                    "to": str((folder / f"tp{tp}" / ATTENTION).relative_to(out)),
                    "sha256": blob_sha(att)}
            have.append(tp)
        family = "mixtral" if "Mixtral" in model else "llama"
        write_meta(folder, {
            "gpu": "NVIDIA H100 80GB HBM3", "hardware": "H100", "model": model,
            "variant": "bf16", "architecture": family, "dtype": "bfloat16",
            "source": f"LLMServingSim llm_profile/perf_models/H100/{model} at {LSS_COMMIT[:7]} "
                      "(MIT), converted by bench/convert_peer_tables.py",
            "timed": "Hugging Face transformers' modules with PyTorch profiler hooks (CUDA "
                     "kernel time, ns), one input of N tokens and no KV history; attention by "
                     "Vidur's attention profiler (FlashAttention)",
            "vllm_kernels": "embedding, o_proj, down_proj and lm_head (per_sequence.csv) are "
                            "the kernels vLLM runs; the other rows are LLMServingSim's names "
                            "behind hf_ "
                            "(vLLM fuses q/k/v, gate/up and the norms, rotary and SiLU that "
                            "transformers runs apart); " + ATTENTION + " (TP 4) is "
                            "FlashAttention without split-KV, which vLLM's decode does not run",
            "not_measured": ["layernorm", "qkv_proj", "rotary_emb", "gate_up_proj", "act_fn",
                             "final_layernorm", "sampler", "attention"],
            "tp_degrees": have,
            "engine_effective": {"hf_overrides": {
                "num_hidden_layers": 1, **per_rank(shape["heads"], shape["kv"], shape["inter"],
                                                   shape["vocab"], shape["hidden"], max(have))}},
            "model_shapes": {"hidden_size": shape["hidden"], "num_attention_heads": shape["heads"],
                             "num_key_value_heads": shape["kv"],
                             "intermediate_size": shape["inter"], "vocab_size": shape["vocab"]},
        })
    (out / "LICENSE").write_bytes(git_show(repo, LSS_COMMIT, "LICENSE"))
    return {"repository": "github.com/casys-kaist/LLMServingSim", "commit": LSS_COMMIT,
            "licence": "MIT (../LICENSE and LICENSE here, which travel with these files)",
            "converted_by": "bench/convert_peer_tables.py", "files": files}


def attention_rows(data: bytes) -> list[tuple]:
    """Vidur-format attention shots -> (prefill_chunk, kv_prefill, n_decode, kv_decode, us)."""
    shots: dict[tuple, list[float]] = defaultdict(list)
    for r in csv.DictReader(io.StringIO(data.decode())):
        kv = int(r["kv_cache_size"])
        if r["is_prefill"] == "True":
            chunk = int(r["prefill_chunk_size"])
            if int(r["batch_size"]) != 1:
                continue
            key, v = (chunk, kv, 0, 0), r["time_stats.attn_prefill.median"]
        else:
            key, v = (0, 0, int(r["batch_size"]), kv), r["time_stats.attn_decode.median"]
        if v:
            shots[key].append(1000 * float(v))
    return [(*key, us(statistics.median(ts))) for key, ts in sorted(shots.items())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vidur", type=Path, help="a git directory of microsoft/vidur")
    ap.add_argument("--llmservingsim", type=Path,
                    help="a git directory of casys-kaist/LLMServingSim")
    args = ap.parse_args(argv)
    peers = ROOT / "traces" / "peers"
    if args.vidur:
        out = peers / "vidur"
        doc = convert_vidur(args.vidur, out)
        (out / "source.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
    if args.llmservingsim:
        out = peers / "llmservingsim" / "at-9e3f0ec"
        doc = convert_lss(args.llmservingsim, out)
        (out / "source.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
