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
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

import simpy

from stepgap.common.acceptance import Acceptance
from stepgap.sim.config import SimConfig, resolve
from stepgap.sim.costs import Batch, DeviceCosts
from stepgap.sim.data_parallel import DP_SYNC_US, Lockstep, Router, dummy_batch
from stepgap.sim.drafter_costs import DrafterCosts
from stepgap.sim.jitter import Jitter
from stepgap.sim.profile import Profile
from stepgap.common.errors import UserError
from stepgap.common.run_result import RunResult
from stepgap.common.formats import (RequestTiming, Span, SpecStats, TraceRequest, run_result,
                                    timeseries)
from stepgap.common.scheduler import FINISHED, Request, Scheduler, SchedulerConfig, SchedulerOutput
from stepgap.common.workloads import LoadGenerator, apply_request_rate, load_workload

FRONTEND, ENGINE, WORKER, DEVICE = "cpu.frontend", "cpu.engine", "cpu.worker", "device"


@dataclass(slots=True, eq=False)
class Step:
    out: SchedulerOutput
    batch: Batch
    t_accepted: float = 0.0   # accepted counts on the host (the async sync point)
    t_done: float = 0.0       # last device op done: sampled and draft ids on the host
    t_output: float = 0.0     # the engine can read the output
    ready: simpy.Event | None = None  # process topology: t_output is known
    dummy: bool = False       # data parallelism: vLLM's dummy batch of an idle rank


def batch_of(out: SchedulerOutput) -> Batch:
    """The step's totals, summed over its requests (one pass; conditionals, not max(), as this
    runs for every request of every step)."""
    sampling = logits = drafts = kv = max_query = max_blocks = decode = decode_kv = kv_max = 0
    kv_min = 1 << 62
    pairs = 0.0
    prefills = []
    for s in out.scheduled:
        n, start = s.num_new_tokens, s.start
        kv += start + n
        pairs += n * (start + (n + 1) / 2)
        drafts += s.num_spec
        if n == 1 + s.num_spec:
            decode += 1
            decode_kv += start
            if start > kv_max:
                kv_max = start
            if start < kv_min:
                kv_min = start
        else:
            prefills.append((n, start))
        if n > max_query:
            max_query = n
        blocks = len(s.request.block_ids)
        if blocks > max_blocks:
            max_blocks = blocks
        if s.samples:
            sampling += 1
            logits += 1 + s.num_spec
    return Batch(out.num_batched_tokens, len(out.scheduled), sampling, logits, drafts, kv, pairs,
                 max_query, max_blocks, decode, decode_kv, kv_min if decode else 0, kv_max,
                 prefills)


class Clock(simpy.Environment):
    """SimPy's environment with one more way to pass time: `hold(dt)`, a timeout that costs no
    event when no other event is due by then. Nothing can happen in between, so the clock moves
    on at once (to `now + dt`, the float a timeout would reach, set as `Environment.step` sets
    it) and the process carries on, given an event that has already passed. Every time, and the
    order of everything else, are as with `timeout`; a step with nothing else going on costs no
    trip through the event queue (docs/reports/2026-12-03-advise-speed.md)."""

    def __init__(self):
        super().__init__()
        self.passed = self.event().succeed()
        self.step()   # processed: a process that yields it carries on at once
        self.generators: list = []

    def process(self, generator) -> simpy.Process:
        self.generators.append(generator)
        return super().process(generator)

    def close(self) -> None:
        """End the processes still waiting (the engine loop, a worker's) and drop the events
        still due: their frames and callbacks hold the run, which holds them, a cycle that
        only Python's cycle collector would free, after scanning everything the run made
        (docs/reports/2026-12-03-advise-speed.md)."""
        for g in self.generators:
            g.close()
        self.generators, self._queue = [], []

    def hold(self, dt: float):
        t, queue = self._now + dt, self._queue
        if dt >= 0 and (not queue or t < queue[0][0]):   # peek(), inline: nothing due before
            self._now = t
            return self.passed
        return self.timeout(dt)


# A device-lane entry that is no device op: the device idles while the host prepares the
# drafter's inputs (no padded drafter batch). Falsy, as the RPC pause (None): noise skips it.
DRAFTER_INPUTS = ""


class Device:
    """The device lane: steps run in launch order, each as soon as it is launched and the
    previous one is done. Records step gaps and, when asked, one span per op."""

    def __init__(self, costs: DeviceCosts, k: int, fixup: bool, spans: list | None,
                 jitter: Jitter | None = None, drafter: DrafterCosts | None = None,
                 waits_us: float | None = None):
        self.costs, self.k, self.fixup, self.spans = costs, k, fixup, spans
        self.jitter, self.drafter = jitter, drafter
        # a drafter that waits for the step's tokens on the host (no padded drafter batch):
        # the host's wake after the step's tokens land; None: it does not wait
        self.waits_us = waits_us
        self.draft_forwards = getattr(costs, "draft_forwards", None)   # all passes in one call
        self.step_key = getattr(costs, "step_key", None)
        # step_key -> `times`' answer: a step's times looked up, not computed again, where the
        # noise is none or one constant factor (--speed alone), so that they are the same floats
        self.known: dict = {}
        self.steady = jitter is None or jitter.constant
        # step_key -> `step_ops`' answer before any noise, where `known` cannot keep the whole
        # answer (a noise that varies) or runs share it (a Recording's: their device costs are
        # the same, only the noise's factor differs)
        self.ops: dict | None = None if self.steady else {}
        self.free = 0.0
        self.last_end: float | None = None
        self.gaps: list[float] = []

    def place(self, step: Step, t_first: float, t_last: float, pause: float = 0.0) -> None:
        """Run `step` on the lane. Its first kernel can start at `t_first`; the CPU enqueues its
        last at `t_last`, so the step cannot end earlier (a CPU-bound launch starves the GPU).
        `pause`: the lane idles that long after the target forward (vLLM's worker between its
        execute_model and sample_tokens RPCs, on a synchronous device)."""
        key = self.step_key(step.batch) if self.step_key is not None else None
        if key is not None and pause:
            key += (pause,)
        known = self.known.get(key) if key is not None else None
        if known is None:
            known = self.times(step.batch, pause, t_first, key)
            if key is not None and self.steady:
                self.known[key] = known
        ops, durs, sample, verify, dur = known   # (read only)
        start = max(self.free, t_first, t_last - dur)
        step.t_accepted = start + verify
        step.t_done = self.free = start + dur
        if self.last_end is not None:
            self.gaps.append(max(0.0, start - self.last_end))
        self.last_end = step.t_done
        if self.spans is not None:
            self.record(step.out.step, start, ops, durs, sample)

    def times(self, b: Batch, pause: float, t_first: float, key: tuple | None = None) -> tuple:
        """The step's ops, their times, the sampler's share (`step_ops`), the time until the
        accepted counts are known and the whole step's, the noise's factor applied."""
        kept = self.ops if key is not None else None
        raw = kept.get(key) if kept is not None else None
        if raw is None:
            raw = self.step_ops(b, pause)
            if kept is not None:
                kept[key] = raw
        ops, durs, sample, nverify = raw   # (read only)
        verify = sum(durs[:nverify])
        if self.jitter is not None:   # the machine's noise scales the device ops, not the pause
            f = self.jitter.factor(max(self.free, t_first))
            durs = [d * f if op else d for op, d in zip(ops, durs)]
            verify = (verify - pause) * f + pause
            sample *= f
        return ops, durs, sample, verify, sum(durs)

    def step_ops(self, b: Batch, pause: float = 0.0) -> tuple[list, list, float, int]:
        """The step's device ops in lane order and their times (a `pause` is None), the
        sampler's share of a k = 0 forward's entry, and how many ops come before the accepted
        counts are known (target forward and rejection sampling)."""
        c = self.costs
        ops, durs = [], []   # the ops' names and times, in lane order
        if self.fixup and b.num_drafts:
            ops.append("fixup")
            durs.append(c.fixup(b))
        ops.append("target_forward")
        durs.append(c.target_forward(b))
        sample = 0.0   # k = 0: the sampler's share of the forward's entry (below)
        if b.num_sampling and not self.k:
            # NOTE: at k = 0 the sampler is timed as one entry with the forward it follows, as the
            # cost models counted it inside target_forward before it was an op of its own: the
            # step's times are the same sums, scaled by the same factor, bit for bit
            # (docs/explanation/device-costs.md, "Device cost model"); `record` draws it as its own
            # span.
            ops[-1] = "target_forward+rejection_sample"
            sample = c.rejection_sample(b)
            durs[-1] += sample
        if pause:
            ops.append(None)
            durs.append(pause)
        if self.k and b.num_sampling:
            ops.append("rejection_sample")
            durs.append(c.rejection_sample(b))
        nverify = len(durs)
        passes = self.draft_passes(b)
        if passes:
            d = self.drafter
            pb = d.parallel_batch(b) if d.parallel else b
            many = self.draft_forwards
            times = many(pb, passes) if many else [c.draft_forward(pb, i) for i in range(passes)]
            if self.waits_us is not None:   # the host prepares the drafter's inputs first,
                idle, times = d.serialized(times, self.waits_us)   # then dispatches each pass
                ops.append(DRAFTER_INPUTS)
                durs.append(idle)
            ops += ["draft_forward"] * passes
            durs += times
        ops.append("d2h")
        durs.append(c.d2h(b))
        return ops, durs, sample, nverify

    def record(self, n: int, t: float, ops: list, durs: list, sample: float = 0.0,
               starts: list | None = None) -> None:
        """One span per op of step n, from `t` on, back to back, or each from its `starts`
        (data parallelism's lockstep; the args only now: no timeline, no spans); `sample`: the
        sampler's share of a k = 0 forward's entry."""
        i = 0
        for j, (op, d) in enumerate(zip(ops, durs)):
            if starts is not None:
                t = starts[j]
            if op is None:
                self.spans.append(Span(WORKER, "wait", n, t, t + d, {"on": "sample_tokens RPC"}))
            elif op == DRAFTER_INPUTS:
                pass   # the device idles; the worker's wait on the step covers the time
            elif op == "target_forward+rejection_sample":
                self.spans.append(Span(DEVICE, "target_forward", n, t, t + d - sample, None))
                self.spans.append(Span(DEVICE, "rejection_sample", n, t + d - sample, t + d,
                                       None))
            elif op == "draft_forward":
                self.spans.append(Span(DEVICE, op, n, t, t + d, {"i": i}))
                i += 1
            else:
                self.spans.append(Span(DEVICE, op, n, t, t + d, None))
            t += d

    def draft_passes(self, b: Batch) -> int:
        """The step's draft passes (sim/drafter_costs.py `DrafterCosts.passes`)."""
        return self.drafter.passes(b) if self.drafter is not None else 0


@dataclass(slots=True)
class Planned:
    """A recorded step, as the engine loop reads its SchedulerOutput (`Recording`)."""

    step: int
    scheduled: bool
    num_reqs: int
    num_batched_tokens: int


# Settings that change how long things take, or what a result holds, never which steps run:
# runs that differ in these alone take the same steps (`Recording`; a band's CPU and device ends)
TIME_ONLY = ("cpu_scale", "speed", "cpu_costs", "launch_latency_us", "wake_us", "ipc_us",
             "timeline", "detailed", "drafter_host_scale")


class Recording:
    """The steps of one run, kept so that a run that differs from it only in how long things
    take (TIME_ONLY settings, the device's costs) replays them instead of scheduling and drawing
    acceptance again: the same results, about half the time
    (docs/reports/2026-12-03-advise-speed.md).

    Only where the steps cannot depend on time (`Sim.same_steps`): one thread drives the engine
    core, so the order of everything it does is fixed by the loop, and the client's requests
    come in at fixed points of it (all at once, or each as another finishes). Pass an empty
    one to `simulate` to fill it (where the run allows), then the same one to the runs to
    replay it; a run that differs in anything else is simulated in full, as is one given a
    recording its first run could not fill."""

    def __init__(self):
        self.key: str | None = None
        self.requests: list[TraceRequest] | None = None
        self.plans: list[tuple[Planned, Batch | None]] = []   # every schedule()'s
        self.outcomes: list[list] = []   # every update's chunks (EngineCoreOutput: read only)
        self.totals: dict | None = None   # the counters the result reads, once it is complete
        self.device_ops: dict = {}   # its runs' Device.ops, where the costs come from the config

    @staticmethod
    def key_of(cfg: SimConfig) -> str:
        return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in TIME_ONLY},
                          sort_keys=True, default=str)

    def start(self, cfg: SimConfig, requests: list[TraceRequest]) -> Recording | None:
        """This recording, to be filled by a run of `cfg` (None: it is filled already)."""
        if self.totals is not None:
            return None
        self.key, self.requests = self.key_of(cfg), requests
        # (what a run that failed part way left, maybe of another run, dropped)
        self.plans, self.outcomes, self.device_ops = [], [], {}
        return self

    def close(self, sim: Sim) -> None:
        self.totals = {"num_preemptions": sim.sched.num_preemptions,
                       "prefix_cache": sim.sched.prefix_cache_counts(),
                       "accepted_hist": list(sim.accepted_hist),
                       "num_draft_tokens": sim.num_draft_tokens}

    def replays(self, cfg: SimConfig, requests: list[TraceRequest]) -> bool:
        """Whether a run of `cfg` over `requests` takes the recorded steps."""
        return self.totals is not None and self.key == self.key_of(cfg) \
            and (self.requests is requests or self.requests == requests)


class Sim:
    """One simulated serving run. `run()` returns (run result, spans)."""

    recording: Recording | None = None   # where its steps are kept for a replay (`Recording`)

    def __init__(self, cfg: SimConfig, requests: list[TraceRequest],
                 device_costs: DeviceCosts | None = None, profile: Profile | None = None,
                 recording: Recording | None = None):
        if not requests:
            raise UserError("the workload holds no requests")
        self.cfg = cfg
        self.r = r = resolve(cfg, profile, device_costs)
        check_requests(requests, r.scheduler, r.target.vocab_size)
        check = getattr(r.device_costs, "check_request", None)
        if check is not None:   # measured tables cover contexts up to their grid
            for tr in requests:
                check(tr.request_id, tr.prompt_len + tr.output_len)
        self.requests = requests
        self.env = Clock()
        self.acc = Acceptance(r.profile, cfg.k, requests, cfg.seed, cfg.replay)
        self.out_latency = cfg.output_latency_ms * 1e3
        self.gen = LoadGenerator(requests, cfg.max_concurrency)
        self.timings: dict[str, RequestTiming] = {}
        self.slot_free: simpy.Event | None = None    # the client waits on it
        self._init_engine()
        if recording is not None and self.same_steps():
            self.recording = recording.start(cfg, requests)
            if self.recording is not None and device_costs is None:
                self.device.ops = self.shared_ops(recording)

    def shared_ops(self, recording: Recording) -> dict:
        """The step ops a recording's runs share: those of runs whose drafter's host costs are
        the same (a drafter that waits for the step's tokens has them on the device lane)."""
        return recording.device_ops.setdefault(
            (self.device.waits_us, self.cfg.drafter_host_scale), {})

    def _init_engine(self) -> None:
        """The engine core's, its worker's and its device's state (one DP rank's:
        sim/data_parallel.py builds one per rank on the run's clock)."""
        cfg, r = self.cfg, self.r
        self.lockstep = None   # data parallelism of a MoE target: the ranks' forwards meet
        self.sched = Scheduler(r.scheduler)
        self.caching = r.scheduler.enable_prefix_caching
        self.cpu = r.cpu
        self.spans: list[Span] | None = [] if cfg.timeline else None
        topo = r.topology
        self.async_ = r.scheduler.async_scheduling
        self.wait_accepted, self.cpu_propose = r.wait_accepted, r.cpu_propose
        self.inline, self.tp, self.computes_ahead = topo.inline, topo.tp, topo.computes_ahead
        self.device_async = topo.device_async
        self.api_server, self.rpc_share = topo.api_server, r.rpc_share
        # vLLM's async path's own costs (sim/cpu_costs.py VLLM_ASYNC_TERMS)
        self.async_terms = topo.engine == "vllm" and r.mode != "sync"
        jitter = None
        if r.noise is not None:
            j = r.noise
            jitter = Jitter(j.trace, j.bin_ms * 1e3, j.sigma_step, cfg.speed, cfg.seed)
        elif cfg.speed != 1.0:
            jitter = Jitter([], 1.0, 0.0, cfg.speed, cfg.seed)
        waits = r.drafter_host and r.drafter.waits_for_tokens()
        self.device = Device(r.device_costs, cfg.k, r.fixup, self.spans, jitter, r.drafter,
                             r.cpu.wake_us if waits else None)
        # the drafter's host work in each launch (the padded drafter batch), where priced
        self.drafter_launch = r.drafter.launch_us if r.drafter_host else None
        self.inbox: deque[TraceRequest] = deque()
        self.accepted_hist = [0] * (cfg.k + 1)   # decode steps by accepted count
        self.num_draft_tokens = 0
        self.prev: Step | None = None        # the worker's last launched step
        self.wake: simpy.Event | None = None         # the engine idles on it
        self.to_worker = simpy.Store(self.env)
        # the API server (vLLM's topology, a served stepgap engine) shares the engine core's CPU
        self.host = simpy.Resource(self.env, 1) if self.api_server else None
        self.to_frontend = simpy.Store(self.env)
        self.num_steps = 0
        self.tokens = [[0] * (1 + n) for n in range(cfg.k + 1)]
        # (t_s, running, waiting, kv %, prompt tokens, generated tokens) after every step
        self.samples: list[tuple] | None = [] if cfg.timeseries_interval_s else None

    # -- helpers ----------------------------------------------------------------------------

    def busy(self, lane: str, op: str, step: int, dur: float, args: dict | None = None):
        """The thread spends `dur` on `op`: a timeout to yield, and a span when recording.
        Where it is `env.passed` (nothing else was due first: the clock has moved on), the
        hot callers carry on without yielding it, which is what SimPy would do at once (one
        trip through its resume loop fewer a step; docs/reports/2026-12-03-advise-speed.md)."""
        if self.spans is not None:
            now = self.env.now
            self.spans.append(Span(lane, op, step, now, now + dur, args))
        return self.env.hold(dur)

    def on_host(self, lane: str, op: str, step: int, dur: float, args: dict | None = None):
        """`busy`, on the core the engine core shares with the API server (vLLM's topology):
        it waits for the core first. Only where there is an API server (and so `host`)."""
        with self.host.request() as core:
            yield core
            yield self.busy(lane, op, step, dur, args)

    def same_steps(self) -> bool:
        """Whether this run takes the same steps however long each thing takes (`Recording`):
        one thread drives the engine core (inline, no API server, one rank), every request
        arrives at once and the client sends the next one as the last chunk of another lands,
        and nothing reads the scheduler between steps (no series)."""
        return (type(self) in (Sim, Replayed) and self.inline and not self.api_server
                and not self.out_latency and self.samples is None
                and all(tr.arrival_s == 0 for tr in self.requests))

    def run(self) -> tuple[dict, list[Span]]:
        env = self.env
        client = env.process(self.client())
        self.start_engine()
        try:
            env.run(until=client)
        finally:
            env.close()
        if self.recording is not None:
            self.recording.close(self)
        spans = sorted(self.spans, key=lambda s: s.start_us) if self.spans else []
        return self.result(env.now / 1e6), spans

    def start_engine(self) -> None:
        """The engine core's processes: its loop, its worker's, its API server's."""
        env = self.env
        env.process(self.engine())
        if not self.inline:
            env.process(self.worker())
        if self.api_server:
            env.process(self.frontend())

    # -- the client -------------------------------------------------------------------------

    def client(self):
        env, gen = self.env, self.gen
        while not gen.done:
            self.send_due()
            nxt = gen.next_arrival()
            if nxt is not None:
                yield env.hold(max(0.0, nxt * 1e6 - env.now))
            elif not gen.done:
                self.slot_free = env.event()
                yield self.slot_free

    def send_due(self) -> None:
        """Send every request that has arrived, while slots are free; wake an idle engine."""
        now_s = self.env.now / 1e6
        sent = self.gen.pop_due(now_s + 1e-9)
        for tr in sent:
            self.timings[tr.request_id] = RequestTiming(tr.request_id, tr.prompt_len, now_s)
            self.take(tr)
        if sent and not self.api_server:
            self.wake_engine()

    def take(self, tr: TraceRequest) -> None:
        """A sent request reaches the engine core (through the API server where there is
        one); data parallelism routes it to a rank (sim/data_parallel.py)."""
        if self.api_server:   # the API server takes it in first
            self.env.process(self.admit(tr))
        else:
            self.inbox.append(tr)

    def wake_engine(self) -> None:
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def _complete(self, _=None) -> None:
        self.gen.complete()
        if not self.out_latency:
            # The client learns of the last chunk when update_from_output emits it, and sends
            # the next request at once: the engine's next schedule sees it (as the engine's own
            # in-process client does).
            self.send_due()
        if self.slot_free is not None and not self.slot_free.triggered:
            self.slot_free.succeed()

    # -- the engine core --------------------------------------------------------------------

    def engine(self):
        env, sched, cpu = self.env, self.sched, self.cpu
        queue: deque[Step] = deque()
        depth = 2 if self.async_ else 1
        while True:
            while self.inbox:
                tr = self.inbox.popleft()
                sched.add_request(Request(tr.request_id, tr.prompt_len, tr.output_len,
                                          tr.prompt_token_ids if self.caching else None))
            launched = False
            if sched.has_unfinished():
                out, batch = self.plan()
                cost = cpu.schedule(out.num_reqs, out.num_batched_tokens)
                if self.async_terms and cpu.async_schedule is not None and batch is not None:
                    cost += cpu.async_schedule(out.num_reqs, batch.num_drafts)
                if self.host is None:
                    if (ev := self.busy(ENGINE, "schedule", out.step, cost)) is not env.passed:
                        yield ev
                else:
                    yield from self.on_host(ENGINE, "schedule", out.step, cost)
                if out.scheduled:
                    step = Step(out, batch)
                    self.num_steps += 1
                    if self.inline:
                        yield from self.execute(step)
                        step.t_output = step.t_done + cpu.wake_us
                    else:
                        step.ready = env.event()
                        self.to_worker.put((step, env.now + cpu.ipc_us))
                    queue.append(step)
                    launched = True
            if not queue:
                if sched.has_unfinished():
                    raise RuntimeError("simulator stalled: requests wait but nothing is in flight")
                if self.lockstep is not None and self.lockstep.running:
                    yield from self.dummy_forward()   # another rank has work: meet it
                    continue
                self.wake = env.event()
                yield self.wake
                continue
            if launched and len(queue) < depth:
                continue  # the queue has room: schedule the next step first
            step = queue.popleft()
            yield from self.await_output(step)
            yield from self.update(step)
            if not launched and self.lockstep is not None and self.lockstep.running:
                yield from self.dummy_forward()   # as vLLM's busy loop: no forward this turn

    def dummy_forward(self):
        """vLLM's execute_dummy_batch: a rank of a data-parallel MoE group with nothing to run
        this turn runs a one-token forward, so that its experts' collectives meet the other
        ranks' (sim/data_parallel.py). It takes a step number as an empty schedule would."""
        out, batch = dummy_batch(self.sched)
        step = Step(out, batch, dummy=True)
        if self.inline:
            yield from self.execute(step)
        else:   # the executor's call returns once the worker has launched it
            step.ready = self.env.event()
            self.to_worker.put((step, self.env.now + self.cpu.ipc_us))
            yield step.ready

    def await_output(self, step: Step):
        env = self.env
        if step.ready is not None and not step.ready.triggered:
            yield step.ready
        if step.t_output > env.now:
            if self.inline:  # the engine's thread is the worker's: blocked on the device
                if (ev := self.busy(WORKER, "wait", step.out.step, step.t_output - env.now)) \
                        is not env.passed:
                    yield ev
            else:
                yield env.hold(step.t_output - env.now)
        if self.inline and self.cpu_propose:
            yield self.propose(step)

    def propose(self, step: Step):
        """A CPU proposer's drafts for the next step, from this step's tokens on the host."""
        return self.busy(WORKER, "propose", step.out.step,
                         self.cpu.propose(step.out.num_reqs, step.batch.kv_tokens))

    def plan(self) -> tuple:
        """The next step: the scheduler's output and its totals (None: nothing scheduled)."""
        out = self.sched.schedule()
        batch = batch_of(out) if out.scheduled else None
        if self.recording is not None:
            self.recording.plans.append((Planned(out.step, bool(out.scheduled), out.num_reqs,
                                                 out.num_batched_tokens), batch))
        return out, batch

    def outcome(self, out: SchedulerOutput) -> list:
        """The step's tokens, 1 + accepted for each request that samples (the acceptance's
        draws), applied by the scheduler: the chunks to stream."""
        acc, tokens, hist = self.acc, self.tokens, self.accepted_hist
        sampled, drafts = {}, 0
        for s in out.scheduled:
            req = s.request
            if s.samples and req.status != FINISHED:
                n = 0
                if s.num_spec:
                    n = acc.next(req.request_id, s.num_spec)
                    hist[n] += 1
                    drafts += s.num_spec
                sampled[req.request_id] = tokens[n]
        self.num_draft_tokens += drafts
        emitted = self.sched.update_from_output(out, sampled)
        if self.recording is not None:
            self.recording.outcomes.append(emitted)
        return emitted

    def update(self, step: Step):
        out = step.out
        emitted = self.outcome(out)
        if self.samples is not None:
            self.sample(step, emitted)
        cpu = self.cpu
        cost = cpu.update_from_output(out.num_reqs, out.num_batched_tokens)
        if self.host is None:
            if (ev := self.busy(ENGINE, "update_from_output", out.step, cost)) \
                    is not self.env.passed:
                yield ev
        else:
            yield from self.on_host(ENGINE, "update_from_output", out.step, cost)
        if self.api_server:
            if emitted:
                self.to_frontend.put((out.step, emitted))
            if not self.async_ and self.cfg.k and cpu.rpc_drafts is not None:
                yield self.busy(ENGINE, "wait", out.step,
                                cpu.rpc_drafts(out.num_reqs, out.num_batched_tokens),
                                {"on": "take_draft_token_ids"})
            return
        t, timings = (self.env.now + self.out_latency) / 1e6, self.timings
        for o in emitted:
            timings[o.request.request_id].add_chunk(t, len(o.new_token_ids))
            if o.finished:
                self.acc.finished(o.request.request_id)
                if self.out_latency:
                    self.env.timeout(self.out_latency).callbacks.append(self._complete)
                else:
                    self._complete()

    def sample(self, step: Step, emitted) -> None:
        """The series' point after a step: running, waiting, KV use, tokens in and out."""
        s = self.sched
        self.samples.append((self.env.now / 1e6, len(s.running), len(s.waiting),
                             100.0 * (1 - s.num_free_blocks / s.cfg.num_blocks),
                             sum(c for c, _ in step.batch.prefills),
                             sum(len(o.new_token_ids) for o in emitted)))

    # -- the API server (vLLM's topology) ---------------------------------------------------

    def admit(self, tr: TraceRequest):
        """The API server takes a request in (tokenize, hand to the engine core)."""
        cost = self.cpu.add_request
        if cost is not None:
            yield from self.on_host(FRONTEND, "add_request", -1, cost(1, tr.prompt_len),
                                    {"request": tr.request_id})
        self.inbox.append(tr)
        self.wake_engine()

    def frontend(self):
        """The API server processes each step's outputs in turn; the client has the chunks
        client_latency_us later."""
        env, cpu = self.env, self.cpu
        while True:
            n, emitted = yield self.to_frontend.get()
            if cpu.process_outputs is not None:
                tokens = sum(len(o.new_token_ids) for o in emitted)
                yield from self.on_host(FRONTEND, "process_outputs", n,
                                        cpu.process_outputs(len(emitted), tokens))
            lat = cpu.client_latency_us
            t = (env.now + lat) / 1e6
            for o in emitted:
                self.timings[o.request.request_id].add_chunk(t, len(o.new_token_ids))
                if o.finished:
                    self.acc.finished(o.request.request_id)
                    env.timeout(lat).callbacks.append(self._complete)

    # -- the worker -------------------------------------------------------------------------

    def worker(self):
        """The `process` topology: the worker's own thread, fed over IPC."""
        env, cpu = self.env, self.cpu
        while True:
            step, t_arrive = yield self.to_worker.get()
            if t_arrive > env.now:
                yield env.hold(t_arrive - env.now)
            n, tokens = step.out.num_reqs, step.out.num_batched_tokens
            if self.tp > 1:   # the executor's message reaches every rank
                yield self.busy(WORKER, "broadcast", step.out.step, cpu.broadcast(n, tokens))
            yield from self.execute(step)
            if step.dummy:   # no output: the engine core waits for the launch only
                step.ready.succeed()
                continue
            if self.computes_ahead:  # it computed the step itself: it sends the result and
                # turns to the next message, which keeps its thread busy (no span: no op)
                t_host = step.t_done
                if self.cpu_propose:
                    yield self.propose(step)
                    t_host = env.now
                step.t_output = t_host + cpu.result_latency_us(n, tokens)
                step.ready.succeed()
                turn = cpu.worker_turnaround(n, tokens) * self.rpc_share
                if self.async_terms and cpu.async_output is not None:   # its output thread
                    turn += cpu.async_output(n, step.batch.num_drafts)
                yield env.hold(turn)
                continue
            if self.async_:  # an output thread sends the result once the copy lands
                collect = cpu.collect(n, tokens) if self.tp > 1 else 0.0
                step.t_output = step.t_done + cpu.wake_us + collect + cpu.ipc_us
            else:
                t = step.t_done + cpu.wake_us
                if t > env.now:
                    yield self.busy(WORKER, "wait", step.out.step, t - env.now)
                if self.cpu_propose:
                    yield self.propose(step)
                if self.tp > 1:
                    yield self.busy(WORKER, "collect", step.out.step, cpu.collect(n, tokens))
                step.t_output = env.now + cpu.ipc_us
            step.ready.succeed()

    def execute(self, step: Step):
        """prepare_inputs and launch one step, on the worker's thread."""
        env, cpu, out = self.env, self.cpu, step.out
        prev = self.prev
        if self.wait_accepted and prev is not None and prev.batch.num_drafts \
                and not step.dummy:
            t = prev.t_accepted + cpu.wake_us
            if t > env.now:
                yield self.busy(WORKER, "wait", out.step, t - env.now,
                                {"on": "accepted", "of": prev.out.step})
        prep = cpu.prepare_inputs(out.num_reqs, out.num_batched_tokens)
        if self.async_terms:   # vLLM's async path: the previous step's tokens placed here,
            # and (a device running on its own) the output thread of the previous step
            if cpu.async_prepare is not None:
                prep += cpu.async_prepare(out.num_reqs, step.batch.num_drafts)
            if self.device_async and prev is not None and cpu.async_output is not None:
                prep += cpu.async_output(prev.out.num_reqs, prev.batch.num_drafts)
        if (ev := self.busy(WORKER, "prepare_inputs", out.step, prep)) is not env.passed:
            yield ev
        dur = cpu.launch(out.num_reqs, out.num_batched_tokens)
        if self.drafter_launch is not None and not step.dummy:
            dur += self.drafter_launch(step.batch)
        if self.device_async:
            lat = cpu.launch_latency_us
            if self.lockstep is None:
                self.device.place(step, env.now + lat, env.now + dur + lat)
            else:   # a data-parallel MoE group: the ranks meet, then launch together
                yield from self.lockstep.meet(self, step, dur, lat)
            if (ev := self.busy(WORKER, "launch", out.step, dur)) is not env.passed:
                yield ev
        else:  # the device is this thread: launch packs the inputs, then runs the ops itself
            pause = cpu.rpc_mid(out.num_reqs, out.num_batched_tokens) * self.rpc_share \
                if self.api_server and cpu.rpc_mid is not None else 0.0
            self.device.place(step, env.now + dur, env.now + dur, pause)
            if (ev := self.busy(WORKER, "launch", out.step, step.t_done - env.now)) \
                    is not env.passed:
                yield ev
        if not step.dummy:
            self.prev = step

    # -- the result -------------------------------------------------------------------------

    def result(self, duration_s: float) -> dict:
        cfg, r = self.cfg, self.r
        timings = [self.timings[tr.request_id] for tr in self.requests]
        config = cfg.to_dict()
        steps, preemptions, cached, gaps = self.engine_totals()
        if config["request_rate"] is None:
            config["request_rate"] = ("inf" if all(tr.arrival_s == 0 for tr in self.requests)
                                      else "trace")
        config["resolved"] = {
            "hardware": r.hw.name, "device": "cuda" if r.device_async else "cpu",
            "mode": r.mode, "notes": list(r.notes),
            "target": r.target.name, "draft": r.draft.name if r.draft else None,
            "num_kv_blocks": r.scheduler.num_blocks,
            "acceptance_rates": list(r.profile.rates), "acceptance_spread": r.profile.spread,
            **({"acceptance_profile": r.profile.name} if cfg.k else {}),
            **({"drafter": r.drafter.to_dict()} if r.drafter_host else {}),
            "cpu_costs_us": r.cpu.to_dict(), "num_steps": steps,
            "num_preemptions": preemptions,
        }
        if self.caching:   # vLLM's prefix-cache counters (tokens)
            config["resolved"]["prefix_cache"] = cached
        if r.measured is not None and r.measured.jitter and self.device.jitter is not None:
            j = r.measured.jitter
            config["resolved"]["jitter"] = {"bin_ms": j.bin_ms, "sigma_step": j.sigma_step,
                                            "trace_bins": len(j.trace),
                                            "offset": self.device.jitter.offset}
        sources = getattr(r.device_costs, "sources", None)
        if sources is not None:   # a measured profile or tables: which ops each priced
            config["resolved"]["device_costs"] = {"profile": getattr(r.device_costs, "path",
                                                                     None), **sources}
            moe = getattr(r.device_costs, "moe", None)
            if moe is not None and moe.grid is not None:   # how much moe.csv covered
                config["resolved"]["device_costs"]["moe_coverage"] = moe.coverage()
        res = run_result(timings, duration_s, backend="stepgap-sim", config=config,
                         gaps_us=gaps, spec=self.spec_stats() if cfg.k else None,
                         detailed=cfg.detailed, percentiles=cfg.metric_percentiles,
                         percentile_metrics=cfg.percentile_metrics)
        if self.samples is not None:
            res["timeseries"] = timeseries(self.samples, cfg.timeseries_interval_s)
        return res

    def engine_totals(self) -> tuple[int, int, dict | None, list[float]]:
        """What the result counts of the engine: its steps, preemptions, prefix-cache counters
        (None with caching off) and the device's step gaps (data parallelism sums its ranks')."""
        return (self.num_steps, self.sched.num_preemptions,
                self.sched.prefix_cache_counts() if self.caching else None, self.device.gaps)

    def spec_stats(self) -> SpecStats:
        """The acceptance counters of vLLM's SpecDecodingStats, from the histogram."""
        hist, spec = self.accepted_hist, SpecStats(self.cfg.k)
        spec.num_drafts = sum(hist)
        spec.num_draft_tokens = self.num_draft_tokens
        spec.num_accepted_tokens = sum(n * c for n, c in enumerate(hist))
        spec.accepted_per_pos = [sum(hist[i + 1:]) for i in range(self.cfg.k)]
        return spec


class Replayed(Sim):
    """A run that takes a `Recording`'s steps: the scheduler's outputs and the tokens each step
    gave are read back, not computed again; everything that takes time runs as in `Sim`."""

    def __init__(self, cfg: SimConfig, requests: list[TraceRequest],
                 device_costs: DeviceCosts | None, profile: Profile | None,
                 recording: Recording):
        super().__init__(cfg, requests, device_costs, profile)
        if not self.same_steps():
            raise RuntimeError("a replayed run must take the same steps whatever the times")
        if device_costs is None:
            self.device.ops = self.shared_ops(recording)
        self.sched = ReplayedScheduler(recording.totals)
        self.plans, self.outcomes = iter(recording.plans), iter(recording.outcomes)
        self.accepted_hist = list(recording.totals["accepted_hist"])
        self.num_draft_tokens = recording.totals["num_draft_tokens"]

    def plan(self) -> tuple:
        step = next(self.plans, None)
        if step is None:
            raise RuntimeError("the replayed run went on past the recorded steps")
        return step

    def outcome(self, out: Planned) -> list:
        # NOTE: the run ends when the client has its last chunk, and the engine may or may not
        # have applied a step launched after it by then (async: a step in flight for requests
        # its predecessor finished), as the times fall: one update more or fewer than the
        # recording. Such an update is of finished requests only, so it emits nothing.
        emitted = next(self.outcomes, [])
        for o in emitted:
            if o.finished:
                self.sched.unfinished -= 1
        return emitted

    def run(self) -> tuple[dict, list[Span]]:
        res = super().run()
        if next(self.plans, None) is not None or any(self.outcomes):   # (see outcome)
            raise RuntimeError("the replayed run ended before the recorded steps did")
        return res


class ReplayedScheduler:
    """What a replayed run's engine asks of its scheduler besides the steps: whether any
    request is unfinished, and the recorded run's counters."""

    def __init__(self, totals: dict):
        self.unfinished = 0
        self.num_preemptions = totals["num_preemptions"]
        self.prefix_cache = totals["prefix_cache"]

    def add_request(self, req: Request) -> None:
        self.unfinished += 1

    def has_unfinished(self) -> bool:
        return self.unfinished > 0

    def prefix_cache_counts(self) -> dict | None:
        return self.prefix_cache


# -------------------------------------------------------------------------------------------
# Data parallelism (sim/data_parallel.py): the engine cores and the run


class DPRank(Sim):
    """One engine core of a data-parallel group: sim/loop.py's step loop on the group's clock,
    its requests routed to it, its finished ones reported to the group's client."""

    def __init__(self, group: DPSim, index: int):
        self.group, self.index = group, index
        self.cfg, self.r, self.env, self.requests = group.cfg, group.r, group.env, group.requests
        self.acc, self.gen, self.timings = group.acc, group.gen, group.timings
        self.out_latency, self.slot_free = group.out_latency, None
        self._init_engine()
        self.lockstep = group.lockstep
        self.dummies = 0

    def unfinished(self) -> bool:
        return self.sched.has_unfinished() or bool(self.inbox)

    def dummy_forward(self):
        self.dummies += 1
        yield from super().dummy_forward()

    def update(self, step: Step):
        yield from super().update(step)
        self.group.router.report(self.index, len(self.sched.waiting), len(self.sched.running))

    def sample(self, step: Step, emitted) -> None:
        self.group.sample_group(step, emitted)

    def _complete(self, _=None) -> None:
        self.group._complete()


class DPSim(Sim):
    """A data-parallel run: the benchmark client and vLLM's DP front end before N `DPRank`s
    (module docstring). `run()` returns the run result and the ranks' spans."""

    def _init_engine(self) -> None:
        cfg, r = self.cfg, self.r
        n = cfg.data_parallel_size
        self.api_server, self.spans = False, None
        self.caching = r.scheduler.enable_prefix_caching
        self.samples: list[tuple] | None = [] if cfg.timeseries_interval_s else None
        self.router = Router(self.env, n)
        moe_drafter = cfg.k > 0 and (cfg.method == "mtp" or (
            r.draft is not None and getattr(r.draft, "is_moe", False)))
        sync = r.cpu.dp_sync
        sync = sync(0, 0) if sync is not None else DP_SYNC_US * cfg.cpu_scale * cfg.speed
        self.lockstep = Lockstep(self, sync, moe_drafter) if r.target.is_moe else None
        self.ranks = [DPRank(self, i) for i in range(n)]

    def take(self, tr) -> None:
        rank = self.ranks[self.router.choose()]
        rank.inbox.append(tr)
        if self.lockstep is not None and not self.lockstep.running:
            self.lockstep.start_wave()
        else:
            rank.wake_engine()

    def wake_engine(self) -> None:
        """(`take` wakes the rank a request goes to.)"""

    def start_engine(self) -> None:
        for rank in self.ranks:
            rank.start_engine()

    def sample_group(self, step: Step, emitted) -> None:
        """The series' point after a rank's step: the group's running and waiting requests,
        its ranks' mean KV use, the step's tokens in and out."""
        ranks = [r.sched for r in self.ranks]
        kv = sum(1 - s.num_free_blocks / s.cfg.num_blocks for s in ranks) / len(ranks)
        self.samples.append((self.env.now / 1e6, sum(len(s.running) for s in ranks),
                             sum(len(s.waiting) for s in ranks), 100.0 * kv,
                             sum(c for c, _ in step.batch.prefills),
                             sum(len(o.new_token_ids) for o in emitted)))

    def run(self) -> tuple[dict, list[Span]]:
        res, _ = super().run()
        spans = []
        for rank in self.ranks:
            for s in rank.spans or ():
                spans.append(s._replace(args={**(s.args or {}), "dp": rank.index}))
        for rank in self.ranks:   # the ranks and the lockstep refer to the group and to each
            rank.group = rank.lockstep = None   # other: freed at once now (Clock.close)
        self.ranks = self.lockstep = None
        return res, sorted(spans, key=lambda s: s.start_us)

    def engine_totals(self):
        ranks = self.ranks
        cached = None
        if self.caching:
            counts = [r.sched.prefix_cache_counts() for r in ranks]
            cached = {k: sum(c[k] for c in counts) for k in counts[0]}
        return (sum(r.num_steps for r in ranks), sum(r.sched.num_preemptions for r in ranks),
                cached, [g for r in ranks for g in r.device.gaps])

    def spec_stats(self):
        self.accepted_hist = [sum(h) for h in zip(*(r.accepted_hist for r in self.ranks))]
        self.num_draft_tokens = sum(r.num_draft_tokens for r in self.ranks)
        return super().spec_stats()

    def result(self, duration_s: float) -> dict:
        res = super().result(duration_s)
        ranks = self.ranks
        res["config"]["resolved"]["data_parallel"] = {
            "size": len(ranks), "lockstep": self.lockstep is not None,
            "dp_sync_us": self.lockstep.dp_sync if self.lockstep is not None else None,
            "requests": list(self.router.sent), "steps": [r.num_steps for r in ranks],
            "dummy_forwards": [r.dummies for r in ranks],
            "num_preemptions": [r.sched.num_preemptions for r in ranks]}
        return res


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
    if cfg.data_parallel_size > 1:   # N engine cores behind vLLM's DP front end
        sim = DPSim(cfg, reqs, device_costs, profile)
    elif recording is not None and recording.replays(cfg, reqs):
        sim = Replayed(cfg, reqs, device_costs, profile, recording)
    else:
        sim = Sim(cfg, reqs, device_costs, profile, recording)
    res, spans = sim.run()
    # Sim.result still writes the document (formats.run_result); read once, as a typed result
    return (res if isinstance(res, RunResult) else RunResult.from_dict(res)), spans
