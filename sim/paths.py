"""The record pass taken request by request: each request's steps computed whole, the run's
steps summed from them (issue 54).

In a run whose steps cannot depend on time (sim/plain_loop.py), a running request's steps
depend on nothing but its own state and its own acceptance stream, as long as the scheduler
never has to weigh it against another: no preemption (the pool never runs dry), no decode
capped by the token budget, no prefix-cache hit (no prompt token ids to match). Where that
holds, the scheduler's decisions reduce to two a request: the step at which it is admitted,
and how its prefill is chunked. From the step of its last prefill chunk on, its decode steps,
their context lengths, the blocks it holds, the tokens it emits at each update and the step
whose update finishes it follow from its own draws alone.

`record` takes a run in three passes:

- `_decodes`: every request's decode steps, relative to its last prefill step, a few thousand
  requests at once (numpy over their draws; each group's rows kept as a piece, never all
  requests' at once), or one by one (`_walk`) for a request whose context may reach
  --max-model-len, where a step takes fewer drafts;
- the admissions, one event per request: the client's sends and the waiting queue, FCFS,
  against the budget, the pool and `max_num_seqs` as the requests admitted before leave them
  at that step (`_Steps`: their tokens, blocks and count, by step), and each admitted
  request's prefill chunks;
- `_program`: the steps' `Batch`es summed from every request's chunks and decode steps, a
  piece at a time (in any order: the sums are of integers, or of halves far below 2**53), and
  the same `Program` that sim/plain_loop.py's `record` writes.

Where the run breaks a premise (a step over the budget or the pool, a stall, token ids under
prefix caching), it returns False having changed nothing, and the scheduler's own record pass
runs instead.

A request's decode steps follow the scheduler's rules (common/scheduler.py: `schedule`'s
running loop, `_take`, `update_from_output`): in sync each step verifies the k drafts of the
last update, from context P + O - 1 (P prompt tokens, O emitted); under async scheduling a
step is planned before the previous one's tokens are known, from context P + O' + k (O' the
tokens emitted before the step in flight), and one more step runs after the finishing one
unless the step in flight surely finishes it. `tests/test_paths.py` holds both ways of
computing them to each other, and this pass to the scheduler's own.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from stepgap.common.scheduler import cdiv
from stepgap.sim.steps import LAUNCHED, PLANNED, UPDATED, Columns, Program


GROUP = 2048   # requests whose decode steps `_decodes` computes together


class Bail(Exception):
    """The run breaks a premise of the request paths: the scheduler's record pass takes it."""


@dataclass(slots=True)
class _Run:
    """What every request of a run shares."""

    k: int
    block_size: int
    last: int         # max_model_len - 1: the furthest a step may reach
    budget: int       # max_num_batched_tokens
    lag: int          # turns from a step's plan to its update: 1 under async scheduling
    per_token: float  # counts drawn first per token needed: 1.5 times a median request's steps


def record(core, client, rec) -> bool:
    """sim/plain_loop.py `record`'s program, by request paths; False, with nothing changed,
    where the run breaks their premises."""
    try:
        program, hist, drafts, queries = _record(core, client, rec)
    except Bail:
        return False
    steps, sched = core.steps, core.sched
    for a, n in enumerate(hist):
        steps.accepted_hist[a] += n
    steps.num_draft_tokens += drafts
    if sched.caching:
        sched.prefix_cache_queries += queries
    rec.program = program
    return True


@dataclass(slots=True)
class Decodes:
    """Every request's decode steps, relative to the step of its last prefill chunk (offset
    0), by request in trace order: request i's steps are `nrows[i]` rows from `row0[i]` of the
    columns (offset, tokens, start, drafts verified, blocks held after it, and the request),
    kept in `pieces` (each a group's or a walk's, `piece_at` its first row: `rows`), and it
    emits at the updates of its first `emits[i]` steps (`e_tokens` from `emits_at[i]`), after
    the prefill's one token. `finish[i]`: the offset whose update finishes it (`emits[i]`, but
    for a walked request, whose steps may skip an offset). `held`, from
    `held_at[i]`, `span[i]` long: the blocks it holds at each offset from 0 until the plan
    after that update. Its accepted counts, and the drafts verified in the steps that drew
    them, are summed over the run."""

    pieces: list         # [offset, tokens, start, drafts, blocks, request]: a few thousand
    piece_at: np.ndarray  # requests' rows each (never all at once: a bounded memory)
    row0: np.ndarray
    nrows: np.ndarray
    emits: np.ndarray
    emits_at: np.ndarray
    e_tokens: np.ndarray
    finish: np.ndarray
    held: np.ndarray
    held_at: np.ndarray
    span: np.ndarray
    contiguous: np.ndarray   # one step an offset from 1 (not a walk's)
    hist: list[int]
    verified: int

    def rows(self, i: int) -> list[np.ndarray]:
        """Request i's rows: offset, tokens, start, drafts and blocks."""
        r0 = int(self.row0[i])
        j = int(np.searchsorted(self.piece_at, r0, "right")) - 1
        lo = r0 - int(self.piece_at[j])
        return [c[lo:lo + int(self.nrows[i])] for c in self.pieces[j][:5]]


def _decodes(requests, acc, run: _Run) -> Decodes:
    """Every request's decode steps (`Decodes`): each one a step from the step after its last
    prefill chunk, verifying k drafts (1 + k tokens) and emitting 1 + its accepted count, the
    last up to its max_tokens, computed for all requests at once; one by one (`_walk`) where
    a step's context may reach --max-model-len."""
    k, bs, lag = run.k, run.block_size, run.lag
    n_req = len(requests)
    p = np.array([tr.prompt_len for tr in requests], np.int64)
    m = np.array([tr.output_len for tr in requests], np.int64)
    held0 = (p + k + bs - 1) // bs   # cdiv(P + k): after the last prefill chunk, however cut
    need = np.maximum(m - 1, 0)      # the tokens after the prefill's one
    # no decode step's context can reach --max-model-len: c + 1 + k <= last for c at most
    # P + M - 2 (sync), P + M - 2 + k (async)
    walks = p + m + (1 + lag) * k > run.last + 1
    at_once = np.flatnonzero(~walks)
    row0, nrows = np.zeros(n_req, np.int64), np.zeros(n_req, np.int64)
    emits, emits_at = np.zeros(n_req, np.int64), np.zeros(n_req, np.int64)
    finish = np.zeros(n_req, np.int64)
    held_at, spans = np.zeros(n_req, np.int64), np.zeros(n_req, np.int64)
    pieces = []
    rows_n = e_n = h_n = verified = 0
    hist = np.zeros(k + 1, np.int64)
    for lo in range(0, len(at_once), GROUP):   # (a bounded memory, and less of it touched)
        at = at_once[lo:lo + GROUP]
        piece, (r0, n, d, k_start, h0, span), g_hist, g_verified = _group(
            requests, at, p, m, need, held0, acc, run)
        row0[at], nrows[at], emits[at], emits_at[at], finish[at] = r0 + rows_n, n, d, \
            k_start + e_n, d
        held_at[at], spans[at] = h0 + h_n, span
        rows_n, e_n, h_n = rows_n + len(piece[0]), e_n + len(piece[5]), h_n + len(piece[6])
        pieces.append(piece)
        hist += g_hist
        verified += g_verified
    for i in np.flatnonzero(walks).tolist():
        tr = requests[i]
        w_off, w_tokens, w_starts, w_drafts, w_blocks, w_e, f, w_acc, w_ver = _walk(
            tr.prompt_len, tr.output_len, int(held0[i]),
            acc.first_counts([tr.request_id], [tr.output_len]) if k else None, run)
        w_held = np.zeros(f + lag + 1, np.int64)
        w_held[0] = held0[i]
        w_held[w_off] = w_blocks
        w_held = np.maximum.accumulate(w_held)
        pieces.append([w_off, w_tokens, w_starts, w_drafts, w_blocks, w_e, w_held,
                       np.full(len(w_off), i, np.int64)])
        row0[i], nrows[i], emits[i], emits_at[i], finish[i] = rows_n, len(w_off), len(w_e), \
            e_n, f
        held_at[i], spans[i] = h_n, len(w_held)
        rows_n, e_n, h_n = rows_n + len(w_off), e_n + len(w_e), h_n + len(w_held)
        if k:
            hist = hist + np.bincount(w_acc, minlength=k + 1)
        verified += w_ver
    e_tokens, held = (np.concatenate([piece[c] for piece in pieces]) if pieces
                      else np.zeros(0, np.int64) for c in (5, 6))
    piece_at = np.cumsum([0] + [len(piece[0]) for piece in pieces[:-1]], dtype=np.int64)
    return Decodes([piece[:5] + piece[7:] for piece in pieces], piece_at, row0, nrows, emits,
                   emits_at, e_tokens, finish, held, held_at, spans, ~walks, hist.tolist(),
                   verified)


def _group(requests, at_once: np.ndarray, p, m, need, held0, acc, run: _Run) -> tuple:
    """`_decodes`' columns for the requests `at_once` (their indices), computed together: the
    rows (offset, tokens, start, drafts, blocks), emitted tokens, blocks held and each row's
    request; per request, where its rows, emitted tokens and blocks held start in them, its
    rows, finishing offset and span; the accepted counts and drafts verified."""
    k, bs, lag = run.k, run.block_size, run.lag
    # each request's accepted counts: at most one a token it needs, half as many again as a
    # median request's steps drawn first
    ids = [requests[i].request_id for i in at_once.tolist()]
    wanted = np.minimum(need[at_once], (need[at_once] * run.per_token).astype(np.int64) + 16)
    rows = wanted if k else need[at_once]
    counts = acc.first_counts(ids, rows.tolist()) if k else np.zeros(int(rows.sum()), np.int64)
    while True:
        a = np.minimum(counts, k)
        start = np.concatenate(([0], np.cumsum(rows)))
        out = np.concatenate(([0], np.cumsum(a + 1)))   # tokens emitted, over all requests
        short = np.flatnonzero(out[start[1:]] - out[start[:-1]] < need[at_once])
        if not len(short):
            break
        # (the requests that accept less than most: twice as much of their streams)
        pieces = np.split(counts, start[1:-1])
        rows = rows.copy()
        rows[short] = 2 * rows[short] + 16
        more = acc.first_counts([ids[j] for j in short.tolist()], rows[short].tolist())
        for j, c in zip(short.tolist(), np.split(more, np.cumsum(rows[short])[:-1])):
            pieces[j] = c
        counts = np.concatenate(pieces)
    # the step that reaches max_tokens, d: the first whose running sum of 1 + accepted counts
    # is the tokens it needs (the prefill's one aside); the steps before it, kept
    base = out[start[:-1]]
    d = np.searchsorted(out, base + need[at_once]) - start[:-1]
    local = np.arange(len(a)) - np.repeat(start[:-1], rows)
    keep = local < np.repeat(d, rows)
    a = a[keep]
    emitted = out[1:][keep] - np.repeat(base, rows)[keep] + 1   # O_j, after decode step j
    k_start = np.concatenate(([0], np.cumsum(d)))[:-1]
    e_tokens = a + 1
    last = k_start + d - 1
    has = d > 0
    before = np.ones(len(d), np.int64)   # O_{d-1}
    two = d > 1
    before[two] = emitted[last[two] - 1]
    e_tokens[last[has]] = m[at_once][has] - before[has]
    # the steps: under async one more after the finishing one unless the step in flight
    # surely finished it (the scheduler's skip: O_{d-1} = M - 1)
    pv = p[at_once]
    extra = (has & (before <= m[at_once] - 2)) if lag else np.zeros(len(d), bool)
    n = d + extra
    r_start = np.concatenate(([0], np.cumsum(n)))
    j = np.arange(r_start[-1]) - np.repeat(r_start[:-1], n)
    ks = np.repeat(k_start, n)
    if lag:   # P + O_{j-2} + k, the first from P, the second from O_0 = 1
        g = np.maximum(ks + j - 2, 0)
        o_prev = emitted[g] if len(emitted) else np.zeros(len(j), np.int64)
        starts = np.repeat(pv, n) + np.where(j == 0, 0, k + np.where(j == 1, 1, o_prev))
    else:     # P + O_{j-1} - 1, the first from P
        g = np.maximum(ks + j - 1, 0)
        o_prev = emitted[g] if len(emitted) else np.zeros(len(j), np.int64)
        starts = np.repeat(pv, n) + np.where(j == 0, 0, o_prev - 1)
    blocks = np.maximum((starts + (2 * k + bs)) // bs, np.repeat(held0[at_once], n))
    span = d + lag + 1
    h_start = np.concatenate(([0], np.cumsum(span)))
    held = np.repeat(held0[at_once], span)
    held[np.repeat(h_start[:-1], n) + j + 1] = blocks
    tail = (n == d) & (n > 0) & (lag > 0)   # (async without the extra step: held one more)
    held[h_start[:-1][tail] + d[tail] + 1] = blocks[r_start[1:][tail] - 1]
    cols = [j + 1, np.full(len(j), 1 + k, np.int64), starts, np.full(len(j), k, np.int64),
            blocks]
    hist = np.bincount(a, minlength=k + 1) if k else np.zeros(1, np.int64)
    return (cols + [e_tokens, held, np.repeat(at_once, n)],
            (r_start[:-1], n, d, k_start, h_start[:-1], span), hist, k * int(d.sum()))


def _walk(p: int, m: int, held0: int, counts: np.ndarray | None, run: _Run) -> tuple:
    """A request's decode steps one by one, by the scheduler's rules for one request, where
    its context may reach --max-model-len: there a step takes fewer drafts, or none, and
    under async scheduling a step may be skipped. Offsets are from its last prefill step."""
    k, bs, last, async_ = run.k, run.block_size, run.last, bool(run.lag)
    draws = counts.tolist() if k else None   # (M of them: a step draws once, emits >= 1)
    nd = verified = 0
    off, tokens, starts, drafts, blocks, e_tokens, accepted = ([] for _ in range(7))
    held = held0
    c, o, ns, ph = p, 0, (k if async_ else 0), (1 if async_ else 0)
    # (offset, drafts, samples) of the step just planned, and under async of the one before
    # it, in flight: first the last prefill step's (offset 0), whose update comes at once in
    # sync, after step 1's plan under async
    took, inflight = (0, 0, True), None
    i = 0
    finish = None
    while finish is None:
        if i:   # plan step i: schedule()'s running loop and _take, for this request
            if i > 2 * m + 8:
                raise Bail   # (no progress: never, by the rules below)
            took = None
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
            if took is None and not async_:
                raise Bail   # (sync never skips a running request)
        # update_from_output of the step it reads: in sync this one, under async the one before
        step = inflight if async_ else took
        if step is not None and step[2]:
            oi, sp, _ = step
            a = 0
            if sp:
                a = min(draws[nd], sp)
                nd += 1
                verified += sp
                accepted.append(a)
                c -= sp - a
                if async_:
                    ph -= sp - a
            room = m - o
            new = 1 + a if 1 + a < room else room
            o += new
            e_tokens.append(new)
            if async_:
                ph -= 1 + a
            if 1 + a >= room:
                finish = oi
            elif not async_:
                ns = k   # (the worker drafted k after sampling)
        inflight = took
        i += 1
    off, tokens, starts, drafts, blocks, e_tokens, accepted = (
        np.array(x, np.int64)
        for x in (off, tokens, starts, drafts, blocks, e_tokens[1:], accepted))
    return off, tokens, starts, drafts, blocks, e_tokens, finish, accepted, verified


class _Steps:
    """Per step, what the requests admitted so far take: tokens, blocks held after the
    running requests' allocations, requests running. Grown as they reach further."""

    def __init__(self, size: int):
        self.tokens = np.zeros(size, np.int64)
        self.held = np.zeros(size, np.int64)
        self.running = np.zeros(size, np.int64)

    def reach(self, end: int) -> None:
        size = len(self.tokens)
        if end > size:
            more = np.zeros(max(end, 2 * size) - size, np.int64)
            self.tokens = np.concatenate((self.tokens, more))
            self.held = np.concatenate((self.held, more))
            self.running = np.concatenate((self.running, more))


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
    run = _Run(k, bs, cfg.max_model_len - 1, budget_max, lag, 1.5 / acc.mean_length())
    dec = _decodes(requests, acc, run)
    table = _Steps(1024)
    pending = deque(enumerate(requests))   # (all at once: the client sends in trace order)
    conc = client.gen.max_concurrency
    waiting: deque = deque()
    sent: dict[str, int] = {}   # request id -> the step whose update sent it (-1: at 0 s)
    for _ in range(len(pending) if conc is None else min(conc, len(pending))):
        i, tr = pending.popleft()
        waiting.append((i, tr))
        sent[tr.request_id] = -1
    finishes: list = []   # (step whose update finishes it, order), a heap
    last_prefill = np.full(len(requests), -1, np.int64)   # each request's last prefill step
    chunks: list[tuple] = []   # every prefill chunk, in admission order
    order = s = 0
    while True:
        # the requests sent by updates before this step's plan (the inbox, at the turn's start)
        while finishes and finishes[0][0] + 1 + lag <= s:
            f, _ = heapq.heappop(finishes)
            if pending:
                i, tr = pending.popleft()
                waiting.append((i, tr))
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
            i, tr = waiting[0]
            p = tr.prompt_len
            if reserve and cdiv(p, bs) > free:
                break
            first = p if p < budget else budget
            if cdiv(first + (k if first == p else 0), bs) > free:
                break
            waiting.popleft()
            sp = _admit(i, tr, s, first, table, dec, run, chunks)
            last_prefill[i] = sp
            heapq.heappush(finishes, (sp + int(dec.finish[i]), order))
            order += 1
            budget -= first
            free = nb - int(table.held[s])
            running += 1
        if waiting and not finishes:
            raise Bail   # a stall: nothing runs that could free what it waits for
        s += 1
    program = _program(requests, dec, last_prefill, chunks, sent, table, budget_max, nb, lag)
    return (program, dec.hist, dec.verified,
            sum(tr.prompt_len for tr in requests))   # (each admitted once, none found cached)


def _admit(i: int, tr, s0: int, first: int, table: _Steps, dec: Decodes, run: _Run,
           chunks: list) -> int:
    """Admit request `i` at step `s0` with a first chunk of `first` tokens: its prefill
    chunks (the rest, each what the budget leaves after the requests before it), into
    `chunks`; its tokens, blocks and place counted into `table` at every step it holds them.
    Its last prefill step."""
    p, k, bs = tr.prompt_len, run.k, run.block_size
    h0 = cdiv(first + (k if first == p else 0), bs)
    chunks.append((s0, first, 0, first == p, h0))
    c, s = first, s0
    mine = [(s0, h0)]
    while c < p:
        s += 1
        table.reach(s + 1)
        left = run.budget - int(table.tokens[s])
        if left > 0:
            n = p - c if p - c < left else left
            c += n
            h0 = max(h0, cdiv(c + k, bs))
            chunks.append((s, n, c - n, c == p, h0))
            mine.append((s, h0))
    sp = s   # its last chunk samples its first token
    at, span = int(dec.held_at[i]), int(dec.span[i])
    held = dec.held[at:at + span]
    if sp > s0:   # (the blocks held before and between its chunks, then from the last on:
        before = np.zeros(sp - s0 + span, np.int64)   # held[0] is cdiv(P + k), the most)
        for step, h in mine:
            before[step - s0] = h
        before[sp - s0:] = held
        held = np.maximum.accumulate(before)
    end = s0 + len(held)
    table.reach(end + 1)
    table.held[s0:end] += held
    table.running[s0:end] += 1
    for step, n, _, _, _ in chunks[len(chunks) - len(mine):]:
        table.tokens[step] += n
    nr = int(dec.nrows[i])
    if nr:
        if dec.contiguous[i]:
            table.tokens[sp + 1:sp + 1 + nr] += 1 + k
        else:
            off, tokens = dec.rows(i)[:2]
            table.tokens[sp + off] += tokens
    return sp


NO_KV = 1 << 62   # kv_min of a step with no decode


def _program(requests, dec: Decodes, last_prefill: np.ndarray, chunks: list, sent: dict,
             table: _Steps, budget_max: int, nb: int, lag: int) -> Program:
    """The recording's program: the turns to the last finishing update's, each launched
    step's `Batch` summed as batch_of sums it from every request's prefill chunks and decode
    steps, and each request's chunks to the client by update."""
    end = int((last_prefill + dec.finish).max()) + lag + 1
    if int(table.tokens[:end].max()) > budget_max or int(table.held[:end].max()) > nb:
        raise Bail   # a decode capped by the budget, or a preemption
    ps, pn, pc, psmp, ph = (np.array(x, np.int64) for x in zip(*chunks))

    def pieces():   # the decode steps a piece at a time (each samples once), then the chunks
        for off, tokens, starts, drafts, blocks, who in dec.pieces:
            yield last_prefill[who] + off, tokens, starts, drafts, None, blocks
        yield ps, pn, pc, np.zeros(len(ps), np.int64), psmp, ph

    # each step's sums over its rows (of integers or halves: exact in any order): tokens,
    # requests, samples, the tokens they verify, drafts, context ends, attended pairs, and of
    # its decodes, how many and their contexts; the most of some, the least of one
    sums = np.zeros((9, end))
    most_query, most_blocks = np.zeros(end, np.int64), np.zeros(end, np.int64)
    kv_min, kv_max = np.full(end, NO_KV, np.int64), np.zeros(end, np.int64)
    for steps, tokens, starts, drafts, samples, blocks in pieces():
        if len(steps) and int(steps.max()) >= end:
            raise Bail   # (a step past the last turn: never, by the paths' rules)
        verify = 1 + drafts if samples is None else samples * (1 + drafts)
        for row, w in enumerate((tokens, None, samples, verify, drafts, starts + tokens,
                                 tokens * (starts + (tokens + 1) / 2))):
            sums[row] += np.bincount(steps, w, minlength=end)
        decode = tokens == 1 + drafts   # (as batch_of counts them: a one-token chunk too)
        ds, dk = steps[decode], starts[decode]
        sums[7] += np.bincount(ds, minlength=end)
        sums[8] += np.bincount(ds, dk, minlength=end)
        np.maximum.at(most_query, steps, tokens)
        np.maximum.at(most_blocks, steps, blocks)
        np.minimum.at(kv_min, ds, dk)
        np.maximum.at(kv_max, ds, dk)
    kv_min[kv_min == NO_KV] = 0
    launched = sums[1] > 0
    if lag:   # an empty plan leaves the queue empty: two in a row stall the loop
        if not launched[0] or np.any(~launched[1:] & ~launched[:-1]):
            raise Bail
    elif not launched.all():
        raise Bail
    prefills: dict[int, list] = {}   # (in admission order: the running order)
    for s, n, c, _, _ in chunks:
        if n != 1:
            prefills.setdefault(s, []).append((n, c))
    ints = sums.astype(np.int64)
    cols = list(ints[:6]) + [sums[6], most_query, most_blocks, ints[7], ints[8], kv_min, kv_max]
    at = np.flatnonzero(launched)   # (batch_of's sums, each exact; Batches made if asked)
    fields = tuple(c[at] for c in cols) + ([prefills.get(s, []) for s in at.tolist()],)
    # a launched step's update comes `lag` turns after its plan; its index counts the
    # launched steps before it
    u_of = np.concatenate(([0], np.cumsum(launched)))
    updated = ~(launched & np.r_[True, ~launched[:-1]]) if lag else np.ones(end, bool)
    turns = (PLANNED + LAUNCHED * launched + UPDATED * updated).tolist()
    # each request's chunks: its last prefill's update, then one a step (its updates a range,
    # since the request runs in every step between: each is launched), or a walk's steps
    chunks_of = {}
    e_tokens = dec.e_tokens.tolist()
    for i, (tr, sp, u0, ne, ea, one) in enumerate(zip(
            requests, last_prefill.tolist(), u_of[last_prefill].tolist(), dec.emits.tolist(),
            dec.emits_at.tolist(), dec.contiguous.tolist())):
        us = range(u0, u0 + ne + 1) if one else [u0] + u_of[sp + dec.rows(i)[0][:ne]].tolist()
        chunks_of[tr.request_id] = (us, [1] + e_tokens[ea:ea + ne])
    sent = {rid: (-1 if f < 0 else int(u_of[f])) for rid, f in sent.items()}
    return Program(turns, sent, Columns(ints[1], ints[0], None, chunks_of, fields))
