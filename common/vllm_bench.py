"""`vllm bench serve --save-result --save-detailed` files, read as stepgap's own.

A bench file holds the client's config (model_id, num_prompts, request_rate, burstiness,
max_concurrency; `--metadata KEY=VALUE` pairs as top-level keys) and, with --save-detailed, the
per-request input and output lengths, TTFTs and ITLs (one per streamed chunk after the first).
`bench_result` turns it into a run result (common/formats.py keys, recomputed from those lists,
so that it pools and compares like any result), `bench_requests` into the trace that produced it
(all sent at 0 when the rate was inf: vLLM keeps no arrival times). `stepgap simulate --trace`,
`stepgap compare` and `stepgap calibrate` take these files as they are.
"""

from __future__ import annotations

from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json
from stepgap.common.formats import RequestTiming, TraceRequest, run_result

BENCH_KEYS = ("date", "backend", "model_id", "num_prompts", "completed", "duration",
              "mean_tpot_ms")
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls")


def read_bench(path) -> dict:
    """A `vllm bench serve --save-result` file, checked for what stepgap reads."""
    path = Path(path)
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a JSON object (a `vllm bench serve --save-result` "
                        "file)")
    missing = [k for k in BENCH_KEYS if k not in doc]
    if missing:
        raise UserError(f"{where(path, field=missing[0])}: missing; not a `vllm bench serve "
                        "--save-result` file")
    return doc


def bench_config(doc: dict) -> dict:
    """What made the run: the bench's own config fields (vLLM writes them at the top)."""
    return {k: doc.get(k) for k in ("backend", "model_id", "tokenizer_id", "num_prompts",
                                    "request_rate", "burstiness", "max_concurrency")}


def bench_requests(doc: dict, path, chunk_tokens: list[list[int]] | None = None,
                   ids: list[str] | None = None) -> list[TraceRequest]:
    """The trace the run served: every successful request's prompt and output lengths (all
    sent at 0 when the rate was inf; vLLM keeps no arrival times), with the accepted counts of
    its steps where the chunks' token counts are known."""
    missing = [k for k in DETAIL_KEYS if k not in doc]
    if missing:
        raise UserError(f"{where(path, field=missing[0])}: missing; rebuilding the trace needs "
                        "`vllm bench serve --save-detailed`")
    errors = doc.get("errors") or [""] * len(doc["input_lens"])
    out = []
    for i, (plen, olen, err) in enumerate(zip(doc["input_lens"], doc["output_lens"], errors)):
        if err or not olen:
            continue
        acc = None
        if chunk_tokens is not None:
            acc = [n - 1 for n in chunk_tokens[i][1:]]
        out.append(TraceRequest(ids[i] if ids else f"req-{i}", 0.0, int(plen), int(olen),
                                accepted=acc))
    return out


def bench_result(doc: dict, path, chunk_tokens: list[list[int]] | None = None,
                 ids: list[str] | None = None, config: dict | None = None) -> dict:
    """The run as a stepgap run result: the bench's own numbers recomputed from its
    per-request lists (so that it pools and compares like any result), chunk sizes where known."""
    reqs = bench_requests(doc, path, chunk_tokens, ids)
    ok = [i for i, (e, o) in enumerate(zip(doc.get("errors") or [""] * len(doc["input_lens"]),
                                           doc["output_lens"])) if not e and o]
    timings = []
    for r, i in zip(reqs, ok):
        t = RequestTiming(r.request_id, r.prompt_len, 0.0)
        times = [doc["ttfts"][i]]
        for gap in doc["itls"][i]:
            times.append(times[-1] + gap)
        sizes = chunk_tokens[i] if chunk_tokens else None
        if sizes is None or len(sizes) != len(times) or sum(sizes) != r.output_len:
            sizes = [1] * len(times)
            sizes[-1] += r.output_len - len(times)
        for tm, k in zip(times, sizes):
            t.add_chunk(tm, k)
        timings.append(t)
    cfg = {**bench_config(doc), **(config or {})}
    res = run_result(timings, doc["duration"], backend=f"vllm-{doc['backend']}", config=cfg,
                     detailed=True, percentiles=(50, 99))
    if doc.get("spec_decode_num_drafts"):
        res["spec_decode"] = {
            "k": len(doc.get("spec_decode_per_position_acceptance_rates") or []),
            "num_drafts": doc["spec_decode_num_drafts"],
            "num_draft_tokens": doc["spec_decode_draft_tokens"],
            "num_accepted_tokens": doc["spec_decode_accepted_tokens"],
            "acceptance_length": doc["spec_decode_acceptance_length"],
            "acceptance_rate": doc["spec_decode_acceptance_rate"] / 100,
            "acceptance_rate_per_pos": doc["spec_decode_per_position_acceptance_rates"]}
    if all(r.accepted is not None for r in reqs):
        res["accepted"] = [r.accepted for r in reqs]
    return res


BURSTY_ITL_MS = 0.05   # no vLLM step streams a chunk this soon after the last
BURSTY_MAX = 0.25      # a run with more of its ITLs under that had a starved client


def bursty_share(doc: dict, under_ms: float = BURSTY_ITL_MS) -> float:
    """The share of a run's ITLs under `under_ms`: chunks the client read together (no engine
    streams two steps that close), the mark of a client that did not read as the server wrote.
    0 without --save-detailed. (vLLM writes ttfts and itls in seconds.)"""
    itls = [x for row in doc.get("itls") or [] for x in row]
    return sum(1 for x in itls if x * 1e3 < under_ms) / len(itls) if itls else 0.0


def is_bursty(doc: dict) -> bool:
    """The run timed its client, not the engine: more than BURSTY_MAX of its ITLs bursty."""
    return bursty_share(doc) > BURSTY_MAX


def is_bench(doc) -> bool:
    """A `vllm bench serve --save-result` document (by its keys)."""
    return isinstance(doc, dict) and all(k in doc for k in BENCH_KEYS)
