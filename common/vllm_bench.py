"""`vllm bench serve --save-result --save-detailed` files, read as stepgap's own.

A bench file holds the client's config (model_id, num_prompts, request_rate, burstiness,
max_concurrency; `--metadata KEY=VALUE` pairs as top-level keys) and, with --save-detailed, the
per-request input and output lengths, TTFTs and ITLs (one per streamed chunk after the first).
common/run_result.py `bench_result` turns it into a run result (recomputed from those lists,
so that it pools and compares like any result), `bench_requests` into the trace that produced it
(all sent at 0 when the rate was inf: vLLM keeps no arrival times). `stepgap simulate --trace`,
`stepgap compare` and `stepgap calibrate` take these files as they are.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json
from stepgap.common.formats import MODES, TraceRequest
from stepgap.common.limits import MAX_K, MAX_PARAM, MAX_PROMPTS, is_finite, is_int

BENCH_KEYS = ("date", "backend", "model_id", "num_prompts", "completed", "duration",
              "mean_tpot_ms")
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls")
# The times of a request that the file sums up (mean_ttft_ms, std_itl_ms, p99_tpot_ms, ...): no
# one of them can be longer than the whole run.
METRIC = re.compile(r"(mean|median|std|p[0-9.]+)_(ttft|tpot|itl|e2el)_ms")


def read_bench(path) -> dict:
    """A `vllm bench serve --save-result` file, checked for what stepgap reads (`check_bench`)."""
    path = Path(path)
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a JSON object (a `vllm bench serve --save-result` "
                        "file)")
    missing = [k for k in BENCH_KEYS if k not in doc]
    if missing:
        raise UserError(f"{where(path, field=missing[0])}: missing; not a `vllm bench serve "
                        "--save-result` file")
    return check_bench(doc, path)


def _number(v) -> bool:
    return is_finite(v)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_bench(doc: dict, path) -> dict:
    """Every field stepgap reads holds what vLLM writes there, or the file is refused, naming
    the field: counts are integers (not "8"), times finite numbers >= 0 (not NaN, not -1), the
    per-request lists (--save-detailed) one entry per prompt, and `completed` the requests
    without an error. Nothing is dropped or coerced silently."""
    def bad(field, expected):
        v = doc.get(field) if "[" not in field else None
        got = f", got {_short(v)}" if "[" not in field else ""
        raise UserError(f"{where(path, field=field)}: expected {expected}{got}")
    for key in ("date", "backend", "model_id"):
        if not isinstance(doc[key], str) or not doc[key]:
            bad(key, "a string")
    try:
        time.strptime(doc["date"], "%Y%m%d-%H%M%S")
    except ValueError:
        bad("date", "the time vLLM writes, YYYYmmdd-HHMMSS")
    n = doc["num_prompts"]
    if not _count(n) or not 1 <= n <= MAX_PROMPTS:
        bad("num_prompts", f"an integer from 1 to {MAX_PROMPTS:,}")
    if not _count(doc["completed"]) or doc["completed"] > n:
        bad("completed", f"an integer from 0 to num_prompts ({n})")
    if not _number(doc["duration"]) or doc["duration"] <= 0:
        bad("duration", "seconds > 0")
    if "failed" in doc and (not _number(doc["failed"]) or doc["failed"] < 0):
        bad("failed", "a finite number >= 0")
    for key in [k for k in doc if METRIC.fullmatch(k)]:   # mean_tpot_ms, p99_itl_ms, ...
        if not _number(doc[key]) or not 0 <= doc[key] <= 1000 * doc["duration"] * 1.01:
            bad(key, f"milliseconds from 0 to the run's duration ({doc['duration']:g} s)")
    rate = doc.get("request_rate", "inf")
    if rate != "inf" and not (_number(rate) and rate > 0):
        bad("request_rate", '"inf" or requests per second > 0')
    if doc.get("burstiness") is not None and not (_number(doc["burstiness"])
                                                  and doc["burstiness"] > 0):
        bad("burstiness", "a number > 0")
    conc = doc.get("max_concurrency")
    if conc is not None and not (_count(conc) and conc >= 1):
        bad("max_concurrency", "null or an integer >= 1")
    if bench_k(doc) is None:   # the depth given, else the rates' count, past MAX_K
        if doc.get("num_speculative_tokens") is not None:
            bad("num_speculative_tokens", f"an integer from 0 to {MAX_K}")
        bad("spec_decode_per_position_acceptance_rates", f"at most {MAX_K} positions (one per "
            "draft token)")
    if doc.get("mode") is not None and doc["mode"] not in MODES:
        bad("mode", f"one of {', '.join(MODES)}")
    if doc.get("spec_decode_num_drafts") is not None:
        for key in SPEC_COUNTS:
            if not _count(doc.get(key)):
                bad(key, "a count (an integer >= 0)")
        if not (_number(doc.get("spec_decode_acceptance_rate"))
                and 0 <= doc["spec_decode_acceptance_rate"] <= 100):
            bad("spec_decode_acceptance_rate", "a percentage from 0 to 100")
        if not (_number(doc.get("spec_decode_acceptance_length"))
                and doc["spec_decode_acceptance_length"] >= 1):
            bad("spec_decode_acceptance_length", "a number >= 1")
    rates = doc.get("spec_decode_per_position_acceptance_rates")
    if (rates is not None or doc.get("spec_decode_num_drafts") is not None) and not (
            isinstance(rates, list) and all(_number(r) and 0 <= r <= 1 for r in rates)):
        bad("spec_decode_per_position_acceptance_rates", "a list of rates from 0 to 1")
    if any(key in doc for key in DETAIL_KEYS):
        check_details(doc, path, n)
    return doc


def bench_k(doc: dict) -> int | None:
    """The run's speculation depth: its `--metadata num_speculative_tokens=K` (a string of
    ASCII digits, or an integer), else the per-position rates' count, else 0; None where it is
    no depth from 0 to MAX_K ("²" is a digit to str.isdigit, 5,000 digits one int() refuses)."""
    k = doc.get("num_speculative_tokens")
    if k is None:
        rates = doc.get("spec_decode_per_position_acceptance_rates")
        k = len(rates) if isinstance(rates, list) else 0
    elif isinstance(k, str) and re.fullmatch(r"[0-9]{1,4}", k):
        k = int(k)
    return k if is_int(k) and 0 <= k <= MAX_K else None


def check_details(doc: dict, path, n: int) -> None:
    """The per-request lists of --save-detailed: as many entries as prompts, each of its type."""
    def bad(field, expected, v=None):
        raise UserError(f"{where(path, field=field)}: expected {expected}, got {_short(v)}")
    errors = doc.get("errors")
    lists = {key: doc.get(key) for key in DETAIL_KEYS if key in doc}
    if errors is not None:
        lists["errors"] = errors
    for key, v in lists.items():
        if not isinstance(v, list):
            bad(key, f"a list of one entry per prompt ({n})", v)
        if len(v) != n:
            raise UserError(f"{where(path, field=key)}: {len(v)} entries for num_prompts {n} "
                            "(one per prompt): a list of another run, or a cut file?")
    for key, v in lists.items():
        for i, x in enumerate(v):
            ok = (_count(x) if key in ("input_lens", "output_lens") else
                  _number(x) and x >= 0 if key == "ttfts" else
                  isinstance(x, list) and all(_number(t) and t >= 0 for t in x)
                  if key == "itls" else x is None or isinstance(x, str))
            if not ok:
                bad(f"{key}[{i}]", EXPECTED[key], x)
    if errors is not None:
        done = sum(1 for e in errors if not e)
        if done != doc["completed"]:
            raise UserError(f"{where(path, field='completed')}: {doc['completed']}, but "
                            f"{done} of the {n} requests have no error")


EXPECTED = {"input_lens": "a token count (an integer >= 0)",
            "output_lens": "a token count (an integer >= 0)",
            "ttfts": "seconds (a finite number >= 0)",
            "itls": "a list of seconds (finite numbers >= 0)",
            "errors": "an error message (a string), or null"}
SPEC_COUNTS = ("spec_decode_num_drafts", "spec_decode_draft_tokens",
               "spec_decode_accepted_tokens")


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


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
        if err:
            continue
        for key, v in (("input_lens", plen), ("output_lens", olen)):
            if v < 1:   # a request that succeeded had a prompt and gave a token
                raise UserError(f"{where(path, field=f'{key}[{i}]')}: {v} tokens for a request "
                                "without an error")
            if v > MAX_PARAM:   # no model's context holds it
                raise UserError(f"{where(path, field=f'{key}[{i}]')}: {v} tokens, more than "
                                f"any request holds (at most {MAX_PARAM:,})")
        acc = None
        if chunk_tokens is not None:
            acc = [n - 1 for n in chunk_tokens[i][1:]]
        out.append(TraceRequest(ids[i] if ids else f"req-{i}", 0.0, int(plen), int(olen),
                                accepted=acc))
    return out


def spec_counts(doc: dict) -> dict:
    """The spec-decode counters a bench file holds (vLLM 0.32 writes those it scraped around the
    run, spec_decode_*), under the names stepgap's acceptance files and results give them."""
    return {"k": len(doc.get("spec_decode_per_position_acceptance_rates") or []),
            "num_drafts": doc["spec_decode_num_drafts"],
            "num_draft_tokens": doc["spec_decode_draft_tokens"],
            "num_accepted_tokens": doc["spec_decode_accepted_tokens"],
            "acceptance_length": doc["spec_decode_acceptance_length"]}


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


def merged_chunks(doc: dict, name) -> str | None:
    """One line for a run whose client merged its streamed chunks (is_bursty): what it still
    supports. None for a run whose client read the stream as the server wrote it."""
    if not is_bursty(doc):
        return None
    return (f"{name}: its streamed chunks were merged ({bursty_share(doc):.0%} of its ITLs "
            f"under {BURSTY_ITL_MS * 1e3:.0f} us: the client read the stream in bursts, short "
            "of CPU), so its TPOT and ITL time the client, not the server; it supports TTFT, "
            "E2EL and throughput only")


def is_bench(doc) -> bool:
    """A `vllm bench serve --save-result` document (by its keys)."""
    return isinstance(doc, dict) and all(k in doc for k in BENCH_KEYS)
