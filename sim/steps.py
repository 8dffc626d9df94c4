"""Where an engine core's steps come from: `LiveSteps` schedules them and draws each step's
acceptance (keeping them in a `Recording` where asked); `ReplayedSteps` reads a recording's back.
Everything that takes time runs the same either way (sim/core.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from stepgap.common.acceptance import Acceptance
from stepgap.common.formats import TraceRequest
from stepgap.common.scheduler import FINISHED, Request, Scheduler, SchedulerOutput
from stepgap.sim.config import SimConfig
from stepgap.sim.costs import Batch
from stepgap.sim.device_lane import batch_of


@dataclass(slots=True)
class Planned:
    """A recorded step, as the engine loop reads its SchedulerOutput (`Recording`)."""

    step: int
    scheduled: bool
    num_reqs: int
    num_batched_tokens: int


# Settings that change how long things take, or what a result holds, never which steps run:
# runs that differ in these alone take the same steps (`Recording`; a band's CPU and device ends)
TIME_ONLY = ("cpu_scale", "speed", "device_scale", "cpu_costs", "launch_latency_us", "wake_us",
             "ipc_us", "timeline", "detailed", "drafter_host_scale")


def steps_key(settings: dict) -> str:
    """What a run's steps depend on, as a key: its settings but the TIME_ONLY ones, zero-bubble
    read as async. Zero-bubble schedules as async does (a step ahead, the same placeholders)
    and differs from it only in how long its steps take (it does not wait for the accepted
    counts; a device fixup applies them), so it takes async's steps."""
    kept = {k: v for k, v in settings.items() if k not in TIME_ONLY}
    if kept.get("mode") == "zero-bubble":
        kept["mode"] = "async"
    return json.dumps(kept, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class Totals:
    """A recorded run's counters, which a replay of it reports as its own."""

    num_preemptions: int
    prefix_cache: dict | None
    accepted_hist: list[int]
    num_draft_tokens: int


class Recording:
    """The steps of one run, kept so that a run that differs from it only in how long things
    take (TIME_ONLY settings, the device's costs, zero-bubble for async: `steps_key`) replays
    them instead of scheduling and drawing acceptance again: the same results, about half the
    time (docs/reports/2026-12-03-advise-speed.md).

    Only where the steps cannot depend on time (`same_steps`): one thread drives the engine
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
        self.totals: Totals | None = None   # the counters the result reads, once complete
        self.device_ops: dict = {}   # its runs' Device.ops, where the costs come from the config

    @staticmethod
    def key_of(cfg: SimConfig) -> str:
        return steps_key(cfg.to_dict())

    def start(self, cfg: SimConfig, requests: list[TraceRequest]) -> Recording | None:
        """This recording, to be filled by a run of `cfg` (None: it is filled already)."""
        if self.totals is not None:
            return None
        self.key, self.requests = self.key_of(cfg), requests
        # (what a run that failed part way left, maybe of another run, dropped)
        self.plans, self.outcomes, self.device_ops = [], [], {}
        return self

    def close(self, steps: LiveSteps) -> None:
        sched = steps.sched
        self.totals = Totals(sched.num_preemptions, sched.prefix_cache_counts(),
                             list(steps.accepted_hist), steps.num_draft_tokens)

    def replays(self, cfg: SimConfig, requests: list[TraceRequest]) -> bool:
        """Whether a run of `cfg` over `requests` takes the recorded steps."""
        return self.totals is not None and self.key == self.key_of(cfg) \
            and (self.requests is requests or self.requests == requests)


class LiveSteps:
    """The steps as the scheduler plans them, and the tokens each gives: 1 + accepted for each
    request that samples (the acceptance's draws), applied by the scheduler. Counts the
    accepted tokens as vLLM's SpecDecodingStats do; keeps every step in `recording` if given."""

    def __init__(self, sched: Scheduler, acc: Acceptance, k: int,
                 recording: Recording | None = None):
        self.sched, self.acc, self.recording = sched, acc, recording
        self.accepted_hist = [0] * (k + 1)   # decode steps by accepted count
        self.num_draft_tokens = 0
        self.tokens = [[0] * (1 + n) for n in range(k + 1)]

    def plan(self) -> tuple:
        """The next step: the scheduler's output and its totals (None: nothing scheduled)."""
        out = self.sched.schedule()
        batch = batch_of(out) if out.scheduled else None
        if self.recording is not None:
            self.recording.plans.append((Planned(out.step, bool(out.scheduled), out.num_reqs,
                                                 out.num_batched_tokens), batch))
        return out, batch

    def outcome(self, out: SchedulerOutput) -> list:
        """The step's chunks to stream, once the scheduler has applied its tokens."""
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

    def close(self) -> None:
        if self.recording is not None:
            self.recording.close(self)


class ReplayedSteps:
    """A `Recording`'s steps: the scheduler's outputs and the tokens each step gave are read
    back, not computed again."""

    def __init__(self, recording: Recording):
        self.sched = ReplayedScheduler(recording.totals)
        self.plans, self.outcomes = iter(recording.plans), iter(recording.outcomes)
        self.accepted_hist = list(recording.totals.accepted_hist)
        self.num_draft_tokens = recording.totals.num_draft_tokens

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

    def close(self) -> None:
        if next(self.plans, None) is not None or any(self.outcomes):   # (see outcome)
            raise RuntimeError("the replayed run ended before the recorded steps did")


class ReplayedScheduler:
    """What a replayed run's engine asks of its scheduler besides the steps: whether any
    request is unfinished, and the recorded run's counters."""

    def __init__(self, totals: Totals):
        self.unfinished = 0
        self.num_preemptions = totals.num_preemptions
        self.prefix_cache = totals.prefix_cache

    def add_request(self, req: Request) -> None:
        self.unfinished += 1

    def has_unfinished(self) -> bool:
        return self.unfinished > 0

    def prefix_cache_counts(self) -> dict | None:
        return self.prefix_cache
