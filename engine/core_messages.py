"""What `stepgap serve`'s front end (engine/api_server.py) and engine core (engine/core_proc.py)
say to each other over their two pipes: one class per message, pickled as it is sent.

To the engine core: `AddRequest`, `Abort`, `DumpSpans`, `Shutdown`.
From it: `Ready` once its worker is built; `StepOutputs` after every step; `Idle` when it runs
out of work; `Rejected` for a request it cannot take; `SpansDump` for a `DumpSpans`; `Failed`
when it cannot start or dies (a dead worker); `Bye` when it stops as told. `EngineStats`, the
scheduler's state after a step, travels with `StepOutputs` and `Idle` and feeds /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

from stepgap.common.formats import Span, SpecStats


# -- to the engine core ------------------------------------------------------------------------

@dataclass(slots=True)
class AddRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    eos_token_id: int | None     # the token it stops at (None: ignore_eos)


@dataclass(slots=True)
class Abort:
    request_id: str              # the client went away: free its blocks before the next step


@dataclass(slots=True)
class DumpSpans:
    token: int                   # the spans recorded so far, then forget them


@dataclass(slots=True)
class Shutdown:
    pass


ToCore = Union[AddRequest, Abort, DumpSpans, Shutdown]


# -- from the engine core ----------------------------------------------------------------------

class SpecCounts(NamedTuple):
    """The engine's cumulative acceptance counts (`SpecStats`'s, frozen for the pipe)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @classmethod
    def of(cls, spec: SpecStats) -> "SpecCounts":
        return cls(spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens,
                   tuple(spec.accepted_per_pos))

    def since(self, then: "SpecCounts", k: int) -> SpecStats:
        """What was counted between `then` and these counts."""
        out = SpecStats(k)
        out.num_drafts = self.num_drafts - then.num_drafts
        out.num_draft_tokens = self.num_draft_tokens - then.num_draft_tokens
        out.num_accepted_tokens = self.num_accepted_tokens - then.num_accepted_tokens
        out.accepted_per_pos = [a - b for a, b in zip(self.accepted_per_pos,
                                                      then.accepted_per_pos)]
        return out


@dataclass(slots=True)
class EngineStats:
    """The scheduler's state after a step; the counters are cumulative."""

    running: int
    waiting: int
    free_blocks: int
    preemptions: int
    spec: SpecCounts
    prefix_cache_queries: int    # tokens
    prefix_cache_hits: int       # tokens


class Chunk(NamedTuple):
    """One request's new tokens of a step."""

    request_id: str
    new_ids: list[int]
    finished: bool


@dataclass(slots=True)
class Ready:
    info: dict                   # the worker's info, the processes' pids, the KV blocks


@dataclass(slots=True)
class StepOutputs:
    step: int
    chunks: list[Chunk]
    gap_us: float | None         # the device idle before the step (None after a wait for work)
    stats: EngineStats


@dataclass(slots=True)
class Idle:
    stats: EngineStats           # nothing in flight, nothing to schedule


@dataclass(slots=True)
class Rejected:
    request_id: str
    message: str


@dataclass(slots=True)
class SpansDump:
    token: int                   # the DumpSpans this answers
    spans: list[Span]


@dataclass(slots=True)
class Failed:
    message: str                 # bad settings found while starting, or how it died


@dataclass(slots=True)
class Bye:
    pass


FromCore = Union[Ready, StepOutputs, Idle, Rejected, SpansDump, Failed, Bye]
