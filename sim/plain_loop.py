"""The engine loop in plain Python, without SimPy, where nothing but the loop moves time
(issue 54).

Where a run's steps cannot depend on time (`Run.same_steps`: one thread drives the engine core,
every request arrives at once, and the client sends the next the moment another's last chunk
lands), nothing happens between the engine thread's own actions, and what the loop decides
never depends on the clock. Such a run, unless it records a timeline or takes vLLM's async
terms (`runs_plainly`), runs here in two passes over sim/core.py's `EngineCore.engine`,
`execute`, `await_output` and `update` for an inline worker:

- `record`: the loop's decisions alone, with no clock: each turn's plan, launch and update (a
  `Program`), the steps scheduled live (sim/steps.py `LiveSteps`) and kept as `Columns`, the
  chunks to the client and the requests it sends back. Where no request's steps depend on
  another's, sim/paths.py writes the same program request by request, and this pass runs only
  where it hands the run back. A replay of a `Recording` skips both.
- `timed`: the clock over those turns, every op's time looked up or computed for all steps
  before the loop, which is then the same sums in the same order as SimPy's clock reaches (a
  hold of dt is `now + dt`; a wait until t is `now + (t - now)`), so the same result to the
  byte; then the client's timings.

`tests/test_sim_replay.py::test_the_plain_loop_gives_what_simpy_gives` holds the two loops to
each other over every case the replays are tested on. Every other run takes SimPy's loop: one
that records a timeline (its spans come from EngineCore's `busy`), an API server, a process
worker, arrivals over time, an output latency, a series, data parallelism.
"""

from __future__ import annotations

import gc
from collections import deque
from contextlib import contextmanager
from operator import itemgetter

import numpy as np

from stepgap.common.formats import RequestTiming
from stepgap.common.scheduler import Request
from stepgap.sim.cluster import Client
from stepgap.sim import paths
from stepgap.sim.config import SimConfig
from stepgap.sim.core import EngineCore, async_terms
from stepgap.sim.device_lane import Step
from stepgap.sim.plan import Resolved
from stepgap.sim.steady import InFlight, SteadyTurns
from stepgap.sim.steps import (LAUNCHED, PLANNED, UPDATED, Columns, LiveSteps, Program,
                               Recording)


def runs_plainly(cfg: SimConfig, r: Resolved) -> bool:
    """Whether a run whose steps cannot depend on time (`Run.same_steps`: an inline worker, no
    API server, alone) can go here: no timeline to record, and not vLLM's async terms."""
    return not cfg.timeline and not async_terms(r)


@contextmanager
def paused_gc():
    """The cycle collector paused (and left as it was found): the plain loop and a run's
    result make a few objects a request and a step, millions in a large run, and no cycle, so
    the collector's passes over them find nothing, at 10-30 % of the run's time
    (docs/explanation/speed.md)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def run(core: EngineCore, client: Client, rec: Recording) -> None:
    """Run `core`'s steps for `client` to the last request's last chunk, the clock left at
    that time: scheduled live into `rec` first (`record`), unless they are `rec`'s own."""
    if isinstance(core.steps, LiveSteps):
        if not paths.record(core, client, rec):   # (sim/paths.py: request by request)
            record(core, client, rec)
        rec.close(core.steps)
    timed(core, client, rec)


def record(core: EngineCore, client: Client, rec: Recording) -> None:
    """The loop's turns with no clock, its steps scheduled live: `rec.program`."""
    steps, sched, inbox = core.steps, core.sched, core.inbox
    plan, outcome = steps.plan, steps.outcome
    gen, acc, complete = client.gen, client.acc, client.complete
    depth, caching = (2 if core.async_ else 1), core.caching
    plan_reqs, plan_tokens, batches = [], [], []
    chunks: dict = {}   # request id -> ([update], [tokens])
    sent: dict[str, int] = {}
    turns: list[int] = []
    queue: deque = deque()
    steady = SteadyTurns(sched, steps, client, (plan_reqs, plan_tokens, batches, chunks))
    u = 0   # the next update
    client.send_due()   # at 0, every request the concurrency lets in
    for tr in inbox:
        sent[tr.request_id] = -1
        chunks[tr.request_id] = ([], [])
    while True:
        while inbox:
            tr = inbox.popleft()
            sched.add_request(Request(tr.request_id, tr.prompt_len, tr.output_len,
                                      tr.prompt_token_ids if caching else None))
        if steady.take(queue, u):   # (sim/steady.py: the scheduler's decisions, without it)
            turn = PLANNED | LAUNCHED
        else:
            launched = False
            turn = 0
            if sched.has_unfinished():
                turn = PLANNED
                out, batch = plan()
                plan_reqs.append(out.num_reqs)
                plan_tokens.append(out.num_batched_tokens)
                if out.scheduled:
                    batches.append(batch)
                    queue.append(out)
                    launched = True
                    turn = PLANNED | LAUNCHED
            if not queue:
                raise RuntimeError("simulator stalled: requests wait but nothing is in flight")
            if launched and len(queue) < depth:
                turns.append(turn)
                continue
            out = queue.popleft()
            if type(out) is InFlight:   # a steady turn's step
                out = out.output()
            for o in outcome(out):   # the chunks, as Client.deliver takes them
                rid = o.request.request_id
                us, ns = chunks[rid]
                us.append(u)
                ns.append(len(o.new_token_ids))
                if o.finished:
                    acc.finished(rid)
                    complete()   # the client's next request, into the inbox
        for tr in inbox:   # (sent by this update: the inbox is read at each turn's start)
            sent[tr.request_id] = u
            chunks[tr.request_id] = ([], [])
        turns.append(turn | UPDATED)
        u += 1
        if gen.done:
            break
    rec.program = Program(turns, sent, Columns(np.array(plan_reqs), np.array(plan_tokens),
                                               batches, chunks))


def timed(core: EngineCore, client: Client, rec: Recording) -> None:
    """The clock over `rec`'s turns, as sim/core.py's loop moves it for an inline worker, and
    the client's timings."""
    cpu, device, program = core.cpu, core.device, rec.program
    cols = program.columns
    sched_us = cpu.schedule.each(cols.plan_reqs, cols.plan_tokens)
    reqs, tokens = cols.reqs, cols.tokens
    prepare_us = cpu.prepare_inputs.each(reqs, tokens)
    launch_us = cpu.launch.each(reqs, tokens)
    if core.drafter_launch is not None:   # (the passes are the steps': the recording's)
        d = core.r.drafter
        if cols.passes is None:
            cols.passes = d.passes_of(cols.sampling)
        of = np.array([d.launch_of(n) for n in range(int(cols.passes.max(initial=0)) + 1)])
        launch_us = (np.asarray(launch_us, np.float64) + of[cols.passes]).tolist()
    update_us = cpu.update_from_output.each(reqs, tokens)
    propose_us = cpu.propose.each(reqs, cols.kv) if core.cpu_propose else None
    steady = device.steady
    verify_us = device_us = None
    if steady:   # (all steps at once where the costs can, else each by its key)
        times = device.steady_times(cols)
        verify_us, device_us = (times[0].tolist(), times[1].tolist()) if times is not None \
            else _device_times(device, cols, rec)
    batches, drafts = (None if steady else cols.batch_list()), cols.drafts
    wake, latency = cpu.wake_us, cpu.launch_latency_us
    wait_accepted, device_async, place = core.wait_accepted, core.device_async, device.place
    free, last_end, gaps = device.free, device.last_end, device.gaps
    t = 0.0
    ip = il = iu = 0   # the next plan, launched step, update
    accepted = 0.0   # the last launched step's t_accepted
    outputs: list[float] = []   # each launched step's t_output
    updates: list[float] = []   # each update's time: its chunks reach the client
    starts: list[float] = []    # each launched step's start on a steady device
    for turn in program.turns:
        if turn & PLANNED:
            t += sched_us[ip]
            ip += 1
            if turn & LAUNCHED:
                if wait_accepted and il and drafts[il - 1]:
                    ready = accepted + wake
                    if ready > t:
                        t += ready - t
                t += prepare_us[il]
                dur = launch_us[il]
                if device_async:
                    t_first, t_last = t + latency, t + dur + latency
                else:   # the device is this thread
                    t_first = t_last = t + dur
                if steady:   # Device.place, inline (its gaps from the starts, after)
                    d = device_us[il]
                    start = free   # max(free, t_first, t_last - d)
                    if t_first > start:
                        start = t_first
                    if t_last - d > start:
                        start = t_last - d
                    accepted = start + verify_us[il]
                    done = free = start + d
                    starts.append(start)
                else:   # a noise that varies: each step's times drawn as it starts
                    step = Step(None, batches[il])
                    place(step, t_first, t_last)
                    accepted, done = step.t_accepted, step.t_done
                if device_async:
                    t += dur
                else:
                    t += done - t
                outputs.append(done + wake)
                il += 1
        if turn & UPDATED:
            ready = outputs[iu]
            if ready > t:
                t += ready - t
            if propose_us is not None:
                t += propose_us[iu]
            t += update_us[iu]
            updates.append(t)
            iu += 1
    if steady and starts:   # each step's gap after the one before (Device.place's)
        at = np.array(starts)
        done = at + np.array(device_us[:len(starts)])   # (the same sums as in the loop)
        if last_end is not None:
            gaps.append(max(0.0, starts[0] - last_end))
        gaps += np.maximum(0.0, at[1:] - done[:-1]).tolist()
        device.free = device.last_end = free
    core.num_steps += il
    core.env._now = t
    at = [u / 1e6 for u in updates]
    timings = client.timings   # each request sent at its update (-1: at 0 s), each chunk at its
    for tr in rec.requests:
        rid = tr.request_id
        u = program.sent[rid]
        us, ns = cols.chunks[rid]
        timings[rid] = RequestTiming(rid, tr.prompt_len, at[u] if u >= 0 else 0.0,
                                     at[us.start:us.stop] if type(us) is range else
                                     list(itemgetter(*us)(at)) if len(us) > 1 else
                                     [at[i] for i in us], list(ns))


def _device_times(device, cols: Columns, rec: Recording) -> tuple[list[float], list[float]]:
    """Each launched step's time until the accepted counts are known, and its whole time, on a
    steady device (`Device.steady`: they depend on the batch alone), as `Device.place` finds
    them: looked up by the step's key, or computed where it has none. The keys are kept with
    the recording for the runs whose device costs come from their configs (`Recording`'s
    `device_ops`: their keys are the same)."""
    key_of, known, batches = device.step_key, device.known, cols.batch_list()
    shared = any(device.ops is ops for ops in rec.device_ops.values())
    keys = cols.keys if shared else None
    if keys is None:
        keys = [key_of(b) for b in batches] if key_of is not None else [None] * len(batches)
        if shared:
            cols.keys = keys
    verify, whole = [], []
    for key, b in zip(keys, batches):
        times = known.get(key) if key is not None else None
        if times is None:
            times = device.times(b, 0.0, 0.0, key)
            if key is not None:
                known[key] = times
        verify.append(times[3])
        whole.append(times[4])
    return verify, whole
