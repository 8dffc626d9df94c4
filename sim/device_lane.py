"""The device lane and the step (sim/loop.py's module docstring tells the step loop): a `Step`
as the engine launches it, its `Batch` of totals, the `Device` lane that places steps in closed
form, and the `Clock` that moves on without an event where nothing else is due.

Lanes (docs/explanation/design.md §2): `cpu.frontend` (the API server), `cpu.engine`,
`cpu.worker` and `device`. Time is in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from stepgap.common.formats import Span
from stepgap.common.scheduler import SchedulerOutput
from stepgap.sim.costs import Batch, DeviceCosts
from stepgap.sim.drafter_costs import DrafterCosts
from stepgap.sim.jitter import Jitter

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


# `Device.ops`' entry for a recording's steps priced at once (`Device.steady_times`); a step's
# own key is a tuple of its numbers
AT_ONCE = ("at once",)

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
        self.draft_forwards = costs.draft_forwards   # all passes in one call, where it can
        self.step_key = costs.step_key
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

    def steady_times(self, cols) -> tuple | None:
        """Each of a recording's steps' time until its accepted counts are known and its whole
        time, as `times` gives them on a device without noise or with one constant factor,
        all at once where the costs can price columns of steps (`RooflineCosts.step_times`):
        the same sums of the same floats, an op a step does not run adding an exact 0.0, the
        factor on each op before the whole time's sum and on the verify time after its own.
        None where they cannot. The op times are kept with the runs that share `ops` (a
        recording's: the same steps, costs, drafter and fixup, the noise's factor aside)."""
        step_times = getattr(self.costs, "step_times", None)
        d = self.drafter
        if step_times is None or self.waits_us is not None \
                or d is not None and d.k and not d.on_cpu and (d.parallel or d.spec.one_pass):
            return None
        kept = self.ops.get(AT_ONCE) if self.ops is not None else None
        if kept is None:
            if cols.passes is None:   # (the drafter's launch costs read them too)
                cols.passes = d.passes_of(cols.sampling) if d is not None else \
                    np.zeros(len(cols.tokens), np.int64)
            kept = step_times(cols, cols.passes,
                              np.array(cols.drafts) > 0 if self.fixup else None)
            if kept is None:
                return None
            if self.ops is not None:
                self.ops[AT_ONCE] = kept
        ops, nverify = kept
        factor = self.jitter.factor(0.0) if self.jitter is not None else None   # (constant)
        verify = whole = 0.0
        for i, op in enumerate(ops):
            if i < nverify:
                verify = verify + op
            whole = whole + (op if factor is None else op * factor)
        return (verify if factor is None else verify * factor), whole

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
