"""Where each microsecond of a step and its gap goes: a timeline's time, op by op.

The rule (`breakdown`), over a window of whole steps, each with the gap before it (from the last
device op of the step before the first to the last device op of the last; by default every step
but the first, which has no gap before it), cut at every span's start and end into pieces in
which nothing starts or ends:

- a piece in which a device op runs is **device busy**, and belongs to that op (to each of
  them equally, where ops overlap on the device);
- a piece in which no device op runs is **device idle**, and is **exposed** time of the one CPU
  op on the critical path then: the device waits for the worker, the worker for the engine
  core, the engine core for the front end, so it is the op running on the lane nearest the
  device (`cpu.worker`, else `cpu.engine`, else `cpu.frontend`; equal shares where one lane
  runs several). A `wait` span is a lane blocked, not work, and is never on the path. An idle
  piece in which no CPU op runs is `(no op)`: latencies with no span of their own (a launch
  reaching the device, a blocking sync waking up, a message between processes, the result
  reaching the engine) and the engine waiting for requests;
- the rest of a CPU op's time in the window is **hidden**: under device work, or behind an op
  on a lane nearer the device.

So the device's busy time by op, the exposed time by op and `(no op)` add up to the window,
exactly; the exposed time and `(no op)` add up to the device's idle time, of which the step
gaps (common/formats.py `step_gaps`) are the part between steps. Every sum is divided by the
window's steps: microseconds per step.

A data-parallel run's spans carry their rank (args.dp): each rank is its own device, and is
broken down on its own (`ranks`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from stepgap.common.errors import UserError

# NOTE: spans are common/formats.py's `Span`s, read by attribute: that module imports this one
# (its Chrome trace carries the idle stretches), so this one does not import it

# The lanes that feed the device, nearest first: in a device-idle piece the first of them that
# runs an op is the one the device waits for.
PATH_ORDER = ("cpu.worker", "cpu.engine", "cpu.frontend")
NO_OP = ("idle", "(no op)")
NOT_WORK = ("wait",)   # a lane blocked, not working
FORMAT = "stepgap-explain/1"
RULE = ("device busy: the device op running; device idle: exposed time of the op running on "
        "the lane nearest the device (cpu.worker, then cpu.engine, then cpu.frontend; wait "
        "spans are not work), (no op) where none runs; hidden: the rest of each CPU op's time")


@dataclass
class OpTime:
    """One op of one lane in a breakdown: microseconds in the window."""
    lane: str
    op: str
    busy_us: float = 0.0      # device ops: the device running it
    exposed_us: float = 0.0   # CPU ops: on the critical path while the device idles
    hidden_us: float = 0.0    # CPU ops: the rest of its time

    def to_dict(self, steps: int) -> dict:
        return {"lane": self.lane, "op": self.op,
                **{k: round(getattr(self, k) / steps, 3)
                   for k in ("busy_us", "exposed_us", "hidden_us")}}


@dataclass
class Breakdown:
    """A window of a timeline, every microsecond of it attributed (module docstring)."""
    label: str
    steps: int                  # device steps in the window
    first_step: int
    last_step: int
    window_us: float
    ops: dict = field(default_factory=dict)   # (lane, op) -> OpTime
    gaps_us: float = 0.0        # the step gaps inside the window, summed
    pieces: list = field(default_factory=list)   # (start, end, lane, op) of each idle stretch

    def per_step(self, us: float) -> float:
        return us / self.steps

    @property
    def busy_us(self) -> float:
        return sum(o.busy_us for o in self.ops.values())

    @property
    def idle_us(self) -> float:
        return sum(o.exposed_us for o in self.ops.values())

    def rows(self) -> list[OpTime]:
        """Device ops first (in the order a step runs them), then the CPU ops by lane, then
        (no op)."""
        order = {"device": 0, "cpu.worker": 1, "cpu.engine": 2, "cpu.frontend": 3, "idle": 4}
        dev = ("fixup", "target_forward", "rejection_sample", "draft_forward", "d2h")
        return sorted(self.ops.values(), key=lambda o: (
            order.get(o.lane, 5), dev.index(o.op) if o.op in dev else len(dev), o.op))

    def to_dict(self) -> dict:
        n = self.steps
        return {"label": self.label, "steps": [self.first_step, self.last_step],
                "num_steps": n, "window_us": round(self.window_us, 3),
                "step_us": round(self.window_us / n, 3),
                "device_busy_us": round(self.busy_us / n, 3),
                "device_idle_us": round(self.idle_us / n, 3),
                "step_gap_us": round(self.gaps_us / n, 3),
                "ops": [o.to_dict(n) for o in self.rows()]}


def ranks(spans: list) -> dict:
    """rank -> its spans (None: a run without data parallelism)."""
    out: dict = {}
    for s in spans:
        out.setdefault(s.args.get("dp") if s.args else None, []).append(s)
    return out


def breakdown(spans: list, label: str = "", steps: tuple[int, int] | None = None) \
        -> Breakdown:
    """The breakdown of `spans` (one device's) over steps A..B (all of them by default)."""
    dev = {}
    for s in spans:
        if s.lane == "device":
            a, b = dev.get(s.step, (s.start_us, s.end_us))
            dev[s.step] = (min(a, s.start_us), max(b, s.end_us))
    order = sorted(dev)
    # every step with the gap before it: by default all but the first, which has none
    chosen = [k for k in order if (k > order[0] if steps is None else steps[0] <= k <= steps[1])]
    if not chosen:
        have = f"{order[0]}-{order[-1]}" if dev else "none"
        raise UserError(f"explain{': ' + label if label else ''}: no device op in "
                        f"{'steps %d-%d' % steps if steps else 'a step after the first'} "
                        f"(device steps: {have})")
    before = [k for k in order if k < chosen[0]]
    t0 = dev[before[-1]][1] if before else dev[chosen[0]][0]
    t1 = max(dev[k][1] for k in chosen)
    out = Breakdown(label, len(chosen), chosen[0], chosen[-1], t1 - t0)
    # the step gaps (common/formats.py `step_gaps`): the first op of each step after the last
    # of the one before, where it starts after it
    out.gaps_us = sum(max(0.0, dev[b][0] - dev[a][1])
                      for a, b in zip(before[-1:] + chosen, chosen))
    events = []
    for i, s in enumerate(spans):
        a, b = max(s.start_us, t0), min(s.end_us, t1)
        if b > a and s.op not in NOT_WORK:
            events += [(a, 1, i), (b, 0, i)]
    events.sort()
    active = {lane: set() for lane in ("device", *PATH_ORDER)}

    def op(i) -> OpTime:
        key = (spans[i].lane, spans[i].op)
        if key not in out.ops:
            out.ops[key] = OpTime(*key)
        return out.ops[key]

    prev = t0
    for t, kind, i in events:
        if t > prev:
            attribute(prev, t, active, op, out, spans)
            prev = t
        lane = spans[i].lane
        if lane in active:
            (active[lane].add if kind else active[lane].discard)(i)
    if t1 > prev:
        attribute(prev, t1, active, op, out, spans)
    return out


def attribute(a: float, b: float, active: dict, op, out: Breakdown, spans) -> None:
    """The piece [a, b): to the device ops running, or (idle) to the op on the critical path;
    every other CPU op running is hidden for it."""
    d = b - a
    path = []
    if active["device"]:
        for i in active["device"]:
            op(i).busy_us += d / len(active["device"])
    else:
        lane = next((lane for lane in PATH_ORDER if active[lane]), None)
        path = sorted(active[lane]) if lane else []
        for i in path:
            op(i).exposed_us += d / len(path)
        if not path:
            if NO_OP not in out.ops:
                out.ops[NO_OP] = OpTime(*NO_OP)
            out.ops[NO_OP].exposed_us += d
        name = (spans[path[0]].lane, spans[path[0]].op) if path else NO_OP
        if out.pieces and out.pieces[-1][1] == a and out.pieces[-1][2:] == name:
            out.pieces[-1] = (out.pieces[-1][0], b, *name)
        else:
            out.pieces.append((a, b, *name))
    for lane in PATH_ORDER:
        for i in active[lane]:
            if i not in path:
                op(i).hidden_us += d


def idle_events(spans: list) -> list[tuple[float, float, str, str, int]]:
    """(start, end, lane, op, the step it delays) of every device-idle stretch of a timeline,
    by what it is exposed to (for the Chrome trace; whole timeline, one device)."""
    dev_steps = {}
    for s in spans:
        if s.lane == "device":
            dev_steps[s.step] = min(dev_steps.get(s.step, s.start_us), s.start_us)
    if len(dev_steps) < 2:
        return []
    b = breakdown(spans)
    order = sorted((t, k) for k, t in dev_steps.items())
    times = [t for t, _ in order]
    out = []
    for a, e, lane, op in b.pieces:
        j = min(bisect.bisect_left(times, e), len(order) - 1)
        out.append((a, e, lane, op, order[j][1]))
    return out
