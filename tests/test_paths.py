"""Request paths (sim/paths.py) give the scheduler's own steps: the same program, counters and
result as the record pass that schedules every turn, wherever their premises hold, and hand
the run to it where they do not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepgap.sim import paths
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from stepgap.sim.steps import Recording
from tests.test_sim_replay import BASE, CPU, REPLAYED

LONG = dict(workload="random", max_model_len=2048, num_prompts=8, max_concurrency=4)
CASES = {**REPLAYED,
         "sharegpt at concurrency 32": dict(num_prompts=200, max_concurrency=32),
         "sync at concurrency 32": dict(num_prompts=200, max_concurrency=32, mode="sync"),
         "sync, chunked prefill": dict(mode="sync", max_num_batched_tokens=64, max_num_seqs=8),
         "a queue behind max_num_seqs": dict(max_concurrency=None, max_num_seqs=3,
                                             num_prompts=30),
         # prompt 1024 + output near 1024: the last steps reach --max-model-len (`_walk`)
         "async to max-model-len": dict(LONG, output_len=1024),
         "sync to max-model-len": dict(LONG, output_len=1024, mode="sync"),
         "k = 1 to max-model-len": dict(LONG, output_len=1020, k=1),
         "k = 5, every draft accepted": dict(LONG, output_len=1022, k=5, acceptance="full"),
         "sync, k = 5, every draft accepted": dict(LONG, output_len=1022, k=5,
                                                   acceptance="full", mode="sync"),
         "k = 5, none accepted": dict(LONG, output_len=1023, k=5, acceptance="none"),
         "one output token": dict(output_len=1, num_prompts=12),
         "sync, one output token": dict(output_len=1, num_prompts=12, mode="sync"),
         "two output tokens": dict(output_len=2, num_prompts=12),
         # admissions wait for the pool (whole prompts reserved), no request is preempted
         "a queue behind the pool": dict(max_concurrency=None, num_prompts=30, output_len=4,
                                         num_gpu_blocks_override=60),
         "chunked prompts behind the pool": dict(
             max_concurrency=None, num_prompts=30, output_len=4, num_gpu_blocks_override=40,
             max_num_batched_tokens=64),
         "no whole-prompt reservation": dict(
             max_concurrency=None, num_prompts=30, output_len=4, num_gpu_blocks_override=60,
             max_num_batched_tokens=64, scheduler_reserve_full_isl=False),
         # a trace with token ids (and recorded acceptance), no prefix cache to tie them
         "token ids, prefix caching off": dict(CPU, enable_prefix_caching=False),
         }
# where a premise breaks: preemption; prompt token ids under prefix caching
SCHEDULED = {"preemption", "the CPU device, a measured profile with its noise"}


def run(settings: dict, monkeypatch, on: bool) -> tuple[str, list, bool]:
    """The run's result and its recording (turns, sends, columns, counters), and whether the
    paths took it."""
    taken = []
    real = paths.record
    monkeypatch.setattr(paths, "record",
                        lambda *a: taken.append(on and real(*a)) or taken[-1])
    settings = {k: v for k, v in settings.items() if not (k == "draft" and v is None)}
    rec = Recording()
    res = simulate(SimConfig(**settings), recording=rec)[0]
    prog, cols = rec.program, rec.program.columns
    kept = [prog.turns, prog.sent, cols.plan_reqs.tolist(), cols.plan_tokens.tolist(),
            [repr(b) for b in cols.batch_list()],
            {rid: (list(us), ns) for rid, (us, ns) in cols.chunks.items()}, repr(rec.totals)]
    return json.dumps(res, sort_keys=True, default=str), kept, taken == [True]


@pytest.mark.parametrize("case", list(CASES))
def test_request_paths_give_the_scheduler_s_steps(case, monkeypatch):
    if case.startswith(("sharegpt", "async to")) or "pool" in case:   # (in groups of 7)
        monkeypatch.setattr(paths, "GROUP", 7)
    settings = {**BASE, **CASES[case]}
    res, kept, taken = run(settings, monkeypatch, True)
    assert taken == (case not in SCHEDULED)
    own = run(settings, monkeypatch, False)
    assert own[0] == res
    assert own[1] == kept


@pytest.mark.parametrize("lag", [0, 1])
@pytest.mark.parametrize("first", [1.5, 0.01])
def test_a_walk_gives_the_decode_steps_computed_for_all_requests_at_once(lag, first,
                                                                         monkeypatch):
    """Where no step reaches --max-model-len, `_walk`'s steps one by one are those
    `_decodes` computes for every request at once: offsets, tokens, starts, drafts, blocks,
    emitted tokens, the finishing step, the blocks held. So too where the counts drawn first
    fall short for every request (`first`: steps drawn first per token, of a median
    request's), and more are drawn until they do not. In groups of 7 requests: each request's
    rows found in its group's piece (`Decodes.rows`)."""
    from stepgap.common.acceptance import PROFILES, Acceptance
    from stepgap.common.formats import TraceRequest
    rng = np.random.default_rng(7)
    reqs = [TraceRequest(f"r{i}", 0.0, int(rng.integers(1, 300)), int(rng.integers(1, 300)))
            for i in range(60)]
    monkeypatch.setattr(paths, "GROUP", 7)
    for k in (0, 1, 3, 7):
        acc = Acceptance(PROFILES["mtbench"], k, reqs, seed=3)
        run = paths._Run(k, 16, 100_000, 8192, lag, first / acc.mean_length())
        dec = paths._decodes(reqs, acc, run)
        assert dec.contiguous.all()
        for i, tr in enumerate(reqs):
            held0 = -(-(tr.prompt_len + k) // 16)
            w = paths._walk(tr.prompt_len, tr.output_len, held0,
                            acc.first_counts([tr.request_id], [tr.output_len]) if k
                            else None, run)
            off, tokens, starts, drafts, blocks = dec.rows(i)
            emits = slice(dec.emits_at[i], dec.emits_at[i] + dec.emits[i])
            held = dec.held[dec.held_at[i]:dec.held_at[i] + dec.span[i]]
            w_held = np.zeros(w[6] + lag + 1, np.int64)
            w_held[0] = held0
            w_held[w[0]] = w[4]
            for got, want in ((off, w[0]), (tokens, w[1]), (starts, w[2]), (drafts, w[3]),
                              (blocks, w[4]), (dec.e_tokens[emits], w[5]),
                              (dec.finish[i], w[6]), (held, np.maximum.accumulate(w_held))):
                assert np.array_equal(got, want), (k, tr)


def test_pcg64_seeds_are_numpy_s_seed_sequence_s():
    """`pcg64_seeds` gives each row what numpy's SeedSequence gives it, for rows of 1 to 4
    uint32 words, zeros and the largest words among them."""
    from stepgap.common.acceptance import pcg64_seeds
    rng = np.random.default_rng(5)
    for width in (1, 2, 3, 4):
        rows = rng.integers(0, 2**32, (300, width), dtype=np.uint64).astype(np.uint32)
        rows[0], rows[1] = 0, 2**32 - 1
        want = [np.random.SeedSequence(r).generate_state(4, np.uint64).tolist() for r in rows]
        assert pcg64_seeds(rows).tolist() == want


def test_first_counts_are_the_counts_next_draws_one_by_one():
    """`Acceptance.first_counts` gives each request's counts as `next` draws them, a step at a
    time: its recorded counts first, then its own stream (seeded by pcg64_seeds where the seed
    is one uint32 word, the same stream as numpy's from the list of ints), request after
    request in one array."""
    from stepgap.common.acceptance import PROFILES, Acceptance
    from stepgap.common.formats import TraceRequest
    reqs = [TraceRequest(f"r{i}", 0.0, 50, 80, accepted=[3, 0, 2] if i % 9 == 0 else None)
            for i in range(20)]
    acc = Acceptance(PROFILES["mtbench"], 3, reqs, seed=2**32 - 1)
    # (the last two seeds are numpy's to seed: more than one uint32 word)
    for seed in (0, 2**32 - 1, 2**32, 2**70):
        one = Acceptance(PROFILES["mtbench"], 3, reqs, seed=seed)
        for i in (0, 4, 19):
            assert one._generator(f"r{i}").random(4).tolist() == \
                np.random.default_rng([seed, 1, i]).random(4).tolist()
    rows = [1, 2, 3, 70, 130] * 4
    got = acc.first_counts([tr.request_id for tr in reqs], rows)
    one_by_one = Acceptance(PROFILES["mtbench"], 3, reqs, seed=2**32 - 1)
    for tr, n, counts in zip(reqs, rows, np.split(got, np.cumsum(rows)[:-1])):
        assert counts.tolist() == [one_by_one.next(tr.request_id, 3) for _ in range(n)]
