"""The step loop as a SimPy model (docs/explanation/design.md §1 and §2).

Lanes and ops: `cpu.engine` (schedule, update_from_output), `cpu.worker` (prepare_inputs,
launch, wait; and propose, broadcast, collect, below) and `device` (fixup, target_forward,
rejection_sample, draft_forward i, d2h). Time is in microseconds.

Processes:
- `client`: the benchmark client; sends each request at max(its arrival, a free slot).
- `engine`: the engine-core loop, vLLM's step_with_batch_queue (engine/loop.py's `step_loop`
  runs the same rule): keep the queue of launched steps filled, one deep in `sync` and two in
  `async` and `zero-bubble`; block on the oldest step's output only when the queue is full or
  nothing more could be scheduled. So sync runs schedule, execute, wait, update; the async modes
  schedule and launch step N+1, then block on step N's output, apply it, and schedule N+2.
- `worker`: only for the `process` topology. Inline, the engine's thread runs the worker's code.

Sync points:
- sync: the worker waits for the whole device step before the engine updates and schedules.
- async with k > 0: before preparing step N+1, the worker waits for step N's accepted counts,
  which reach the host after N's target forward and rejection sampling, before N's drafting
  (only if N verified drafts: otherwise every count is known to be 1).
- zero-bubble: no wait; a device `fixup` at the start of N+1 applies N's accepted counts.
A step with nothing scheduled is not launched: the engine waits for the step in flight.

Speculation methods: every device drafter (eagle, eagle3, mtp, draft_model) runs k
`draft_forward` passes after rejection sampling, ngram_gpu one matching pass; `ngram` has no
device draft: after the step's sampled tokens reach the host, the worker `propose`s on the CPU,
and the output goes to the engine only then (vLLM runs it in sync; `resolve` says so).
With tensor parallelism the worker is vLLM's multiprocess executor over N ranks, drawn as one
lane: each step is `broadcast` to the ranks before they prepare it, and rank 0 `collect`s its
output for the engine after the step (in async, on its output thread: a latency, no span).

vLLM's topology (`topology="vllm"`, docs/explanation/vllm.md) adds what vLLM's own processes do: the
worker answers two RPCs per step, so it idles `rpc_mid` between the target forward and the sampler
(half of it in async, where the next RPC is already queued, and so for `worker_turnaround`); in sync
with drafts the engine core makes a third, take_draft_token_ids (`rpc_drafts`), after
update_from_output; an API server (`frontend`, lane cpu.frontend) takes each request in
(`add_request`) and processes each step's outputs (`process_outputs`) before the client has its
chunks (`client_latency_us` later); and the engine core and the API server share one core (`host`),
so their work is serialised. The `served` topology is `stepgap serve` (docs/explanation/serve.md):
stepgap's own engine core and worker, with that API server in front on the engine core's CPU.

The device is a FIFO lane whose op durations are known when a step is launched, so its timing is
computed in closed form (`Device.place`) instead of by a process; a device step costs no SimPy
event. With a synchronous device (the CPU) the device ops occupy the worker's thread, inside its
`launch`; a `process` worker there also sends each result itself (`result_latency`) and turns
around (`worker_turnaround`) before it prepares the next step. With a measured profile, the
machine's own noise (`Jitter`) scales each step's device ops.

Where a run's steps cannot depend on time (`Run.same_steps`) and no timeline is asked for, the
engine's thread is all that moves time, and sim/plain_loop.py runs the same loop without SimPy:
the same result, to the byte.
"""


from __future__ import annotations

from stepgap.common.acceptance import Acceptance
from stepgap.common.errors import UserError
from stepgap.common.run_result import ResolvedPlan, RunResult
from stepgap.common.formats import SpecStats, Span, TraceRequest, timeseries
from stepgap.common.scheduler import Scheduler, SchedulerConfig
from stepgap.common.workloads import apply_request_rate, load_workload
from stepgap.sim import plain_loop
from stepgap.sim.cluster import Client, DataParallel, Series
from stepgap.sim.config import SimConfig
from stepgap.sim.plan import resolve
from stepgap.sim.core import EngineCore
from stepgap.sim.costs import DeviceCosts
from stepgap.sim.device_lane import Clock
from stepgap.sim.profile import Profile
from stepgap.sim.steps import LiveSteps, Recording, ReplayedSteps


class Run:
    """One simulated serving run, of parts: the client, the engine it sends to (one
    `EngineCore`, or a `DataParallel` group of them) and where each core's steps come from
    (scheduled, or replayed from a `Recording`). `run()` returns (run result, spans)."""

    def __init__(self, cfg: SimConfig, requests: list[TraceRequest],
                 device_costs: DeviceCosts | None = None, profile: Profile | None = None,
                 recording: Recording | None = None):
        if not requests:
            raise UserError("the workload holds no requests")
        self.cfg, self.requests = cfg, requests
        self.r = r = resolve(cfg, profile, device_costs)
        check_requests(requests, r.scheduler, r.target.vocab_size)
        for tr in requests:   # (measured tables cover contexts up to their grid)
            r.device_costs.check_request(tr.request_id, tr.prompt_len + tr.output_len)
        self.env = env = Clock()
        acc = Acceptance(r.profile, cfg.k, requests, cfg.seed, cfg.replay)
        self.client = Client(env, requests, cfg.max_concurrency, acc,
                             cfg.output_latency_ms * 1e3)
        self.series = Series(env) if cfg.timeseries_interval_s else None
        self.steps = None   # a lone core's
        self.plain, self.recording = False, None   # run by sim/plain_loop.py, its steps'
        if cfg.data_parallel_size > 1:   # N engine cores behind vLLM's DP front end
            self.engine = DataParallel(env, cfg, r, self.client, acc, self.series)
            self.cores = self.engine.ranks
        else:
            # where the plain loop runs it, its steps go to a recording (the caller's, where it
            # has one to fill, else one of its own), or come from the caller's
            self.plain = self.same_steps() and plain_loop.runs_plainly(cfg, r)
            if self.plain and recording is not None and recording.replays(cfg, requests):
                self.steps, self.recording = ReplayedSteps(recording), recording
            else:
                self.steps = LiveSteps(Scheduler(r.scheduler), acc, cfg.k)
                kept = recording.start(cfg, requests) if self.plain and recording else None
                self.recording = kept or (Recording(requests) if self.plain else None)
            self.engine = EngineCore(env, cfg, r, self.client, self.steps, self.series)
            self.cores = [self.engine]
            if self.plain and self.recording is recording and device_costs is None:
                # the step ops its runs share: those of runs whose drafter's host costs are
                # the same (a drafter that waits for the step's tokens has them on the device
                # lane) and that fix up alike (zero-bubble's fixup op, in async's steps)
                device = self.engine.device
                device.ops = recording.device_ops.setdefault(
                    (device.waits_us, cfg.drafter_host_scale, device.fixup), {})
        if self.series is not None:
            self.series.cores = self.cores
        self.client.engine = self.engine

    @property
    def num_steps(self) -> int:
        return sum(c.num_steps for c in self.cores)

    def same_steps(self) -> bool:
        """Whether this run takes the same steps however long each thing takes (`Recording`):
        one thread drives the engine core (inline, no API server, one rank), every request
        arrives at once and the client sends the next one as the last chunk of another lands,
        and nothing reads the scheduler between steps (no series)."""
        cfg, topo = self.cfg, self.r.topology
        return (topo.inline and not topo.api_server and not cfg.output_latency_ms
                and not cfg.timeseries_interval_s
                and all(tr.arrival_s == 0 for tr in self.requests))

    def run(self) -> tuple[RunResult, list[Span]]:
        env = self.env
        if self.plain:
            with plain_loop.paused_gc():
                plain_loop.run(self.engine, self.client, self.recording)   # the same times
        else:
            client = env.process(self.client.run())
            self.engine.start()
            try:
                env.run(until=client)
            finally:
                env.close()
        spans = []
        for core in self.cores:
            if len(self.cores) == 1:
                spans += core.spans or ()
            else:   # each rank's spans carry it
                spans += [s._replace(args={**(s.args or {}), "dp": core.index})
                          for s in core.spans or ()]
        with plain_loop.paused_gc():
            res = self.result(env.now / 1e6)
        # the parts refer to each other: freed at once, not by the cycle collector (Clock.close)
        self.client.engine = None
        if self.series is not None:
            self.series.cores = []
        if isinstance(self.engine, DataParallel):
            self.engine.close()
        return res, sorted(spans, key=lambda s: s.start_us)

    def result(self, duration_s: float) -> RunResult:
        """The run's result: the client's timings, the cores' gaps and counters, the plan."""
        cfg, cores = self.cfg, self.cores
        timings = [self.client.timings[tr.request_id] for tr in self.requests]
        config = cfg.to_dict()
        if config["request_rate"] is None:
            config["request_rate"] = ("inf" if all(tr.arrival_s == 0 for tr in self.requests)
                                      else "trace")
        gaps = [g for c in cores for g in c.device.gaps]
        return RunResult.build(
            timings, duration_s, backend="stepgap-sim", config=config, resolved=self.plan(),
            gaps_us=gaps, spec=self.spec_stats() if cfg.k else None, detailed=cfg.detailed,
            percentiles=cfg.metric_percentiles, percentile_metrics=cfg.percentile_metrics,
            timeseries=timeseries(self.series.samples, cfg.timeseries_interval_s)
            if self.series is not None else None)

    def plan(self) -> ResolvedPlan:
        """What the run rested on (written as config.resolved) and its counters."""
        cfg, r, cores = self.cfg, self.r, self.cores
        plan = ResolvedPlan(
            hardware=r.hw.name, device="cuda" if r.device_async else "cpu", mode=r.mode,
            notes=list(r.notes), target=r.target.name, draft=r.draft.name if r.draft else None,
            num_kv_blocks=r.scheduler.num_blocks, acceptance_rates=list(r.profile.rates),
            acceptance_spread=r.profile.spread,
            acceptance_profile=r.profile.name if cfg.k else None,
            drafter=r.drafter.to_dict() if r.drafter_host else None,
            cpu_costs_us=r.cpu.to_dict(), num_steps=sum(c.num_steps for c in cores),
            num_preemptions=sum(c.sched.num_preemptions for c in cores))
        if r.scheduler.enable_prefix_caching:   # vLLM's prefix-cache counters (tokens)
            counts = [c.sched.prefix_cache_counts() for c in cores]
            plan.prefix_cache = {k: sum(c[k] for c in counts) for k in counts[0]}
        jitter = cores[0].device.jitter
        if r.measured is not None and r.measured.jitter and jitter is not None:
            j = r.measured.jitter
            plan.jitter = {"bin_ms": j.bin_ms, "sigma_step": j.sigma_step,
                           "trace_bins": len(j.trace), "offset": jitter.offset}
        costs = r.device_costs
        if costs.sources is not None:   # a measured profile or tables: which ops each priced
            plan.device_costs = {"profile": costs.path, **costs.sources}
            moe = costs.moe
            if moe is not None and moe.grid is not None:   # how much moe.csv covered
                plan.device_costs["moe_coverage"] = moe.coverage()
        if isinstance(self.engine, DataParallel):
            plan.data_parallel = self.engine.summary()
        return plan

    def spec_stats(self) -> SpecStats:
        """The acceptance counters of vLLM's SpecDecodingStats, from the cores' histograms."""
        hist = [sum(h) for h in zip(*(c.steps.accepted_hist for c in self.cores))]
        spec = SpecStats(self.cfg.k)
        spec.num_drafts = sum(hist)
        spec.num_draft_tokens = sum(c.steps.num_draft_tokens for c in self.cores)
        spec.num_accepted_tokens = sum(n * c for n, c in enumerate(hist))
        spec.accepted_per_pos = [sum(hist[i + 1:]) for i in range(self.cfg.k)]
        return spec


def check_requests(requests: list[TraceRequest], sched: SchedulerConfig,
                   vocab_size: int | None = None) -> None:
    """Reject requests the engine could never serve, before the run, naming them: too long for
    the scheduler, or token ids past the target's vocabulary."""
    for tr in requests:
        sched.check_fits(tr.request_id, tr.prompt_len, tr.output_len)
        top = max(tr.prompt_token_ids) if vocab_size is not None and tr.prompt_token_ids \
            else -1
        if top >= vocab_size:
            raise UserError(f"request {tr.request_id!r}: prompt_token_ids holds {top}, past the "
                            f"target's vocabulary of {vocab_size}")


def build_workload(cfg: SimConfig) -> list[TraceRequest]:
    from stepgap.common.workloads import BUILTIN, TOKEN_WORKLOADS
    name = cfg.workload.split(":")[0]
    vocab = None
    if name in BUILTIN and name in TOKEN_WORKLOADS:   # token ids within the target's vocab
        from stepgap.common.model_presets import load_model_config
        vocab = load_model_config(cfg.model).vocab_size
    reqs = load_workload(cfg.workload, cfg.num_prompts, cfg.output_len, cfg.seed, vocab,
                         cfg.shared_fraction, cfg.model)
    return apply_request_rate(reqs, cfg.request_rate, cfg.burstiness, cfg.seed)


def simulate(cfg: SimConfig, requests: list[TraceRequest] | None = None,
             device_costs: DeviceCosts | None = None, profile: Profile | None = None,
             recording: Recording | None = None) -> tuple[RunResult, list[Span]]:
    """Simulate one serving run: the run result (common/run_result.py RunResult,
    docs/explanation/design.md §4) and the timeline's spans.

    `requests` defaults to the workload `cfg` names, with its request rate applied; requests
    given here are used with their own arrival times. `device_costs` replaces the roofline
    (ConstantCosts in tests); `profile` is a measured profile to use instead of reading
    `cfg.profile`'s file (the fits re-simulate the runs with the profile they are making).
    `recording`: an empty one is filled with this run's steps where the run allows; a filled
    one is replayed where this run takes the same steps (`Recording`).
    """
    reqs = requests if requests is not None else build_workload(cfg)
    return Run(cfg, reqs, device_costs, profile, recording).run()
