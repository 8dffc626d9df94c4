"""Automatic prefix caching in the shared scheduler (vLLM V1's semantics) and vLLM's
scheduler_reserve_full_isl admission: hits, LRU eviction, self-hits after a preemption, no
leaked blocks, and the simulator's requests each finishing with exactly their tokens."""

import pytest

from stepgap.common.scheduler import Request, Scheduler, SchedulerConfig
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from tests.test_scheduler import drive, full, none

BS = 16


def cfg(**kw):
    return SchedulerConfig(**{"num_blocks": 64, "block_size": BS, "max_num_seqs": 8,
                              "max_num_batched_tokens": 512, "max_model_len": 1024,
                              "enable_prefix_caching": True, **kw})


def finish(s: Scheduler, out):
    """Apply one step's output: one token per sampling request."""
    return s.update_from_output(out, {x.request.request_id: [7] for x in out.scheduled
                                      if x.samples})


def run_alone(s: Scheduler, req: Request):
    s.add_request(req)
    while req.request_id in s.requests:
        finish(s, s.schedule())


def test_a_second_request_with_the_same_prompt_reuses_its_full_blocks():
    s = Scheduler(cfg())
    prompt = list(range(100))   # 6 full blocks and 4 tokens
    run_alone(s, Request("a", 100, 5, prompt))
    s.add_request(Request("b", 100, 5, list(prompt)))
    out = s.schedule()
    (b,) = out.scheduled
    assert (b.start, b.num_new_tokens) == (6 * BS, 100 - 6 * BS)   # 96 tokens hit
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (200, 96)


def test_at_least_the_last_token_is_computed_even_when_every_block_is_cached():
    s = Scheduler(cfg())
    prompt = list(range(64))   # exactly 4 blocks
    run_alone(s, Request("a", 64, 3, prompt))
    s.add_request(Request("b", 64, 3, list(prompt)))
    (b,) = s.schedule().scheduled
    assert (b.start, b.num_new_tokens) == (3 * BS, BS)   # the last block is recomputed


def test_a_different_prompt_shares_only_its_common_leading_blocks():
    s = Scheduler(cfg())
    run_alone(s, Request("a", 80, 2, list(range(80))))
    other = list(range(40)) + [999] * 40   # diverges inside block 2 (tokens 32..47)
    s.add_request(Request("b", 80, 2, other))
    (b,) = s.schedule().scheduled
    assert b.start == 2 * BS


def test_freed_blocks_are_evicted_least_recently_freed_first_and_tail_first():
    s = Scheduler(cfg(num_blocks=8))
    run_alone(s, Request("a", 64, 1, list(range(64))))          # a: blocks 0-4, freed
    run_alone(s, Request("x", 40, 1, [500 + i for i in range(40)]))   # takes 3 blocks: the
    # fresh 5, 6, 7 first, so a's cached blocks are all still there
    s.add_request(Request("b", 64, 1, list(range(64))))
    assert s.schedule().scheduled[0].start == 3 * BS
    s = Scheduler(cfg(num_blocks=6))
    run_alone(s, Request("a", 64, 1, list(range(64))))          # blocks 0-4 (a 5th for the
    # output token), 1 fresh left; freed tail first: 4, 3, 2, 1, 0
    run_alone(s, Request("y", 40, 1, [500 + i for i in range(40)]))   # 3 blocks: fresh 5,
    # then a's tail blocks 4 and 3 are evicted; its prefix (0, 1, 2) survives
    s.add_request(Request("b", 64, 1, list(range(64))))
    assert s.schedule().scheduled[0].start == 3 * BS


def test_a_preempted_request_finds_its_own_blocks_again_without_token_ids():
    c = cfg(num_blocks=12, max_num_batched_tokens=64, max_num_seqs=4)
    reqs = [("a", 60, 60), ("b", 60, 60)]
    s, chunks, _ = drive(c, reqs, none)
    assert s.num_preemptions > 0
    assert s.preempted_hits > 0
    assert {rid: sum(ch) for rid, ch in chunks.items()} == {"a": 60, "b": 60}


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("k", [0, 3])
def test_no_block_leaks_and_every_request_gets_exactly_its_tokens(async_, k):
    c = cfg(num_blocks=40, max_num_batched_tokens=96, max_num_seqs=6, num_spec_tokens=k,
            async_scheduling=async_)
    reqs = [(f"r{i}", 30 + 7 * (i % 3), 20 + i) for i in range(12)]   # shared prompts
    s, chunks, _ = drive(c, reqs, full if k else none)
    assert {rid: sum(ch) for rid, ch in chunks.items()} == {r: n for r, _, n in reqs}
    assert s.num_free_blocks == c.num_blocks and not s.pool.refs
    assert s.prefix_cache_hits > 0


def test_a_request_whose_whole_sequence_cannot_fit_waits_though_its_first_chunk_could():
    def admitted(reserve):
        s = Scheduler(SchedulerConfig(num_blocks=20, block_size=BS, max_num_seqs=4,
                                      max_num_batched_tokens=64, max_model_len=1024,
                                      scheduler_reserve_full_isl=reserve))
        s.add_request(Request("small", 150, 100))   # holds 10 blocks after its prefill
        for _ in range(3):
            finish(s, s.schedule())
        s.add_request(Request("big", 200, 1))   # 13 blocks in all; its first chunk 4
        return [x.request.request_id for x in s.schedule().scheduled]
    assert admitted(True) == ["small"] and admitted(False) == ["small", "big"]


def test_the_simulator_counts_hits_and_finishes_every_request_with_caching_on(tmp_path):
    import json
    trace = tmp_path / "t.jsonl"
    prompt = list(range(200))
    trace.write_text("".join(json.dumps({"request_id": f"q{i}", "arrival_s": 0.01 * i,
                                         "prompt_len": 200, "output_len": 30,
                                         "prompt_token_ids": prompt}) + "\n"
                             for i in range(20)))
    on, _ = simulate(SimConfig(workload=str(trace), enable_prefix_caching=True, detailed=True))
    off, _ = simulate(SimConfig(workload=str(trace), enable_prefix_caching=False, detailed=True))
    pc = on["config"]["resolved"]["prefix_cache"]
    assert pc["queries"] == 20 * 200 and pc["hits"] == 19 * 12 * BS   # 12 full blocks each
    assert on["output_lens"] == off["output_lens"] == [30] * 20
    assert on["mean_ttft_ms"] < off["mean_ttft_ms"]
