"""Where an engine core's steps come from: `LiveSteps` schedules them and draws each step's
acceptance; a `Recording` keeps them as columns, where the run allows, for the runs that take the
same steps to time them again without scheduling (sim/plain_loop.py); `ReplayedSteps` stands for
the scheduler in such a run. Everything that takes time runs the same either way."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from stepgap.common.acceptance import Acceptance
from stepgap.common.formats import TraceRequest
from stepgap.common.scheduler import FINISHED, Scheduler, SchedulerOutput
from stepgap.sim.config import SimConfig
from stepgap.sim.costs import Batch
from stepgap.sim.device_lane import batch_of


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


@dataclass(slots=True)
class Columns:
    """A run's steps as columns: every plan's requests and tokens; each launched step's
    `Batch`, and its requests, tokens, context tokens, drafts, sampling requests, logits and
    attended pairs read from it; each request's chunks (the updates that emitted them, their
    tokens). Once a replay has them: each launched step's draft passes and device keys
    (sim/plain_loop.py). The device prices the steps from their columns where it can
    (`Device.steady_times`).

    Given `fields` instead of batches (each of `Batch`'s fields but the prefills as a column,
    then each step's prefill chunks: sim/paths.py), the batches are made only when one is asked
    for (`batch_list`)."""

    plan_reqs: np.ndarray
    plan_tokens: np.ndarray
    batches: list | None
    chunks: dict   # request id -> ([update] or a range of them, [tokens])
    fields: tuple | None = None
    reqs: np.ndarray | None = None
    tokens: np.ndarray | None = None
    kv: np.ndarray | None = None
    drafts: list[int] | None = None
    sampling: np.ndarray | None = None
    logits: np.ndarray | None = None
    pairs: np.ndarray | None = None
    passes: np.ndarray | None = None
    keys: list | None = None

    def __post_init__(self):
        if self.batches is None:   # Batch's order: tokens, reqs, sampling, logits, drafts, kv,
            f = self.fields        # pairs, ...
            self.tokens, self.reqs, self.sampling, self.logits = f[0], f[1], f[2], f[3]
            self.drafts, self.kv, self.pairs = f[4].tolist(), f[5], f[6]
            return
        b = self.batches
        self.reqs = np.array([x.num_reqs for x in b])
        self.tokens = np.array([x.num_tokens for x in b])
        self.kv = np.array([x.kv_tokens for x in b], np.int64)
        self.drafts = [x.num_drafts for x in b]
        self.sampling = np.array([x.num_sampling for x in b], np.int64)
        self.logits = np.array([x.num_logits for x in b], np.int64)
        self.pairs = np.array([x.attn_pairs for x in b], np.float64)

    def batch_list(self) -> list:
        """Each launched step's `Batch`."""
        if self.batches is None:
            *cols, prefills = self.fields
            rows = zip(*(c.tolist() for c in cols))
            self.batches = [Batch(*row, p) for row, p in zip(rows, prefills)]
            self.fields = None   # (one copy kept)
        return self.batches


PLANNED, LAUNCHED, UPDATED = 1, 2, 4   # what one turn of the engine loop did (`Program`)


@dataclass(slots=True)
class Program:
    """What the engine loop did, turn by turn, in a run whose steps cannot depend on time: each
    turn's `PLANNED | LAUNCHED | UPDATED`, the update at which the client sent each request
    (-1: at 0 s), and the steps as `Columns`. Every run of the same steps takes the same turns,
    since nothing in the loop but the clock depends on time (sim/plain_loop.py)."""

    turns: list[int]
    sent: dict[str, int]
    columns: Columns


class Recording:
    """The steps of one run, kept so that a run that differs from it only in how long things
    take (TIME_ONLY settings, the device's costs, zero-bubble for async: `steps_key`) times
    them again instead of scheduling and drawing acceptance again: the same results, in a
    fraction of the time (docs/reports/2026-12-07-simulator-speed.md).

    Only where the steps cannot depend on time and the plain loop runs them (sim/plain_loop.py
    `runs_plainly`): one thread drives the engine core, so the order of everything it does is
    fixed by the loop, and the client's requests come in at fixed points of it (all at once,
    or each as another finishes). Pass an empty one to `simulate` to fill it (where the run
    allows), then the same one to the runs to replay it; a run that differs in anything else is
    simulated in full, as is one given a recording its first run could not fill."""

    def __init__(self, requests: list[TraceRequest] | None = None):
        self.key: str | None = None   # (None: a run's own, which nothing replays)
        self.requests = requests
        self.program: Program | None = None   # the steps, once a run has them all
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
        self.program, self.device_ops = None, {}
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
    accepted tokens as vLLM's SpecDecodingStats do."""

    def __init__(self, sched: Scheduler, acc: Acceptance, k: int):
        self.sched, self.acc = sched, acc
        self.accepted_hist = [0] * (k + 1)   # decode steps by accepted count
        self.num_draft_tokens = 0
        self.tokens = [[0] * (1 + n) for n in range(k + 1)]

    def plan(self) -> tuple:
        """The next step: the scheduler's output and its totals (None: nothing scheduled)."""
        out = self.sched.schedule()
        return out, (batch_of(out) if out.scheduled else None)

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
        return self.sched.update_from_output(out, sampled)


class ReplayedSteps:
    """A `Recording`'s steps, timed again from its columns (sim/plain_loop.py `timed`), with the
    recorded run's counters for the result; nothing is scheduled."""

    def __init__(self, recording: Recording):
        totals = recording.totals
        self.recording = recording
        self.sched = ReplayedScheduler(totals)
        self.accepted_hist = list(totals.accepted_hist)
        self.num_draft_tokens = totals.num_draft_tokens

    def plan(self):
        raise RuntimeError("a replayed run is timed from its recording's columns, in the plain "
                           "loop (sim/plain_loop.py)")

    outcome = plan


class ReplayedScheduler:
    """What a replayed run's result reads of its scheduler: the recorded run's counters."""

    def __init__(self, totals: Totals):
        self.num_preemptions = totals.num_preemptions
        self.prefix_cache = totals.prefix_cache

    def prefix_cache_counts(self) -> dict | None:
        return self.prefix_cache
