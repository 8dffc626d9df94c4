"""One run's result, typed: `RunResult`, the one schema of every result file (docs/explanation/design.md §4).

The simulator (`simulate`), the engine (`run_trace`, `stepgap run`), `stepgap serve`, `vllm bench
serve --save-result` (as vLLM writes it, or as `stepgap ingest` and a measured folder keep it) and
a peer's vLLM run (its requests.jsonl) all give a `RunResult`. Its parts:

- `metrics` (`Metrics`): the numbers of `vllm bench serve`, by vLLM's names
  (`res.metrics.mean_tpot_ms`; any of them by name with `res.metrics.get("p99_itl_ms")`);
- `step_gaps` (`StepGaps`): the device's idle time before each step (`count` 0 where the run
  recorded none: vLLM's files);
- `spec_decode` (`SpecDecode`): the acceptance counters, or None;
- `config`: the run's settings as the run wrote them (a dict), without the simulator's plan;
- `resolved` (`ResolvedPlan`): the simulator's plan (written as `config.resolved`), or None for
  a measured run;
- `requests` (`Requests`): the per-request lists of a detailed result, or None;
- `timeseries`: the stat logger's columns (formats.TIMESERIES), or None;
- `extra`: the keys of the file no part reads (vLLM's `date`, `model_id`, ..., `bands`).

It is built in one call (`RunResult.build`: the client's timings, the gaps, the counters, the
plan), read from any layout (`RunResult.load`; `RunResult.from_dict` for a document in memory)
and written as today's files are (`to_dict`, `to_json`, `save`: keys in their order, so that the
same run gives the same bytes, and a file read and written again keeps its bytes).

    res = RunResult.load("run.json")
    res.metrics.mean_tpot_ms, res.step_gaps.median_us, res.prefix_cache, res.notes
    res.config["mode"], res.resolved.hardware, res.requests.ttfts
    res.save("copy.json")
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from stepgap.common.errors import UserError, shown, where
from stepgap.common.fileio import check_file, dumps_json, read_json_object
from stepgap.common.formats import (METRICS, PERCENTILES, RequestTiming, SpecStats,
                                    check_result, compute_metrics, is_metric, median, percentile,
                                    save_result)
from stepgap.common.limits import is_int
from stepgap.common.peer_run import PERCENTILES as PEER_PERCENTILES
from stepgap.common.peer_run import is_peer_requests, load_peer_requests
from stepgap.common.vllm_bench import bench_config, bench_requests, check_details, spec_counts


def _layout(full: dict, always: Iterable[str], order: tuple | None) -> dict:
    """A part's keys as written: in its own order with the keys that are None left out (but
    `always`); in `order` where the part was read from a file (a key it held is written again,
    a key it did not is written only when set)."""
    if order is None:
        always = set(always)
        return {k: v for k, v in full.items() if v is not None or k in always}
    out = {k: full[k] for k in order if k in full}
    out.update((k, v) for k, v in full.items() if k not in out and v is not None)
    return out


def _split(cls, d: dict) -> tuple[dict, dict]:
    """`d`'s keys that are fields of `cls`, and the rest."""
    names = {f.name for f in fields(cls)} - {"extra", "order"}
    return {k: v for k, v in d.items() if k in names}, \
        {k: v for k, v in d.items() if k not in names}


# ---------------------------------------------------------------------------------------------
# The parts


class _Keys:
    """A part's keys, read as they are written (`part["mean_us"]`, `part.get(...)`), for tests
    and scripts; the product code reads the attributes."""

    __slots__ = ()

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def get(self, key: str, default=None):
        v = self.to_dict().get(key)
        return default if v is None else v

    def keys(self):
        return self.to_dict().keys()

    def items(self):
        return self.to_dict().items()

    def __iter__(self):
        return iter(self.to_dict())

    def __contains__(self, key: str) -> bool:
        return key in self.to_dict()


STATS = ("mean", "median", "std")
COUNTS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
          "request_throughput", "output_throughput", "total_token_throughput")


@dataclass(slots=True)
class Metrics(_Keys):
    """The numbers of `vllm bench serve --save-result`, by vLLM's names (formats.compute_metrics):
    counts and throughputs; the mean, median and std of TTFT, TPOT, ITL and E2EL (ms); their
    percentiles in `percentiles` ("p99_tpot_ms": ...); other metrics a vLLM file holds in
    `extra`. A metric a file lacks is None."""

    duration: float | None = None
    completed: int | None = None
    failed: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    percentiles: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> Metrics:
        """The metric keys of `d` (formats.is_metric), whatever else it holds."""
        # a metric written as null (vLLM's, for one it did not take) is kept as it is
        own, rest = _split(cls, {k: v for k, v in d.items() if is_metric(k) and v is not None})
        rest.update((k, None) for k, v in d.items() if is_metric(k) and v is None)
        pcts = {k: v for k, v in rest.items()
                if k.startswith("p") and k.endswith(tuple(f"_{m}_ms" for m in METRICS))}
        return cls(**own, percentiles=pcts,
                   extra={k: v for k, v in rest.items() if k not in pcts})

    def to_dict(self) -> dict:
        """In the order `vllm bench serve` writes them: the counts, then each latency's stats
        and percentiles."""
        out = {k: getattr(self, k) for k in COUNTS}
        for m in METRICS:
            out.update((f"{s}_{m}_ms", getattr(self, f"{s}_{m}_ms")) for s in STATS)
            out.update((k, v) for k, v in self.percentiles.items() if k.endswith(f"_{m}_ms"))
        out = {k: v for k, v in out.items() if v is not None or k in self.percentiles}
        out.update(self.extra)
        return out

    def percentile(self, metric: str, p: float) -> float | None:
        """A metric's percentile ("tpot", 99: p99_tpot_ms), None where the run has none."""
        return self.percentiles.get(f"p{int(p) if float(p).is_integer() else p}_{metric}_ms")



@dataclass(slots=True)
class StepGaps(_Keys):
    """The device's idle time before each step, in microseconds (formats.step_gaps): `count`
    gaps (0 where the run recorded none), their summary, and every gap (`values_us`) with
    --detailed."""

    count: int = 0
    mean_us: float | None = None
    median_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    max_us: float | None = None
    values_us: list[float] | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, gaps_us: list[float], detailed: bool = False) -> StepGaps:
        """The summary of a gap distribution."""
        if not gaps_us:
            return cls()
        g = np.asarray(gaps_us, dtype=float)
        return cls(int(g.size), float(g.mean()), median(g),
                   percentile(g, 90), percentile(g, 99), float(g.max()),
                   [round(float(x), 3) for x in g] if detailed else None)

    @classmethod
    def from_dict(cls, d: dict | None) -> StepGaps:
        own, rest = _split(cls, d or {})
        return cls(**own, extra=rest)

    def to_dict(self) -> dict:
        full = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**_layout(full, ("count",), None), **self.extra}


@dataclass(slots=True)
class SpecDecode(_Keys):
    """The acceptance counters of a run with speculation, as vLLM's SpecDecodingStats counts
    them (formats.SpecStats gives them)."""

    k: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_length: float
    acceptance_rate: float
    acceptance_rate_per_pos: list[float]
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, spec: SpecStats) -> SpecDecode:
        return cls(**spec.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> SpecDecode:
        own, rest = _split(cls, d)
        return cls(**{f.name: own.get(f.name) for f in fields(cls) if f.name != "extra"},
                   extra=rest)

    def to_dict(self) -> dict:
        full = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in full.items() if v is not None}, **self.extra}


@dataclass(slots=True)
class ResolvedPlan(_Keys):
    """The simulator's plan of a run (written as `config.resolved`): the hardware, the device's
    kind, the mode, the notes its answer rests on, the models, the KV blocks, the acceptance
    model, the host's costs, the counters of the run (steps, preemptions, prefix cache), and
    where they apply the jitter, the device's cost sources and data parallelism's ranks."""

    hardware: str | None = None
    device: str | None = None
    mode: str | None = None
    notes: list[str] | None = None
    target: str | None = None
    draft: str | None = None
    num_kv_blocks: int | None = None
    acceptance_rates: list[float] | None = None
    acceptance_spread: float | None = None
    acceptance_profile: str | None = None
    drafter: dict | None = None
    cpu_costs_us: dict | None = None
    num_steps: int | None = None
    num_preemptions: int | None = None
    prefix_cache: dict | None = None
    jitter: dict | None = None
    device_costs: dict | None = None
    data_parallel: dict | None = None
    extra: dict = field(default_factory=dict)
    order: tuple | None = field(default=None, repr=False, compare=False)

    # written even when None (a run without a draft model writes "draft": null)
    ALWAYS = ("hardware", "device", "mode", "notes", "target", "draft", "num_kv_blocks",
              "acceptance_rates", "acceptance_spread", "cpu_costs_us", "num_steps",
              "num_preemptions")

    @classmethod
    def from_dict(cls, d: dict) -> ResolvedPlan:
        own, rest = _split(cls, d)
        return cls(**own, extra=rest, order=tuple(d))

    def to_dict(self) -> dict:
        full = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("extra", "order")}
        return _layout({**full, **self.extra}, self.ALWAYS, self.order)


@dataclass(slots=True)
class Requests:
    """A detailed result's per-request lists, as `vllm bench serve --save-detailed` writes them:
    times in seconds, one entry per request (stepgap adds `chunk_tokens`, the tokens of each
    streamed chunk; the engine `accepted`, the drafts accepted at each step, and
    `output_token_ids`)."""

    ids: list[str] | None
    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    chunk_tokens: list[list[int]] | None = None
    accepted: list[list[int]] | None = None   # the engine's accepted drafts of each step
    output_token_ids: list[list[int]] | None = None   # the engine's tokens

    @classmethod
    def of(cls, timings: list[RequestTiming]) -> Requests:
        """The lists of the client's timings (a request that never answered: TTFT 0)."""
        return cls([t.request_id for t in timings], [t.prompt_len for t in timings],
                   [t.output_len for t in timings],
                   [t.chunk_s[0] - t.send_s if t.chunk_s else 0.0 for t in timings],
                   [[b - a for a, b in zip(t.chunk_s, t.chunk_s[1:])] for t in timings],
                   [t.chunk_tokens for t in timings])

    def timings(self, tag: str = "") -> list[RequestTiming]:
        """The client's view of each request, rebuilt: its chunks at the times they came
        (from a send at 0), with their token counts where known (else the output length
        spread over the chunks)."""
        ids = self.ids or [str(i) for i in range(len(self.ttfts))]
        out = []
        for n, (rid, ttft, itls, plen) in enumerate(zip(ids, self.ttfts, self.itls,
                                                        self.input_lens)):
            t = RequestTiming(f"{rid}{tag}", plen, 0.0)
            times = np.cumsum([ttft, *itls]).tolist()
            tokens = self.chunk_tokens[n] if self.chunk_tokens else [1] * len(times)
            if not self.chunk_tokens:
                tokens[-1] += self.output_lens[n] - len(times)
            for tm, k in zip(times, tokens):
                t.add_chunk(tm, k)
            out.append(t)
        return out


DETAIL_KEYS = ("ttfts", "itls", "input_lens")
# A result's per-request keys, in the order they are written, and the Requests field of each
# (the timeseries sits between the client's lists and the engine's).
REQUEST_KEYS = {"request_ids": "ids", "input_lens": "input_lens", "output_lens": "output_lens",
                "ttfts": "ttfts", "itls": "itls", "chunk_tokens": "chunk_tokens"}
ENGINE_KEYS = {"output_token_ids": "output_token_ids", "accepted": "accepted"}
HEAD = ("backend", "num_prompts", "request_rate", "burstiness", "max_concurrency")


def _requests(doc: dict) -> Requests | None:
    if not all(k in doc for k in DETAIL_KEYS):
        return None
    output_lens = doc.get("output_lens")
    return Requests(doc.get("request_ids"), doc["input_lens"],
                    output_lens if output_lens is not None else [], doc["ttfts"], doc["itls"],
                    doc.get("chunk_tokens"), doc.get("accepted"), doc.get("output_token_ids"))


# ---------------------------------------------------------------------------------------------
# A run's result


@dataclass
class RunResult(_Keys):
    """One run's result (the module's docstring names its parts). `source` is the file it was
    read from (None for a result made in this process)."""

    backend: str
    metrics: Metrics
    num_prompts: int | None = None
    request_rate: Any = "inf"   # requests per second, "inf", or "trace"
    burstiness: float | None = 1.0
    max_concurrency: int | None = None
    step_gaps: StepGaps = field(default_factory=StepGaps)
    spec_decode: SpecDecode | None = None
    config: dict = field(default_factory=dict)
    resolved: ResolvedPlan | None = None
    requests: Requests | None = None
    timeseries: dict | None = None
    extra: dict = field(default_factory=dict)
    source: str | None = field(default=None, compare=False)
    # a document's key orders, where it was read from one that writes them otherwise: the top
    # level's, and config's (where `resolved` sat)
    order: tuple | None = field(default=None, repr=False, compare=False)
    config_order: tuple | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, timings: list[RequestTiming], duration_s: float, *, backend: str,
              config: dict, resolved: ResolvedPlan | None = None,
              gaps_us: list[float] | None = None, spec: SpecStats | None = None,
              detailed: bool = False, percentiles: Iterable[float] = PERCENTILES,
              percentile_metrics: Iterable[str] = METRICS,
              timeseries: dict | None = None) -> RunResult:
        """One run's result from what its client saw (`timings`, in the trace's order) over
        `duration_s`: the metrics of `vllm bench serve`, the step gaps, the acceptance counters
        (`spec`, with speculation), the run's `config` (its load read from there: request_rate,
        burstiness, max_concurrency) and the simulator's plan (`resolved`). With `detailed`,
        the per-request lists and every step gap."""
        return cls(backend=backend, num_prompts=len(timings),
                   request_rate=config.get("request_rate", "inf"),
                   burstiness=config.get("burstiness", 1.0),
                   max_concurrency=config.get("max_concurrency"),
                   metrics=Metrics.from_dict(compute_metrics(timings, duration_s, percentiles,
                                                             percentile_metrics)),
                   step_gaps=StepGaps.of(gaps_us or [], detailed),
                   spec_decode=SpecDecode.of(spec) if spec is not None else None,
                   config=config, resolved=resolved,
                   requests=Requests.of(timings) if detailed else None, timeseries=timeseries)

    @classmethod
    def from_dict(cls, doc: dict, source=None) -> RunResult:
        """The result of a document already checked (formats.check_result) or just made: every
        layout (the simulator's, the engine's, a served run's, vLLM's own files)."""
        config = dict(doc.get("config") or {})
        config_order = tuple(config) if list(config)[-1:] != ["resolved"] and \
            "resolved" in config else None
        resolved = config.pop("resolved", None)
        spec = doc.get("spec_decode")
        known = {*HEAD, "step_gaps", "spec_decode", "config", "timeseries", *REQUEST_KEYS,
                 *ENGINE_KEYS}
        requests = _requests(doc)
        extra = {k: v for k, v in doc.items() if k not in known and not is_metric(k)}
        if requests is None:   # lists that do not make a Requests are kept as they are
            extra.update((k, doc[k]) for k in (*REQUEST_KEYS, *ENGINE_KEYS) if k in doc)
        res = cls(backend=doc.get("backend"), num_prompts=doc.get("num_prompts"),
                  request_rate=doc.get("request_rate"), burstiness=doc.get("burstiness"),
                  max_concurrency=doc.get("max_concurrency"),
                  metrics=Metrics.from_dict(doc),
                  step_gaps=StepGaps.from_dict(doc.get("step_gaps")),
                  spec_decode=SpecDecode.from_dict(spec) if spec else None,
                  config=config,
                  resolved=ResolvedPlan.from_dict(resolved) if resolved is not None else None,
                  requests=requests, timeseries=doc.get("timeseries"), extra=extra,
                  source=None if source is None else str(source),
                  order=tuple(doc), config_order=config_order)
        return res

    @classmethod
    def load(cls, path) -> RunResult:
        """A result file of any layout: stepgap's (`.json`, `.json.gz`: the simulator's, the
        engine's, a served run's, an ingested vLLM run's), one `vllm bench serve --save-result`
        wrote, or a peer's vLLM run (its requests.jsonl, common/peer_run.py)."""
        path = Path(path)
        if is_peer_requests(path):
            return cls.from_dict(peer_result(path).to_dict(), path)
        check_file(path, "result file")
        doc = check_result(read_json_object(path, "a run result"), path)
        if any(key in doc for key in (*DETAIL_KEYS, "output_lens")):   # one entry a prompt
            first = next(doc[k] for k in (*DETAIL_KEYS, "output_lens") if k in doc)
            n = doc.get("num_prompts", len(first) if isinstance(first, list) else None)
            if not (is_int(n) and n >= 0):
                raise UserError(f"{where(path, field='num_prompts')}: expected a count (the "
                                f"per-request lists hold one entry a prompt), got {shown(n)}")
            check_details(doc, path, n)
        return cls.from_dict(doc, path)

    # -- as written ----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The document, as `save` writes it: the keys of `vllm bench serve` in its order,
        then `step_gaps`, `spec_decode`, `config` (the plan last, as `resolved`), the
        per-request lists, `timeseries`, the engine's lists and the rest; a result read from
        a file in that file's order."""
        config = dict(self.config)
        if self.resolved is not None:
            config["resolved"] = self.resolved.to_dict()
            if self.config_order is not None:
                config = {k: config[k] for k in self.config_order if k in config}
        out = {k: getattr(self, k) for k in HEAD}
        out.update(self.metrics.to_dict())
        out["step_gaps"] = self.step_gaps.to_dict()
        if self.spec_decode is not None:
            out["spec_decode"] = self.spec_decode.to_dict()
        out["config"] = config
        r = self.requests
        if r is not None:
            out.update((k, getattr(r, f)) for k, f in REQUEST_KEYS.items())
        if self.timeseries is not None:
            out["timeseries"] = self.timeseries
        if r is not None:
            out.update((k, getattr(r, f)) for k, f in ENGINE_KEYS.items())
        out.update(self.extra)
        if self.order is None:   # made here: a list that is not set is not written
            return {k: v for k, v in out.items()
                    if v is not None or k in HEAD or k in self.metrics.percentiles}
        # a file without step gaps or config (vLLM's) is written without them again
        if "step_gaps" not in self.order and out["step_gaps"] == {"count": 0}:
            del out["step_gaps"]
        if "config" not in self.order and not config:
            del out["config"]
        return _layout(out, (), self.order)

    def to_json(self, **kwargs) -> str:
        """The document as JSON text (fileio.dumps_json: non-finite numbers as strings)."""
        return dumps_json(self.to_dict(), **kwargs)

    def save(self, path) -> None:
        """Write the result (formats.save_result: keys in their order; `.gz` compressed)."""
        save_result(path, self.to_dict())

    def get(self, key: str, default=None):
        """The document's key (a null one as None), for tests and scripts (_Keys)."""
        return self.to_dict().get(key, default)

    # -- what readers ask of a result ----------------------------------------------------------

    @property
    def plan(self) -> ResolvedPlan:
        """The simulator's plan, or an empty one for a measured run."""
        return self.resolved if self.resolved is not None else ResolvedPlan()

    @property
    def prefix_cache(self) -> dict | None:
        """vLLM's prefix-cache counters (`queries`, `hits`, in tokens), wherever the layout put
        them (the engine's under config, the simulator's in its plan), or None with prefix
        caching off."""
        return self.config.get("prefix_cache", self.plan.prefix_cache)

    @property
    def num_preemptions(self) -> int | None:
        """The engine's preemptions (simulated or measured), or None where the file does not
        say."""
        return self.config.get("num_preemptions", self.plan.num_preemptions)

    @property
    def mode(self) -> str | None:
        """The scheduling mode the run used (the simulator's resolved one where it differs)."""
        return self.plan.mode if self.plan.mode is not None else self.config.get("mode")

    @property
    def k(self) -> int:
        return self.config.get("k", 0)

    @property
    def notes(self) -> list[str]:
        """The simulator's notes on what its answer rests on ([] for a measured run)."""
        return list(self.plan.notes or [])

    def timings(self, tag: str = "") -> list[RequestTiming]:
        """Each request as the client saw it (`Requests.timings`); UserError without the
        per-request lists."""
        if self.requests is None:
            doc = self.to_dict()
            missing = next(k for k in DETAIL_KEYS if k not in doc)
            raise UserError(f"result has no {missing!r}: pooling needs detailed results "
                            "(--detailed)")
        return self.requests.timings(tag)


def bench_result(doc: dict, path, chunk_tokens: list[list[int]] | None = None,
                 ids: list[str] | None = None, config: dict | None = None) -> RunResult:
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
    res = RunResult.build(timings, doc["duration"], backend=f"vllm-{doc['backend']}",
                          config=cfg, detailed=True, percentiles=(50, 99))
    if doc.get("spec_decode_num_drafts"):
        res.spec_decode = SpecDecode(
            **spec_counts(doc), acceptance_rate=doc["spec_decode_acceptance_rate"] / 100,
            acceptance_rate_per_pos=doc["spec_decode_per_position_acceptance_rates"])
    if all(r.accepted is not None for r in reqs):
        res.requests.accepted = [r.accepted for r in reqs]
    return res


def peer_result(path, percentiles=PEER_PERCENTILES) -> RunResult:
    """The run as a measured run result (the keys of `vllm bench serve --save-result`): no step
    gaps, no ITLs (NaN: only each request's first and last token are timed)."""
    reqs = load_peer_requests(path)
    t0 = min(r["queued_ts"] for r in reqs)
    timings = []
    for r in reqs:
        t = RequestTiming(r["request_id"], r["input_toks"], r["queued_ts"] - t0)
        t.add_chunk(r["first_token_ts"] - t0, 1)
        if r["output_toks"] > 1:
            t.add_chunk(r["last_token_ts"] - t0, r["output_toks"] - 1)
        timings.append(t)
    duration = max(r["last_token_ts"] for r in reqs) - t0
    res = RunResult.build(timings, duration, backend="vllm", config={"source": str(path)},
                          percentiles=percentiles)
    res.request_rate = "trace"
    m = res.metrics
    m.mean_itl_ms = m.median_itl_ms = m.std_itl_ms = math.nan
    m.percentiles.update((k, math.nan) for k in m.percentiles if k.endswith("_itl_ms"))
    return res
