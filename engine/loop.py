"""The engine core: the benchmark client, the shared scheduler, the step loop, and its records.

One run sends a trace's requests as `vllm bench serve` would (LoadGenerator: arrival times and
max concurrency), adds them to the shared vLLM V1 scheduler between steps, and runs the step
loop in one of the modes of DESIGN.md §1:

- `sync`: schedule N, execute N, collect N, update_from_output N, then schedule N+1;
- `async` and `zero-bubble`: a batch queue of depth 2: schedule and execute N+1, then collect and
  update N. The scheduler counts placeholders for the step in flight (`async_scheduling`).

A chunk's time is when update_from_output emits it; TTFT and E2EL run from the request's send
time. The run result has the keys of `vllm bench serve --save-result`, plus step gaps (from the
device spans of the timeline), acceptance statistics and the run's config.
"""

from __future__ import annotations

import gc
import time
import zlib
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from engine.sampler import SamplingConfig
from engine.worker import RunConfig, StepMsg
from engine.timing import HostSpans
from common.errors import UserError
from common.formats import (RequestTiming, Span, SpecStats, TraceRequest, run_result,
                             step_gaps)
from common.scheduler import FINISHED, Request, Scheduler, SchedulerConfig
from common.workloads import LoadGenerator


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One run's scheduling settings (the worker's models and cache are built once)."""

    mode: str = "sync"
    k: int = 0
    num_blocks: int = 1024
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    sampling: SamplingConfig = SamplingConfig()

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(num_blocks=self.num_blocks, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens,
                               max_model_len=self.max_model_len, num_spec_tokens=self.k,
                               async_scheduling=self.mode != "sync")


@dataclass
class RunOutput:
    result: dict
    spans: list[Span]
    output_token_ids: dict[str, list[int]]
    accepted: dict[str, list[int]] = field(default_factory=dict)
    num_free_blocks: int = 0
    num_blocks: int = 0
    num_discarded: int = 0  # sampled rows of requests that had finished: their tokens dropped


def prompt_ids(req: TraceRequest, vocab_size: int, seed: int) -> list[int]:
    """The trace's prompt tokens, or deterministic random ones when the trace has none."""
    if req.prompt_token_ids is not None:
        bad = [t for t in req.prompt_token_ids if t >= vocab_size]
        if bad:
            raise UserError(f"request {req.request_id!r}: prompt token id {bad[0]} is outside "
                            f"the target's vocabulary of {vocab_size}")
        return list(req.prompt_token_ids)
    rng = np.random.default_rng([seed, zlib.crc32(req.request_id.encode())])
    return rng.integers(0, vocab_size, req.prompt_len).tolist()


def run_trace(executor, requests: list[TraceRequest], cfg: EngineConfig, *, vocab_size: int,
              max_concurrency: int | None = None, seed: int = 0, detailed: bool = False,
              config: dict | None = None, on_step=None) -> RunOutput:
    """Run one trace to completion through `executor` and measure it."""
    if not requests:
        raise UserError("the trace holds no requests")
    sched = Scheduler(cfg.scheduler_config())
    gen = LoadGenerator(requests, max_concurrency)
    prompts = {r.request_id: prompt_ids(r, vocab_size, seed) for r in requests}
    executor.configure(RunConfig(cfg.mode, cfg.k, cfg.sampling))  # may capture CUDA graphs
    # What the process already holds (models, earlier runs' results) is kept out of the cyclic
    # collector for the run, as vLLM's engine core freezes its start-up objects: a full
    # collection over a million objects stalls the step loop for 100-170 ms (docs/validation.md).
    gc.collect()
    gc.freeze()
    t0_ns = time.perf_counter_ns()
    host = HostSpans("cpu.engine")
    timings: dict[str, RequestTiming] = {}
    outputs: dict[str, list[int]] = {r.request_id: [] for r in requests}
    accepted: dict[str, list[int]] = {r.request_id: [] for r in requests}
    replay = {r.request_id: r.accepted for r in requests}
    spec = SpecStats(cfg.k)
    spans: list[Span] = []
    depth = 1 if cfg.mode == "sync" else 2
    in_flight: deque = deque()
    discarded = 0
    last_done = 0.0

    def clock() -> float:
        return (time.perf_counter_ns() - t0_ns) / 1e9

    def send(reqs: list[TraceRequest], at: float | None) -> None:
        for r in reqs:
            sent = r.arrival_s if at is None else max(at, r.arrival_s)
            timings[r.request_id] = RequestTiming(r.request_id, r.prompt_len, sent)
            sched.add_request(Request(r.request_id, r.prompt_len, r.output_len,
                                      prompts[r.request_id]))

    while not (gen.done and not in_flight):
        send(gen.pop_due(clock()), None)
        out = None
        if sched.has_unfinished() and len(in_flight) < depth:
            with host.span("schedule", sched.step) as args:
                out = sched.schedule()
                msg = to_msg(out, replay) if out.scheduled else None
                args.update(reqs=out.num_reqs, tokens=out.num_batched_tokens)
            if msg is not None:
                in_flight.append((out, executor.execute(msg)))
            else:
                out = None
        if in_flight and (len(in_flight) == depth or out is None):
            done_out, handle = in_flight.popleft()
            res = executor.collect(handle)
            spans += res.spans
            with host.span("update_from_output", done_out.step, reqs=done_out.num_reqs,
                           tokens=done_out.num_batched_tokens):
                discarded += _observe(done_out, res.sampled, spec, accepted)
                emitted = sched.update_from_output(done_out, res.sampled)
                now = clock()
                freed = 0
                for req, new, finished in emitted:
                    timings[req.request_id].add_chunk(now, len(new))
                    outputs[req.request_id] += new
                    if finished:
                        gen.complete()
                        freed += 1
                        last_done = now
                if freed:  # the client sends the next requests the moment slots free up
                    send(gen.pop_due(now), now)
            if on_step is not None:
                on_step(done_out.step)
        elif not in_flight and out is None:
            nxt = gen.next_arrival()
            if nxt is None:
                if sched.has_unfinished():
                    raise RuntimeError("engine: requests are waiting but nothing can be "
                                       "scheduled (the KV cache is too small for them)")
                break
            time.sleep(max(0.0, nxt - clock()))
    gc.unfreeze()
    duration = last_done  # as the benchmark client ends: at the last request's last chunk
    t0_us = t0_ns / 1000.0  # spans are taken on the monotonic clock: make them run-relative
    spans = sorted((s._replace(start_us=s.start_us - t0_us, end_us=s.end_us - t0_us)
                    for s in spans + host.take()), key=lambda s: (s.start_us, s.end_us))
    order = [r.request_id for r in requests]
    result = run_result([timings[rid] for rid in order if rid in timings], duration,
                        backend="stepgap-engine", config=dict(config or {}),
                        gaps_us=step_gaps(spans), spec=spec if cfg.k else None,
                        detailed=detailed)
    result["config"].setdefault("mode", cfg.mode)
    result["config"].setdefault("k", cfg.k)
    result["config"]["num_preemptions"] = sched.num_preemptions
    if detailed:
        result["output_token_ids"] = [outputs[rid] for rid in order]
        if cfg.k:
            result["accepted"] = [accepted[rid] for rid in order]
    return RunOutput(result, spans, outputs, accepted, sched.num_free_blocks, cfg.num_blocks,
                     discarded)


def to_msg(out, replay: dict) -> StepMsg:
    reqs = []
    for s in out.scheduled:
        r = s.request
        reqs.append((r.request_id, s.num_new_tokens, s.num_spec, s.samples, s.start,
                     list(r.block_ids), r.token_ids() if s.fresh else None,
                     replay.get(r.request_id) if s.fresh else None))
    return StepMsg(out.step, reqs, list(out.preempted), list(out.finished))


def _observe(out, sampled: dict, spec: SpecStats, accepted: dict) -> int:
    """Acceptance statistics of the chunks that will be emitted (not of discarded steps).
    Returns how many sampled rows belong to requests that have already finished."""
    discarded = 0
    for s in out.scheduled:
        if not s.samples:
            continue
        if s.request.status == FINISHED:
            discarded += 1
        elif s.num_spec:
            a = len(sampled[s.request.request_id]) - 1
            spec.observe(s.num_spec, a)
            accepted[s.request.request_id].append(a)
    return discarded


def config_summary(cfg: EngineConfig) -> dict:
    d = asdict(cfg)
    d["sampling"] = asdict(cfg.sampling)
    return d
