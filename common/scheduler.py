"""The vLLM V1 scheduler: continuous batching with speculative tokens, shared by both halves.

The simulator and the engine run this same code, so that they batch, chunk, admit and preempt
identically and differ only in how time passes. It follows vLLM V1 (`vllm/v1/core/sched/`):

- No prefill or decode phase. Each request has `num_computed_tokens` and a target: its known
  tokens plus draft tokens (plus, under async scheduling, placeholders for tokens in flight).
  Each step gives every running request the tokens it lacks, then admits waiting requests FCFS,
  within `max_num_seqs` and a `max_num_batched_tokens` budget that chunks long prefills.
- KV blocks of `block_size` tokens from a fixed pool, allocated with `k` lookahead slots for the
  drafter. When the pool runs dry the newest running request is preempted by recompute: its
  blocks are freed and it goes back to the head of the waiting queue. A waiting request is
  admitted only when the blocks of its whole sequence are free (vLLM's
  `scheduler_reserve_full_isl`, on by default), not just those of its first chunk.
- Async scheduling (`async_scheduling=True`, for the `async` and `zero-bubble` modes): step N+1
  is scheduled before step N's output is known. A decoding request counts 1 + k placeholder
  output tokens and k placeholder drafts, optimistically; when step N's output arrives, the
  rejected drafts are taken back from both `num_computed_tokens` and the placeholders. A request
  is skipped only when its in-flight step surely finishes it (even if every draft is rejected),
  so one extra step may be scheduled for a request that has in fact finished; that step's tokens
  are discarded, never emitted.
- Automatic prefix caching (`enable_prefix_caching`, vLLM V1's `kv_cache_manager` and
  `block_pool`): a full block is known by a hash chained over its tokens and every block before
  it (a request without token ids: by its id and the block's place, so it can only meet its own
  blocks again, after a preemption). A request taken from the waiting queue reuses the longest
  run of its leading blocks still cached (at least its last token is recomputed); blocks no
  request holds stay cached in a free queue, least recently freed first (a request's blocks
  are freed tail first, so its prefix outlives its tail), and are evicted only when the pool
  hands them out again. Queried and hit tokens are counted as vLLM's prefix-cache metrics.
- A request finishes at `max_tokens`, at its `eos_token_id` when it has one (a served request
  without `ignore_eos`; traces have none), or when it is aborted (`abort_request`: a served
  client went away). Either way its blocks return to the pool at once and the worker hears of
  it through the next step's `finished`; tokens of its steps still in flight are discarded.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from stepgap.common.errors import UserError
from stepgap.common.limits import is_int

# The scheduler's defaults, declared here once (RunSpec's options, both halves' configs):
BLOCK_SIZE = 16                 # tokens per KV block, as vLLM's
MAX_NUM_SEQS = 256              # requests in one step, as vLLM's
MAX_NUM_BATCHED_TOKENS = 8192   # the token budget of one step, as vLLM's for online serving
MAX_MODEL_LEN = 2048            # prompt + output (vLLM's is the model's context; the seed's)

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
    block_keys: list = field(default_factory=list)   # prefix caching: its full blocks' hashes
    num_cached_blocks: int = 0        # of block_ids, how many the cache knows

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

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
class EngineCoreOutput:
    """One request's chunk of a step's output, as `update_from_output` emits it (vLLM's
    EngineCoreOutput): its new tokens, and whether the request finished with them."""

    request: Request
    new_token_ids: list[int]
    finished: bool


@dataclass(slots=True)
class SchedulerConfig:
    num_blocks: int
    block_size: int = BLOCK_SIZE
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    max_model_len: int = MAX_MODEL_LEN
    num_spec_tokens: int = 0        # k
    async_scheduling: bool = False
    max_position_embeddings: int | None = None   # the target's context (its config.json's)
    # vLLM's scheduler_reserve_full_isl (on by default): admit a waiting request only if the
    # KV blocks of its whole sequence are free, not just those of its first chunk
    scheduler_reserve_full_isl: bool = True
    enable_prefix_caching: bool = True   # vLLM's default

    @classmethod
    def for_run(cls, mode: str, k: int, num_blocks: int, block_size: int, max_num_seqs: int,
                max_num_batched_tokens: int, max_model_len: int,
                max_position_embeddings: int | None = None,
                scheduler_reserve_full_isl: bool = True,
                enable_prefix_caching: bool = True) -> SchedulerConfig:
        """One run's scheduler, as both halves build it: async scheduling (placeholders, a
        step ahead) in the async modes, async and zero-bubble."""
        return cls(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                   max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                   num_spec_tokens=k, async_scheduling=mode != "sync",
                   max_position_embeddings=max_position_embeddings,
                   scheduler_reserve_full_isl=scheduler_reserve_full_isl,
                   enable_prefix_caching=enable_prefix_caching)

    def __post_init__(self):
        # (the limits come from a SimConfig or an EngineArgs, which checked them:
        # common/run_spec.py; the cache's size and a run's k are the run's own)
        if not is_int(self.num_blocks) or self.num_blocks < 1:
            raise UserError(f"scheduler: num_blocks must be an integer >= 1, "
                            f"got {self.num_blocks!r}")
        if not is_int(self.num_spec_tokens) or self.num_spec_tokens < 0:
            raise UserError(f"scheduler: k (num_spec_tokens) must be an integer >= 0, "
                            f"got {self.num_spec_tokens!r}")
        if self.max_num_batched_tokens < 1 + self.num_spec_tokens:
            raise UserError(f"scheduler: max_num_batched_tokens ({self.max_num_batched_tokens}) "
                            f"must hold at least 1 + k = {1 + self.num_spec_tokens} tokens")
        ctx = self.max_position_embeddings   # the model's context (a run may stop short)
        if self.enable_prefix_caching and is_int(ctx) and ctx > 0 and ctx % self.block_size:
            raise UserError(f"--block-size {self.block_size} does not divide the model's "
                            f"context (max_position_embeddings {ctx}): with prefix caching a "
                            "context is cached in whole blocks (give a block size that divides "
                            "it, or --no-enable-prefix-caching)")

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
                            f"exceeds --max-model-len {self.max_model_len} (give a larger one, "
                            "as the vllm serve line does; vLLM's default is the model's "
                            "context)")
        need = cdiv(total + self.num_spec_tokens, self.block_size)
        if need > self.num_blocks:
            raise UserError(f"request {request_id!r} needs {need} KV blocks ({prompt_len} prompt "
                            f"and {output_len} output tokens, {self.block_size} a block) but "
                            f"the cache holds {self.num_blocks}")


class BlockPool:
    """A free list of KV block ids, allocated from the front, freed to the back.

    The ids never handed out yet are the front of the list, held as a count rather than
    listed: a cache sized from a large device's memory holds tens of millions of blocks.

    With `caching`, a freed block keeps its hash (`cached`, `key_of`) until it is handed out
    again, a block may be held by several requests at once (`refs`), and a cached free block
    that a request reuses leaves the free list (`touch`)."""

    def __init__(self, num_blocks: int, caching: bool = False):
        self.num_blocks = num_blocks
        self.fresh = 0                 # ids fresh..num_blocks-1 were never allocated
        self.caching = caching
        # freed ids, behind the fresh ones (in order: an ordered dict so that a reused cached
        # block can leave from the middle)
        self.free_ids = OrderedDict() if caching else deque()
        self.cached: dict = {}         # block hash -> block id
        self.key_of: dict[int, object] = {}
        self.refs: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.fresh + len(self.free_ids)

    def allocate(self, n: int) -> list[int]:
        fresh = self.fresh
        new = n if n < self.num_blocks - fresh else self.num_blocks - fresh
        ids = list(range(fresh, fresh + new)) if new != 1 else [fresh]
        self.fresh = fresh + new
        if not self.caching:
            return ids + [self.free_ids.popleft() for _ in range(n - new)] if n > new else ids
        for _ in range(n - new):
            bid = self.free_ids.popitem(last=False)[0]
            key = self.key_of.pop(bid, None)
            if key is not None:   # evicted: handed out again
                del self.cached[key]
            ids.append(bid)
        refs = self.refs
        for bid in ids:   # (a decode step's one new block: no dict built to update from)
            refs[bid] = 1
        return ids

    def free(self, ids: list[int]) -> None:
        if not self.caching:
            self.free_ids.extend(ids)
            return
        refs, free_ids = self.refs, self.free_ids
        for bid in reversed(ids):   # the tail first: a request's prefix is evicted last
            n = refs.pop(bid) - 1
            if n:
                refs[bid] = n
            else:
                free_ids[bid] = None

    def touch(self, ids: list[int]) -> None:
        """Another holder for each (cached) block; a free one leaves the free list."""
        for bid in ids:
            if bid in self.refs:
                self.refs[bid] += 1
            else:
                del self.free_ids[bid]
                self.refs[bid] = 1


class Scheduler:
    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.k = cfg.num_spec_tokens
        self.pool = BlockPool(cfg.num_blocks, cfg.enable_prefix_caching)
        self.caching = cfg.enable_prefix_caching
        # vLLM's prefix-cache counters: tokens looked up and found, for new requests and for
        # preempted ones taken back
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        self.preempted_queries = self.preempted_hits = 0
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

    def prefix_cache_counts(self) -> dict | None:
        """vLLM's prefix-cache counters (tokens), as a run's result reports them in both
        halves; None with caching off."""
        if not self.caching:
            return None
        return {"queries": self.prefix_cache_queries, "hits": self.prefix_cache_hits,
                "preempted_queries": self.preempted_queries,
                "preempted_hits": self.preempted_hits}

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

    # -- prefix caching -----------------------------------------------------------------------

    def _keys(self, req: Request, n: int) -> list:
        """The hashes of the request's first n full blocks (extended as its tokens grow)."""
        keys, bs = req.block_keys, self.cfg.block_size
        if req.prompt_token_ids is None:
            while len(keys) < n:
                keys.append((req.request_id, len(keys)))
            return keys
        tokens = None
        while len(keys) < n:
            if tokens is None:
                tokens = req.prompt_token_ids + req.output_token_ids
            i = len(keys)
            keys.append(hash((keys[-1] if keys else None, tuple(tokens[i * bs:(i + 1) * bs]))))
        return keys

    def _cache_blocks(self, req: Request, full: int) -> None:
        """Make the request's first `full` blocks, filled by known tokens, findable (vLLM
        caches at schedule time; `_take` calls this when it has new full blocks)."""
        pool, keys = self.pool, self._keys(req, full)
        for i in range(req.num_cached_blocks, full):
            bid = req.block_ids[i]
            if keys[i] not in pool.cached and bid not in pool.key_of:
                pool.cached[keys[i]] = bid
                pool.key_of[bid] = keys[i]
        req.num_cached_blocks = full

    def _cache_hit(self, req: Request) -> list[int]:
        """The cached blocks of the request's longest cached prefix, at most num_tokens - 1
        tokens (its last token is always computed, for its logits)."""
        if req.prompt_token_ids is None and not req.num_preemptions:
            return []   # its blocks are known by its id: none was cached before it first ran
        most = (req.num_tokens - 1) // self.cfg.block_size
        cached, hit = self.pool.cached, []
        for key in self._keys(req, most)[:most]:
            bid = cached.get(key)
            if bid is None:
                break
            hit.append(bid)
        return hit

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_cached_blocks = 0
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
        tokens = req.num_prompt_tokens + len(req.output_token_ids)
        known = tokens + req.num_output_placeholders
        num_spec = 0
        if end > known:   # the chunk reaches past the known tokens: drafts are verified
            num_spec = req.num_spec_tokens if req.num_spec_tokens < end - known else end - known
        samples = end >= known
        req.num_computed_tokens = end
        if self.caching:   # the blocks now full of known tokens (inline: every request, step)
            full = (end if end < tokens else tokens) // self.cfg.block_size
            if full > req.num_cached_blocks:
                self._cache_blocks(req, full)
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
        # request holds checked here before _allocate is called. sim/steady.py does its
        # arithmetic (and _take's, update_from_output's) for a turn in which every running
        # request decodes and nobody waits: a change here is a change there
        # (tests/test_steady.py compares the two).
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
            fresh = req.num_computed_tokens == 0
            hit = self._cache_hit(req) if self.caching and fresh else []
            computed = req.num_computed_tokens + len(hit) * cfg.block_size
            num_new = min(req.num_tokens - computed, budget)
            lookahead = self.k if num_new == req.num_tokens - computed else 0
            # cached blocks no request holds leave the free list when reused: they count
            taken = sum(1 for b in hit if b not in self.pool.refs) if hit else 0
            held = len(req.block_ids) + len(hit)
            if cfg.scheduler_reserve_full_isl \
                    and cdiv(req.num_tokens, cfg.block_size) - held + taken > self.pool.num_free:
                break  # its whole sequence would not fit: do not start what must thrash
            if hit:
                if cdiv(computed + num_new + lookahead, cfg.block_size) - held + taken \
                        > self.pool.num_free:
                    break
                self.pool.touch(hit)
                req.block_ids = list(hit)
                req.num_computed_tokens = computed
                req.num_cached_blocks = len(hit)
            if not self._allocate(req, num_new, lookahead):
                break  # admission control: wait for blocks rather than preempt for a newcomer
            if self.caching and fresh:
                if req.num_preemptions:
                    self.preempted_queries += req.num_tokens
                    self.preempted_hits += len(hit) * cfg.block_size
                else:
                    self.prefix_cache_queries += req.num_tokens
                    self.prefix_cache_hits += len(hit) * cfg.block_size
            self.waiting.popleft()
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
                           sampled: dict[str, list[int]]) -> list[EngineCoreOutput]:
        """Apply one step's sampled tokens (1 + accepted per sampling request).

        Returns the chunks to stream, one per request that sampled. Tokens of a request that
        finished before this step's output arrived are discarded.
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
            emitted.append(EngineCoreOutput(req, new, done))
        return emitted

    def _finish(self, req: Request) -> None:
        if req.status == RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = FINISHED
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_cached_blocks = 0
        req.num_output_placeholders = 0
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)
