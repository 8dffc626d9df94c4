"""The engine's run: the benchmark client, the engine core and its step loop, and the result.

One run sends a trace's requests as `vllm bench serve` would (`Client`: arrival times and max
concurrency), adds them to the shared vLLM V1 scheduler between steps, and runs the step loop
(`step_loop`) in one of the modes of docs/explanation/design.md §1:

- `sync`: schedule N, execute N, collect N, update_from_output N, then schedule N+1;
- `async` and `zero-bubble`: a batch queue of depth 2: schedule and execute N+1, then collect and
  update N. The scheduler counts placeholders for the step in flight (`async_scheduling`).

The loop is vLLM's `EngineCore.step_with_batch_queue`, and sim/core.py's engine process runs the
same rule; `stepgap serve` runs it too, with engine/core_proc.py's `ServedClient` in the client's
place (requests from the HTTP front end instead of a trace). A chunk's time is when update_from_output emits it; TTFT and E2EL run from the
request's send time. The run result has the keys of `vllm bench serve --save-result`, plus step
gaps (from the device spans of the timeline), acceptance statistics and the run's config.
"""

from __future__ import annotations

import gc
import time
import zlib
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np

from stepgap.common.acceptance import Acceptance, check_replay
from stepgap.common.errors import UserError
from stepgap.common.formats import (METRICS, PERCENTILES, RequestTiming, Span, SpecStats, TraceRequest,
                            step_gaps)
from stepgap.common.run_result import RunResult
from stepgap.common.scheduler import (FINISHED, MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS,
                                      MAX_NUM_SEQS, EngineCoreOutput, Request, Scheduler,
                                      SchedulerConfig, SchedulerOutput)
from stepgap.common.workloads import LoadGenerator
from stepgap.engine.kv_cache import BLOCK_SIZE
from stepgap.engine.sampler import SamplingConfig
from stepgap.engine.timing import HostSpans
from stepgap.engine.worker import ReqRow, RunConfig, StepMsg


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One run's scheduling settings (the worker's models and cache are built once)."""

    mode: str = "sync"
    k: int = 0
    num_blocks: int = 1024
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    max_model_len: int = MAX_MODEL_LEN
    sampling: SamplingConfig = SamplingConfig()
    block_size: int = BLOCK_SIZE
    max_position_embeddings: int | None = None   # the target's context
    enable_prefix_caching: bool = True           # vLLM's automatic prefix caching
    scheduler_reserve_full_isl: bool = True      # vLLM's admission rule

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig.for_run(self.mode, self.k, self.num_blocks, self.block_size,
                                       self.max_num_seqs, self.max_num_batched_tokens,
                                       self.max_model_len, self.max_position_embeddings,
                                       scheduler_reserve_full_isl=self.scheduler_reserve_full_isl,
                                       enable_prefix_caching=self.enable_prefix_caching)


@dataclass
class RunOutput:
    result: RunResult
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


def acceptance_plans(requests: list[TraceRequest], cfg: EngineConfig) -> dict[str, list[int]]:
    """The accepted count of each request's decode steps, where drafts are not judged by the
    target: the trace's own (replay), or drawn from the synthetic profile by the simulator's own
    model (common/acceptance.py, the same draws for the same requests and seed)."""
    s = cfg.sampling
    if s.replay:
        check_replay(requests, cfg.k)
        return {r.request_id: r.accepted for r in requests if r.accepted is not None}
    if s.synthetic is None or not cfg.k:
        return {}
    acc = Acceptance(s.synthetic, cfg.k, requests, s.seed, replay=False)
    return {r.request_id: [acc.next(r.request_id, cfg.k) for _ in range(r.output_len)]
            for r in requests}


# ---------------------------------------------------------------------------------------------
# The client


class Client:
    """The benchmark client: sends each request at max(its arrival, a free slot), as `vllm bench
    serve` does, and times the chunks it receives."""

    def __init__(self, requests: list[TraceRequest], max_concurrency: int | None):
        self.gen = LoadGenerator(requests, max_concurrency)
        self.timings: dict[str, RequestTiming] = {}
        self.outputs: dict[str, list[int]] = {r.request_id: [] for r in requests}
        self.last_done = 0.0   # the run ends at the last request's last chunk
        self.t0_ns = time.perf_counter_ns()

    def clock(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9

    @property
    def done(self) -> bool:
        return self.gen.done

    def send_due(self, core: "EngineCore", at: float | None = None) -> None:
        """Send every request that has arrived, while slots are free (at `at`, when a slot has
        just freed, or else at its arrival time)."""
        for r in self.gen.pop_due(self.clock() if at is None else at):
            sent = r.arrival_s if at is None else max(at, r.arrival_s)
            self.timings[r.request_id] = RequestTiming(r.request_id, r.prompt_len, sent)
            core.add(r)

    def receive(self, core: "EngineCore", emitted: list[EngineCoreOutput], step: int) -> None:
        """One step's chunks; the next requests go out the moment slots free up."""
        now = self.clock()
        freed = 0
        for o in emitted:
            rid = o.request.request_id
            self.timings[rid].add_chunk(now, len(o.new_token_ids))
            self.outputs[rid] += o.new_token_ids
            if o.finished:
                self.gen.complete()
                self.last_done = now
                freed += 1
        if freed:
            self.send_due(core, now)

    def wait_for_arrival(self) -> None:
        nxt = self.gen.next_arrival()
        if nxt is None:
            raise RuntimeError("engine: the client waits for requests the engine does not hold")
        time.sleep(max(0.0, nxt - self.clock()))


# ---------------------------------------------------------------------------------------------
# The engine core


class EngineCore:
    """The scheduler, the queue of launched steps, and what their outputs have shown."""

    def __init__(self, executor, cfg: EngineConfig, requests: list[TraceRequest],
                 vocab_size: int, seed: int):
        self.executor, self.cfg = executor, cfg
        self.sched = Scheduler(cfg.scheduler_config())
        for r in requests:   # before anything a request asks for is allocated (its prompt ids)
            self.sched.cfg.check_fits(r.request_id, r.prompt_len, r.output_len)
        self.depth = 1 if cfg.mode == "sync" else 2
        self.queue: deque[tuple[SchedulerOutput, object]] = deque()   # launched, oldest first
        self.host = HostSpans("cpu.engine")
        self.vocab_size, self.seed = vocab_size, seed
        self.prompts = {r.request_id: prompt_ids(r, vocab_size, seed) for r in requests}
        self.plans = acceptance_plans(requests, cfg)
        self.spec = SpecStats(cfg.k)
        self.accepted: dict[str, list[int]] = {r.request_id: [] for r in requests}
        self.spans: list[Span] = []
        self.discarded = 0

    def add(self, r: TraceRequest, eos_token_id: int | None = None) -> None:
        """Hand a request to the scheduler: a trace's (its prompt made up front) or a served
        one (its prompt ids with it, and an EOS token unless the client said ignore_eos)."""
        ids = self.prompts.get(r.request_id)
        if ids is None:
            ids = prompt_ids(r, self.vocab_size, self.seed)
        self.sched.add_request(Request(r.request_id, r.prompt_len, r.output_len, ids,
                                       eos_token_id=eos_token_id))
        self.accepted.setdefault(r.request_id, [])

    def schedule_and_launch(self) -> bool:
        """Schedule a step and hand it to the executor; False if nothing was scheduled."""
        if not self.sched.has_unfinished():
            return False
        with self.host.span("schedule", self.sched.step) as args:
            out = self.sched.schedule()
            msg = self.step_msg(out) if out.scheduled else None
            args.update(reqs=out.num_reqs, tokens=out.num_batched_tokens)
        if msg is None:   # an empty step is not launched
            return False
        self.queue.append((out, self.executor.execute(msg)))
        return True

    def step_msg(self, out: SchedulerOutput) -> StepMsg:
        rows = []
        for s in out.scheduled:
            r = s.request
            rows.append(ReqRow(r.request_id, s.num_new_tokens, s.num_spec, s.samples, s.start,
                               list(r.block_ids), r.token_ids() if s.fresh else None,
                               self.plans.get(r.request_id) if s.fresh else None))
        return StepMsg(out.step, rows, list(out.preempted), list(out.finished))

    def update_oldest(self, client: Client) -> int:
        """Block on the oldest step's output, apply it, and stream its chunks. Its step."""
        out, handle = self.queue.popleft()
        res = self.executor.collect(handle)
        self.spans += res.spans
        with self.host.span("update_from_output", out.step, reqs=out.num_reqs,
                            tokens=out.num_batched_tokens):
            self.observe(out, res.sampled)
            client.receive(self, self.sched.update_from_output(out, res.sampled), out.step)
        return out.step

    def observe(self, out: SchedulerOutput, sampled: dict) -> None:
        """Acceptance statistics of the chunks that will be emitted (not of discarded steps)."""
        for s in out.scheduled:
            if not s.samples:
                continue
            if s.request.status == FINISHED:
                self.discarded += 1
            elif s.num_spec:
                a = len(sampled[s.request.request_id]) - 1
                self.spec.observe(s.num_spec, a)
                self.accepted[s.request.request_id].append(a)

    def stalled(self) -> None:
        if self.sched.has_unfinished():
            raise RuntimeError("engine: requests are waiting but nothing can be scheduled "
                               "(the KV cache is too small for them)")


def step_loop(core: EngineCore, client: Client, on_step=None) -> None:
    """vLLM's step_with_batch_queue (sim/core.py runs the same rule): keep the queue of launched
    steps filled, one deep in sync and two in async; block on the oldest step's output only when
    the queue is full or nothing more could be scheduled."""
    while not (client.done and not core.queue):
        client.send_due(core)
        launched = core.schedule_and_launch()
        if not core.queue:
            core.stalled()            # nothing in flight and nothing schedulable: idle
            client.wait_for_arrival()
            continue
        if launched and len(core.queue) < core.depth:
            continue                  # the queue has room: schedule the next step first
        step = core.update_oldest(client)
        if on_step is not None:
            on_step(step)


@contextmanager
def frozen_gc():
    """What the process already holds (models, earlier runs' results) is kept out of the cyclic
    collector for the run, as vLLM's engine core freezes its start-up objects: a full collection
    over a million objects stalls the step loop for 100-170 ms (docs/explanation/validation.md)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# ---------------------------------------------------------------------------------------------
# A run


def run_trace(executor, requests: list[TraceRequest], cfg: EngineConfig, *, vocab_size: int,
              max_concurrency: int | None = None, seed: int = 0, detailed: bool = False,
              config: dict | None = None, on_step=None, percentiles=PERCENTILES,
              percentile_metrics=METRICS) -> RunOutput:
    """Run one trace to completion through `executor` and measure it."""
    if not requests:
        raise UserError("the trace holds no requests")
    core = EngineCore(executor, cfg, requests, vocab_size, seed)
    executor.configure(RunConfig(cfg.mode, cfg.k, cfg.sampling))  # may capture CUDA graphs
    with frozen_gc():
        client = Client(requests, max_concurrency)
        step_loop(core, client, on_step)
    return run_output(core, client, requests, config, detailed, percentiles, percentile_metrics)


def run_output(core: EngineCore, client: Client, requests: list[TraceRequest], config,
               detailed: bool, percentiles, percentile_metrics) -> RunOutput:
    cfg = core.cfg
    t0_us = client.t0_ns / 1000.0  # spans are taken on the monotonic clock: make them relative
    spans = sorted((s._replace(start_us=s.start_us - t0_us, end_us=s.end_us - t0_us)
                    for s in core.spans + core.host.take()), key=lambda s: (s.start_us, s.end_us))
    order = [r.request_id for r in requests]
    given = dict(config or {})
    defaults = {"mode": cfg.mode, "k": cfg.k, "enable_prefix_caching": cfg.enable_prefix_caching}
    counters = {"num_preemptions": core.sched.num_preemptions,   # and vLLM's prefix-cache
                **({"prefix_cache": core.sched.prefix_cache_counts()}   # counters (tokens)
                   if core.sched.caching else {})}
    config = {**given, **{k: v for k, v in defaults.items() if k not in given}, **counters}
    result = RunResult.build([client.timings[rid] for rid in order if rid in client.timings],
                             client.last_done, backend="stepgap-engine", config=config,
                             gaps_us=step_gaps(spans), spec=core.spec if cfg.k else None,
                             detailed=detailed, percentiles=percentiles,
                             percentile_metrics=percentile_metrics)
    if detailed:
        result.requests.output_token_ids = [client.outputs[rid] for rid in order]
        if cfg.k:
            result.requests.accepted = [core.accepted[rid] for rid in order]
    return RunOutput(result, spans, client.outputs, core.accepted, core.sched.num_free_blocks,
                     cfg.num_blocks, core.discarded)


def config_summary(cfg: EngineConfig, executor: str, info: dict, **extra) -> dict:
    """A measured run's `config` block (`stepgap run`'s and `stepgap serve`'s alike): the
    engine's config, where its worker ran (the executor, and `info`: its pids and pinning) and
    what the command adds. run_output adds the run's counters (preemptions, prefix cache)."""
    d = asdict(cfg)
    d["sampling"] = asdict(cfg.sampling)
    return {**d, "executor": executor, **info, **extra}
