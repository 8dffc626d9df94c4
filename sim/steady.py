"""A steady turn of the engine loop, taken without the scheduler's objects (issue 54).

Most turns of a run at low concurrency change nothing but the numbers: every running request
decodes (1 + k tokens, k drafts verified), nobody waits, the pool has the blocks (a request
whose update finishes it leaves as `_finish` lets it, and the client sends its next). Scheduling such a turn through `Scheduler.schedule` and `update_from_output` builds a
`Scheduled` per request, a `SchedulerOutput`, a dict of sampled tokens, an `EngineCoreOutput`
per chunk and a `Batch` from them, for the same arithmetic on each request every time.
`SteadyTurns.take` does that arithmetic on the requests themselves, in the scheduler's order
(common/scheduler.py's running loop, `_allocate`, `_take`, `update_from_output`: the same blocks
from the pool, the same prefix-cache entries, the same draws from each request's stream), and
writes the step to the record pass's columns (sim/plain_loop.py `record`) as `batch_of` sums it.

It takes a turn only where it can tell before touching anything that the scheduler would
decide so: else the turn goes through the scheduler, which then finds every request as it would
have left it. Under async scheduling the step a steady turn launches stays in flight; the
scheduler's own path reads it as the `SchedulerOutput` it would have built (`InFlight.output`).
`tests/test_steady.py` holds the scheduler's state and the results to its own turns',
`bench/sim_results.py` the results to those before steady turns.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepgap.common.scheduler import RUNNING, Scheduled, Scheduler, SchedulerOutput, cdiv
from stepgap.sim.cluster import Client
from stepgap.sim.costs import Batch
from stepgap.sim.steps import LiveSteps


@dataclass(slots=True)
class InFlight:
    """A steady step in flight (async scheduling): its requests and their starts."""

    step: int
    requests: list
    starts: list[int]
    k: int

    def output(self) -> SchedulerOutput:
        """The scheduler's output of this step, as `schedule` would have built it."""
        n = 1 + self.k
        return SchedulerOutput(self.step, [Scheduled(r, n, self.k, s, True, False)
                                           for r, s in zip(self.requests, self.starts)],
                               [], [], n * len(self.requests))


class SteadyTurns:
    """The record pass's steady turns, for one engine core's live steps."""

    def __init__(self, sched: Scheduler, steps: LiveSteps, client: Client, columns: tuple):
        self.sched, self.steps, self.acc, self.client = sched, steps, client.acc, client
        cfg = sched.cfg
        self.k, self.async_ = sched.k, cfg.async_scheduling
        self.bs, self.budget, self.last = (cfg.block_size, cfg.max_num_batched_tokens,
                                           cfg.max_model_len - 1)
        # the record pass's lists: every plan's requests and tokens, each launched step's
        # batch; request id -> its chunks
        self.plan_reqs, self.plan_tokens, self.batches, self.chunks = columns

    def take(self, queue, u: int) -> bool:
        """Take this turn if it is steady: schedule and launch a step of every running request,
        then update the step this turn reads (async: the one in flight; sync: this one), its
        chunks as update `u`. False, with nothing changed: the scheduler's turn."""
        sched, k = self.sched, self.k
        running = sched.running
        n = 1 + k
        if sched.waiting or not running or n * len(running) > self.budget:
            return False
        if self.async_:   # the step in flight must be a steady step of these requests
            if len(queue) != 1:
                return False
            prev = queue[0]
            if type(prev) is InFlight:   # (steady, but some of its requests may have finished)
                if prev.requests != running:
                    return False
            else:
                if prev.preempted or len(prev.scheduled) != len(running):
                    return False
                for s, req in zip(prev.scheduled, running):
                    if s.request is not req or s.num_spec != k or not s.samples:
                        return False
        elif queue:
            return False
        acc, bs, last = self.acc, self.bs, self.last
        need = 0
        for req in running:   # would schedule() give each 1 + k tokens?
            c, p = req.num_computed_tokens, req.num_output_placeholders
            if p and c + 2 - p >= req.num_prompt_tokens + req.max_tokens:
                return False   # skipped: its step in flight finishes it
            if req.num_spec_tokens != k or req.eos_token_id is not None or n > last - c \
                    or req.num_prompt_tokens + len(req.output_token_ids) + k + p - c != n:
                return False
            end = c + n + k
            if end > len(req.block_ids) * bs:
                need += cdiv(end, bs) - len(req.block_ids)
        pool = sched.pool
        if need > pool.num_free:
            return False
        # the step, as schedule() takes it (common/scheduler.py: _allocate, then _take)
        async_, caching = self.async_, sched.caching
        kv = decode_kv = max_blocks = kv_max = 0
        kv_min = 1 << 62
        pairs = 0.0
        starts = []
        for req in running:
            c = req.num_computed_tokens
            end = c + n
            held = len(req.block_ids)
            if end + k > held * bs:
                req.block_ids += pool.allocate(cdiv(end + k, bs) - held)
            req.num_computed_tokens = end
            if caching:
                tokens = req.num_prompt_tokens + len(req.output_token_ids)
                full = (end if end < tokens else tokens) // bs
                if full > req.num_cached_blocks:
                    sched._cache_blocks(req, full)
            if async_:
                req.num_output_placeholders += n
                req.num_spec_tokens = k
            else:
                req.num_spec_tokens = 0
            starts.append(c)   # batch_of's sums, in its order
            kv += end
            pairs += n * (c + (n + 1) / 2)
            decode_kv += c
            if c > kv_max:
                kv_max = c
            if c < kv_min:
                kv_min = c
            blocks = len(req.block_ids)
            if blocks > max_blocks:
                max_blocks = blocks
        r = len(running)
        batch = Batch(n * r, r, r, n * r, k * r, kv, pairs, n, max_blocks, r, decode_kv, kv_min,
                      kv_max, [])
        step = sched.step
        sched.step += 1
        sched._finished_ids = []   # (the step's `finished`: only a worker reads it)
        self.plan_reqs.append(r)
        self.plan_tokens.append(n * r)
        self.batches.append(batch)
        # the update (update_from_output): 1 + accepted tokens each, up to its max_tokens
        steps, chunks = self.steps, self.chunks
        hist, sampled = steps.accepted_hist, steps.tokens
        launched = list(running)
        done = []
        for req in launched:
            rid = req.request_id
            a = 0
            if k:   # (drafts verified: LiveSteps.outcome's draw)
                a = acc.next(rid, k)
                hist[a] += 1
            rejected = k - a
            if req.status == RUNNING:
                req.num_computed_tokens -= rejected
            room = req.max_tokens - len(req.output_token_ids)
            new = sampled[a] if a < room else sampled[room - 1]   # (ids[:room], all zeros)
            req.output_token_ids += new
            if async_:
                req.num_output_placeholders -= rejected + 1 + a
            us, ns = chunks[rid]
            us.append(u)
            ns.append(len(new))
            if a + 1 >= room:
                sched._finish(req)
                done.append(rid)
            elif not async_:
                req.num_spec_tokens = k
        steps.num_draft_tokens += k * r
        if async_:   # this turn's step stays in flight
            queue.popleft()
            queue.append(InFlight(step, launched, starts, k))
        for rid in done:   # the client has the last chunks (sim/plain_loop.py `record`)
            acc.finished(rid)
            self.client.complete()   # its next request, into the inbox
        return True
