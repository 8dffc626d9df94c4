"""What stands around the engine cores (sim/core.py): the benchmark `Client`, the series it
samples, and vLLM's data-parallel front end (`DataParallel`), which routes each request to one
of N engine cores and, for a MoE target, keeps them in lockstep (sim/data_parallel.py).

The client sends to an engine: one `EngineCore`, or a `DataParallel` group. Both answer
`take(tr)`, `wake_engine()`, `start()` and `api_server`; a router and a KV link for P/D
disaggregation or several replicas would be one more such engine, the cores unchanged.
"""

from __future__ import annotations

from stepgap.common.acceptance import Acceptance
from stepgap.common.formats import RequestTiming, TraceRequest
from stepgap.common.scheduler import Scheduler
from stepgap.common.speculation import METHODS
from stepgap.common.workloads import LoadGenerator
from stepgap.sim.config import SimConfig
from stepgap.sim.core import EngineCore
from stepgap.sim.data_parallel import DP_SYNC_US, Lockstep, Router
from stepgap.sim.device_lane import Clock, Step
from stepgap.sim.plan import Resolved
from stepgap.sim.steps import LiveSteps


class Client:
    """The benchmark client (`vllm bench serve`): sends each request at max(its arrival, a
    free slot) and takes each chunk as the engine streams it. `engine`: what it sends to."""

    def __init__(self, env: Clock, requests: list[TraceRequest], max_concurrency: int | None,
                 acc: Acceptance, out_latency_us: float):
        self.env, self.acc, self.out_latency = env, acc, out_latency_us
        self.gen = LoadGenerator(requests, max_concurrency)
        self.timings: dict[str, RequestTiming] = {}
        self.slot_free = None    # the client waits on it
        self.engine = None

    def run(self):
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
            self.engine.take(tr)
        if sent and not self.engine.api_server:
            self.engine.wake_engine()

    def deliver(self, t_s: float, emitted: list, delay_us: float | None) -> None:
        """The step's chunks reach the client at `t_s`; a finished request frees its slot
        `delay_us` later (None: at once)."""
        timings, acc = self.timings, self.acc
        for o in emitted:
            timings[o.request.request_id].add_chunk(t_s, len(o.new_token_ids))
            if o.finished:
                acc.finished(o.request.request_id)
                if delay_us is None:
                    self.complete()
                else:
                    self.env.timeout(delay_us).callbacks.append(self.complete)

    def complete(self, _=None) -> None:
        self.gen.complete()
        if not self.out_latency:
            # The client learns of the last chunk when update_from_output emits it, and sends
            # the next request at once: the engine's next schedule sees it (as the engine's own
            # in-process client does).
            self.send_due()
        if self.slot_free is not None and not self.slot_free.triggered:
            self.slot_free.succeed()


class Series:
    """vLLM's stat logger's view after every step of any engine core: running and waiting
    requests, mean KV use over the cores, the step's tokens in and out (timeseries)."""

    def __init__(self, env: Clock):
        self.env, self.samples = env, []
        self.cores: list[EngineCore] = []

    def sample(self, step: Step, emitted) -> None:
        scheds = [c.sched for c in self.cores]
        kv = sum(1 - s.num_free_blocks / s.cfg.num_blocks for s in scheds) / len(scheds)
        self.samples.append((self.env.now / 1e6, sum(len(s.running) for s in scheds),
                             sum(len(s.waiting) for s in scheds), 100.0 * kv,
                             sum(c for c, _ in step.batch.prefills),
                             sum(len(o.new_token_ids) for o in emitted)))


class DataParallel:
    """vLLM's DP front end before N engine cores, each with its own scheduler, worker and
    device on the run's clock (sim/data_parallel.py)."""

    api_server = False   # (the front end routes; each core's own topology holds)

    def __init__(self, env: Clock, cfg: SimConfig, r: Resolved, client: Client,
                 acc: Acceptance, series: Series | None):
        n = cfg.data_parallel_size
        self.env = env
        self.router = Router(env, n)
        moe_drafter = cfg.k > 0 and (METHODS[cfg.method].uses_mtp_layers or (
            r.draft is not None and getattr(r.draft, "is_moe", False)))
        sync = r.cpu.dp_sync
        sync = sync(0, 0) if sync is not None else DP_SYNC_US * cfg.cpu_scale * cfg.speed
        self.lockstep = Lockstep(self, sync, moe_drafter) if r.target.is_moe else None
        self.ranks = [EngineCore(env, cfg, r, client, LiveSteps(Scheduler(r.scheduler), acc,
                                                                cfg.k),
                                 series, i, self.router, self.lockstep) for i in range(n)]

    def take(self, tr: TraceRequest) -> None:
        rank = self.ranks[self.router.choose()]
        rank.inbox.append(tr)
        if self.lockstep is not None and not self.lockstep.running:
            self.lockstep.start_wave()
        else:
            rank.wake_engine()

    def wake_engine(self) -> None:
        """(`take` wakes the rank a request goes to.)"""

    def start(self) -> None:
        for rank in self.ranks:
            rank.start()

    def summary(self) -> dict:
        """The result's `data_parallel` entry."""
        ranks, lockstep = self.ranks, self.lockstep
        return {"size": len(ranks), "lockstep": lockstep is not None,
                "dp_sync_us": lockstep.dp_sync if lockstep is not None else None,
                "requests": list(self.router.sent), "steps": [r.num_steps for r in ranks],
                "dummy_forwards": [r.dummies for r in ranks],
                "num_preemptions": [r.sched.num_preemptions for r in ranks]}

    def close(self) -> None:
        """The ranks and the lockstep refer to the group and to each other: freed at once
        (Clock.close)."""
        for rank in self.ranks:
            rank.lockstep = rank.router = None
        if self.lockstep is not None:
            self.lockstep.group = None
        self.lockstep = None
