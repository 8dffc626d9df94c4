"""One engine core as SimPy processes (sim/loop.py's module docstring tells the rules): its
loop, its worker, its API server where it has one, on the device lane of sim/device_lane.py.

An `EngineCore` is built of parts: where its steps come from (sim/steps.py: scheduled live, or
replayed from a recording), the client it streams chunks to (sim/cluster.py `Client`), and,
as a rank of a data-parallel group, the group's `Lockstep`, `Router` and series. One engine
core serves alone or as such a rank alike (sim/cluster.py).

The inline worker's rules here (`engine`, `execute`, `await_output`, `update`) are also written
in sim/plain_loop.py, which runs them without SimPy where a run's steps cannot depend on time
(its decisions in `record`, its clock in `timed`): a change to one is a change to both
(tests/test_sim_replay.py holds them to the same bytes).
"""

from __future__ import annotations

from collections import deque
import simpy

from stepgap.common.formats import Span, TraceRequest
from stepgap.common.scheduler import Request
from stepgap.sim.config import SimConfig
from stepgap.sim.data_parallel import Lockstep, dummy_batch
from stepgap.sim.device_lane import ENGINE, FRONTEND, WORKER, Clock, Device, Step
from stepgap.sim.jitter import Jitter
from stepgap.sim.plan import Resolved
from stepgap.sim.steps import LiveSteps, ReplayedSteps


def device_of(cfg: SimConfig, r: Resolved, spans: list | None) -> Device:
    """The engine core's device lane: the plan's costs, the machine's noise (or --speed alone)
    and the drafter's host work where it waits for the step's tokens."""
    jitter, level = None, cfg.speed * cfg.device_scale
    if r.noise is not None:
        j = r.noise
        jitter = Jitter(j.trace, j.bin_ms * 1e3, j.sigma_step, level, cfg.seed)
    elif level != 1.0:
        jitter = Jitter([], 1.0, 0.0, level, cfg.seed)
    waits = r.drafter_host and r.drafter.waits_for_tokens()
    return Device(r.device_costs, cfg.k, r.fixup, spans, jitter, r.drafter,
                  r.cpu.wake_us if waits else None)


def async_terms(r: Resolved) -> bool:
    """Whether the run takes vLLM's async path's own costs (sim/cpu_costs.py
    VLLM_ASYNC_TERMS)."""
    return r.topology.engine == "vllm" and r.mode != "sync"


class EngineCore:
    """One engine core, its worker and device, and its API server where the topology has one.
    `client`: where its chunks go (sim/cluster.py `Client.deliver`); `series`: what samples it
    after each step (`Series`), if anything; `index`, `router`, `lockstep`: its place in a
    data-parallel group (None alone)."""

    def __init__(self, env: Clock, cfg: SimConfig, r: Resolved, client,
                 steps: LiveSteps | ReplayedSteps, series=None,
                 index: int = 0, router=None, lockstep: Lockstep | None = None):
        self.env, self.cfg, self.r, self.client = env, cfg, r, client
        self.steps, self.series = steps, series
        self.index, self.router, self.lockstep = index, router, lockstep
        # the steps' own (bound once: they run every step)
        self.sched, self.plan, self.outcome = steps.sched, steps.plan, steps.outcome
        self.caching = r.scheduler.enable_prefix_caching
        self.cpu = r.cpu
        self.spans: list[Span] | None = [] if cfg.timeline else None
        topo = r.topology
        self.async_ = r.scheduler.async_scheduling
        self.wait_accepted, self.cpu_propose = r.wait_accepted, r.cpu_propose
        self.inline, self.tp, self.computes_ahead = topo.inline, topo.tp, topo.computes_ahead
        self.device_async = topo.device_async
        self.api_server, self.rpc_share = topo.api_server, r.rpc_share
        self.async_terms = async_terms(r)
        self.device = device_of(cfg, r, self.spans)
        # the drafter's host work in each launch (the padded drafter batch), where priced
        self.drafter_launch = r.drafter.launch_us if r.drafter_host else None
        self.out_latency = cfg.output_latency_ms * 1e3
        self.inbox: deque[TraceRequest] = deque()
        self.prev: Step | None = None        # the worker's last launched step
        self.wake: simpy.Event | None = None         # the engine idles on it
        self.to_worker = simpy.Store(env)
        # the API server (vLLM's topology, a served stepgap engine) shares the engine core's CPU
        self.host = simpy.Resource(env, 1) if self.api_server else None
        self.to_frontend = simpy.Store(env)
        self.num_steps = 0
        self.dummies = 0   # data parallelism: dummy forwards run

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

    def start(self) -> None:
        """The engine core's processes: its loop, its worker's, its API server's."""
        env = self.env
        env.process(self.engine())
        if not self.inline:
            env.process(self.worker())
        if self.api_server:
            env.process(self.frontend())

    def take(self, tr: TraceRequest) -> None:
        """A sent request reaches the engine core (through the API server where there is
        one)."""
        if self.api_server:   # the API server takes it in first
            self.env.process(self.admit(tr))
        else:
            self.inbox.append(tr)

    def wake_engine(self) -> None:
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def unfinished(self) -> bool:
        return self.sched.has_unfinished() or bool(self.inbox)

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
            if self.router is not None:   # a DP rank reports its counts to the front end
                self.router.report(self.index, len(sched.waiting), len(sched.running))
            if not launched and self.lockstep is not None and self.lockstep.running:
                yield from self.dummy_forward()   # as vLLM's busy loop: no forward this turn

    def dummy_forward(self):
        """vLLM's execute_dummy_batch: a rank of a data-parallel MoE group with nothing to run
        this turn runs a one-token forward, so that its experts' collectives meet the other
        ranks' (sim/data_parallel.py). It takes a step number as an empty schedule would."""
        self.dummies += 1
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

    def update(self, step: Step):
        out = step.out
        emitted = self.outcome(out)
        if self.series is not None:
            self.series.sample(step, emitted)
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
        # The client learns of the last chunk when update_from_output emits it, and sends the
        # next request at once: the engine's next schedule sees it (as the engine's own
        # in-process client does).
        self.client.deliver((self.env.now + self.out_latency) / 1e6, emitted,
                            self.out_latency or None)

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
            self.client.deliver((env.now + lat) / 1e6, emitted, lat)

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
