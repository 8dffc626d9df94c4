"""The vLLM V1 scheduler: continuous batching with speculative tokens, shared by both halves.

The simulator and the engine run this same code, so that they batch, chunk, admit and preempt
identically and differ only in how time passes. It follows vLLM V1 (`vllm/v1/core/sched/`):

- No prefill or decode phase. Each request has `num_computed_tokens` and a target: its known
  tokens plus draft tokens (plus, under async scheduling, placeholders for tokens in flight).
  Each step gives every running request the tokens it lacks, then admits waiting requests FCFS,
  within `max_num_seqs` and a `max_num_batched_tokens` budget that chunks long prefills.
- KV blocks of `block_size` tokens from a fixed pool, allocated with `k` lookahead slots for the
  drafter. When the pool runs dry the newest running request is preempted by recompute: its
  blocks are freed and it goes back to the head of the waiting queue.
- Async scheduling (`async_scheduling=True`, for the `async` and `zero-bubble` modes): step N+1
  is scheduled before step N's output is known. A decoding request counts 1 + k placeholder
  output tokens and k placeholder drafts, optimistically; when step N's output arrives, the
  rejected drafts are taken back from both `num_computed_tokens` and the placeholders. A request
  is skipped only when its in-flight step surely finishes it (even if every draft is rejected),
  so one extra step may be scheduled for a request that has in fact finished; that step's tokens
  are discarded, never emitted.
- A request finishes at `max_tokens`, at its `eos_token_id` when it has one (a served request
  without `ignore_eos`; traces have none), or when it is aborted (`abort_request`: a served
  client went away). Either way its blocks return to the pool at once and the worker hears of
  it through the next step's `finished`; tokens of its steps still in flight are discarded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from stepgap.common.errors import UserError
from stepgap.common.limits import is_int

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0  # async: tokens of in-flight steps, not yet on the host
    num_spec_tokens: int = 0          # draft tokens waiting to be verified (placeholders if async)
    block_ids: list[int] = field(default_factory=list)
    status: str = WAITING
    num_preemptions: int = 0
    eos_token_id: int | None = None   # stop at this token (None: generate max_tokens)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_ids(self) -> list[int]:
        """Prompt and output tokens: what a recompute after preemption runs over."""
        return (self.prompt_token_ids or []) + self.output_token_ids


@dataclass(slots=True)
class Scheduled:
    """One request's share of a step."""

    request: Request
    num_new_tokens: int
    num_spec: int      # draft tokens among num_new_tokens, verified this step
    start: int         # num_computed_tokens before this step (optimistic under async)
    samples: bool      # the chunk reaches the end of the known tokens: it yields 1 + accepted
    fresh: bool        # the worker holds no state for it: new, or resumed after preemption


@dataclass(slots=True)
class SchedulerOutput:
    step: int
    scheduled: list[Scheduled]
    preempted: list[str]   # preempted in this schedule(): the worker drops their state
    finished: list[str]    # finished since the previous schedule(): likewise
    num_batched_tokens: int

    @property
    def num_reqs(self) -> int:
        return len(self.scheduled)


@dataclass(slots=True)
class SchedulerConfig:
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    num_spec_tokens: int = 0        # k
    async_scheduling: bool = False
    max_position_embeddings: int | None = None   # the target's context (its config.json's)

    @classmethod
    def for_run(cls, mode: str, k: int, num_blocks: int, block_size: int, max_num_seqs: int,
                max_num_batched_tokens: int, max_model_len: int,
                max_position_embeddings: int | None = None) -> SchedulerConfig:
        """One run's scheduler, as both halves build it: async scheduling (placeholders, a
        step ahead) in the async modes, async and zero-bubble."""
        return cls(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                   max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                   num_spec_tokens=k, async_scheduling=mode != "sync",
                   max_position_embeddings=max_position_embeddings)

    def __post_init__(self):
        for f in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                  "max_model_len"):
            v = getattr(self, f)
            if not is_int(v) or v < 1:
                raise UserError(f"scheduler: {f} must be an integer >= 1, got {v!r}")
        if not is_int(self.num_spec_tokens) or self.num_spec_tokens < 0:
            raise UserError(f"scheduler: k (num_spec_tokens) must be an integer >= 0, "
                            f"got {self.num_spec_tokens!r}")
        if self.max_num_batched_tokens < 1 + self.num_spec_tokens:
            raise UserError(f"scheduler: max_num_batched_tokens ({self.max_num_batched_tokens}) "
                            f"must hold at least 1 + k = {1 + self.num_spec_tokens} tokens")

    def check_fits(self, request_id: str, prompt_len: int, output_len: int) -> None:
        """Reject a request this engine could never serve, naming it."""
        total = prompt_len + output_len
        # The last output token is never fed: positions 0..total-2 are.
        if self.max_position_embeddings is not None and total - 1 > self.max_position_embeddings:
            raise UserError(f"request {request_id!r}: prompt_len + output_len = {total} takes "
                            f"positions 0..{total - 2}, past the target's context "
                            f"(max_position_embeddings {self.max_position_embeddings} in its "
                            "config)")
        if total > self.max_model_len:
            raise UserError(f"request {request_id!r}: prompt_len + output_len = {total} "
                            f"exceeds --max-model-len {self.max_model_len}")
        need = cdiv(total + self.num_spec_tokens, self.block_size)
        if need > self.num_blocks:
            raise UserError(f"request {request_id!r} needs {need} KV blocks but the cache "
                            f"holds {self.num_blocks}")


class BlockPool:
    """A free list of KV block ids, allocated from the front, freed to the back.

    The ids never handed out yet are the front of the list, held as a count rather than
    listed: a cache sized from a large device's memory holds tens of millions of blocks."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.fresh = 0                 # ids fresh..num_blocks-1 were never allocated
        self.free_ids: deque[int] = deque()   # freed ids, behind the fresh ones

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.fresh + len(self.free_ids)

    def allocate(self, n: int) -> list[int]:
        new = min(n, self.num_blocks - self.fresh)
        ids = list(range(self.fresh, self.fresh + new))
        self.fresh += new
        return ids + [self.free_ids.popleft() for _ in range(n - new)]

    def free(self, ids: list[int]) -> None:
        self.free_ids.extend(ids)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.k = cfg.num_spec_tokens
        self.pool = BlockPool(cfg.num_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step = 0
        self._finished_ids: list[str] = []
        self.num_preemptions = 0

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        self.cfg.check_fits(req.request_id, req.num_prompt_tokens, req.max_tokens)
        if req.request_id in self.requests:
            raise UserError(f"request id {req.request_id!r} is already in the scheduler")
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort_request(self, request_id: str) -> bool:
        """Finish a request early, wherever it is (waiting, running, or with a step in
        flight). False if the scheduler does not hold it (it finished already)."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._finish(req)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    # -- schedule ---------------------------------------------------------------------------

    def _allocate(self, req: Request, num_new: int, lookahead: int) -> bool:
        bs = self.cfg.block_size
        end = req.num_computed_tokens + num_new + lookahead
        if end <= len(req.block_ids) * bs:
            return True  # the common decode case: the blocks it holds suffice
        need = cdiv(end, bs) - len(req.block_ids)
        if need > self.pool.num_free:
            return False
        req.block_ids += self.pool.allocate(need)
        return True

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_spec_tokens = 0
        req.status = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _take(self, req: Request, num_new: int, fresh: bool) -> Scheduled:
        """Count a scheduled chunk into the request's state (vLLM's _update_after_schedule)."""
        start = req.num_computed_tokens
        end = start + num_new
        known = req.num_prompt_tokens + len(req.output_token_ids) + req.num_output_placeholders
        num_spec = 0
        if end > known:   # the chunk reaches past the known tokens: drafts are verified
            num_spec = req.num_spec_tokens if req.num_spec_tokens < end - known else end - known
        samples = end >= known
        req.num_computed_tokens = end
        if self.cfg.async_scheduling and samples:
            req.num_output_placeholders += 1 + num_spec
            req.num_spec_tokens = self.k
        else:
            req.num_spec_tokens = 0
        return Scheduled(req, num_new, num_spec, start, samples, fresh)

    def schedule(self) -> SchedulerOutput:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        scheduled: list[Scheduled] = []
        preempted: list[str] = []

        # Running requests first, in order. This loop runs for every running request every
        # step (the simulator's hot path): conditionals instead of min(), and the blocks a
        # request holds checked here before _allocate is called.
        running, k, last = self.running, self.k, cfg.max_model_len - 1
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            i += 1
            c, p = req.num_computed_tokens, req.num_output_placeholders
            if p and c + 2 - p >= req.num_prompt_tokens + req.max_tokens:
                continue  # the in-flight step finishes it even if every draft is rejected
            num_new = req.num_prompt_tokens + len(req.output_token_ids) + req.num_spec_tokens \
                + p - c
            if num_new > budget:
                num_new = budget
            if num_new > last - c:
                num_new = last - c
            if num_new <= 0:
                continue
            if c + num_new + k > len(req.block_ids) * cfg.block_size:
                while not self._allocate(req, num_new, k):
                    victim = running.pop()  # FCFS: the newest request goes first
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                    if victim is req:
                        break
                if req.status != RUNNING:
                    break
            scheduled.append(self._take(req, num_new, fresh=False))
            budget -= num_new

        # Then waiting requests, FCFS, unless this step had to preempt.
        while not preempted and self.waiting and budget > 0 \
                and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            if req.num_output_placeholders:
                break  # preempted with a step in flight: resume once its tokens have landed
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            lookahead = self.k if num_new == req.num_tokens - req.num_computed_tokens else 0
            if not self._allocate(req, num_new, lookahead):
                break  # admission control: wait for blocks rather than preempt for a newcomer
            self.waiting.popleft()
            fresh = req.num_computed_tokens == 0
            req.status = RUNNING
            self.running.append(req)
            scheduled.append(self._take(req, num_new, fresh=fresh))
            budget -= num_new

        finished = []
        if scheduled:  # an empty step is not launched: its news waits for the next one
            finished, self._finished_ids = self._finished_ids, []
        out = SchedulerOutput(self.step, scheduled, preempted, finished,
                              cfg.max_num_batched_tokens - budget)
        self.step += 1
        return out

    # -- update -----------------------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput,
                           sampled: dict[str, list[int]]) -> list[tuple[Request, list[int], bool]]:
        """Apply one step's sampled tokens (1 + accepted per sampling request).

        Returns the chunks to stream, as (request, new token ids, finished). Tokens of a request
        that finished before this step's output arrived are discarded.
        """
        async_ = self.cfg.async_scheduling
        emitted = []
        for s in out.scheduled:
            req = s.request
            if req.status == FINISHED or not s.samples:
                continue
            ids = sampled[req.request_id]
            n = len(ids)
            if s.num_spec:
                rejected = s.num_spec - (n - 1)
                if req.status == RUNNING:  # a preempted request was already reset to 0
                    req.num_computed_tokens -= rejected
                if async_:
                    req.num_output_placeholders -= rejected
            room = req.max_tokens - len(req.output_token_ids)
            done = n >= room
            new = ids[:room] if n > room else ids   # (no copy in the common case)
            if req.eos_token_id is not None and req.eos_token_id in new:
                new = new[:new.index(req.eos_token_id) + 1]
                done = True
            req.output_token_ids += new
            if async_:
                req.num_output_placeholders -= n
            if done:
                self._finish(req)
            elif not async_ and req.status == RUNNING:
                req.num_spec_tokens = self.k  # the worker drafted k tokens after sampling
            emitted.append((req, new, done))
        return emitted

    def _finish(self, req: Request) -> None:
        if req.status == RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = FINISHED
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_output_placeholders = 0
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)
