"""A peer's real vLLM serving run, read as it is published (docs/explanation/design.md §9):
LLMServingSim's bench recorder writes `vllm/requests.jsonl`, `vllm/meta.json` and
`vllm/timeseries.csv`.

- `requests.jsonl`: one request per line, `input_toks`, `output_toks`, `arrival_time` (epoch
  seconds, when the front end took it) and vLLM's own RequestStateStats timestamps
  (`queued_ts`, `scheduled_ts`, `first_token_ts`, `last_token_ts`: the engine core's monotonic
  clock, seconds). As a trace (`load_peer_trace`): arrivals are the `queued_ts` from the first
  one (the moment the engine core had each request, which is where its TTFT starts), lengths
  the token counts. As a measured side (`peer_result`): TTFT = first_token - queued, TPOT =
  (last_token - first_token) / (output - 1), E2EL = last_token - queued, in the run-result
  keys; ITL is not defined (only the first and the last token are timed), so it is NaN.
- `meta.json`: the engine's settings, mapped to stepgap's vLLM-spelled options
  (`peer_settings`), with a note for each setting stepgap does not model.
- `timeseries.csv`: once a tick, running and waiting requests and KV cache use.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from stepgap.common.errors import UserError, shown, where
from stepgap.common.fileio import csv_rows, json_lines, mark_input, read_json_object, read_text
from stepgap.common.formats import MAX_ARRIVAL_S, TIMESERIES, TraceRequest
from stepgap.common.limits import MAX_TIMESTAMP_S, MAX_TP, is_finite, is_int

STAMPS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
KEYS = ("request_id", "input_toks", "output_toks", *STAMPS)
PERCENTILES = (50, 90, 95, 99)   # a peer's measured side (run_result.py peer_result)


def is_peer_requests(path) -> bool:
    """A requests.jsonl of a peer's vLLM run (its first record has vLLM's queued_ts)."""
    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    for _, obj in json_lines(path):
        return isinstance(obj, dict) and "queued_ts" in obj and "input_toks" in obj
    return False


def _stamp(obj: dict, key: str, path, lineno) -> float:
    v = obj.get(key)
    if v is None:
        raise UserError(f"{where(path, lineno, key)}: missing (every request needs "
                        f"{', '.join(STAMPS)}; a request vLLM never finished has none)")
    if not (is_finite(v) and 0 <= v <= MAX_TIMESTAMP_S):
        raise UserError(f"{where(path, lineno, key)}: expected a timestamp in seconds from 0 to "
                        f"{MAX_TIMESTAMP_S:g} (vLLM's monotonic clock), got {shown(v)}")
    return float(v)


def load_peer_requests(path) -> list[dict]:
    """The run's requests, checked: ids unique, token counts >= 1, timestamps present, finite,
    non-negative and in order (queued <= scheduled <= first token <= last token)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: requests file not found")
    for name in ("meta.json", "timeseries.csv"):   # the run's other files: no output over them
        mark_input(path.with_name(name))
    out, seen, lines = [], {}, []
    for lineno, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise UserError(f"{where(path, lineno)}: expected a JSON object (a request), got "
                            f"{type(obj).__name__}")
        for key in ("request_id", "input_toks", "output_toks"):
            if key not in obj:
                raise UserError(f"{where(path, lineno, key)}: missing (a request of a vLLM run "
                                f"has {', '.join(KEYS)})")
        rid = obj["request_id"]
        if not isinstance(rid, (str, int)) or isinstance(rid, bool) or rid == "":
            raise UserError(f"{where(path, lineno, 'request_id')}: expected a non-empty string "
                            f"or integer, got {rid!r}")
        if str(rid) in seen:
            raise UserError(f"{where(path, lineno, 'request_id')}: duplicate id {rid!r} (first "
                            f"on line {seen[str(rid)]})")
        seen[str(rid)] = lineno
        for key in ("input_toks", "output_toks"):
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{where(path, lineno, key)}: expected an integer >= 1, got "
                                f"{v!r}")
        t = {key: _stamp(obj, key, path, lineno) for key in STAMPS}
        for a, b in zip(STAMPS, STAMPS[1:]):
            if t[b] < t[a]:
                raise UserError(f"{where(path, lineno, b)}: {t[b]:.6f} is before {a} "
                                f"{t[a]:.6f}")
        out.append({"request_id": str(rid), "input_toks": obj["input_toks"],
                    "output_toks": obj["output_toks"], **t})
        lines.append(lineno)
    if not out:
        raise UserError(f"{path}: the run holds no requests")
    t0 = min(r["queued_ts"] for r in out)
    for lineno, r in zip(lines, out):   # one run: every stamp within MAX_ARRIVAL_S of its start
        key = next((k for k in STAMPS if r[k] - t0 > MAX_ARRIVAL_S), None)
        if key is not None:
            raise UserError(f"{where(path, lineno, key)}: {r[key]:g} s is more than "
                            f"{MAX_ARRIVAL_S:g} s after the first queued_ts, {t0:g} (not one "
                            "run's monotonic clock)")
    return out


def find_dataset(path) -> Path | None:
    """The dataset a run replayed, where meta.json (beside its requests.jsonl) names it: its
    `dataset_path`, or that path with `.gz`, under the run's folder or any folder above it
    (LLMServingSim's repository keeps it at the top, in workloads/). None where there is no
    meta.json, no dataset_path or no such file; a file whose sha256 is not the run's
    `dataset_hash` is refused."""
    meta_path = Path(path).with_name("meta.json")
    if not meta_path.is_file():
        return None
    meta = read_json_object(meta_path, "a vLLM run's meta.json")
    rel = meta.get("dataset_path")
    if not isinstance(rel, str) or not rel:
        return None
    for folder in Path(path).resolve().parents:
        for cand in (folder / rel, folder / (rel + ".gz")):
            if cand.is_file():
                digest = hashlib.sha256(read_text(cand).encode()).hexdigest()
                if meta.get("dataset_hash") not in (None, digest):
                    raise UserError(f"{cand}: sha256 {digest[:12]}... is not the run's "
                                    f"dataset_hash {str(meta['dataset_hash'])[:12]}... "
                                    f"({meta_path}): another dataset")
                return cand
    return None


def dataset_token_ids(path, requests: list[dict]) -> dict[str, list[int]]:
    """Each request's prompt token ids from the replayed dataset (LLMServingSim's workload
    file: one line per request, `input_tok_ids`; its runner names line i `bench-i`)."""
    rows = [obj for _, obj in json_lines(path)]
    out = {}
    for r in requests:
        rid = r["request_id"]
        tail = rid.rsplit("-", 1)[-1]   # ASCII digits (str.isdigit takes "²", int() not)
        i = int(tail) if "-" in rid and re.fullmatch(r"[0-9]{1,18}", tail) else -1
        if not 0 <= i < len(rows) or not isinstance(rows[i], dict):
            raise UserError(f"{path}: no line for request {rid!r} (the runner names line i "
                            "bench-i)")
        ids = rows[i].get("input_tok_ids")
        if not isinstance(ids, list) or len(ids) != r["input_toks"] \
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                           for x in ids):
            raise UserError(f"{where(path, i + 1, 'input_tok_ids')}: expected the "
                            f"{r['input_toks']} token ids of request {rid!r}")
        out[rid] = ids
    return out


def load_peer_trace(path) -> list[TraceRequest]:
    """The run as a workload trace: arrivals at the queued_ts, from the first; its lengths;
    its prompts' token ids where the dataset it replayed is found (`find_dataset`), so that
    prefix caching sees what vLLM saw."""
    reqs = load_peer_requests(path)
    dataset = find_dataset(path)
    ids = dataset_token_ids(dataset, reqs) if dataset is not None else {}
    t0 = min(r["queued_ts"] for r in reqs)
    order = sorted(reqs, key=lambda r: r["queued_ts"])
    return [TraceRequest(r["request_id"], r["queued_ts"] - t0, r["input_toks"],
                         r["output_toks"], ids.get(r["request_id"])) for r in order]


# -------------------------------------------------------------------------------------------
# Settings


def _get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _first(doc: dict, *paths: str) -> tuple[str, object]:
    """(path, value) of the first dotted path of meta.json that holds a value (not null); the
    first path and None where none does. A 0 is a value: it is refused where read, never
    passed over for a default."""
    for path in paths:
        v = _get(doc, *path.split("."))
        if v is not None:
            return path, v
    return paths[0], None


def _bad(meta_path, field: str, expected: str, value) -> UserError:
    return UserError(f"{where(meta_path, field=field)}: expected {expected}, got {shown(value)}")


# What meta.json must hold where it holds anything: objects, switches, memory fractions
SECTIONS = ("engine_kwargs", "kv_cache", "resolved_config", "resolved_config.model_config",
            "resolved_config.cache_config", "resolved_config.scheduler_config",
            "resolved_config.compilation_config", "resolved_config.parallel_config")
EXPERT_PARALLEL = ("engine_kwargs.enable_expert_parallel",
                   "resolved_config.parallel_config.enable_expert_parallel")
FLAGS = ("kv_cache.enable_prefix_caching", "resolved_config.cache_config.enable_prefix_caching",
         "resolved_config.scheduler_config.async_scheduling",
         "resolved_config.scheduler_config.scheduler_reserve_full_isl", *EXPERT_PARALLEL)
UTILIZATION = ("kv_cache.gpu_memory_utilization",
               "resolved_config.cache_config.gpu_memory_utilization")


def check_meta(doc: dict, meta_path) -> dict:
    """Every object of meta.json that `peer_settings` reads an object (or null), every switch
    true, false or null (`"false"` would read as true), the memory utilization a fraction
    (`true` would read as 1.0), the CUDA graphs' capture sizes a list of integers; errors name
    the meta.json field. Returns engine_kwargs."""
    for path in SECTIONS:
        v = _get(doc, *path.split("."))
        if v is not None and not isinstance(v, dict):
            raise _bad(meta_path, path, "an object", v)
    for path in FLAGS:
        v = _get(doc, *path.split("."))
        if v is not None and not isinstance(v, bool):
            raise _bad(meta_path, path, "true or false", v)
    for path in UTILIZATION:
        v = _get(doc, *path.split("."))
        if v is not None and not (is_finite(v) and 0 < v <= 1):
            raise _bad(meta_path, path, "a fraction of the GPU's memory, in (0, 1]", v)
    path = "resolved_config.compilation_config.cudagraph_capture_sizes"
    sizes = _get(doc, *path.split("."))
    if sizes is not None and not (isinstance(sizes, list)
                                  and all(is_int(x) and x >= 1 for x in sizes)):
        raise _bad(meta_path, path, "a list of batch sizes (integers >= 1)", sizes)
    return doc.get("engine_kwargs") or {}


def peer_settings(meta_path, context: int) -> tuple[dict, list[str]]:
    """SimConfig settings from a run's meta.json, and one note per setting mapped or not
    modelled. Settings the file does not record keep vLLM's defaults (said so): a null
    max_model_len is the model's own context, `context` (its max_position_embeddings), as vLLM
    takes it. Every path that reads a peer run reads it here (the command line, the judge, the
    benchmarks), so that they all simulate the same settings."""
    meta_path = Path(meta_path)
    doc = read_json_object(meta_path, "a vLLM run's meta.json")
    check_meta(doc, meta_path)
    settings, notes, mapped = {}, [], []

    def take(field: str, option: str, at: str, value, hi: int | None = None) -> None:
        if value is None:
            return
        if not (is_int(value) and value >= 1 and (hi is None or value <= hi)):
            raise _bad(meta_path, at, "an integer >= 1" if hi is None else
                       f"an integer from 1 to {hi}", value)
        settings[field] = value
        mapped.append(f"{option} {value}")

    take("max_num_seqs", "--max-num-seqs", *_first(doc, "engine_kwargs.max_num_seqs"))
    take("max_num_batched_tokens", "--max-num-batched-tokens",
         *_first(doc, "engine_kwargs.max_num_batched_tokens"))
    at, length = _first(doc, "engine_kwargs.max_model_len",
                        "resolved_config.model_config.max_model_len")
    if length is None:
        notes.append(f"meta.json's max_model_len is null: vLLM's default, the model's context "
                     f"(max_position_embeddings), so --max-model-len {context}")
        length = context
    take("max_model_len", "--max-model-len", at, length)
    take("tensor_parallel_size", "--tensor-parallel-size",
         *_first(doc, "engine_kwargs.tensor_parallel_size"), hi=MAX_TP)
    take("block_size", "--block-size", *_first(doc, "kv_cache.block_size",
                                               "resolved_config.cache_config.block_size"))
    at, blocks = _first(doc, "kv_cache.num_gpu_blocks",
                        "resolved_config.cache_config.num_gpu_blocks")
    if blocks is not None:
        take("num_gpu_blocks_override", "--num-gpu-blocks-override", at, blocks)
    else:
        _, util = _first(doc, "kv_cache.gpu_memory_utilization",
                          "resolved_config.cache_config.gpu_memory_utilization")
        if util is not None:
            settings["gpu_memory_utilization"] = float(util)
            mapped.append(f"--gpu-memory-utilization {util}")
        notes.append("meta.json does not record the KV cache vLLM resolved: sized from the "
                     "--gpu's memory (--gpu-memory-utilization), not from the run")
    resolved = doc.get("resolved_config") or {}
    cache = doc.get("kv_cache") or {}
    asched = _get(resolved, "scheduler_config", "async_scheduling")
    if asched is None:
        notes.append(f"meta.json does not record async_scheduling: vLLM "
                     f"{doc.get('vllm_version', '?')} turns it on by default for this setup, so "
                     "--async-scheduling")
        asched = True
    settings["mode"] = "async" if asched else "sync"
    mapped.append("--async-scheduling" if asched else "--no-async-scheduling")
    full = _get(resolved, "scheduler_config", "scheduler_reserve_full_isl")
    if full is not None:
        settings["scheduler_reserve_full_isl"] = bool(full)
        mapped.append(f"--{'' if full else 'no-'}scheduler-reserve-full-isl")
    at, dp = _first(doc, "engine_kwargs.data_parallel_size",
                    "resolved_config.parallel_config.data_parallel_size")
    if dp != 1:   # (1, vLLM's default, needs no option)
        take("data_parallel_size", "--data-parallel-size", at, dp, hi=MAX_TP)
    if _first(doc, *EXPERT_PARALLEL)[1]:   # (a switch: check_meta held it to true or false)
        settings["enable_expert_parallel"] = True
        mapped.append("--enable-expert-parallel")
    prefix = cache.get("enable_prefix_caching",
                       _get(resolved, "cache_config", "enable_prefix_caching"))
    if prefix is None:
        notes.append("meta.json does not say whether prefix caching was on: vLLM's default, "
                     "--enable-prefix-caching")
        prefix = True
    settings["enable_prefix_caching"] = bool(prefix)
    mapped.append(f"--{'' if prefix else 'no-'}enable-prefix-caching")
    notes.insert(0, f"settings from {meta_path}: " + ", ".join(mapped))
    sizes = _get(resolved, "compilation_config", "cudagraph_capture_sizes")
    if sizes:
        notes.append(f"CUDA graphs at the capture sizes {sizes[0]}..{sizes[-1]} and "
                     "torch.compile: a step is priced as its kernels' times back to back "
                     "(docs/explanation/measured-tables.md, 'Measured operator tables')")
    return settings, notes


def load_timeseries(path) -> dict[str, list[float]]:
    """A run's timeseries.csv: column -> values, each row's `t` the end of its tick."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: timeseries not found")
    rows = list(csv_rows(path))
    if not rows or [c.strip() for c in rows[0][1]][:len(TIMESERIES)] != list(TIMESERIES):
        raise UserError(f"{where(path, 1)}: expected the header {','.join(TIMESERIES)}")
    out = {k: [] for k in TIMESERIES}
    for n, row in rows[1:]:
        if not row:
            continue
        for key, cell in zip(TIMESERIES, row):
            try:
                v = float(cell)
            except ValueError:
                raise UserError(f"{where(path, n, key)}: expected a number, got {cell!r}") \
                    from None
            if not math.isfinite(v) or v < 0:
                raise UserError(f"{where(path, n, key)}: expected a number >= 0, got {cell!r}")
            out[key].append(v)
    return out
