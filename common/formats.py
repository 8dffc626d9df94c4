"""Shared file formats and metrics: the contract of docs/explanation/design.md §2, §4 and §5.

Both halves import this module, and nothing else defines these formats:

- workload traces (JSON lines, one request per line),
- timeline spans (JSON lines, plus a Chrome-trace/Perfetto export) and step gaps,
- run results (the keys of `vllm bench serve --save-result`, plus `step_gaps`, `spec_decode`,
  `config`) and the metric computations behind them, as written and checked (a result is read
  as a `RunResult`, common/run_result.py),
- the printed summary in the layout of `vllm bench serve`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np

from stepgap.common.breakdown import idle_events, ranks as by_rank
from stepgap.common.errors import UserError, shown, where
from stepgap.common.limits import MAX_ARRIVAL_S, is_finite, is_int, is_number
from stepgap.common.fileio import (NONFINITE, check_file, dumps_json, json_lines,
                                   write_json, write_text)

MODES = ("sync", "async", "zero-bubble")
# The topology (docs/explanation/design.md §2): the worker in the engine's process or its own
# (vLLM's multiprocess executor); the device asynchronous to the worker (cuda) or the worker's own
# compute (cpu).
EXECUTORS = ("inline", "process")
DEVICES = ("cpu", "cuda")
OLD_DEVICES = {"async": "cuda", "sync": "cpu"}   # the devices as once spelled, still read
# cpu.frontend: the API server of a served engine (vLLM's, or `stepgap serve`), between a step's
# output and the client's chunk (docs/explanation/design.md §8). `add_request` is a request taken
# in, `stream` one chunk written to its client (stepgap serve); `wait` a thread blocked (on the
# device, or the worker blocked on the engine core's next message); `unmapped` a measured span no op
# stands for, its own name in args["vllm"].
LANES = ("cpu.frontend", "cpu.engine", "cpu.worker", "device")
OPS = {
    "cpu.frontend": ("add_request", "process_outputs", "stream"),
    "cpu.engine": ("add_request", "schedule", "update_from_output", "wait"),
    "cpu.worker": ("prepare_inputs", "launch", "wait", "unmapped", "propose", "broadcast",
                   "collect"),
    "device": ("target_forward", "rejection_sample", "draft_forward", "d2h", "fixup"),
}
# (lane, op) the in-process engine never records: an API server's work (vLLM's, simulated with
# its topology, or `stepgap serve`'s front end), vLLM's engine core taking a request in, and a
# vLLM scope with no stepgap op.
VLLM_OPS = (("cpu.frontend", "add_request"), ("cpu.frontend", "process_outputs"),
            ("cpu.frontend", "stream"), ("cpu.engine", "add_request"), ("cpu.worker", "unmapped"))
# Worker ops only the simulator runs: an n-gram proposer's host-side matching, and tensor
# parallelism's broadcast of each step to the ranks and collection of rank 0's output (the
# engine has one device and EAGLE-3 drafts).
SIM_ONLY_OPS = ("propose", "broadcast", "collect")
PERCENTILES = (99,)
METRICS = ("ttft", "tpot", "itl", "e2el")


# ---------------------------------------------------------------------------------------------
# Workload traces


@dataclass(slots=True)
class TraceRequest:
    """One request of a workload trace.

    `accepted` optionally holds the accepted draft count of each decode step, for replay.
    `category` optionally tags the request (the built-in MT-bench-like trace uses it).
    """

    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    prompt_token_ids: list[int] | None = None
    accepted: list[int] | None = None
    category: str | None = None

    def to_dict(self) -> dict:
        d = {"request_id": self.request_id, "arrival_s": self.arrival_s,
             "prompt_len": self.prompt_len, "output_len": self.output_len}
        for key in ("prompt_token_ids", "accepted", "category"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        return d


def parse_trace_line(obj, path, lineno) -> TraceRequest:
    """Validate one decoded trace line. Errors name the file, the line and the field."""
    if not isinstance(obj, dict):
        raise UserError(f"{where(path, lineno)}: expected a JSON object, got {type(obj).__name__}")
    for key in ("request_id", "arrival_s", "prompt_len", "output_len"):
        if key not in obj:
            raise UserError(f"{where(path, lineno, key)}: missing (required: request_id, "
                            "arrival_s, prompt_len, output_len)")
    rid = obj["request_id"]
    if not (isinstance(rid, str) or is_int(rid)) or rid == "":
        raise UserError(f"{where(path, lineno, 'request_id')}: expected a non-empty string or "
                        f"integer, got {rid!r}")
    arrival = obj["arrival_s"]
    if not is_number(arrival) or not 0 <= arrival <= MAX_ARRIVAL_S:
        raise UserError(f"{where(path, lineno, 'arrival_s')}: expected seconds from 0 to "
                        f"{MAX_ARRIVAL_S:g}, got {arrival!r}")
    for key in ("prompt_len", "output_len"):
        v = obj[key]
        if not is_int(v) or v < 1:
            raise UserError(f"{where(path, lineno, key)}: expected an integer >= 1, got {v!r}")
    ids = obj.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(is_int(t) and t >= 0 for t in ids):
            raise UserError(f"{where(path, lineno, 'prompt_token_ids')}: expected a list of "
                            "non-negative integers")
        if len(ids) != obj["prompt_len"]:
            raise UserError(f"{where(path, lineno, 'prompt_token_ids')}: has {len(ids)} tokens "
                            f"but prompt_len is {obj['prompt_len']}")
    accepted = obj.get("accepted")
    if accepted is not None:
        if not isinstance(accepted, list) or not all(is_int(a) and a >= 0 for a in accepted):
            raise UserError(f"{where(path, lineno, 'accepted')}: expected a list of "
                            "non-negative integers (accepted drafts per decode step)")
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise UserError(f"{where(path, lineno, 'category')}: expected a string, got {category!r}")
    return TraceRequest(str(rid), float(arrival), obj["prompt_len"], obj["output_len"],
                        ids, accepted, category)


def load_trace(path) -> list[TraceRequest]:
    """Read a workload trace (JSON lines). Blank lines are skipped."""
    path = Path(path)
    check_file(path, "trace file")
    requests, seen = [], {}
    for lineno, obj in json_lines(path):
        req = parse_trace_line(obj, path, lineno)
        if req.request_id in seen:
            raise UserError(f"{where(path, lineno, 'request_id')}: duplicate id "
                            f"{req.request_id!r} (first on line {seen[req.request_id]})")
        seen[req.request_id] = lineno
        requests.append(req)
    if not requests:
        raise UserError(f"{path}: the trace holds no requests")
    return requests


def save_trace(path, requests: Iterable[TraceRequest]) -> None:
    write_text(path, "".join(dumps_json(r.to_dict()) + "\n" for r in requests))


# ---------------------------------------------------------------------------------------------
# Timelines


class Span(NamedTuple):
    """One op on one lane: `{"lane", "op", "step", "start_us", "end_us", "args"}`."""

    lane: str
    op: str
    step: int
    start_us: float
    end_us: float
    args: dict | None = None

    def to_dict(self) -> dict:
        return {"lane": self.lane, "op": self.op, "step": self.step,
                "start_us": round(self.start_us, 3), "end_us": round(self.end_us, 3),
                "args": self.args or {}}


def save_timeline(path, spans: Iterable[Span]) -> None:
    write_text(path, "".join(dumps_json(s.to_dict()) + "\n" for s in spans))


def _number(d: dict, key: str, path, lineno) -> float:
    v = d.get(key)
    if v is None:
        raise UserError(f"{where(path, lineno, key)}: missing")
    if not is_finite(v):
        raise UserError(f"{where(path, lineno, key)}: expected a finite number, got {v!r}")
    return float(v)


def parse_span(d, path, lineno) -> Span:
    """One decoded timeline line. Errors name the file, the line and the field."""
    if not isinstance(d, dict):
        raise UserError(f"{where(path, lineno)}: expected a JSON object (a span), got "
                        f"{type(d).__name__}")
    lane = d.get("lane")
    if lane not in OPS:
        raise UserError(f"{where(path, lineno, 'lane')}: unknown lane {lane!r} "
                        f"(expected one of {', '.join(LANES)})")
    op = d.get("op")
    if not isinstance(op, str) or not op:
        raise UserError(f"{where(path, lineno, 'op')}: expected an op name, got {op!r}")
    step = d.get("step")
    if not is_int(step) or step < -1:
        raise UserError(f"{where(path, lineno, 'step')}: expected an integer >= 0 (or -1: no "
                        f"step, a request taken in), got {step!r}")
    start, end = _number(d, "start_us", path, lineno), _number(d, "end_us", path, lineno)
    if end < start:
        raise UserError(f"{where(path, lineno, 'end_us')}: {end:g} is before start_us "
                        f"{start:g}")
    args = d.get("args")
    if args is not None and not isinstance(args, dict):
        raise UserError(f"{where(path, lineno, 'args')}: expected an object, got {args!r}")
    return Span(lane, op, step, start, end, args or {})


def load_timeline(path) -> list[Span]:
    path = Path(path)
    check_file(path, "timeline file")
    return [parse_span(d, path, lineno) for lineno, d in json_lines(path)]


IDLE_TRACK = "device idle"   # the Chrome trace's track of the device's idle stretches


def chrome_trace(spans: Iterable[Span], process_name: str = "stepgap") -> dict:
    """Chrome-trace / Perfetto JSON: one thread per lane, one complete ("X") event per span;
    a data-parallel run's ranks (spans with args.dp) each a process of their own. A last
    thread, "device idle", holds the device's idle stretches, each named for the op it is
    exposed to (common/breakdown.py: "idle: prepare_inputs", "idle: (no op)"), with the step
    it delays: where each microsecond of a gap goes, on the timeline."""
    spans = list(spans)
    tid = {lane: i + 1 for i, lane in enumerate((*LANES, IDLE_TRACK))}
    ranks = sorted({s.args["dp"] for s in spans if s.args and "dp" in s.args})
    procs = {None: (1, process_name)} if not ranks else \
        {r: (1 + r, f"{process_name} DP rank {r}") for r in ranks}
    events = []
    for pid, name in procs.values():
        events += [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}]
        events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                    "args": {"name": lane}} for lane, t in tid.items()]
    for s in spans:
        pid = procs[s.args.get("dp") if ranks and s.args else None][0]
        events.append({"name": s.op, "cat": s.lane, "ph": "X", "pid": pid, "tid": tid[s.lane],
                       "ts": round(s.start_us, 3), "dur": round(s.end_us - s.start_us, 3),
                       "args": {"step": s.step, **(s.args or {})}})
    for rank, own in by_rank(spans).items():
        pid = procs[rank if ranks else None][0]
        for a, b, lane, op, step in idle_events(own):
            events.append({"name": f"idle: {op}", "cat": IDLE_TRACK, "ph": "X", "pid": pid,
                           "tid": tid[IDLE_TRACK], "ts": round(a, 3), "dur": round(b - a, 3),
                           "args": {"before_step": step, "exposed_lane": lane}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(path, spans: Iterable[Span], process_name: str = "stepgap") -> None:
    write_text(path, dumps_json(chrome_trace(spans, process_name)))


def step_gaps(spans: Iterable[Span]) -> list[float]:
    """Device idle time before each step, in microseconds (docs/explanation/design.md §2).

    The gap of step N+1 is the start of its first device op minus the end of step N's last device
    op, taken between consecutive steps that have device ops. Overlap counts as no gap (0).
    """
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for s in spans:
        if s.lane != "device":
            continue
        if s.step not in first or s.start_us < first[s.step]:
            first[s.step] = s.start_us
        if s.step not in last or s.end_us > last[s.step]:
            last[s.step] = s.end_us
    steps = sorted(first)
    return [max(0.0, first[b] - last[a]) for a, b in zip(steps, steps[1:])]


# ---------------------------------------------------------------------------------------------
# Metrics, as `vllm bench serve` computes them


@dataclass(slots=True)
class RequestTiming:
    """What the client saw of one request: when it was sent, and each streamed chunk."""

    request_id: str
    prompt_len: int
    send_s: float
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)

    @property
    def output_len(self) -> int:
        return sum(self.chunk_tokens)

    def add_chunk(self, t_s: float, num_tokens: int) -> None:
        self.chunk_s.append(t_s)
        self.chunk_tokens.append(num_tokens)


def _pkey(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def compute_metrics(timings: list[RequestTiming], duration_s: float,
                    percentiles: Iterable[float] = PERCENTILES,
                    percentile_metrics: Iterable[str] = METRICS) -> dict:
    """The metric keys of `vllm bench serve --save-result`, computed its way.

    TTFT = first chunk - send; ITL = gaps between chunks; E2EL = last chunk - send;
    TPOT = (E2EL - TTFT) / (output_len - 1) for requests with more than one token.
    Mean, median, std (population) in milliseconds, and the percentiles of the
    `percentile_metrics` (vLLM's --metric-percentiles and --percentile-metrics).
    """
    done = [t for t in timings if t.chunk_s]
    outs = [t.output_len for t in done]
    ttfts = [t.chunk_s[0] - t.send_s for t in done]
    e2els = [t.chunk_s[-1] - t.send_s for t in done]
    itls = _gaps([t.chunk_s for t in done])
    tpots = [(e - f) / (o - 1) for o, f, e in zip(outs, ttfts, e2els) if o > 1]
    total_in = sum(t.prompt_len for t in done)
    total_out = sum(outs)
    dur = max(duration_s, 1e-12)
    out = {
        "duration": duration_s, "completed": len(done), "failed": len(timings) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / dur, "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        v = np.asarray(values if len(values) else [0.0], dtype=float) * 1000.0
        out[f"mean_{name}_ms"] = float(v.mean())
        out[f"median_{name}_ms"] = median(v)
        out[f"std_{name}_ms"] = float(v.std())
        if name in percentile_metrics:
            for p in percentiles:
                out[f"p{_pkey(p)}_{name}_ms"] = percentile(v, p)
    return out


def _gaps(series: list[list[float]]) -> np.ndarray:
    """The gaps between consecutive values within each series, series after series (each b - a,
    as Python subtracts them): a run's ITLs, without a Python loop over its chunks."""
    if not series:
        return np.zeros(0)
    lens = np.fromiter(map(len, series), np.int64, len(series))
    gaps = np.diff(np.fromiter(chain.from_iterable(series), float, int(lens.sum())))
    keep = np.ones(len(gaps), bool)
    keep[np.cumsum(lens)[:-1] - 1] = False   # not from one series' last to the next's first
    return gaps[keep]


# np.median and np.percentile import numpy's masked arrays on their first call (about 12 ms of
# every simulate's start-up on this VM): a result takes its medians and percentiles from these
# two instead, the same floats to the bit (tests/test_formats.py holds them to numpy's).


def median(v: np.ndarray) -> float:
    """np.median of a float array: the middle value, or the mean of the two middle ones."""
    n = v.size
    m = n // 2
    if n == 0 or np.isnan(v).any():
        return math.nan
    part = np.partition(v, [m - 1, m] if n % 2 == 0 else m)
    return float(part[m]) if n % 2 else float((part[m - 1] + part[m]) / 2)


def percentile(v: np.ndarray, p: float) -> float:
    """np.percentile(v, p) of a float array, its default (linear) method: the value at
    (n - 1) p / 100 in sorted order, between its two neighbours as numpy interpolates."""
    n = v.size
    if n == 0 or np.isnan(v).any():
        return math.nan
    at = (n - 1) * (p / 100)
    i = min(math.floor(at), n - 1)
    j = min(i + 1, n - 1)
    part = np.partition(v, [i, j] if i != j else i)
    a, b, t = float(part[i]), float(part[j]), at - i
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


class SpecStats:
    """Acceptance statistics, counted as vLLM's SpecDecodingStats counts them."""

    def __init__(self, k: int):
        self.k = k
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * k

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    def to_dict(self) -> dict:
        n = max(self.num_drafts, 1)
        return {
            "k": self.k, "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_length": 1.0 + self.num_accepted_tokens / n,
            "acceptance_rate": self.num_accepted_tokens / max(self.num_draft_tokens, 1),
            "acceptance_rate_per_pos": [c / n for c in self.accepted_per_pos],
        }


# ---------------------------------------------------------------------------------------------
# Run results


# Once a tick, as vLLM's stat logger reports it (LLMServingSim's bench writes these columns to
# timeseries.csv): prompt and generated tokens per second over the tick, and the running and
# waiting requests and KV cache use (%) of the last step in it; `t` is the tick's end.
TIMESERIES = ("t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct")


def timeseries(samples: list[tuple], tick_s: float) -> dict[str, list[float]]:
    """Per-step samples (t_s, running, waiting, kv_cache_pct, prompt_tokens, gen_tokens), in
    time order, as the TIMESERIES columns over ticks of `tick_s` (ticks with no step are
    left out, as the stat logger has nothing to report for them)."""
    out = {k: [] for k in TIMESERIES}
    i, n = 0, len(samples)
    while i < n:
        b = int(samples[i][0] // tick_s)
        prompt = gen = 0
        last = None
        while i < n and int(samples[i][0] // tick_s) == b:
            last = samples[i]
            prompt += last[4]
            gen += last[5]
            i += 1
        for key, v in zip(TIMESERIES, ((b + 1) * tick_s, prompt / tick_s, gen / tick_s,
                                       last[1], last[2], last[3])):
            out[key].append(round(v, 3))
    return out


def save_result(path, result) -> None:
    """Write a run result (a RunResult, or its document). Same input, same bytes: keys keep
    their order, floats their repr. A path ending in `.gz` is written gzip-compressed (compact
    JSON, no timestamp)."""
    write_json(path, result if isinstance(result, dict) else result.to_dict())


REQUIRED_RESULT_KEYS = ("completed", "duration", "mean_tpot_ms", "mean_itl_ms", "mean_ttft_ms")
# The parts of a run result other code reads, and what each must be.
RESULT_SECTIONS = {"step_gaps": dict, "spec_decode": dict, "config": dict, "timeseries": dict}


def is_metric(key: str) -> bool:
    """A key of `vllm bench serve`'s numbers (counts, duration, latencies, throughputs)."""
    return key in ("completed", "failed", "duration", "total_input_tokens",
                   "total_output_tokens") or key.endswith(("_ms", "_throughput")) \
        or key == "request_throughput"


def check_result(res, path) -> dict:
    """A run result's shape: an object, its required keys there, every metric a number (NaN
    allowed: vLLM writes it for a metric with no samples), its sections objects."""
    if not isinstance(res, dict):
        raise UserError(f"{path}: expected a JSON object (a run result), got "
                        f"{type(res).__name__}")
    for key in REQUIRED_RESULT_KEYS:
        if key not in res:
            raise UserError(f"{where(path, field=key)}: missing; is this a run result of "
                            "stepgap or of `vllm bench serve --save-result`?")
    for key, v in res.items():
        if v is None and key not in REQUIRED_RESULT_KEYS:
            continue   # vLLM writes null for a metric it did not take (goodput)
        if is_metric(key) and v in NONFINITE:
            v = res[key] = float(v)   # as save_result wrote it
        if is_metric(key) and not (is_number(v) and (math.isnan(v) or 0 <= v < math.inf)):
            raise UserError(f"{where(path, field=key)}: expected a number >= 0 (NaN where the "
                            f"run took none), got {shown(v)}")
    if math.isnan(res["completed"]):
        raise UserError(f"{where(path, field='completed')}: expected a count >= 0, got nan")
    if res["completed"] and not res["duration"] > 0:
        raise UserError(f"{where(path, field='duration')}: {res['duration']!r} s for "
                        f"{res['completed']} requests completed")
    for key, kind in RESULT_SECTIONS.items():
        if res.get(key) is not None and not isinstance(res[key], kind):
            raise UserError(f"{where(path, field=key)}: expected an object, got "
                            f"{type(res[key]).__name__}")
    for key, v in (res.get("step_gaps") or {}).items():
        ok = all(is_finite(x) and x >= 0 for x in v) if key == "values_us" and \
            isinstance(v, list) else is_number(v) and not v < 0 and v != math.inf
        if not ok:
            raise UserError(f"{where(path, field=f'step_gaps.{key}')}: expected "
                            f"{'a list of numbers' if key == 'values_us' else 'a number'}, "
                            f"got {v!r}")
    _check_config(res.get("config") or {}, path)
    return res


def _check_config(config: dict, path) -> None:
    """What readers take from a result's `config` (common/run_result.py): the simulator's plan
    (`resolved`) an object, the prefix-cache counters (`queries`, `hits`: tokens, hits at most
    queries) and the preemptions counts, wherever the layout put them."""
    resolved = config.get("resolved")
    if resolved is not None and not isinstance(resolved, dict):
        raise UserError(f"{where(path, field='config.resolved')}: expected an object (the "
                        f"simulator's plan), got {shown(resolved)}")
    for at, section in (("config", config), ("config.resolved", resolved or {})):
        cache = section.get("prefix_cache")
        if cache is not None and not (
                isinstance(cache, dict) and all(is_int(cache.get(k)) and cache[k] >= 0
                                                for k in ("queries", "hits"))
                and cache["hits"] <= cache["queries"]):
            raise UserError(f"{where(path, field=at + '.prefix_cache')}: expected {{queries, "
                            f"hits}}, token counts with hits <= queries, got {shown(cache)}")
        n = section.get("num_preemptions")
        if n is not None and not (is_int(n) and n >= 0):
            raise UserError(f"{where(path, field=at + '.num_preemptions')}: expected a count, "
                            f"got {shown(n)}")
        notes = section.get("notes")
        if notes is not None and not (isinstance(notes, list)
                                      and all(isinstance(x, str) for x in notes)):
            raise UserError(f"{where(path, field=at + '.notes')}: expected a list of lines, got "
                            f"{shown(notes)}")


def format_summary(res, title: str = "Serving Benchmark Result") -> str:
    """A printed summary of a RunResult (common/run_result.py) in the layout of `vllm bench
    serve`."""
    lines = [f"{' ' + title + ' ':=^50}"]

    def row(label, value, fmt="{:<10.2f}"):
        lines.append("{:<40} ".format(label) + (fmt.format(value) if value is not None else "-"))

    m = res.metrics
    row("Successful requests:", m.completed, "{:<10}")
    if res.max_concurrency is not None:
        row("Maximum request concurrency:", res.max_concurrency, "{:<10}")
    row("Benchmark duration (s):", m.duration)
    row("Total input tokens:", m.total_input_tokens, "{:<10}")
    row("Total generated tokens:", m.total_output_tokens, "{:<10}")
    row("Request throughput (req/s):", m.request_throughput)
    row("Output token throughput (tok/s):", m.output_throughput)
    row("Total Token throughput (tok/s):", m.total_token_throughput)
    sections = (("ttft", "Time to First Token", "TTFT"),
                ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
                ("itl", "Inter-token Latency", "ITL"), ("e2el", "End-to-end Latency", "E2EL"))
    for key, head, short in sections:
        lines.append(f"{head:-^50}")
        row(f"Mean {short} (ms):", getattr(m, f"mean_{key}_ms"))
        row(f"Median {short} (ms):", getattr(m, f"median_{key}_ms"))
        for k in sorted(m.percentiles):
            if k.endswith(f"_{key}_ms"):
                row(f"P{k[1:-len(key) - 4]} {short} (ms):", m.percentiles[k])
    spec = res.spec_decode
    if spec and spec.num_drafts:
        lines.append(f"{'Speculative Decoding':-^50}")
        row("Acceptance rate (%):", 100 * spec.acceptance_rate)
        row("Acceptance length:", spec.acceptance_length)
        row("Drafts:", spec.num_drafts, "{:<10}")
        row("Draft tokens:", spec.num_draft_tokens, "{:<10}")
        row("Accepted tokens:", spec.num_accepted_tokens, "{:<10}")
        per_pos = ", ".join(f"{100 * r:.1f}" for r in spec.acceptance_rate_per_pos)
        lines.append("{:<40} {}".format("Per-position acceptance (%):", per_pos))
    gaps = res.step_gaps
    if gaps.count:
        lines.append(f"{'Step gaps (device idle)':-^50}")
        row("Steps:", gaps.count + 1, "{:<10}")
        row("Mean step gap (us):", gaps.mean_us)
        row("Median step gap (us):", gaps.median_us)
        row("P90 step gap (us):", gaps.p90_us)
        row("P99 step gap (us):", gaps.p99_us)
    lines.append("=" * 50)
    return "\n".join(lines)
