"""The record pass taken request by request: each request's path through the run computed
whole when it is admitted, the steps summed from the paths (issue 54).

In a run whose steps cannot depend on time (sim/plain_loop.py), a running request's steps
depend on nothing but its own state and its own acceptance stream, as long as the scheduler
never has to weigh it against another: no preemption (the pool never runs dry), no decode
capped by the token budget, no prefix-cache hit (no prompt token ids to match). Where that
holds, the scheduler's decisions reduce to one a request: at which step it is admitted, and
how its prefill is chunked. From there, its decode steps, their context lengths, the blocks
it holds, the tokens it emits at each update and the step whose update finishes it follow
from its draws alone, computed at once (numpy) rather than one step and one request at a time.

`record` runs the admissions, one event per request: the client's sends and the waiting
queue, FCFS, against the budget, the pool and `max_num_seqs` as the scheduler leaves them at
that step (`_Steps`: the tokens, blocks and requests of the paths so far, by step). It then
sums the steps' `Batch`es from the paths and writes the same `Program` that
sim/plain_loop.py's `record` writes. Where the run breaks a premise (a step over the budget or
the pool, a stall, token ids with prefix caching, a context that reaches --max-model-len in a
way `_walk` does not follow), it returns False having changed nothing, and the scheduler's
own record pass runs instead.

A request's decode steps follow the scheduler's rules (common/scheduler.py: `schedule`'s
running loop, `_take`, `update_from_output`): in sync each step verifies the k drafts of the
last update, from context P + O - 1 (P prompt tokens, O emitted); under async scheduling a
step is planned before the previous one's tokens are known, from context P + O' + k (O' the
tokens emitted before the step in flight), and one more step runs after the finishing one
unless the step in flight surely finishes it. `_walk` follows them step by step, for the
requests whose context may reach --max-model-len (where a step takes fewer drafts);
`_path` computes them at once for the rest. `tests/test_paths.py` holds both, and this pass,
to the scheduler's own.
"""

from __future__ import annotations

import gc
import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from stepgap.common.scheduler import cdiv
from stepgap.sim.costs import Batch
from stepgap.sim.steps import LAUNCHED, PLANNED, UPDATED, Columns, Program


@dataclass(slots=True)
class Path:
    """One request's steps, as the scheduler would take them.

    Its prefill chunks, as (step, tokens, start, samples, blocks held after it). Its decode
    steps as columns: each one's step, tokens, start (the context before it), drafts
    verified and blocks held after it. The blocks it holds at every step from its admission
    until the step before it frees them (`held`). Its chunks to the client: the step of each
    update that emits some, and their tokens. The step whose update finishes it, its
    accepted counts, and the drafts verified in the steps that drew them.
    """

    prefill: list[tuple]
    steps: np.ndarray
    tokens: np.ndarray | int   # (an int: every decode step's)
    starts: np.ndarray
    drafts: np.ndarray | int
    blocks: np.ndarray
    held: np.ndarray
    emitted: tuple[list[int], list[int]]
    finish: int
    accepted: np.ndarray
    verified: int


# The columns of `_Steps`: what every step's `Batch` sums (batch_of's order of fields, the
# prefill chunks aside), then what the admissions read
BATCH = ("tokens", "reqs", "sampling", "logits", "drafts", "kv", "pairs", "max_query",
         "max_blocks", "decode", "decode_kv", "kv_min", "kv_max")
COLUMNS = BATCH + ("held", "running")
NO_KV = 1 << 62   # kv_min of a step with no decode yet


class _Steps:
    """Per step, what the paths admitted so far schedule, summed as batch_of sums a step's
    requests (`BATCH`), and the prefill chunks; and the blocks held after the running
    requests' allocations and the requests running, for the admissions. Every sum is of
    integers, or of halves well under 2**53 (`pairs`): exact in any order. Grown as paths
    reach further."""

    def __init__(self, size: int):
        for name in COLUMNS:
            setattr(self, name, np.zeros(size, np.float64 if name == "pairs" else np.int64))
        self.kv_min[:] = NO_KV
        self.prefills: dict[int, list] = {}

    def reach(self, end: int) -> None:
        size = len(self.tokens)
        if end > size:
            more = max(end, 2 * size) - size
            for name in COLUMNS:
                col = getattr(self, name)
                setattr(self, name, np.concatenate(
                    (col, np.full(more, NO_KV if name == "kv_min" else 0, col.dtype))))

    def add(self, s0: int, path: Path) -> None:
        end = s0 + len(path.held)
        self.reach(end + 1)
        self.held[s0:end] += path.held
        self.running[s0:end] += 1
        for s, n, c, samples, blocks in path.prefill:   # (as batch_of takes a chunk)
            self._one(s, n, c, 0, samples, blocks)
        steps = path.steps
        if not len(steps):
            return
        at = slice(steps[0], steps[-1] + 1) if type(path.tokens) is int else steps
        n, c, drafts = path.tokens, path.starts, path.drafts   # (every step samples)
        self.tokens[at] += n
        self.reqs[at] += 1
        self.sampling[at] += 1
        self.logits[at] += drafts + 1
        self.drafts[at] += drafts
        self.kv[at] += c + n
        self.pairs[at] += n * (c + (n + 1) / 2)
        self.max_query[at] = np.maximum(self.max_query[at], n)
        self.max_blocks[at] = np.maximum(self.max_blocks[at], path.blocks)
        if type(path.tokens) is not int and np.any(path.tokens != path.drafts + 1):
            raise Bail   # (a decode step that is not 1 + drafts: never, by the rules)
        self.decode[at] += 1
        self.decode_kv[at] += c
        self.kv_min[at] = np.minimum(self.kv_min[at], c)
        self.kv_max[at] = np.maximum(self.kv_max[at], c)

    def _one(self, s: int, n: int, c: int, drafts: int, samples: bool, blocks: int) -> None:
        self.tokens[s] += n
        self.reqs[s] += 1
        if samples:
            self.sampling[s] += 1
            self.logits[s] += 1 + drafts
        self.drafts[s] += drafts
        self.kv[s] += c + n
        self.pairs[s] += n * (c + (n + 1) / 2)
        self.max_query[s] = max(self.max_query[s], n)
        self.max_blocks[s] = max(self.max_blocks[s], blocks)
        if n == 1 + drafts:   # (a one-token chunk counts as a decode)
            self.decode[s] += 1
            self.decode_kv[s] += c
            self.kv_min[s] = min(self.kv_min[s], c)
            self.kv_max[s] = max(self.kv_max[s], c)
        else:
            self.prefills.setdefault(s, []).append((n, c))


class Bail(Exception):
    """The run breaks a premise of the request paths: the scheduler's record pass takes it."""


def record(core, client, rec) -> bool:
    """sim/plain_loop.py `record`'s program, by request paths; False, with nothing changed,
    where the run breaks their premises."""
    gc.disable()   # (it makes ~20 objects a request and no cycle: the collector's passes over
    try:           # the heap find nothing, at about a tenth of the time)
        program, hist, drafts, queries = _record(core, client, rec)
    except Bail:
        return False
    finally:
        gc.enable()
    steps, sched = core.steps, core.sched
    for a, n in enumerate(hist):
        steps.accepted_hist[a] += n
    steps.num_draft_tokens += drafts
    if sched.caching:
        sched.prefix_cache_queries += queries
    rec.program = program
    return True


@dataclass(slots=True)
class _Run:
    """What every path of a run shares."""

    k: int
    block_size: int
    last: int         # max_model_len - 1: the furthest a step may reach
    budget: int       # max_num_batched_tokens
    lag: int          # turns from a step's plan to its update: 1 under async scheduling
    per_token: float  # decode steps per emitted token, a little over a median request's


def _record(core, client, rec):
    sched, acc = core.sched, client.acc
    cfg, k = sched.cfg, sched.k
    requests = rec.requests
    if sched.caching and any(tr.prompt_token_ids is not None for tr in requests):
        raise Bail   # a prefix-cache hit would tie requests together
    if len({tr.request_id for tr in requests}) != len(requests) \
            or any(tr.output_len < 1 or tr.prompt_len < 1 for tr in requests):
        raise Bail   # (the scheduler's own errors)
    budget_max, bs, nb = cfg.max_num_batched_tokens, cfg.block_size, cfg.num_blocks
    seqs, reserve = cfg.max_num_seqs, cfg.scheduler_reserve_full_isl
    lag = 1 if cfg.async_scheduling else 0
    run = _Run(k, bs, cfg.max_model_len - 1, budget_max, lag, 1.25 / acc.mean_length())
    table = _Steps(1024)
    pending = deque(requests)   # (all arrive at once: the client sends them in trace order)
    conc = client.gen.max_concurrency
    waiting: deque = deque()
    sent: dict[str, int] = {}   # request id -> the step whose update sent it (-1: at 0 s)
    for _ in range(len(pending) if conc is None else min(conc, len(pending))):
        tr = pending.popleft()
        waiting.append(tr)
        sent[tr.request_id] = -1
    finishes: list = []   # (step whose update finishes it, order), a heap
    paths: list[tuple] = []   # (request id, its chunks' steps and tokens, its finish)
    accepted: list[np.ndarray] = []
    verified = s = 0
    while True:
        # the requests sent by updates before this step's plan (the inbox, at the turn's start)
        while finishes and finishes[0][0] + 1 + lag <= s:
            f, _ = heapq.heappop(finishes)
            if pending:
                tr = pending.popleft()
                waiting.append(tr)
                sent[tr.request_id] = f
        if not waiting:
            if not finishes:
                break
            s = max(s + 1, finishes[0][0] + 1 + lag)
            continue
        table.reach(s + 1)
        budget = budget_max - int(table.tokens[s])
        free = nb - int(table.held[s])
        running = int(table.running[s])
        while waiting and budget > 0 and running < seqs:   # schedule()'s waiting loop
            tr = waiting[0]
            p = tr.prompt_len
            if reserve and cdiv(p, bs) > free:
                break
            first = p if p < budget else budget
            if cdiv(first + (k if first == p else 0), bs) > free:
                break
            waiting.popleft()
            path = _path(tr, s, first, table, acc, run)
            table.add(s, path)
            heapq.heappush(finishes, (path.finish, len(paths)))
            paths.append((tr.request_id, path.emitted, path.finish))
            accepted.append(path.accepted)
            verified += path.verified
            budget -= first
            free = nb - int(table.held[s])
            running += 1
        if waiting and not finishes:
            raise Bail   # a stall: nothing runs that could free what it waits for
        s += 1
    program = _program(paths, sent, table, budget_max, nb, lag)
    hist = np.bincount(np.concatenate(accepted), minlength=k + 1).tolist()
    return (program, hist, verified,
            sum(tr.prompt_len for tr in requests))   # (each admitted once, none found cached)


def _path(tr, s0: int, first: int, table: _Steps, acc, run: _Run) -> Path:
    """The path of request `tr`, admitted at step `s0` with a first chunk of `first` tokens."""
    p, m, k, bs, lag = tr.prompt_len, tr.output_len, run.k, run.block_size, run.lag
    # its prefill: the first chunk, then what the budget leaves after the requests before it
    held0 = cdiv(first + (k if first == p else 0), bs)
    prefill = [(s0, first, 0, first == p, held0)]
    c, s = first, s0
    while c < p:
        s += 1
        table.reach(s + 1)
        left = run.budget - int(table.tokens[s])
        if left > 0:
            n = p - c if p - c < left else left
            c += n
            held0 = max(held0, cdiv(c + k, bs))
            prefill.append((s, n, c - n, c == p, held0))
    sp = s   # the step of its last chunk, which samples its first token
    take = acc.counts(tr.request_id)
    # no decode step's context can reach --max-model-len: c + 1 + k <= last for c at most
    # P + M - 2 (sync), P + M - 2 + k (async)
    if p + m + (1 + lag) * k <= run.last + 1:
        dec = _decode(p, m, held0, take, run)
    else:
        dec = _walk(p, m, held0, take, run)
    off, tokens, starts, drafts, blocks, e_tokens, f, accepted, verified = dec
    span = sp + f + lag - s0 + 1   # held until the plan after the update that finishes it
    steps = np.arange(sp + 1, sp + len(starts) + 1) if off is None else sp + off
    if sp == s0 and off is None:   # one chunk, then a decode step every step: in order
        n = len(starts)
        held = np.empty(span, np.int64)
        held[0] = held0
        held[1:n + 1] = blocks
        held[n + 1:] = blocks[-1] if n else held0
    else:
        held = np.zeros(span, np.int64)
        for s, _, _, _, h in prefill:
            held[s - s0] = h
        held[steps - s0] = blocks
        held = np.maximum.accumulate(held)
    # each step to the finishing one emits at its update (under async, not the one after)
    return Path(prefill, steps, tokens, starts, drafts, blocks, held,
                ([sp] + steps[:len(e_tokens)].tolist(), [1] + e_tokens.tolist()), sp + f,
                accepted, verified)


def _decode(p: int, m: int, held0: int, take, run: _Run) -> tuple:
    """A request's decode steps, at once, where no step's context reaches --max-model-len:
    one a step from the step after its prefill's last, each verifying k drafts (1 + k tokens)
    and emitting 1 + its accepted count, the last up to its max_tokens. Under async
    scheduling each is planned before the previous one's tokens are known, and one more runs
    after the one that finishes it unless that one surely did (the scheduler's skip)."""
    k, need = run.k, m - 1   # the tokens after the prefill's one
    if need <= 0:
        e = np.zeros(0, np.int64)
        return None, 1 + k, e, k, e, e, 0, e, 0
    if k:
        a = np.minimum(take(min(need, int(need * run.per_token) + 8)), k)
        out = np.cumsum(a + 1)
        while out[-1] < need:   # (a request that accepts less than most: draw on)
            a = np.concatenate((a, np.minimum(take(min(need, 64)), k)))
            out = np.cumsum(a + 1)
        d = int(np.searchsorted(out, need)) + 1   # the step whose tokens reach max_tokens
        a = a[:d]
        emitted = out[:d] + 1   # O_i, the tokens emitted by the update of decode step i
    else:
        d = need
        a = np.zeros(d, np.int64)
        emitted = np.arange(2, d + 2)
    e_tokens = a + 1
    before = emitted[d - 2] if d > 1 else 1   # O_{d-1}
    e_tokens[-1] = m - before
    if run.lag:   # P + O_{i-2} + k, the first from P; and the extra step
        n = d + 1 if before <= m - 2 else d
        starts = np.empty(n, np.int64)
        starts[0] = p
        if n > 1:
            starts[1] = p + k + 1
            starts[2:] = emitted[:n - 2] + (p + k)
    else:   # P + O_{i-1} - 1
        n = d
        starts = np.empty(n, np.int64)
        starts[0] = p
        starts[1:] = emitted[:n - 1] + (p - 1)
    blocks = (starts + (2 * k + run.block_size)) // run.block_size   # cdiv(start + 1 + 2k)
    np.maximum(blocks, held0, out=blocks)
    return None, 1 + k, starts, k, blocks, e_tokens, d, a if k else a[:0], k * d


def _walk(p: int, m: int, held0: int, take, run: _Run) -> tuple:
    """A request's decode steps one by one, by the scheduler's rules for one request, where
    its context may reach --max-model-len: there a step takes fewer drafts, or none, and
    under async scheduling a step may be skipped. Offsets are from its last prefill step."""
    k, bs, last, async_ = run.k, run.block_size, run.last, bool(run.lag)
    draws = take(m).tolist() if k else None   # (each step draws at most once and emits >= 1)
    nd = verified = 0
    off, tokens, starts, drafts, blocks, e_tokens, accepted = ([] for _ in range(7))
    held = held0
    c, o, ns, ph = p, 0, (k if async_ else 0), (1 if async_ else 0)
    inflight = (0, 0, True)   # (offset, drafts, samples): the last prefill step's
    i = 0
    finish = None
    while finish is None:
        if not async_:   # the update of the step just taken (first, the prefill's)
            _, sp, _ = inflight
            a = 0
            if sp:
                a = min(draws[nd], sp)
                nd += 1
                verified += sp
                accepted.append(a)
                c -= sp - a
            room = m - o
            new = 1 + a if 1 + a < room else room
            o += new
            e_tokens.append(new)
            if 1 + a >= room:
                finish = i
                break
            ns = k
        i += 1
        if i > 2 * m + 8:
            raise Bail   # (no progress: never, by the rules above)
        took = None   # plan step i: schedule()'s running loop and _take, for this request
        if not (ph and c + 2 - ph >= p + m):
            n = p + o + ns + ph - c
            if n > last - c:
                n = last - c
            if n > 0:
                end = c + n
                known = p + o + ph
                sp = (ns if ns < end - known else end - known) if end > known else 0
                smp = end >= known
                if end + k > held * bs:
                    held = cdiv(end + k, bs)
                off.append(i)
                tokens.append(n)
                starts.append(c)
                drafts.append(sp)
                blocks.append(held)
                c = end
                if async_ and smp:
                    ph += 1 + sp
                    ns = k
                else:
                    ns = 0
                took = (i, sp, smp)
        if async_:   # then update_from_output of the step in flight
            if inflight is not None and inflight[2]:
                oi, sp, _ = inflight
                a = 0
                if sp:
                    a = min(draws[nd], sp)
                    nd += 1
                    verified += sp
                    accepted.append(a)
                    c -= sp - a
                    ph -= sp - a
                room = m - o
                new = 1 + a if 1 + a < room else room
                o += new
                ph -= 1 + a
                e_tokens.append(new)
                if 1 + a >= room:
                    finish = oi
        elif took is None:
            raise Bail
        inflight = took
    off, tokens, starts, drafts, blocks, e_tokens, accepted = (
        np.array(x, np.int64)
        for x in (off, tokens, starts, drafts, blocks, e_tokens[1:], accepted))
    return off, tokens, starts, drafts, blocks, e_tokens, finish, accepted, verified


def _program(paths: list[tuple], sent: dict, table: _Steps, budget_max: int, nb: int,
             lag: int) -> Program:
    """The recording's program: the turns to the last finishing update's, each launched
    step's `Batch` from the step columns, each request's chunks by update."""
    end = max(f for _, _, f in paths) + lag + 1
    if int(table.tokens[:end].max()) > budget_max or int(table.held[:end].max()) > nb:
        raise Bail   # a decode capped by the budget, or a preemption
    if table.reqs[end:].any():
        raise Bail   # (a step past the last turn: never, by the paths' rules)
    reqs = table.reqs[:end]
    launched = reqs > 0
    if lag:   # an empty plan leaves the queue empty: two in a row stall the loop
        if not launched[0] or np.any(~launched[1:] & ~launched[:-1]):
            raise Bail
    elif not launched.all():
        raise Bail
    kv_min = table.kv_min[:end]
    kv_min[kv_min == NO_KV] = 0   # (batch_of's, where no request decodes)
    at = np.flatnonzero(launched)
    prefills = table.prefills
    batches = [Batch(*row, prefills.get(s, []))
               for s, row in zip(at.tolist(),
                                 zip(*(getattr(table, name)[at].tolist() for name in BATCH)))]
    # a launched step's update comes `lag` turns after its plan; its index counts the
    # launched steps before it
    u_of = np.concatenate(([0], np.cumsum(launched)))
    updated = ~(launched & np.r_[True, ~launched[:-1]]) if lag else np.ones(end, bool)
    turns = (PLANNED + LAUNCHED * launched + UPDATED * updated).tolist()
    chunks = {rid: (u_of[steps].tolist(), tokens) for rid, (steps, tokens), _ in paths}
    sent = {rid: (-1 if f < 0 else int(u_of[f])) for rid, f in sent.items()}
    return Program(turns, sent, Columns(reqs.copy(), table.tokens[:end].copy(), batches,
                                        chunks))

