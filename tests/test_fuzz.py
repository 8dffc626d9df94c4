"""Bad input and faults, generated: every one ends in exit status 2 and one error line that names
the file, the field or the option, with no traceback, and leaves no output file behind
(docs/reference/robustness.md lists the promises).

A seeded generator makes CASES cases, cycling through the kinds of bad input stepgap is fed:
files that are not UTF-8, not JSON, nested too deeply, of the wrong shape or in the wrong place;
traces, model and draft configs, run results, timelines, sweep stores and tables, grid files,
profiles, measured folders and safetensors indexes with one field mistyped (a draft head's as
strictly as a target's; a profile's device_ops null or its device a "tpu"); option values that
are non-finite or absurd; requests that would fill the memory; output paths that are folders,
under a file, not writable or on a full disk (before the work, and during the write); a sweep
whose metric is not finite in any row; a figure named for a format it is not written in. Each case
runs `stepgap.cli.main` in this process. A failure names its case number and seed: the same seed
(STEPGAP_FUZZ_SEED, default 16) makes the same case again.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import random
import re
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest

from stepgap.common.formats import RequestTiming, save_result
from tests.helpers import run_result
from stepgap.cli import build_parser, main

SEED = int(os.environ.get("STEPGAP_FUZZ_SEED", "16"))
# (1,000 cases: 17-18 s on this 2-core VM; STEPGAP_FUZZ_CASES=20000 for a longer hunt)
CASES = int(os.environ.get("STEPGAP_FUZZ_CASES", "1000"))
UNWRITABLE = "/sys/stepgap-fuzz"   # read-only even for root


@dataclass
class Case:
    what: str                        # what is wrong, for the failure message
    argv: list[str]
    names: tuple[str, ...]           # the error line names one of these
    fault: Callable | None = None    # a context manager injecting a fault while it runs
    inputs: tuple = ()               # files the case reads, byte for byte unchanged after it
    digests: tuple = ()              # (taken when the case is made)

    def __post_init__(self):
        self.digests = tuple(digest(p) for p in self.inputs)


def digest(path) -> bytes | None:
    import hashlib
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).digest() if path.is_file() else None


# -------------------------------------------------------------------------------------------
# Valid inputs, which the cases break


def trace_lines() -> list[dict]:
    return [{"request_id": rid, "arrival_s": 0.0, "prompt_len": 8, "output_len": 8}
            for rid in ("a", "b", "c")]


def result_doc() -> dict:
    timings = []
    for rid in ("a", "b"):
        t = RequestTiming(rid, 8, 0.0)
        for i in range(4):
            t.add_chunk(0.01 * (i + 1), 1)
        timings.append(t)
    return run_result(timings, 0.05, backend="x", config={"mode": "sync", "k": 0},
                      gaps_us=[10.0, 20.0], detailed=True)


def model_configs() -> tuple[dict, dict]:
    from stepgap.engine.tiny import TINY_TARGET, tiny_draft_config
    return TINY_TARGET.to_hf_dict(), tiny_draft_config(TINY_TARGET).to_hf_dict()


def span_lines() -> list[dict]:
    out = []
    for step in range(3):
        t = step * 100.0
        out += [{"lane": "cpu.engine", "op": "schedule", "step": step, "start_us": t,
                 "end_us": t + 10, "args": {}},
                {"lane": "device", "op": "target_forward", "step": step, "start_us": t + 20,
                 "end_us": t + 80, "args": {}}]
    return out


def profile_doc() -> dict:
    return {"format": "stepgap-profile/1",
            "device_ops": [{"op": "d2h", "i": None, "k": 0, "coef": [5.0, 0, 0, 0], "n": 3}],
            "cpu": {"schedule": [10.0, 1.0, 0.0]}}


def table_doc() -> dict:
    from stepgap.sim.sweep_table import COLUMNS, TEXT_COLUMNS
    rows = [{"k": k, "max_concurrency": c, **{m: 1.0 for m in COLUMNS},
             **{m: "sync" for m in TEXT_COLUMNS}, "cell": f"{k}{c}"}
            for k in (0, 1) for c in (1, 2)]
    return {"preset": None, "base": {}, "axes": {"k": [0, 1], "max_concurrency": [1, 2]},
            "columns": ["k", "max_concurrency", *COLUMNS, "cell"], "rows": rows}


def store_lines() -> list[dict]:
    return [{"cell": f"c{i}", "values": {"k": i}, "metrics": {"mean_tpot_ms": 1.0 + i}}
            for i in range(3)]


def manifest_doc() -> dict:
    return {"format": "stepgap-measured/1",
            "sim": {"gpu": "cpu", "model": "models/target", "draft": "eagle3",
                    "executor": "process", "device": "cpu"},
            "cells": [{"mode": "sync", "k": 0, "max_concurrency": 1,
                       "runs": "runs/sync-k0-c1.json.gz"}]}


GRID_TOML = 'preset = "seed-l20"\n[base]\nnum_prompts = 2\n[grid]\nk = "0..1"\n'
VLLM_DATA = Path(__file__).parent / "data" / "vllm"


def bench_doc() -> dict:
    """A `vllm bench serve --save-result --save-detailed` file (tests/data/vllm, real vLLM)."""
    return json.loads((VLLM_DATA / "bench.json").read_text())


def vllm_trace_doc() -> dict:
    """The smallest worker trace of a vLLM server that ingests: two steps, their forwards."""
    events = []
    for step in range(2):
        t = 1000.0 * step
        events += [{"ph": "X", "cat": "user_annotation", "ts": t, "dur": 400.0,
                    "name": "execute_context_1(8)_generation_0(0)"},
                   {"ph": "X", "cat": "user_annotation", "ts": t + 10, "dur": 300.0,
                    "name": "gpu_model_runner: forward"},
                   {"ph": "X", "cat": "cpu_op", "ts": t + 20, "dur": 50.0, "name": "aten::mm",
                    "args": {}}]
    return {"vllm_version": "0.32.0", "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "VLLM::Worker"}},
        *events]}


def hook_lines() -> list[dict]:
    """stepgap_hooks spans of the engine core around that trace's steps."""
    return [{"lane": "cpu.engine", "op": op, "start_us": 1000.0 * step + t0,
             "end_us": 1000.0 * step + t1, "args": {"tokens": 8}}
            for step in range(2) for op, t0, t1 in (("schedule", -60, -20),
                                                     ("update_from_output", 420, 450))]


def scrape_text() -> str:
    """A /metrics scrape of a vLLM server with speculative decoding (real vLLM)."""
    return (VLLM_DATA / "bench.after.txt").read_text()


def write_json(path: Path, doc, indent=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(path, json.dumps(doc, indent=indent).encode()))
    return path


def encode(path: Path, data: bytes) -> bytes:
    import gzip
    return gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data


def write_lines(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@dataclass
class Base:
    root: Path
    trace: Path = field(init=False)
    target: Path = field(init=False)
    draft: Path = field(init=False)
    result: Path = field(init=False)

    def __post_init__(self):
        self.trace = write_lines(self.root / "trace.jsonl", trace_lines())
        target, draft = model_configs()
        self.target = write_json(self.root / "target" / "config.json", target).parent
        self.draft = write_json(self.root / "draft" / "config.json", draft).parent
        self.result = self.root / "result.json"
        save_result(self.result, result_doc())


# -------------------------------------------------------------------------------------------
# The files a command reads, each with its valid content and the command that reads it


def sim_args(base: Base, out: Path) -> list[str]:
    return ["--trace", str(base.trace), "--num-prompts", "2", "--quiet",
            "--result-json", str(out / "r.json")]


def run_args(base: Base, out: Path, random_weights: bool = True) -> list[str]:
    """`stepgap run`'s tail: the config folders here hold no weights."""
    return ["--trace", str(base.trace), "--num-prompts", "2", "--output-len", "4", "--quiet",
            *(["--random-weights"] if random_weights else []),
            "--result-json", str(out / "r.json")]


def measured_folder(d: Path, base: Base, manifest=None, runs=None) -> Path:
    folder = d / "measured"
    write_json(folder / "manifest.json", manifest_doc() if manifest is None else manifest)
    write_json(folder / "models" / "target" / "config.json", model_configs()[0])
    write_json(folder / "runs" / "sync-k0-c1.json.gz", [result_doc()] if runs is None else runs)
    return folder


# name -> (the file's path in the case's folder, valid content (bytes), argv(path, out, base))
def file_kinds(base: Base) -> dict:
    target, draft = model_configs()
    lines = lambda docs: "".join(json.dumps(x) + "\n" for x in docs).encode()  # noqa: E731
    return {
        "trace": ("t.jsonl", lines(trace_lines()),
                  lambda p, out: ["simulate", *sim_args(base, out)[2:], "--trace", str(p)]),
        "trace (run)": ("t.jsonl", lines(trace_lines()),
                        lambda p, out: ["run", "--model", "tiny", *run_args(base, out)[2:],
                                        "--trace", str(p)]),
        "grid file": ("g.json", json.dumps({"preset": "seed-l20", "grid": {"k": "0..1"}}).encode(),
                      lambda p, out: ["sweep", "--grid-file", str(p), "--jobs", "1",
                                      "--out", str(out / "sw"), "--quiet"]),
        "grid file (toml)": ("g.toml", GRID_TOML.encode(),
                             lambda p, out: ["sweep", "--grid-file", str(p), "--jobs", "1",
                                             "--out", str(out / "sw"), "--quiet"]),
        "profile": ("p.json", json.dumps(profile_doc()).encode(),
                    lambda p, out: ["simulate", "--profile", str(p), *sim_args(base, out)]),
        "demo profile": ("p.json", json.dumps(profile_doc()).encode(),
                         lambda p, out: ["demo", "--profile", str(p), "--quiet"]),
        "sweep store": ("sw/cells.jsonl", lines(store_lines()),
                        lambda p, out: ["sweep", "--set", f"workload={base.trace}", "--set",
                                        "num_prompts=2", "--grid", "k=0,1", "--jobs", "1",
                                        "--out", str(p.parent), "--quiet"]),
        "sweep table": ("tb/sweep.json", json.dumps(table_doc()).encode(),
                        lambda p, out: ["plot", "sweep", str(p.parent), "--out",
                                        str(out / "plots"), "--quiet"]),
        "timeline": ("tl.jsonl", lines(span_lines()),
                     lambda p, out: ["plot", "timeline", str(p), "--out", str(out / "t.png"),
                                     "--quiet"]),
        "target config": ("m/config.json", json.dumps(target).encode(),
                          lambda p, out: ["simulate", "--model", str(p.parent),
                                          *sim_args(base, out)]),
        "target config (run)": ("m/config.json", json.dumps(target).encode(),
                                lambda p, out: ["run", "--model", str(p.parent),
                                                *run_args(base, out)]),
        "draft config": ("h/config.json", json.dumps(draft).encode(),
                         lambda p, out: ["simulate", "--model", str(base.target), "--draft",
                                         str(p.parent), "-k", "2", *sim_args(base, out)]),
        "draft config (run)": ("h/config.json", json.dumps(draft).encode(),
                               lambda p, out: ["run", "--model", str(base.target), "--draft",
                                               str(p.parent), "-k", "2", *run_args(base, out)]),
        "run result": ("r.json", json.dumps(result_doc()).encode(),
                       lambda p, out: ["compare", str(p), str(base.result)]),
        "measured manifest": ("measured/manifest.json", json.dumps(manifest_doc()).encode(),
                              lambda p, out: ["validate", "--from-measured", str(p.parent),
                                              "--out", str(out / "v"), "--quiet"]),
        "measured runs": ("measured/runs/sync-k0-c1.json.gz", json.dumps([result_doc()]).encode(),
                          lambda p, out: ["validate", "--from-measured", str(p.parents[1]),
                                          "--out", str(out / "v"), "--quiet"]),
        "vllm bench": ("vb.json", json.dumps(bench_doc()).encode(),
                       lambda p, out: ["ingest", "vllm-bench", str(p), "--out",
                                       str(out / "r.json")]),
        "vllm bench (simulate)": ("vb.json", json.dumps(bench_doc()).encode(),
                                  lambda p, out: ["simulate", *sim_args(base, out)[2:],
                                                  "--trace", str(p)]),
        "vllm trace": ("w.pt.trace.json.gz", json.dumps(vllm_trace_doc()).encode(),
                       lambda p, out: ["ingest", "vllm-profile", str(p), "--out",
                                       str(out / "tl.jsonl")]),
        "vllm trace (.json)": ("w.json", json.dumps(vllm_trace_doc()).encode(),
                               lambda p, out: ["ingest", "vllm-profile", str(p), "--out",
                                               str(out / "tl.jsonl")]),
        "vllm hooks": ("h/1.jsonl", lines(hook_lines()),
                       lambda p, out: ["ingest", "vllm-profile", str(vllm_trace(p.parents[1])),
                                       str(p), "--out", str(out / "tl.jsonl")]),
        "vllm scrape": ("after.txt", scrape_text().encode(),
                        lambda p, out: ["ingest", "vllm-metrics", str(p), "--out",
                                        str(out / "acc.json")]),
    }


def prepare(kind: str, d: Path, base: Base) -> None:
    """What a kind's file needs beside it."""
    if kind.startswith("measured"):
        measured_folder(d, base)


def vllm_trace(d: Path) -> Path:
    return write_json(d / "vllm" / "w.pt.trace.json.gz", vllm_trace_doc())


# -------------------------------------------------------------------------------------------
# Generators, one per kind of bad input


# A number of a JSON (or TOML) file: after a colon, comma, bracket or equals sign.
LONG_AT = re.compile(rb"(?:(?<=[:,\[] )|(?<=[:,\[])|(?<== ))\d+(?![\d.eE])")


def deep(n: int = 100_000) -> bytes:
    return b"[" * n + b"]" * n


def broken_file(rng: random.Random, d: Path, base: Base) -> Case:
    """Encoding and structure: not UTF-8, not JSON, nested too deeply, the wrong shape, empty,
    a folder, missing."""
    kinds = file_kinds(base)
    kind = rng.choice(sorted(kinds))
    name, valid, argv = kinds[kind]
    prepare(kind, d, base)
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    toml = name.endswith(".toml")
    how = rng.choice(["not utf-8", "nested", "garbage", "shape", "empty", "folder", "missing",
                      "long integer"])
    if how == "long integer" and not LONG_AT.search(valid):
        how = "garbage"   # (a Prometheus scrape holds no integer that is a JSON number)
    if how == "long integer":   # one of its numbers past Python's 4,300 digits
        at = rng.choice(list(LONG_AT.finditer(valid)))
        data = valid[:at.start()] + b"9" * rng.choice([4301, 5000, 100_000]) + valid[at.end():]
    elif how == "not utf-8":
        at = rng.randrange(len(valid))
        data = valid[:at] + bytes([rng.choice([0xff, 0xfe, 0xc3, 0x80])]) + b"\xff" + valid[at:]
    elif how == "nested":
        data = b"a = " + deep() if toml else deep() + (b"\n" + valid if name.endswith("l")
                                                       else b"")
    elif how == "garbage":
        data = b"@" + rng.choice([b"{", b"[", b"x = ", b"\"unterminated"]) + b"\n" + valid
    elif how == "shape":
        data = b"grid = 5\n" if toml else (b'[1, "x"]\n' if not name.endswith("l") else
                                           b'["not", "an", "object"]\n' + valid)
    elif how == "empty":
        data = b""
    if kind == "sweep store" and how in ("empty", "missing"):   # a store of no finished cells
        how, data = "garbage", b"@\n" + valid
    if kind == "vllm hooks" and how == "empty":   # a process that recorded no span
        how, data = "garbage", b"@\n" + valid
    if how in ("folder", "missing"):
        path.unlink(missing_ok=True)   # prepare() may have written it
        if how == "folder":
            (path / "inside").mkdir(parents=True)
    else:
        path.write_bytes(encode(path, data))
    names = (str(path), str(path.parent)) if how in ("missing", "folder") else (str(path),)
    return Case(f"{kind} file {how}", argv(path, d / "out"), names)


def mistyped(doc: dict, rng: random.Random, table: dict) -> tuple[str, object]:
    key = rng.choice(sorted(table))
    value = rng.choice(table[key])
    if value is DELETE:
        doc.pop(key, None)
    else:
        doc[key] = value
    return key, value


def mistyped_line(lines: list, rng: random.Random, table: dict, path: Path):
    """One line of a JSON-lines file with one field mistyped (as `mistyped`), written to path:
    the line's number (from 1), the key, the value and the path."""
    n = rng.randrange(len(lines))
    key, value = mistyped(lines[n], rng, table)
    return n + 1, key, value, write_lines(path, lines)


DELETE = object()
BAD_TRACE = {
    "request_id": ["", None, [1], 1.5, True, {}],
    "arrival_s": [-1, 1e12, 1e308, float("nan"), float("inf"), "0", None, True, [0]],
    "prompt_len": [0, -1, 1.5, "8", None, True, 1e9],
    "output_len": [0, -3, 2.5, "8", None, False],
    "prompt_token_ids": [[1, 2], "x", [1, -1, 2, 3, 4, 5, 6, 7], [0.5] * 8, 5],
    "accepted": ["x", [-1], [1.5], 3, [None]],
    "category": [5, [], {}],
}
BAD_TARGET = {
    "hidden_size": ["64", 64.5, 0, -64, True, None],
    "num_hidden_layers": [0, "4", 4.0, None],
    "num_attention_heads": [0, "4", 4.5],
    "num_key_value_heads": [3, 0, "2"],
    "head_dim": ["abc", 16.5, -8, 15, True],
    "intermediate_size": [0, "128", 1e3],
    "vocab_size": [0, "512", 512.5],
    "rope_theta": [0, -1, "x", float("inf"), True],
    "rms_norm_eps": [0, -1e-5, "x", float("nan")],
    "max_position_embeddings": [0, "4096", 4096.5],
    "rope_scaling": ["llama3", [1], {"rope_type": "yarn", "factor": 2.0},
                     {"rope_type": "llama3", "factor": "x", "low_freq_factor": 1,
                      "high_freq_factor": 4, "original_max_position_embeddings": 64},
                     {"rope_type": "llama3", "factor": 4.0},
                     {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 4,
                      "high_freq_factor": 1, "original_max_position_embeddings": 64},
                     {"rope_type": "linear"}, {"type": "linear", "factor": -2}],
    "tie_word_embeddings": ["false", "true", 1, 0],
    "architectures": [5, "LlamaForCausalLM", [1], {}],
    "model_type": ["mistral", 5, ["llama"]],   # (qwen3 etc. are simulator-only: BAD_FAMILY)
    "torch_dtype": [5, ["bfloat16"]],
    "bos_token_id": [-1, "1", 1.5, 512, 100000],   # (the tiny target's vocabulary: 512)
    "eos_token_id": [[1, "2"], "2", -2, 512, [2, 512]],
    "hidden_act": ["gelu", "relu", 5, ["silu"]],   # the engine computes SiLU
    "attention_bias": [True, "false", 1],          # ... and has no biases
    "mlp_bias": [True, "true"],
}
BAD_DRAFT = {
    "draft_vocab_size": ["abc", 2048.7, 0, -1, 100000],
    "target_hidden_size": [0, "64", 65.5, 32],
    "eagle_aux_hidden_state_layer_ids": [[1, 2], [1, 2, "3"], "1,2,3", [1, 2, -3], [1, 2, 99]],
    "norm_before_residual": ["false", 1],
    "head_dim": ["abc", 16.5, -8],
    "architectures": [5, "LlamaForCausalLMEagle3", [None]],
    "rope_scaling": [{"rope_type": "llama3", "factor": 4.0}, "x"],
    "num_key_value_heads": [3, 0],
    "hidden_size": [0, "64"],
    # as strictly as the target's: one layer, a Llama layer as the engine builds it, its own
    # lm_head, token ids in the vocabulary
    "num_hidden_layers": [2, 0, "1", 1.0],
    "tie_word_embeddings": ["false", True, 1],
    "hidden_act": ["gelu", 5],
    "attention_bias": [True, "no"],
    "mlp_bias": [True],
    "model_type": ["qwen3", 5],
    "torch_dtype": [5],
    "bos_token_id": [512, -1, "1"],
    "eos_token_id": [512, [2, 100000], "2"],
}
# The simulator's other families (common/model_families.py FAMILIES), each from its preset's
# config.json fields (HF_PRESETS) with one field broken; the simulator only (the engine builds
# Llama targets). FAMILY_ARGS: what the preset needs to fit in memory.
FAMILY_PRESETS = {"qwen3_moe": "qwen3-30b-a3b", "gpt_oss": "gpt-oss-20b",
                  "deepseek_v3": "deepseek-v3"}
FAMILY_ARGS = {"deepseek_v3": ["--tensor-parallel-size", "8", "--gpu", "h200"]}
BAD_FAMILY = {
    "qwen3_moe": {
        "num_experts": [0, "128", 12.5, None, True],
        "num_experts_per_tok": [0, 129, "8", None],
        "moe_intermediate_size": [0, "768", None],
        "decoder_sparse_step": [0, "1", 49],
        "mlp_only_layers": ["x", [1, "2"], [-1], [True], list(range(48))],
        "use_sliding_window": [True, "false", 1],
        "quantization_config": [5, "fp8", {"quant_method": "awq"}, {"quant_method": "mxfp4"}],
        "rope_scaling": [{"rope_type": [1]}, {"rope_type": "linear", "factor": 0}],
    },
    "gpt_oss": {
        "num_local_experts": [0, "32", None],
        "num_experts_per_tok": [0, 33, "4"],
        "layer_types": ["x", ["sliding_attention"] * 3, [["x"]] * 24, ["local"] * 24, None],
        "sliding_window": [0, "128", None, 1.5],
        "head_dim": [None, 15, "64", 0],
        "quantization_config": [{"quant_method": "gptq"}, ["mxfp4"]],
        "rope_scaling": [{"rope_type": "yarn"}, {"rope_type": "yarn", "factor": -1}, "yarn"],
    },
    "deepseek_v3": {
        "kv_lora_rank": [0, "512", None],
        "q_lora_rank": [-1, "x", 1.5],
        "qk_nope_head_dim": [0, None],
        "qk_rope_head_dim": [0, None, "64"],
        "v_head_dim": ["128", 0],
        "n_routed_experts": [0, None],
        "n_shared_experts": [-1, "1", 1.5],
        "first_k_dense_replace": [61, -1, "3", 1.5],
        "moe_layer_freq": [2, "1"],
        "num_nextn_predict_layers": [-1, "1"],
        "quantization_config": [{"quant_method": "mxfp4"}, [1], {"quant_method": None}],
        "num_key_value_heads": [3],
    },
}
# Values of those fields the real configs use besides the presets' (DeepSeek-V2-Lite has no
# q_lora_rank; gpt-oss's own config.json also spells top-k experts_per_token).
# Each variant: the fields it changes.
ACCEPTED_FAMILY = {
    "qwen3_moe": [{"mlp_only_layers": None}, {"decoder_sparse_step": 2, "mlp_only_layers": [0]},
                  {"use_sliding_window": None}],
    "gpt_oss": [{"num_experts_per_tok": DELETE, "experts_per_token": 4},
                {"layer_types": ["full_attention"] * 24}],
    "deepseek_v3": [{"q_lora_rank": None}, {"first_k_dense_replace": 0},
                    {"num_nextn_predict_layers": 0, "n_shared_experts": None}],
}


def family_config(family: str) -> dict:
    from stepgap.common.model_presets import HF_PRESETS
    return json.loads(json.dumps(HF_PRESETS[FAMILY_PRESETS[family]]))


BAD_RESULT = {
    "completed": ["2", -1, None, [2], True],
    "duration": ["0.05", None, {}],
    "mean_tpot_ms": ["1.0", None, [1.0], True],
    "p99_itl_ms": ["x", {}],
    "step_gaps": [[10.0, 20.0], "x", 5, {"mean_us": "x"}, {"values_us": ["x"]}],
    "config": [[1], "x", 5],
    "spec_decode": ["x", [1]],
    "mean_itl_ms": [DELETE],
}
BAD_SPAN = {
    "end_us": [float("inf"), "x", None, -1e9, float("nan"), True],
    "start_us": [float("-inf"), "0", None],
    "step": [-2, 1.5, "3", None, True],
    "lane": ["gpu", 5, None],
    "op": [5, "", None, []],
    "args": [[1], "x", 5],
}
BAD_STORE = {
    "metrics": [None, "x", [1], 5, {"mean_tpot_ms": "1.0"}, {"a": [1]},
                {"simulated_mode": "fast"}, {"simulated_mode": 1.0}],
    "cell": [5, None, [1]],
}
BAD_PROFILE = {
    "device_ops": ["x", 5, [5], [{"op": "warp", "coef": [1, 0, 0, 0]}],
                   [{"op": "d2h", "coef": [1, 0]}], [{"op": "d2h", "coef": ["x", 0, 0, 0]}],
                   [{"op": "d2h", "coef": [float("inf"), 0, 0, 0]}],
                   [{"op": "d2h", "coef": [1, 0, 0, 0], "k": "x"}],
                   None, {}, DELETE],   # null or missing is not "no fits": [] says that
    "cpu": ["x", [1], {"schedule": ["x"]}, {"schedule": [float("nan")]}, {"bogus": [1]},
            {"wake_us": -1}, {"schedule": [1, 2, 3, 4]}],
    "jitter": ["x", {"trace": [1], "run_log_factors": [0], "bin_ms": 0, "sigma_step": 0},
               {"trace": ["x"], "run_log_factors": [0], "bin_ms": 1, "sigma_step": 0}],
    "cpu_by_k": ["x", {"x": {}}, {"2": {"schedule": "x"}}],
    "topology": [5, "x", [], {"device": "tpu"}, {"device": 5}, {"device": "CUDA"},
                 {"executor": "threads"}],
    "device": ["tpu", 5, "", ["cpu"]],
    "format": ["stepgap-profile/0", 5, DELETE],
}
BAD_TABLE = {
    "axes": ["x", [1], {"k": 5}, None],
    "rows": ["x", {"a": 1}, [5]],
    "base": [5, "x"],
    "row": [{"mean_tpot_ms": "1.0"}, {"p99_tpot_ms": [1]}, {"mean_itl_ms": True},
            {"simulated_mode": 5}, {"simulated_mode": "nan"}],
}
BAD_MANIFEST = {
    "format": ["stepgap-measured/0", 5, DELETE],
    "sim": [5, "x", None],
    "cells": [[], "x", [5], [{"mode": "sync"}], [{"mode": "sync", "k": "0", "runs": "x"}],
              [{"mode": "sync", "k": 0, "runs": "runs/none.json.gz"}]],
}
BAD_RUNS = [{"x": 1}, [5], ["x"], [{**result_doc(), "mean_tpot_ms": "1.0"}],
            [{**result_doc(), "step_gaps": [1]}], {"a": [result_doc()]}]
BAD_GRID = {
    "grid": ["x", 5, {}, {"k": []}, {"k": "0..x"}, {"k": "5..1"}, {"nope": "1,2"},
             {"k": "0..100000"}, {"k": [1, 1]}, {"k": "1,1"}, {"max_concurrency": "1..8:x1"}],
    "base": [5, "x", {"nope": 1}, {"max_num_seqs": "x"}, {"output_latency_ms": 1e308},
             {"cpu_costs": {"schedule": ["x"]}}, {"num_prompts": 10 ** 9},
             {"max_concurrency": 0},
             {"mode": "fast"}, {"model": 5}, {"jitter": "yes"}],
    "preset": [5, "nope", ["seed-l20"]],
    "extra": [{"x": 1}],
}
BAD_INDEX = [{"weight_map": {"a.weight": ["model.safetensors"]}}, {"weight_map": ["x"]},
             {"weight_map": {"a.weight": "/etc/passwd"}}, {"weight_map": {"a.weight": "../x"}},
             {"weight_map": {"a.weight": 5}}, {}, [1]]


BAD_BENCH = {
    "completed": ["8", -1, 9, 7, None, True, 8.5],
    "num_prompts": [0, "8", None, 8.0],
    "duration": [float("nan"), float("inf"), -1.0, 0, "0.46", None],
    "mean_tpot_ms": ["x", float("nan"), -1, None],
    "date": ["yesterday", 20261201, "20261399-103126"],
    "backend": [5, ""],
    "request_rate": ["x", -1, 0, float("nan")],
    "burstiness": [0, "1", float("inf")],
    "max_concurrency": [0, "4", 4.5],
    "num_speculative_tokens": ["x", "-1", 2.5],
    "mode": ["fast", 5],
    "input_lens": ["x", None, [100] * 7, [100] * 9, [100, "8", 1, 1, 1, 1, 1, 1],
                   [-1] * 8, [100.5] * 8],
    "output_lens": [[0] * 8, [-5] * 8, None, [8] * 3, ["8"] * 8],
    "ttfts": [None, "x", [0.1], [float("nan")] * 8, [-0.1] * 8, [[0.1]] * 8],
    "itls": ["abc", [[0.01]], [None] * 8, [[float("inf")]] * 8, [[-0.01]] * 8, [["x"]] * 8],
    "errors": ["x", [5] * 8, [""] * 7, ["boom"] + [""] * 7],
    "spec_decode_num_drafts": [-1, "287", 1.5],
    "spec_decode_acceptance_rate": [150.0, "x", float("nan")],
    "spec_decode_acceptance_length": [0.5, None],
    "spec_decode_per_position_acceptance_rates": ["x", [1.5], [float("nan")], [-0.1]],
}
BAD_HOOK = {
    "start_us": [float("nan"), "x", None, float("-inf"), True],
    "end_us": [float("nan"), -1e9, None, "1"],
    "op": [None, "", 5, []],
    "lane": ["gpu", None, 5],
    "args": [[1], "x", 5],
}
BAD_EVENT = {
    "ts": [float("nan"), "12", None, float("inf"), True],
    "dur": [-5.0, float("nan"), None, "1", float("inf")],
    "name": [None, "", 5],
    "args": [[1], "x"],
}


def broken_scrape(text: str, rng: random.Random) -> tuple[str, str]:
    """(what, the scrape with one counter broken)."""
    drafts = re.compile(r"^(vllm:spec_decode_num_drafts_total\{[^}]*\}) \S+$", re.M)
    how = rng.choice(["NaN", "+Inf", "-Inf", "-5.0", "no per-position", "position 999999999",
                      "position -1", "position x", "a gap in positions", "a rate above 1"])
    if how in ("NaN", "+Inf", "-Inf", "-5.0"):
        return f"num_drafts {how}", drafts.sub(rf"\1 {how}", text)
    if how == "no per-position":
        return how, "".join(x + "\n" for x in text.splitlines() if "per_pos" not in x)
    if how == "a rate above 1":
        return how, drafts.sub(r"\1 1.0", text)
    if how == "a gap in positions":
        return how, text.replace('position="0"', 'position="7"')
    return how, text.replace('position="1"', f'position="{how.split()[1]}"')


def mistyped_field(rng: random.Random, d: Path, base: Base) -> Case:
    """One field of a valid file set to a value of the wrong type or out of range."""
    out = d / "out"
    which = rng.choice(["trace", "trace (run)", "target", "target (run)", "draft",
                        "draft (run)", "family", "result", "span", "store", "profile", "table",
                        "manifest", "runs", "grid", "index", "vllm bench", "vllm bench",
                        "vllm hooks", "vllm trace event", "vllm scrape"])
    if which.startswith("vllm"):
        return mistyped_vllm(which, rng, d, base)
    if which.startswith("trace"):
        lines = trace_lines()
        n = rng.randrange(len(lines))
        key, value = mistyped(lines[n], rng, BAD_TRACE)
        path = write_lines(d / "t.jsonl", lines)
        argv = ["simulate", *sim_args(base, out)[2:]] if which == "trace" else \
            ["run", "--model", "tiny", *run_args(base, out)[2:]]
        return Case(f"{which} line {n + 1} {key}={value!r}", argv + ["--trace", str(path)],
                    (f"{path}:{n + 1}",))
    if which.startswith("target") or which.startswith("draft"):
        target, draft = model_configs()
        doc = target if which.startswith("target") else draft
        key, value = mistyped(doc, rng, BAD_TARGET if doc is target else BAD_DRAFT)
        path = write_json(d / "m" / "config.json", doc)
        tail = sim_args(base, out) if "(run)" not in which else run_args(base, out)
        command = "run" if "(run)" in which else "simulate"
        if doc is target:
            argv = [command, "--model", str(path.parent), *tail]
        else:
            argv = [command, "--model", str(base.target), "--draft", str(path.parent), "-k", "2",
                    *tail]
        return Case(f"{which} config {key}={value!r}", argv, (str(path), str(path.parent)))
    if which == "family":
        family = rng.choice(sorted(BAD_FAMILY))
        doc = family_config(family)
        key, value = mistyped(doc, rng, BAD_FAMILY[family])
        path = write_json(d / "m" / "config.json", doc)
        return Case(f"{family} config {key}={value!r}",
                    ["simulate", "--model", str(path.parent), *FAMILY_ARGS.get(family, []),
                     *sim_args(base, out)], (str(path), str(path.parent)))
    if which == "result":
        doc = result_doc()
        key, value = mistyped(doc, rng, BAD_RESULT)
        path = write_json(d / "r.json", doc)
        first = rng.random() < 0.5
        argv = ["compare", str(path), str(base.result)] if first else \
            ["compare", str(base.result), str(path)]
        return Case(f"run result {key}={value!r}", argv, (str(path),))
    if which == "span":
        n, key, value, path = mistyped_line(span_lines(), rng, BAD_SPAN, d / "tl.jsonl")
        return Case(f"timeline line {n} {key}={value!r}",
                    ["plot", "timeline", str(path), "--out", str(out / "t.png"), "--quiet"],
                    (f"{path}:{n}",))
    if which == "store":
        n, key, value, path = mistyped_line(store_lines(), rng, BAD_STORE,
                                            d / "sw" / "cells.jsonl")
        return Case(f"sweep store line {n} {key}={value!r}",
                    ["sweep", "--set", f"workload={base.trace}", "--set", "num_prompts=2",
                     "--grid", "k=0,1", "--jobs", "1", "--out", str(path.parent), "--quiet"],
                    (f"{path}:{n}",))
    if which == "profile":
        doc = profile_doc()
        key, value = mistyped(doc, rng, BAD_PROFILE)
        path = write_json(d / "p.json", doc)
        return Case(f"profile {key}={value!r}",
                    ["simulate", "--profile", str(path), *sim_args(base, out)], (str(path),))
    if which == "table":
        doc = table_doc()
        key, value = mistyped(doc, rng, BAD_TABLE)
        if key == "row":
            doc.pop("row")
            doc["rows"][rng.randrange(len(doc["rows"]))].update(value)
        path = write_json(d / "tb" / "sweep.json", doc)
        return Case(f"sweep table {key}={value!r}",
                    ["plot", "sweep", str(path.parent), "--out", str(out / "plots"), "--quiet"],
                    (str(path),))
    if which == "manifest":
        doc = manifest_doc()
        key, value = mistyped(doc, rng, BAD_MANIFEST)
        folder = measured_folder(d, base, manifest=doc)
        return Case(f"measured manifest {key}={value!r}",
                    ["validate", "--from-measured", str(folder), "--out", str(out / "v"),
                     "--quiet"], (str(folder),))
    if which == "runs":
        runs = rng.choice(BAD_RUNS)
        folder = measured_folder(d, base, runs=runs)
        return Case(f"measured runs {str(runs)[:60]}",
                    ["validate", "--from-measured", str(folder), "--out", str(out / "v"),
                     "--quiet"], (str(folder / "runs"),))
    if which == "grid":
        doc = {"preset": "seed-l20", "base": {"num_prompts": 2}, "grid": {"k": "0..1"}}
        key, value = mistyped(doc, rng, BAD_GRID)
        path = write_json(d / "g.json", doc)
        return Case(f"grid file {key}={value!r}",
                    ["sweep", "--grid-file", str(path), "--jobs", "1", "--out", str(out / "sw"),
                     "--quiet"], (str(path), "grid", "--num-speculative-tokens", "--mode"))
    index = rng.choice(BAD_INDEX)
    folder = write_json(d / "m" / "config.json", model_configs()[0]).parent
    path = write_json(folder / "model.safetensors.index.json", index)
    return Case(f"safetensors index {index!r}", ["run", "--model", str(folder),
                                                 *run_args(base, out, False)], (str(path),))


def mistyped_vllm(which: str, rng: random.Random, d: Path, base: Base) -> Case:
    """One field of a vLLM file broken: a bench file (read by ingest and simulate --trace), a
    hook span, a worker trace's event, a scrape's counter."""
    out = d / "out"
    if which == "vllm bench":
        doc = bench_doc()
        key, value = mistyped(doc, rng, BAD_BENCH)
        path = write_json(d / "vb.json", doc)
        argv = ["ingest", "vllm-bench", str(path), "--out", str(out / "r.json"), "--trace-out",
                str(out / "t.jsonl")] if rng.random() < 0.6 else \
            ["simulate", *sim_args(base, out)[2:], "--trace", str(path)]
        names = (f"{path}: field '{key}",) + ((f"{path}: field 'completed'",)
                                              if key == "errors" else ())
        return Case(f"vllm bench {key}={str(value)[:40]}", argv, names)
    if which == "vllm hooks":
        n, key, value, path = mistyped_line(hook_lines(), rng, BAD_HOOK, d / "h" / "1.jsonl")
        return Case(f"hook line {n} {key}={value!r}",
                    ["ingest", "vllm-profile", str(vllm_trace(d)), str(path), "--out",
                     str(out / "tl.jsonl")], (f"{path}:{n}",))
    if which == "vllm trace event":
        doc = vllm_trace_doc()
        n = rng.randrange(1, len(doc["traceEvents"]))
        key, value = mistyped(doc["traceEvents"][n], rng, BAD_EVENT)
        path = write_json(d / "w.pt.trace.json.gz", doc)
        return Case(f"trace event {n} {key}={value!r}",
                    ["ingest", "vllm-profile", str(path), "--out", str(out / "tl.jsonl")],
                    (f"{path}: field 'traceEvents[{n}]",))
    what, text = broken_scrape(scrape_text(), rng)
    after = d / "after.txt"
    after.write_text(text)
    before = rng.random() < 0.5
    return Case(f"scrape {what}", ["ingest", "vllm-metrics", str(after), "--out",
                                   str(out / "acc.json"), *(["--before", str(after)] if before
                                                            else [])], (str(after),))


# option -> bad values, per command
BAD_OPTIONS = {
    "simulate": {
        "--cpu-cost": ["schedule=nan", "schedule=inf", "schedule=1e308", "schedule=-1",
                       "schedule=1,2,3,4", "nap=1", "schedule=x", "schedule"],
        "--output-latency-ms": ["1e308", "nan", "inf", "-1", "x"],
        "--launch-latency-us": ["1e308", "nan", "-0.5"], "--wake-us": ["inf", "-1"],
        "--ipc-us": ["nan", "1e12"], "--speed": ["0", "nan", "1e9", "-1"],
        "--cpu-scale": ["-1", "inf", "1e308"], "--acceptance-spread": ["-1", "nan", "1e6"],
        "--num-speculative-tokens": ["-1", "1000", "1.5", "x"],
        "--num-prompts": ["0", "-1", "1000000000", "x"],
        "--request-rate": ["0", "-1", "nan", "x"], "--burstiness": ["0", "-1", "nan"],
        "--max-model-len": ["0", "-5", "1.5"], "--block-size": ["0", "x"],
        "--max-num-seqs": ["0"], "--gpu-memory-utilization": ["0", "1.5", "nan", "-1"],
        "--metric-percentiles": ["0", "100", "nan", "x", ""],
        "--acceptance-rates": ["1.5", "nan", "0.5,0.9", "x"], "--output-len": ["0", "-1"],
        "--max-concurrency": ["0", "-1"], "--seed": ["-1", "x"],
        "--speculative-config": ['{"num_speculative_tokens": 1000}', '{"method": "medusa"}',
                                 "[1]", "{", '{"model": 5}', "[" * 100000],
        "--spec-tokens": ["-1", "1000", "x"], "--spec-method": ["medusa", "EAGLE3"],
        "--tensor-parallel-size": ["0", "9", "3", "x"],
        "--moe-routing-skew": ["-1", "nan", "1e9"], "--all-reduce-latency-us": ["1e308", "-1"],
        "--percentile-metrics": ["ttft,nope", ""],
    },
    "run": {
        "--kv-cache-gib": ["nan", "inf", "-1", "0", "x"],
        "--temperature": ["-1", "nan", "inf"], "--top-p": ["2", "0", "nan"],
        "--top-k": ["-1", "x"], "--num-gpu-blocks-override": ["0", "1000000000000"],
        "--max-model-len": ["1000000000000", "0"], "--num-speculative-tokens": ["1000", "-2"],
        "--spec-tokens": ["1000"], "--tensor-parallel-size": ["2", "0"],
        "--spec-method": ["mtp", "ngram", "medusa"],
        "--synthetic-acceptance": ["1.5", "nope", "0.5,0.9"],
        "--acceptance-spread": ["nan", "-1"],
    },
    "sweep": {
        "--set": ["k=1000", "output_latency_ms=1e308", "num_prompts=0", "k=x", "nope=1",
                  "cpu_costs=1", "speed=nan", "mode=fast", "k"],
        "--grid": ["k=0..x", "k=5..1", "request_rate=nan..2", "k=1,1", "k=", "nope=1",
                   "max_concurrency=1..100000:x1.0001", "k=0..100000"],
        "--jobs": ["0", "x"],
    },
    "demo": {"--num-prompts": ["0", "-1", "x"], "--k": ["0", "-1", "1000"],
             "--max-concurrency": ["0", "-3"]},
    # hours of work or unbounded memory, refused before anything is built
    "profile": {"--ks": ["1000", "65", "-1", "x", "2,1000"], "--repeats": ["1000000000", "0"],
                "--calibration-prompts": ["1000000000", "10001", "0"]},
    "validate": {"--ks": ["1000", "65", "-1"], "--repeats": ["1000000000", "1001", "0"],
                 "--calibration-prompts": ["1000000000", "0"], "--concurrency": ["0", "x"],
                 "--modes": ["fast"]},
}
try:
    import torch
    if not torch.cuda.is_available():   # a torch without CUDA: --device cuda is bad input
        BAD_OPTIONS["run"]["--device"] = ["cuda"]
except ImportError:
    pass


def bad_option(rng: random.Random, d: Path, base: Base) -> Case:
    """Numbers: non-finite, negative, absurd or unparsable option values."""
    out = d / "out"
    command = rng.choice(sorted(BAD_OPTIONS))
    option = rng.choice(sorted(BAD_OPTIONS[command]))
    value = rng.choice(BAD_OPTIONS[command][option])
    argv = {"simulate": ["simulate", *sim_args(base, out)],
            "run": ["run", "--model", "tiny", "--draft", "tiny-eagle3", "-k", "1",
                    *run_args(base, out)],
            "sweep": ["sweep", "--set", f"workload={base.trace}", "--set", "num_prompts=2",
                      "--grid", "max_num_seqs=1,2", "--jobs", "1", "--out", str(out / "sw"),
                      "--quiet"],
            "demo": ["demo", "--quiet"],
            "profile": ["profile", "--out", str(out / "p.json"), "--quiet"],
            "validate": ["validate", "--out", str(out / "v"), "--quiet"]}[command]
    names = {"--set": ("--set", "grid cell", "--"), "--grid": ("--grid",)}.get(option, (option,))
    if option == "--num-speculative-tokens" and command == "run":
        argv = [a for a in argv if a not in ("-k", "1")]
    return Case(f"{command} {option} {value[:40]!r}", argv + [f"{option}={value}"], names)


def too_large(rng: random.Random, d: Path, base: Base) -> Case:
    """Memory: requests and caches far larger than the machine, refused before allocating."""
    out = d / "out"
    how = rng.choice(["prompt", "output", "blocks", "model-len"])
    if how in ("prompt", "output"):
        lines = trace_lines()
        lines[rng.randrange(2)][f"{how}_len"] = rng.choice([10 ** 9, 10 ** 12, 5000])
        path = write_lines(d / "big.jsonl", lines)
        command = rng.choice(["simulate", "run"])
        argv = ["simulate", *sim_args(base, out)[2:]] if command == "simulate" else \
            ["run", "--model", "tiny", "--num-prompts", "3", "--quiet", "--result-json",
             str(out / "r.json")]
        if how == "output" and command == "run":
            argv = argv  # no --output-len: the trace's own is used
        return Case(f"{command}: {how}_len too large", argv + ["--trace", str(path)],
                    ("exceeds", "past the target's context"))
    if how == "blocks":
        return Case("run: --num-gpu-blocks-override 10**11",
                    ["run", "--model", "tiny", *run_args(base, out),
                     "--num-gpu-blocks-override", str(10 ** 11)], ("--num-gpu-blocks-override",))
    return Case("run: --max-model-len 10**11",
                ["run", "--model", "tiny", *run_args(base, out), "--max-model-len",
                 str(10 ** 11)], ("--max-model-len",))


@contextlib.contextmanager
def disk_full_now():
    """The output's disk has no space left (statvfs says so)."""
    real = os.statvfs

    def statvfs(path):
        st = real(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, st.f_files,
                                  st.f_ffree, st.f_favail, st.f_flag, st.f_namemax))
    with mock.patch("stepgap.common.fileio.os.statvfs", statvfs):
        yield


class _FillsUp:
    """A file whose disk fills up half way through the write."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self):
        return self.f.fileno()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


@contextlib.contextmanager
def disk_full_while_writing():
    real = os.fdopen
    with mock.patch("stepgap.common.fileio.os.fdopen", lambda fd, mode: _FillsUp(real(fd, mode))):
        yield


def bad_output(rng: random.Random, d: Path, base: Base) -> Case:
    """Output paths: a folder, under a file, not writable, a full disk (found before the work
    starts), and a disk that fills up during the write (no torn file left)."""
    out = d / "out"
    out.mkdir(parents=True)
    (out / "afile").write_text("x")   # out/afile is where the case's own input lives
    how = rng.choice(["folder", "under a file", "not writable", "disk full", "fills up"])
    folder_outputs = {
        "sweep": lambda p: ["sweep", "--set", f"workload={base.trace}", "--set",
                            "num_prompts=2", "--grid", "k=0,1", "--jobs", "1", "--out", p,
                            "--quiet"],
        "plot sweep": lambda p: ["plot", "sweep", str(table_folder(d)), "--out", p, "--quiet"],
        "make-tiny": lambda p: ["make-tiny", p, "--train-steps", "0"],
        "train": lambda p: ["train", p, "--preset", "smoke", "--quiet"],
        "validate": lambda p: ["validate", "--from-measured", str(measured_folder(d, base)),
                               "--out", p, "--quiet"],
    }
    file_outputs = {
        "simulate --result-json": lambda p: ["simulate", *sim_args(base, out)[:-1], p],
        "simulate --timeline": lambda p: ["simulate", *sim_args(base, out)[:-2], "--timeline",
                                          p],
        "run --result-json": lambda p: ["run", "--model", "tiny", *run_args(base, out)[:-1], p],
        "run --timeline": lambda p: ["run", "--model", "tiny", *run_args(base, out)[:-2],
                                     "--timeline", p],
        "run --chrome-trace": lambda p: ["run", "--model", "tiny", *run_args(base, out)[:-2],
                                         "--chrome-trace", p],
        "plot timeline --out": lambda p: ["plot", "timeline", str(timeline_file(d)), "--out", p,
                                          "--quiet"],
        "plot timeline --chrome": lambda p: ["plot", "timeline", str(timeline_file(d)), "--out",
                                             str(out / "t.png"), "--chrome", p, "--quiet"],
        "profile --out": lambda p: ["profile", "--out", p, "--quiet"],
        # a served run's files are written at shutdown: checked before it serves
        "serve --result-json": lambda p: ["serve", "--model", "tiny", "--result-json", p],
        "serve --timeline": lambda p: ["serve", "--model", "tiny", "--timeline", p],
    }
    png = str(out / "t.png")   # plot timeline --chrome writes its figure too, first
    if how == "fills up":   # the work runs; its write fails half way
        which = rng.choice(["simulate --result-json", "simulate --timeline",
                            "plot timeline --out", "plot timeline --chrome"])
        path = str(out / "new" / ("x.png" if which == "plot timeline --out" else "x.out"))
        return Case(f"{which}: the disk fills up while writing", file_outputs[which](path),
                    (path, png), disk_full_while_writing)
    folder = how != "under a file" and rng.random() < 0.4
    which = rng.choice(sorted(folder_outputs if folder else file_outputs))
    build = (folder_outputs if folder else file_outputs)[which]
    if how == "folder":
        path = str(out / "afile") if folder else str(out)   # the wrong kind of thing
    elif how == "under a file":
        path = str(out / "afile" / "x.json")
    elif how == "not writable":
        path = f"{UNWRITABLE}/x.json"
    else:
        path = str(out / "x.json")
    fault = disk_full_now if how == "disk full" else None
    if which.startswith("serve"):   # a check that let it through would serve forever: fail
        fault = serving_fails(fault)
    return Case(f"{which}: output {how}", build(path), (path, png), fault)


def serving_fails(inner=None):
    """A fault that makes starting an engine core an exception (the test's failure, not a
    server that never returns), around `inner`."""
    @contextlib.contextmanager
    def fault():
        def start(self):
            raise RuntimeError("the engine core was started before the outputs were checked")
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch("stepgap.engine.api_server.EngineClient.start",
                                           start))
            if inner is not None:
                stack.enter_context(inner())
            yield
    return fault


def same_or_empty_path(rng: random.Random, d: Path, base: Base) -> Case:
    """'' where a file, folder or name belongs (every command's path options), and two outputs
    of one command named alike: refused before any work, nothing written."""
    out = d / "out"
    if rng.random() < 0.5:
        paths = {   # command -> (argv, the options that take a path)
            "simulate": (["simulate", *sim_args(base, out)],
                         ["--result-json", "--timeline", "--trace", "--model", "--draft",
                          "--profile", "--acceptance", "--result-dir", "--result-filename"]),
            "run": (["run", "--model", "tiny", *run_args(base, out)],
                    ["--result-json", "--timeline", "--chrome-trace", "--trace", "--draft"]),
            "compare": (["compare", str(base.result), str(base.result)], ["--json"]),
            "sweep": (["sweep", "--set", f"workload={base.trace}", "--grid", "k=0,1", "--out",
                       str(out / "sw"), "--quiet"], ["--out", "--grid-file"]),
            "plot timeline": (["plot", "timeline", str(timeline_file(d)), "--quiet"],
                              ["--out", "--chrome"]),
            "ingest vllm-bench": (["ingest", "vllm-bench", str(VLLM_DATA / "bench.json")],
                                  ["--out", "--trace-out"]),
            "serve": (["serve", "--model", "tiny"], ["--result-json", "--timeline",
                                                     "--tokenizer", "--draft"]),
            "demo": (["demo", "--quiet"], ["--profile", "--pair"]),
        }
        command = rng.choice(sorted(paths))
        argv, options = paths[command]
        option = rng.choice(options)
        if option == "--json":   # compare's paths are its two arguments
            argv = ["compare", *rng.choice([["", str(base.result)], [str(base.result), ""]])]
            return Case("compare ''", argv, ("argument MEASURED", "argument SIMULATED"))
        return Case(f"{command} {option} ''", argv + [option, ""], (f"argument {option}",),
                    serving_fails() if command == "serve" else None)
    path = str(out / rng.choice(["x.json", "x.jsonl", "x.chrome.json", "x.trace.json"]))
    same = {
        "simulate --result-json = --timeline": ["simulate", *sim_args(base, out)[:-1], path,
                                                "--timeline", path],
        "simulate --result-json = the Chrome trace": ["simulate", *sim_args(base, out)[:-1],
                                                      str(out / "x.chrome.json"), "--timeline",
                                                      str(out / "x.jsonl")],
        "run --result-json = --chrome-trace": ["run", "--model", "tiny",
                                               *run_args(base, out)[:-1], path,
                                               "--chrome-trace", f"{out}/./{Path(path).name}"],
        "plot timeline --out = --chrome": ["plot", "timeline", str(timeline_file(d)), "--out",
                                           path, "--chrome", path, "--quiet"],
        "serve --result-json = the Chrome trace": ["serve", "--model", "tiny", "--timeline",
                                                   str(out / "t.jsonl"), "--result-json",
                                                   str(out / "t.trace.json")],
    }
    which = rng.choice(sorted(same))
    return Case(which, same[which], ("the same file as",),
                serving_fails() if which.startswith("serve") else None)


class _FullStdout(io.StringIO):
    def write(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@contextlib.contextmanager
def stdout_closed():
    """`>&-`: Python then has no sys.stdout at all."""
    with contextlib.redirect_stdout(None):
        yield


@contextlib.contextmanager
def stdout_full():
    """`> /dev/full`: every write fails for want of space."""
    with contextlib.redirect_stdout(_FullStdout()):
        yield


def stdout_fault(rng: random.Random, d: Path, base: Base) -> Case:
    """stdout closed or full while a command prints: one line, nothing written."""
    out = d / "out"
    argv = rng.choice([["compare", str(base.result), str(base.result)],
                       ["compare", str(base.result), str(base.result), "--json"],
                       ["simulate", *sim_args(base, out)[:-3], "--result-json",
                        str(out / "r.json")],
                       ["simulate", *sim_args(base, out)[:-3], "--timeline",
                        str(out / "t.jsonl")]])
    how = rng.choice([stdout_closed, stdout_full])
    return Case(f"{argv[0]} with stdout {how.__name__[7:]}", argv, ("stdout",), how)


def table_folder(d: Path) -> Path:
    return write_json(d / "tb" / "sweep.json", table_doc()).parent


def timeline_file(d: Path) -> Path:
    return write_lines(d / "tl.jsonl", span_lines())


def small_ones(rng: random.Random, d: Path, base: Base) -> Case:
    """The small ones of the issue: names the right file or option."""
    out = d / "out"
    how = rng.choice(["demo profile missing", "empty measured folder", "empty timeline",
                      "timeline without the steps", "missing trace", "missing model",
                      "accepted above k", "accepted above k (run)", "sweep metric not finite",
                      "figure of another format"])
    if how == "sweep metric not finite":   # in every row: nothing to draw
        metric = rng.choice(["mean_tpot_ms", "p99_itl_ms", "output_throughput"])
        doc = table_doc()
        for row in doc["rows"]:   # as save_result writes them, as Python's json does, or none
            row[metric] = rng.choice(["inf", "-inf", "nan", float("inf"), float("nan"), -1e400,
                                      None])
        path = write_json(d / "tb" / "sweep.json", doc)
        return Case(f"{how}: {metric}", ["plot", "sweep", str(path.parent), "--metric", metric,
                                         "--out", str(out / "plots"), "--quiet"],
                    (f"{path}: field 'rows[*].{metric}'",))
    if how == "figure of another format":   # refused before the work, not PNG bytes in x.jpg
        name = rng.choice(["t.jpg", "t", "t.png.txt", "t.svgz", "t.eps"])
        return Case(f"{how}: --out {name}", ["plot", "timeline", str(timeline_file(d)),
                                             "--out", str(out / name), "--quiet"],
                    (f"--out {out / name}",))
    if how.startswith("accepted above k"):
        lines = trace_lines()
        lines[0]["accepted"] = [1, rng.choice([3, 5, 100])]
        path = write_lines(d / "acc.jsonl", lines)
        # no --output-len: it would drop the recorded counts
        argv = ["simulate", "-k", "2"] if "run" not in how else \
            ["run", "--model", "tiny", "--draft", "tiny-eagle3", "-k", "2",
             "--synthetic-acceptance", "replay", "--random-weights"]
        return Case(how, argv + ["--trace", str(path), "--num-prompts", "2", "--quiet",
                                 "--result-json", str(out / "r.json")], ("'a'",))
    if how == "demo profile missing":
        path = str(d / "missing.json")
        return Case(how, ["demo", "--profile", path, "--quiet"], (path,))
    if how == "empty measured folder":
        (d / "EMPTY").mkdir(parents=True)
        return Case(how, ["validate", "--from-measured", str(d / "EMPTY"), "--out",
                          str(out / "v"), "--quiet"], (str(d / "EMPTY"),))
    if how == "empty timeline":
        path = write_lines(d / "e.jsonl", [])
        return Case(how, ["plot", "timeline", str(path), "--out", str(out / "t.png")],
                    (str(path),))
    if how == "timeline without the steps":
        path = timeline_file(d)
        return Case(how, ["plot", "timeline", str(path), "--steps", "50:60", "--out",
                          str(out / "t.png")], (str(path),))
    if how == "missing trace":
        path = str(d / "none.jsonl")
        return Case(how, ["simulate", *sim_args(base, out), "--trace", path], (path,))
    path = str(d / "nomodel")
    return Case(how, ["simulate", "--model", path, *sim_args(base, out)], (path,))


# ------------------------------------------------------------------------------------------- Round
# 3 (docs/reference/robustness.md): gzip bombs, workloads whose size is a product, tiny rates,
# outputs that name an input or a link that loops, a full sweep store, and the small ones


@contextlib.contextmanager
def small_gzip_limit():
    """MAX_DECOMPRESSED_BYTES at 1 MiB, so that a bomb costs the test milliseconds; the real
    limit's own case is tests/test_faults.py's."""
    with mock.patch("stepgap.common.fileio.MAX_DECOMPRESSED_BYTES", 1 << 20):
        yield


def bomb(path: Path, valid: bytes) -> Path:
    """A gzip file of `valid` and then 4 MiB of spaces, packed into a few kilobytes."""
    import gzip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(valid + b" " * (4 << 20), mtime=0))
    return path


class _StoreFillsUp:
    """The sweep store's file on a disk that fills up: a write takes part of its bytes, the
    next fails with ENOSPC (or EFBIG: `ulimit -f`)."""

    def __init__(self, f, err: int):
        self.f, self.err, self.left = f, err, 40

    def write(self, data) -> int:
        if self.left <= 0:
            raise OSError(self.err, os.strerror(self.err))
        n = self.f.write(bytes(data[:self.left]))
        self.left -= n
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)


def store_fills_up(err: int):
    @contextlib.contextmanager
    def fault():
        real = open
        with mock.patch("stepgap.sim.sweep_store.open", create=True,
                        new=lambda *a, **kw: _StoreFillsUp(real(*a, **kw), err)):
            yield
    return fault


def round3(rng: random.Random, d: Path, base: Base) -> Case:
    """The families of round 3: one line naming the file, field or option, exit 2, before any
    work, nothing written, and every input byte for byte as it was."""
    out = d / "out"
    how = rng.choice(["gzip bomb", "workload product", "tiny rate", "tiny speed", "output loop",
                      "output is an input", "store full", "cluster ''", "plot no axis",
                      "known miss", "table cells", "negative metric", "fifo"])
    if how == "gzip bomb":
        kind = rng.choice(["trace", "run result", "timeline", "measured runs"])
        if kind == "trace":
            path = bomb(d / "t.jsonl.gz", json.dumps(trace_lines()[0]).encode() + b"\n")
            argv = ["simulate", *sim_args(base, out)[2:], "--trace", str(path)]
        elif kind == "run result":
            path = bomb(d / "r.json.gz", json.dumps(result_doc()).encode())
            argv = ["compare", str(path), str(base.result)]
        elif kind == "timeline":
            path = bomb(d / "tl.jsonl.gz", json.dumps(span_lines()[0]).encode() + b"\n")
            argv = ["plot", "timeline", str(path), "--out", str(out / "t.png")]
        else:
            folder = measured_folder(d, base)
            path = bomb(folder / "runs" / "sync-k0-c1.json.gz", json.dumps([result_doc()])
                        .encode())
            argv = ["validate", "--from-measured", str(folder), "--out", str(out / "v"),
                    "--quiet"]
        return Case(f"{how}: {kind}", argv, (f"{path}: decompresses to more than",),
                    small_gzip_limit, (path,))
    if how == "workload product":
        spec, cut = rng.choice([
            ("multi-turn:sessions=1000000:turns=1000000", None),
            ("generated-shared-prefix:num_groups=1000000:prompts_per_group=1000000", None),
            ("multi-turn:sessions=1000:turns=1000:first_len=1000000", "2000"),
            ("prefix_repetition:prefix_len=1000000:suffix_len=1000000", "100000")])
        argv = rng.choice([["simulate", "--quiet"], ["run", "--model", "tiny", "--quiet"],
                           ["sweep", "--grid", "k=0,1", "--dry-run", "--set",
                            f"workload={spec}"]])
        if argv[0] == "sweep":
            argv += [] if cut is None else ["--set", f"num_prompts={cut}"]
        else:
            argv += ["--trace", spec] + ([] if cut is None else ["--num-prompts", cut])
        return Case(f"{how}: {argv[0]} {spec}", argv, ("workload",))
    if how == "tiny rate":
        rate = rng.choice(["1e-20", "1e-300", "1e-7"])
        argv = rng.choice([["simulate", *sim_args(base, out)],
                           ["run", "--model", "tiny", *run_args(base, out)],
                           ["sweep", "--set", f"workload={base.trace}", "--set", "num_prompts=2",
                            "--grid", f"request_rate=1,{rate}", "--dry-run"]])
        if argv[0] != "sweep":
            argv += ["--request-rate", rate]
        return Case(f"{how}: {argv[0]} {rate}", argv, ("--request-rate", "request_rate"),
                    inputs=(base.trace,))
    if how == "tiny speed":
        option = rng.choice(["--speed", "--burstiness"])
        return Case(f"{option} 1e-300", ["simulate", *sim_args(base, out), option, "1e-300",
                                         "--request-rate", "1"], (option,))
    if how == "output loop":   # a link to itself: refused before the work, not after it
        out.mkdir(parents=True)
        loop = out / "loop"
        os.symlink(loop.name, loop)
        option = rng.choice(["--result-json", "--timeline", "calibrate --out", "plot --out"])
        argv = {"--result-json": ["simulate", *sim_args(base, out)[:-1], str(loop)],
                "--timeline": ["simulate", *sim_args(base, out)[:-2], "--timeline", str(loop)],
                "calibrate --out": ["calibrate", str(VLLM_DATA / "bench.json"), "--model",
                                    str(base.target), "--out", str(loop)],
                "plot --out": ["plot", "timeline", str(timeline_file(d)), "--chrome",
                               str(loop), "--out", str(d / "t.png")]}[option]
        return Case(f"{how}: {option}", argv, ("loops",))
    if how == "output is an input":
        trace = write_lines(d / "t.jsonl", trace_lines())
        bench = write_json(d / "b.json", bench_doc())
        tl = timeline_file(d)
        link = d / "link.json"
        os.symlink(trace.name, link)
        target = d / "m"
        shutil.copytree(base.target, target)
        which = rng.choice(["--timeline = --trace", "--result-json links to --trace",
                            "calibrate --out = its bench", "ingest --out = its bench",
                            "plot --chrome = its timeline", "run --timeline = --trace",
                            "serve --result-json = config.json", "simulate into --model",
                            "advise --plot = --trace"])
        argv, inputs = {
            "--timeline = --trace": (["simulate", "--trace", str(trace), "--timeline",
                                      str(trace), "--quiet"], (trace,)),
            "--result-json links to --trace": (["simulate", "--trace", str(trace),
                                                "--result-json", str(link), "--quiet"],
                                               (trace,)),
            "run --timeline = --trace": (["run", "--model", "tiny", "--trace", str(trace),
                                          "--timeline", str(trace), "--quiet"], (trace,)),
            "calibrate --out = its bench": (["calibrate", str(bench), "--model",
                                             str(base.target), "--out", str(bench)], (bench,)),
            "ingest --out = its bench": (["ingest", "vllm-bench", str(bench), "--out",
                                          str(bench)], (bench,)),
            "plot --chrome = its timeline": (["plot", "timeline", str(tl), "--chrome", str(tl),
                                              "--out", str(out / "t.png")], (tl,)),
            "serve --result-json = config.json": (["serve", "--model", str(target),
                                                   "--result-json",
                                                   str(target / "config.json")],
                                                  (target / "config.json",)),
            "advise --plot = --trace": (["advise", "--trace", str(trace), "--plot",
                                         str(trace), "--quiet"], (trace,)),
            "simulate into --model": (["simulate", "--model", str(target), "--trace",
                                       str(trace), "--timeline", str(target / "config.json"),
                                       "--quiet"], (target / "config.json",)),
        }[which]
        return Case(f"{how}: {which}", argv, ("the same file as the input",
                                              "a file in the input"),
                    serving_fails() if which.startswith("serve") else None, inputs)
    if how == "store full":
        store = write_lines(d / "sw" / "cells.jsonl", store_lines())
        err = rng.choice([errno.ENOSPC, errno.EFBIG])
        return Case(f"{how}: {errno.errorcode[err]}",
                    ["sweep", "--set", f"workload={base.trace}", "--set", "num_prompts=2",
                     "--grid", "k=0,1", "--jobs", "1", "--out", str(store.parent), "--quiet"],
                    (f"{store}: cannot write",), store_fills_up(err))
    if how == "cluster ''":
        return Case(how, ["sweep", "--set", f"workload={base.trace}", "--grid", "k=0,1",
                          "--cluster", "", "--out", str(out / "sw"), "--quiet"],
                    ("--cluster ''",))
    if how == "plot no axis":
        return Case(how, ["sweep", "--set", f"workload={base.trace}", "--set", "num_prompts=2",
                          "--grid", rng.choice(["k=0,1", "max_concurrency=1,2"]), "--plot",
                          "--jobs", "1", "--out", str(out / "sw"), "--quiet"], ("--plot",))
    if how == "known miss":
        folder = measured_folder(d, base)
        entry = rng.choice(['miss = 5', 'miss = "x"',
                            '[[miss]]\ncell = "sync-k0-c1"\nmetric = "mean_tpot"\nerror = nan'
                            '\ncap = nan\nreason = "x"',
                            '[[miss]]\ncell = "sync-k0-c1"\nmetric = "mean_tpot"\nerror = 0.1'
                            '\ncap = inf\nreason = "x"'])
        path = folder / rng.choice(["known_misses.toml", "known_misses_sync_only.toml"])
        path.write_text(entry + "\n")
        return Case(f"{how}: {entry.splitlines()[-2 if '[' in entry else 0]}",
                    ["validate", "--from-measured", str(folder), "--out", str(out / "v"),
                     "--quiet"], (f"{path}: field 'miss",), inputs=(path,))
    if how == "table cells":
        doc = table_doc()
        what = rng.choice(["row twice", "row off the grid", "nan axis"])
        if what == "row twice":
            doc["rows"][3] = dict(doc["rows"][0])
            names = ("field 'rows[3]'",)
        elif what == "row off the grid":
            doc["rows"][1]["max_concurrency"] = 3
            names = ("field 'rows[1].max_concurrency'",)
        else:
            doc["axes"]["shared_fraction"] = [0.5, "nan"]
            for row in doc["rows"]:
                row["shared_fraction"] = 0.5
            names = ("field 'axes.shared_fraction'",)
        path = write_json(d / "tb" / "sweep.json", doc)
        return Case(f"{how}: {what}", ["plot", "sweep", str(path.parent), "--out",
                                       str(out / "plots"), "--quiet"], names, inputs=(path,))
    if how == "negative metric":
        lines = store_lines()
        metric = rng.choice(["mean_tpot_ms", "p99_itl_ms", "num_steps", "duration"])
        lines[1]["metrics"][metric] = rng.choice([-1.0, -1e-9, -1e300])
        store = write_lines(d / "sw" / "cells.jsonl", lines)
        return Case(f"{how}: {metric}", ["sweep", "--set", f"workload={base.trace}", "--set",
                                         "num_prompts=2", "--grid", "k=0,1", "--jobs", "1",
                                         "--out", str(store.parent), "--quiet"],
                    (f"{store}:2: field 'metrics.{metric}'",), inputs=(store,))
    fifo = d / "fifo.jsonl"
    os.mkfifo(fifo)
    argv = rng.choice([["simulate", *sim_args(base, out)[2:], "--trace", str(fifo)],
                       ["compare", str(fifo), str(base.result)],
                       ["plot", "timeline", str(fifo), "--out", str(out / "t.png")]])
    return Case(f"{how}: {argv[0]}", argv, (f"{fifo}: a FIFO",))


# Round 3, second phase: a GPU's measured tables (--device-profile), a peer's vLLM run (its
# meta.json and requests) and calibrate's inputs, each of the wrong type or out of range

SKEW_ENTRY = "  per_tp:\n    1: {alpha_default: 0.1, bucket_table: tp1/skew_fit.csv}\n"
BAD_META_YAML = [   # (text of tests/test_tables.py's SKEW_META, what replaces it, the field)
    ("engine_effective:\n  enforce_eager: true\n  hf_overrides:",
     "engine_effective: [eager]\nhf_overrides:", "engine_effective"),
    ("engine_effective:\n  enforce_eager: true\n  hf_overrides:",
     "engine_effective: eager\nhf_overrides:", "engine_effective"),
    *[("tp_degrees: [1]", f"tp_degrees: {v}", "tp_degrees")
      for v in ("[a, 1]", "[1000000000000]", "'1'", "{1: 1}")],
    ("num_attention_heads: 32", "num_attention_heads: '32'",
     "engine_effective.hf_overrides.num_attention_heads"),
    ("vocab_size: 128256", "vocab_size: [128256]", "engine_effective.hf_overrides.vocab_size"),
    ("gpu: Test GPU", "gpu: {name: x}", "gpu"),
    ("kv_big_bins: [0, 1.0e+9]", "kv_big_bins: [0, 1.0e9]", "skew_fit.bucket_axes.kv_big_bins[1]"),
    ("kv_big_bins: [0, 1.0e+9]", "kv_big_bins: [0, 1e9]", "skew_fit.bucket_axes.kv_big_bins[1]"),
    ("n_bins: [0, 2, 1000000]", "n_bins: [0, x, 1000000]", "skew_fit.bucket_axes.n_bins[1]"),
    ("n_labels: [n<=2, n>2]", "n_labels: [n<=2, 2]", "skew_fit.bucket_axes.n_labels"),
    (SKEW_ENTRY, "  per_tp: [{alpha_default: 0.1}]\n", "skew_fit.per_tp"),
    (SKEW_ENTRY, "  per_tp:\n    1: [0.1]\n", "skew_fit.per_tp.1"),
    *[("alpha_default: 0.1", f"alpha_default: {v}", "skew_fit.per_tp.1.alpha_default")
      for v in ("-1e6", "-1.0e+6", ".nan", ".inf", "'0.1'")],
    ("enabled: true", "enabled: 'yes'", "skew_fit.enabled"),
]
BAD_PEER_META = [   # (a field of the RTX 4090 run's meta.json, its bad value)
    ("kv_cache", [1]), ("kv_cache", "abc"), ("engine_kwargs", 5),
    ("resolved_config.cache_config", [16]),
    ("kv_cache.gpu_memory_utilization", "abc"), ("kv_cache.gpu_memory_utilization", [0.9]),
    ("kv_cache.gpu_memory_utilization", True), ("kv_cache.gpu_memory_utilization", 0),
    ("resolved_config.cache_config.gpu_memory_utilization", 1.5),
    ("resolved_config.compilation_config.cudagraph_capture_sizes", {"1": 1}),
    ("resolved_config.compilation_config.cudagraph_capture_sizes", 512),
    ("resolved_config.compilation_config.cudagraph_capture_sizes", [1, "2"]),
    ("kv_cache.block_size", 0), ("kv_cache.num_gpu_blocks", 0),
    ("engine_kwargs.max_num_seqs", "256"), ("engine_kwargs.tensor_parallel_size", 64),
    ("resolved_config.scheduler_config.async_scheduling", "false"),
    ("kv_cache.enable_prefix_caching", 0),
]


def round3_files(rng: random.Random, d: Path, base: Base) -> Case:
    """Round 3's second phase: a perf bundle, a peer run and calibrate's inputs of the wrong
    types, each one line naming the file, line and field (or the option), exit 2, before any
    work, nothing written, every input as it was."""
    from tests.test_tables import REQ, SKEW_META, meta_with, skew_bundle, write_requests
    out = d / "out"
    how = rng.choice(["meta.yaml", "table", "peer meta.json", "peer requests", "bench depth",
                      "calibrate inputs"])
    if how in ("meta.yaml", "table"):
        b = skew_bundle(d / "bf16")
        meta, skew = b / "meta.yaml", b / "tp1" / "skew_fit.csv"
        argv = ["simulate", "--gpu", "h100", "--device-profile", str(b), "--num-prompts", "2",
                "--quiet", "--result-json", str(out / "r.json")]
        inputs = (meta, skew, *sorted((b / "tp1").glob("*.csv")))
        if how == "meta.yaml":
            old, new, field_ = rng.choice(BAD_META_YAML + [("", "", "deep")])
            if field_ == "deep":
                n = rng.choice([101, 20_000])
                meta.write_text("a: " + "[" * n + "]" * n + "\n")
                return Case(f"{how}: nested", argv, (f"{meta}:1: not valid YAML (nested",),
                            inputs=inputs)
            meta.write_text(SKEW_META.replace(old, new))
            return Case(f"{how}: {new.strip()}", argv, (f"{meta}: field '{field_}'",),
                        inputs=inputs)
        name = rng.choice(["dense.csv", "attention.csv", "per_sequence.csv", "skew_fit.csv"])
        path = b / "tp1" / name
        lines = path.read_text().splitlines()
        what = rng.choice(["long field", "count", "alpha"] if name == "skew_fit.csv" else
                          ["long field", "count"])
        if what == "long field":   # past the csv module's 131,072
            row = lines[1].rsplit(",", 1)[0] + "," + "1" * rng.choice([131_073, 400_000])
            names = (f"{path}:2: not valid CSV",)
        elif what == "count":   # a grid point past MAX_TABLE_COUNT
            big = rng.choice(["1e300", "1e8", "16777217"])
            cells = lines[1].split(",")
            cells[rng.randrange(len(cells) - 1) if name == "attention.csv" else
                  0 if name == "skew_fit.csv" else 1] = big
            row = ",".join(cells)
            names = (f"{path}:2: field '",)
        else:
            row = lines[1].rsplit(",", 1)[0] + "," + rng.choice(["nan", "-1e9", "inf", "1e3"])
            names = (f"{path}:2: field 'alpha'",)
        path.write_text("\n".join([lines[0], row, *lines[2:]]) + "\n")
        return Case(f"{how}: {name} {what}", argv, names, inputs=inputs)
    if how.startswith("peer"):
        run = d / "vllm"
        run.mkdir(parents=True)
        reqs = write_requests(run / "requests.jsonl", [REQ, {**REQ, "request_id": "bench-1"}])
        meta = run / "meta.json"
        sim = ["simulate", "--trace", str(reqs), "--quiet", "--result-json", str(out / "r.json")]
        if how == "peer meta.json":
            path, value = rng.choice(BAD_PEER_META)
            meta.write_text(json.dumps(meta_with(path, value)))
            return Case(f"{how}: {path} {value!r}", sim, (f"{meta}: field '{path}'",),
                        inputs=(meta, reqs))
        meta.write_text(json.dumps({**meta_with("dataset_path", "ds.jsonl"),
                                    "dataset_hash": None}))
        dataset = write_lines(d / "ds.jsonl", [{"input_tok_ids": list(range(100))}] * 2)
        key, value = rng.choice([("last_token_ts", 1e308), ("last_token_ts", 5e6),
                                 ("queued_ts", 1e11), ("last_token_ts", float("nan")),
                                 ("request_id", "bench-²"), ("request_id", "bench-" + "9" * 5000),
                                 ("request_id", "7")])
        write_requests(reqs, [REQ, {**REQ, "request_id": "bench-1", key: value}])
        if key == "request_id":
            return Case(f"{how}: {value[:12]!r}", sim, (f"{dataset}: no line for request",),
                        inputs=(meta, reqs, dataset))
        argv = rng.choice([sim, ["compare", str(reqs), str(base.result)]])
        return Case(f"{how}: {key} {value:g} ({argv[0]})", argv, (f"{reqs}:2: field '{key}'",),
                    inputs=(reqs,))
    if how == "bench depth":
        bench = write_json(d / "bench.json", {**bench_doc(), "num_speculative_tokens": rng.choice(
            ["²", "٣", "9" * 5000, "65", "-1", 2.5, True, 1000])})
        argv = rng.choice([["calibrate", str(bench), "--model", str(base.target), "--out",
                            str(out / "p.json")],
                           ["ingest", "vllm-bench", str(bench), "--out", str(out / "r.json")],
                           ["simulate", *sim_args(base, out)[2:], "--trace", str(bench)]])
        return Case(f"{how}: {argv[0]}", argv, (f"{bench}: field 'num_speculative_tokens'",),
                    inputs=(bench,))
    runs = d / "runs"
    shutil.copytree(VLLM_DATA, runs)
    cal = lambda *paths: ["calibrate", *map(str, paths), "--model", str(base.target),  # noqa
                          "--out", str(out / "p.json")]
    what = rng.choice(["option 0", "broken json", "no bench", "stray jsonl", "twice",
                       "trace bomb"])
    if what == "option 0":
        option = rng.choice(["--max-num-seqs", "--block-size", "--max-model-len"])
        return Case(f"calibrate {option} 0", cal(runs) + [option, rng.choice(["0", "-4"])],
                    (option,))
    if what == "broken json":   # not skipped: it may be a broken bench file
        broken = runs / rng.choice(["bench.json", "other.json"])
        broken.write_text(rng.choice(['{"date": ', "{not json}", "\ufeff\ufeff{}", ""]))
        return Case(f"calibrate {what}", cal(runs), (f"{broken}:1: not valid JSON",),
                    inputs=(broken,))
    if what == "no bench":   # the file skipped is named in the one line
        doc = bench_doc()
        del doc[rng.choice(["date", "duration", "mean_tpot_ms"])]
        write_json(runs / "bench.json", doc)
        return Case(f"calibrate {what}", cal(runs), (f"{runs / 'bench.json'}: skipped",))
    if what == "stray jsonl":   # named on the command line, a .jsonl must be hook spans
        stray = write_lines(d / "stray.jsonl", trace_lines())
        return Case(f"calibrate {what}", cal(runs / "bench.json", stray),
                    (f"{stray}:1: field 'lane'",), inputs=(stray,))
    if what == "twice":
        argv = rng.choice([cal(runs, runs), cal(runs, runs / "bench.json"),
                           cal(runs / "hooks", runs)])
        return Case(f"calibrate {what}", argv, ("given twice",))
    bomb_path = bomb(runs / "worker.pt.trace.json.gz", json.dumps(vllm_trace_doc()).encode())
    argv = rng.choice([cal(runs), ["ingest", "vllm-profile", str(bomb_path), "--out",
                                   str(out / "tl.jsonl")]])
    return Case(f"{what}: {argv[0]}", argv, (f"{bomb_path}: decompresses to more than",),
                small_gzip_limit, (bomb_path,))


# A calibrate profile's fields (issue 55), each broken as a hostile user would: (path, value,
# the field the one line names).
BAD_PROFILE_NOTES = [("bands.split", {}, "bands.split.low"), ("bands.split.high", None,
                                                        "bands.split.high"),
               ("bands.split.low", 3, "bands.split.low"),
               ("bands.split.low.device", 0, "bands.split.low.device"),
               ("bands.split.high.device", None, "bands.split.high.device"),
               ("bands.split.low.cpu", "0.4", "bands.split.low.cpu"),
               ("bands.split.high.cpu", float("inf"), "bands.split.high.cpu"),
               ("bands.split.low.cpu", 9.0, "bands.split"), ("bands", [1], "bands"),
               ("bands", "x", "bands"), ("residuals", {"a": 1}, "residuals"),
               ("residuals.0.mean_itl_ms", -1, "residuals[0].mean_itl_ms"),
               ("residuals.0.mean_itl_ms", float("nan"), "residuals[0].mean_itl_ms"),
               ("residuals.0.mean_itl_ms", 1e300, "residuals[0].mean_itl_ms"),
               ("cpu.launch_latency_us", 1e300, "cpu"), ("cpu.schedule", [-1], "cpu")]
# A run result's sections as compare reads them: (path, value, the field named).
BAD_RESULT_SECTIONS = [("config.resolved", [1], "config.resolved"), ("config.resolved", "x",
                                                            "config.resolved"),
              ("config.resolved.prefix_cache", [1], "config.resolved.prefix_cache"),
              ("config.prefix_cache", {"queries": 1, "hits": 2}, "config.prefix_cache"),
              ("config.resolved.notes", "x", "config.resolved.notes"),
              ("mean_tpot_ms", -1.0, "mean_tpot_ms"), ("p99_itl_ms", "inf", "p99_itl_ms"),
              ("duration", 0, "duration"), ("ttfts", [0.1], "ttfts"),
              ("itls", [["x"], []], "itls[0]")]


def set_path(doc, dotted: str, value) -> None:
    """doc with the dotted path (list indices as digits) set to value; None deletes a key."""
    *parents, last = dotted.split(".")
    for part in parents:
        doc = doc[int(part)] if isinstance(doc, list) else doc.setdefault(part, {})
    if value is None and isinstance(doc, dict) and last in ("high",):
        doc.pop(last, None)
    elif isinstance(doc, list):
        doc[int(last)] = value
    else:
        doc[last] = value


def round4(rng: random.Random, d: Path, base: Base) -> Case:
    """The classes of round 4 (issue 55): files stepgap wrote and reads back (a calibrate
    profile's bands, split, residuals and CPU costs; a result's sections), measured tables of
    zero or impossible times, one-token workloads, sizes past their bounds, an output inside a
    folder the command reads, one run given twice, a band past the device level's limit. Each
    one line naming the file and field (or the option), exit 2, nothing written, inputs unchanged."""
    from tests.test_bad_input_round4 import bench_profile
    out = d / "out"
    how = rng.choice(["profile", "result", "table", "one token", "size", "output in input",
                      "run twice", "band limit"])
    if how == "profile":
        path, value, field_ = rng.choice(BAD_PROFILE_NOTES)
        prof = bench_profile(d)
        doc = json.loads(prof.read_text())
        set_path(doc, path, value)
        prof.write_text(json.dumps(doc))
        argv = rng.choice([
            ["simulate", "--profile", str(prof), "--band", *sim_args(base, out)],
            ["advise", "--profile", str(prof), "--model", "llama-3.1-8b", "--max-k", "1",
             "--num-prompts", "2", "--output-len", "4", "--max-concurrency", "1", "--jobs",
             "1", "--quiet", "--result-json", str(out / "a.json")],
            ["sweep", "--set", f"profile={prof}", "--set", "num_prompts=2", "--grid", "k=0,1",
             "--band", "--jobs", "1", "--out", str(out / "sw")]])
        return Case(f"{how}: {path} {value!r} ({argv[0]})", argv,
                    (f"{prof}: field '{field_}'",), inputs=(prof,))
    if how == "result":
        path, value, field_ = rng.choice(BAD_RESULT_SECTIONS)
        doc = json.loads(base.result.read_text())
        set_path(doc, path, value)
        bad = write_json(d / "r.json", doc)
        return Case(f"{how}: {path} {value!r}", ["compare", str(base.result), str(bad)],
                    (f"{bad}: field '{field_}'",), inputs=(bad,))
    if how == "table":
        from tests.test_tables import DENSE_LAYERS, TOKENS, write_bundle
        layer, v = rng.choice([("qkv_proj", 0), ("qkv_proj", 1e9), ("embedding", 1e9),
                               ("lm_head", 1e-3), ("lm_head", 0)])
        if layer == "lm_head":
            b = write_bundle(d / "bf16", per_seq=[("lm_head", n, v) for n in (1, 10)]
                             + [("sampler", n, 1 + n) for n in (1, 10)])
            file = "per_sequence.csv"
        else:
            b = write_bundle(d / "bf16", dense=[(x, n, v if x == layer else 10 + n)
                                                for x in DENSE_LAYERS for n in TOKENS])
            file = "dense.csv"
        return Case(f"{how}: {layer} at {v:g} us", ["simulate", "--gpu", "h100",
                                                    "--device-profile", str(b), "--num-prompts",
                                                    "2", "--quiet", "--result-json",
                                                    str(out / "r.json")],
                    (f"{b / 'tp1' / file}",), inputs=tuple((b / "tp1").glob("*.csv")))
    if how == "one token":
        bench = write_json(d / "b.json", json.loads(SEED_BENCH.read_text()))
        argv = rng.choice([
            ["advise", "--model", "llama-3.1-8b", "--max-k", "1", "--num-prompts",
             str(rng.choice([1, 4])), "--output-len", "1", "--max-concurrency", "1", "--jobs",
             "1", "--cpu-scale", "2.42", "--result-json", str(out / "a.json")],
            ["calibrate", str(bench), "--gpu", "l20", "--model", "llama-3.1-8b", "--draft",
             "llama-3.1-8b-eagle3", "-k", "4", "--output-len", "1", "--out",
             str(out / "p.json")]])
        return Case(f"{how}: {argv[0]}", argv, ("--output-len 1",), inputs=(bench,))
    if how == "size":
        what = rng.choice(["option", "loads", "bench files"])
        if what == "option":
            option = rng.choice(["--block-size", "--max-model-len", "--max-num-seqs",
                                 "--max-num-batched-tokens", "--num-gpu-blocks-override"])
            return Case(f"{how}: {option} 10^170", ["simulate", *sim_args(base, out), option,
                                                    "1" + "0" * 170], (option,))
        if what == "loads":
            return Case(f"{how}: 3,000 loads", ["advise", "--model", "llama-3.1-8b",
                                                "--max-k", "1", "--jobs", "1",
                                                "--max-concurrency",
                                                ",".join(map(str, range(1, 3001)))],
                        ("--max-concurrency",))
        runs = d / "runs"
        runs.mkdir()
        for i in range(101):
            (runs / f"b{i}.json").write_text("")
        return Case(f"{how}: 101 bench files", ["calibrate", str(runs), "--model",
                                               str(base.target), "--out", str(out / "p.json")],
                    (f"{runs}: 101 bench files",))
    if how == "output in input":
        runs = d / "runs"
        write_json(runs / "bench.json", bench_doc())
        target = runs / rng.choice(["p.json", "sub/p.json"])
        return Case(f"{how}: {target.name}", ["calibrate", str(runs), "--model",
                                              str(base.target), "--out", str(target)],
                    (f"--out {target}",), inputs=(runs / "bench.json",))
    if how == "run twice":
        doc = json.loads(SEED_BENCH.read_text())
        a = write_json(d / "a.json", doc)
        b = write_json(d / "b.json", {**doc, **rng.choice([{}, {"max_concurrency": 8},
                                                           {"num_prompts": 81}])})
        return Case(f"{how}", ["calibrate", str(a), str(b), "--gpu", "l20", "--model",
                               "llama-3.1-8b", "--draft", "llama-3.1-8b-eagle3", "-k", "4",
                               "--out", str(out / "p.json")],
                    (f"{b}: the same run as {a}",), inputs=(a, b))
    option, v = rng.choice([("--speed", "1e6"), ("--speed", "1e-6"), ("--device-scale", "1e6"),
                            ("--device-scale", "1e-6")])
    return Case(f"{how}: {option} {v}", ["simulate", *sim_args(base, out), "--band", option, v],
                (f"{option} {float(v):g}: the band's",))


SEED_BENCH = Path(__file__).resolve().parents[1] / "traces" / "seed" / "vllm-pr25872-sync.json"


GENERATORS = (broken_file, broken_file, mistyped_field, mistyped_field, mistyped_field,
              bad_option, too_large, bad_output, small_ones, same_or_empty_path, stdout_fault,
              round3, round3_files, round4)


# -------------------------------------------------------------------------------------------
# Running and judging one case


def run_case(case: Case) -> tuple[int | str, str]:
    """(exit status, or the exception that escaped; stderr)."""
    err = io.StringIO()
    fault = case.fault() if case.fault else contextlib.nullcontext()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), fault:
        try:
            code = main(case.argv)
        except SystemExit as e:   # argparse's own errors
            code = e.code
        except BaseException:     # a traceback: the failure this test exists to catch
            code = "raised " + traceback.format_exc()
    return code, err.getvalue()


def judge(case: Case, code, err: str, out: Path) -> str | None:
    """Why the case failed its promises, or None."""
    if not isinstance(code, int):
        return code
    if code != 2:
        return f"exit status {code}"
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    others = [line for line in lines if line not in errors and not line.startswith("usage:")
              and not line.startswith(" ")]
    if len(errors) != 1 or others:
        return f"expected one error line, got:\n{err}"
    if not any(name in errors[0] for name in case.names):
        return f"the error names none of {case.names}: {errors[0]}"
    if "Traceback" in err:
        return f"a traceback:\n{err}"
    left = [p for p in out.rglob("*") if p.is_file() and p.name != "afile"] \
        if out.exists() else []
    if left:
        return f"left output files behind: {[str(p) for p in left]}"
    changed = [str(p) for p, was in zip(case.inputs, case.digests) if digest(p) != was]
    if changed:
        return f"changed its inputs: {changed}"
    return None


@pytest.fixture(scope="module", autouse=True)
def one_parser():
    """Every case here is parsed by one parser, built once (building it is a large part of a
    case's time): argparse keeps nothing from one parse to the next, so `main` reads each
    case's arguments as a parser of its own would."""
    parser = build_parser()
    with mock.patch("stepgap.cli.build_parser", lambda: parser):
        yield


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return Base(tmp_path_factory.mktemp("fuzz-base"))


def test_bad_input_and_faults_end_in_one_clear_error_and_no_output(base, tmp_path):
    failures = []
    shared = [p for p in base.root.rglob("*") if p.is_file()]   # every case's common inputs
    before = [digest(p) for p in shared]
    for i in range(CASES):
        rng = random.Random(f"{SEED}:{i}")
        d = tmp_path / f"case{i}"
        d.mkdir()
        case = GENERATORS[i % len(GENERATORS)](rng, d, base)
        code, err = run_case(case)
        why = judge(case, code, err, d / "out")
        if why is None and [digest(p) for p in shared] != before:
            why = "changed a shared input: " + ", ".join(
                str(p) for p, was in zip(shared, before) if digest(p) != was)
            before = [digest(p) for p in shared]
        if why:
            failures.append(f"case {i} (STEPGAP_FUZZ_SEED={SEED}): {case.what}\n"
                            f"  argv: {case.argv}\n  {why}")
        shutil.rmtree(d, ignore_errors=True)
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n\n" + \
        "\n\n".join(failures[:20])


# -------------------------------------------------------------------------------------------
# What is not an error


# Fields whose value is accepted by both commands, beside the bad ones above.
ACCEPTED_TARGET = {"architectures": None, "head_dim": None, "tie_word_embeddings": DELETE,
                   "rope_scaling": None, "bos_token_id": None, "eos_token_id": [2, 511],
                   "hidden_act": "swish"}
ACCEPTED_DRAFT = {"architectures": None, "eagle_aux_hidden_state_layer_ids": None,
                  "norm_before_residual": True, "num_hidden_layers": DELETE,
                  "eos_token_id": 2}


def config_cases():
    for table, accepted, which in ((BAD_TARGET, ACCEPTED_TARGET, "target"),
                                   (BAD_DRAFT, ACCEPTED_DRAFT, "draft")):
        for key, values in table.items():
            for value in values:
                yield which, key, value, 2
        for key, value in accepted.items():
            yield which, key, value, 0


def test_simulate_and_run_accept_and_reject_the_same_configs(base, tmp_path):
    """One validation of every field (common/modelcfg.py) serves both halves."""
    differ = []
    for n, (which, key, value, want) in enumerate(config_cases()):
        target, draft = model_configs()
        doc = target if which == "target" else draft
        if value is DELETE:
            doc.pop(key, None)
        else:
            doc[key] = value
        path = write_json(tmp_path / f"c{n}" / "config.json", doc)
        model, head = (path.parent, None) if which == "target" else (base.target, path.parent)
        codes = []
        for command, tail in (("simulate", sim_args), ("run", run_args)):
            argv = [command, "--model", str(model), *(["--draft", str(head), "-k", "2"]
                                                      if head else []),
                    *tail(base, tmp_path / f"c{n}" / command)]
            codes.append(run_case(Case("", argv, ()))[0])
        if codes != [want, want]:
            differ.append(f"{which} {key}={value!r}: simulate {codes[0]}, run {codes[1]} "
                          f"(expected {want})")
    assert not differ, "\n".join(differ)


@pytest.mark.parametrize("kind", sorted(set(file_kinds(Base.__new__(Base))) - {"demo profile"}))
def test_a_byte_order_mark_is_read_as_nothing_by_every_loader(kind, base, tmp_path):
    name, valid, argv = file_kinds(base)[kind]
    prepare(kind, tmp_path, base)
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(path, b"\xef\xbb\xbf" + valid))
    code, err = run_case(Case(kind, argv(path, tmp_path / "out"), ()))
    assert code == 0, err


@pytest.mark.parametrize("family", sorted(ACCEPTED_FAMILY))
def test_each_familys_config_json_and_its_real_variants_simulate(family, base, tmp_path):
    """The validation of the other families accepts their published configs (the preset's
    fields as a config.json) and the variants real configs use, and rejects each broken
    field of BAD_FAMILY (the fuzz cases above sample those)."""
    for n, changes in enumerate([{}, *ACCEPTED_FAMILY[family]]):
        doc = family_config(family)
        for key, value in changes.items():
            if value is DELETE:
                doc.pop(key, None)
            else:
                doc[key] = value
        path = write_json(tmp_path / f"v{n}" / "config.json", doc)
        argv = ["simulate", "--model", str(path.parent), *FAMILY_ARGS.get(family, []),
                *sim_args(base, tmp_path / f"v{n}" / "out")]
        code, err = run_case(Case("", argv, ()))
        assert code == 0, f"{family} {changes or 'preset'}: {err}"
    for key, values in BAD_FAMILY[family].items():
        for value in values:
            doc = family_config(family)
            doc[key] = value
            path = write_json(tmp_path / "bad" / "config.json", doc)
            argv = ["simulate", "--model", str(path.parent), *FAMILY_ARGS.get(family, []),
                    *sim_args(base, tmp_path / "bad" / "out")]
            case = Case(f"{family} {key}={value!r}", argv, (str(path),))
            why = judge(case, *run_case(case), tmp_path / "bad" / "out")
            assert why is None, f"{case.what}: {why}"


def strict_json(text: str):
    """JSON as RFC 8259 has it: NaN, Infinity and -Infinity are not JSON."""
    def refuse(word):
        raise ValueError(f"{word} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("literal, read", [("NaN", "nan"), ("Infinity", "inf"),
                                           ("-Infinity", "-inf"), ("1e400", "inf")])
def test_a_non_finite_metric_is_written_as_valid_json_and_read_back(literal, read, base,
                                                                    tmp_path, capsys):
    """vLLM writes NaN for a metric with no samples (Python's json writes it bare; no other JSON
    reader takes it), and 1e400 reads as infinity. Whatever stepgap writes is JSON: compare
    --json, every result and a sweep's store map a non-finite number to "nan", "inf" or "-inf"
    (fileio.py dumps_json), which RunRecord.load and the store read back as the float. A
    latency no run takes (infinite, or negative) is refused where a result is read, naming the
    field (issue 55); NaN, vLLM's "no samples", is read."""
    from stepgap.common.formats import save_result
    from stepgap.common.run_result import RunResult
    rng = random.Random(literal)
    keys = rng.sample(sorted(k for k, v in result_doc().items()
                             if k.endswith("_ms") and isinstance(v, float)), 3)
    text = json.dumps(result_doc())
    for key in keys:
        text = re.sub(rf'"{key}": [^,]+', f'"{key}": {literal}', text)
    path = tmp_path / "r.json"
    path.write_text(text)
    again = tmp_path / "again.json"
    if read != "nan":
        assert main(["compare", str(path), str(base.result), "--json"]) == 2
        assert f"field '{min(keys, key=list(result_doc()).index)}'" in capsys.readouterr().err
        save_result(again, json.loads(text))
        doc = strict_json(again.read_text())
        assert all(doc[key] == read for key in keys)
    else:
        assert main(["compare", str(path), str(base.result), "--json"]) == 0
        rows = {r["metric"]: r for r in strict_json(capsys.readouterr().out)["metrics"]}
        assert any(r["measured"] == read for r in rows.values())
        RunResult.load(path).save(again)
        doc = strict_json(again.read_text())
        for key in keys:
            assert doc[key] == read
            assert str(RunResult.load(again).metrics[key]) == read
    # a sweep's store too (sim/sweep_store.py), line by line, read back by a resumed sweep
    from stepgap.sim.sweep_grid import GridCell
    from stepgap.sim.sweep_store import CellStore
    path = tmp_path / "sw" / "cells.jsonl"
    path.parent.mkdir()
    store = CellStore(path)
    store.add(GridCell({"k": 0}, {}, "c0"), {"mean_tpot_ms": float(read), "completed": 2,
                                             "simulated_mode": "sync"})
    store.close()
    assert strict_json(path.read_text())["metrics"]["mean_tpot_ms"] == read
    assert str(CellStore(path).done["c0"]["mean_tpot_ms"]) == read


@pytest.mark.parametrize("part", ["create_engine_config", "worker_spec", "make_executor",
                                  "engine_config"])
def test_every_engine_user_gets_the_cuda_check(part):
    """--device cuda where torch has no CUDA is one line naming the option for every user of
    EngineArgs (the demo, calibrate/, the benchmarks, training), not only `run` and `serve`:
    the setup checks it when it is resolved (engine/args.py check_cuda)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    from stepgap.common.errors import UserError
    from stepgap.engine.args import EngineArgs
    with pytest.raises(UserError, match=r"^--device cuda: .*run with --device cpu$"):
        getattr(EngineArgs(model="tiny", device="cuda"), part)()
