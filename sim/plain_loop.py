"""The engine loop in plain Python, without SimPy, where nothing but the loop moves time
(issue 54).

Where a run's steps cannot depend on time (`Run.same_steps`: one thread drives the engine core,
every request arrives at once, and the client sends the next the moment another's last chunk
lands), nothing happens between the engine thread's own actions. Its time is then one float,
moved on by each thing the thread does in turn, as sim/core.py's `EngineCore.engine`, `execute`,
`await_output` and `update` move SimPy's clock for an inline worker: the same steps, scheduled
live or replayed (sim/steps.py), and the same sums in the same order (a hold of dt is
`now + dt`; a wait until t is `now + (t - now)`), so the same result to the byte, in about two
thirds of the time at low concurrency (docs/reports/2026-12-07-simulator-speed.md).
`tests/test_sim_replay.py::test_the_plain_loop_gives_what_simpy_gives` holds the two to each
other over every case the replays are tested on.

Every other run takes SimPy's loop: one that records a timeline (its spans come from
EngineCore's `busy`), an API server, a process worker, arrivals over time, an output latency, a
series, data parallelism.
"""

from __future__ import annotations

from collections import deque

from stepgap.common.scheduler import Request
from stepgap.sim.cluster import Client
from stepgap.sim.core import EngineCore
from stepgap.sim.device_lane import Step


def runs_plainly(core: EngineCore) -> bool:
    """Whether a run whose steps cannot depend on time (`Run.same_steps`: an inline worker, no
    API server, alone) can go here: no timeline to record, and not vLLM's async terms."""
    return core.spans is None and not core.async_terms


def run(core: EngineCore, client: Client) -> None:
    """Run `core`'s steps for `client` to the last request's last chunk, the clock left at
    that time."""
    env, cpu, device, steps, sched = core.env, core.cpu, core.device, core.steps, core.sched
    schedule, prepare, launch, update = (cpu.schedule, cpu.prepare_inputs, cpu.launch,
                                         cpu.update_from_output)
    propose = cpu.propose if core.cpu_propose else None
    wake, latency = cpu.wake_us, cpu.launch_latency_us
    drafter_launch, wait_accepted = core.drafter_launch, core.wait_accepted
    device_async, place, inbox = core.device_async, device.place, core.inbox
    plan, outcome, deliver, gen = steps.plan, steps.outcome, client.deliver, client.gen
    depth, caching = (2 if core.async_ else 1), core.caching
    queue: deque[Step] = deque()
    prev: Step | None = None
    t = 0.0
    client.send_due()   # at 0, every request the concurrency lets in
    while True:
        while inbox:
            tr = inbox.popleft()
            sched.add_request(Request(tr.request_id, tr.prompt_len, tr.output_len,
                                      tr.prompt_token_ids if caching else None))
        launched = False
        if sched.has_unfinished():
            out, batch = plan()
            n, tokens = out.num_reqs, out.num_batched_tokens
            t += schedule(n, tokens)
            if out.scheduled:
                step = Step(out, batch)
                core.num_steps += 1
                if wait_accepted and prev is not None and prev.batch.num_drafts:
                    ready = prev.t_accepted + wake
                    if ready > t:
                        t += ready - t
                t += prepare(n, tokens)
                dur = launch(n, tokens)
                if drafter_launch is not None:
                    dur += drafter_launch(batch)
                if device_async:
                    place(step, t + latency, t + dur + latency)
                    t += dur
                else:   # the device is this thread
                    place(step, t + dur, t + dur)
                    t += step.t_done - t
                prev = step
                step.t_output = step.t_done + wake
                queue.append(step)
                launched = True
        if not queue:
            raise RuntimeError("simulator stalled: requests wait but nothing is in flight")
        if launched and len(queue) < depth:
            continue
        step = queue.popleft()
        out = step.out
        if step.t_output > t:
            t += step.t_output - t
        if propose is not None:
            t += propose(out.num_reqs, step.batch.kv_tokens)
        emitted = outcome(out)
        t += update(out.num_reqs, out.num_batched_tokens)
        env._now = t   # (the client stamps the requests it sends now)
        deliver(t / 1e6, emitted, None)
        if gen.done:
            return
