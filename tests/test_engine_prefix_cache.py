"""The engine reuses cached KV (automatic prefix caching, common/scheduler.py): its greedy
output is the same with caching on and off, blocks are never leaked, and it finds exactly the
hits the simulator finds on the same trace."""

import json

import pytest

from stepgap.common.formats import TraceRequest
from stepgap.common.workloads import prefix_repetition
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from tests.helpers import inline_executor, run, tiny_checkpoints

VOCAB = 512   # the tiny target's


def shared(n: int = 12, prefix: int = 40, suffix: int = 9, groups: int = 3, out: int = 12):
    reqs = prefix_repetition(n, out, seed=1, prefix_len=prefix, suffix_len=suffix,
                             num_prefixes=groups, vocab_size=VOCAB)
    return reqs


@pytest.fixture(scope="module")
def executor():
    return inline_executor()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("k", [0, 3])
def test_greedy_output_is_the_same_with_caching_on_and_off(executor, mode, k):
    reqs = shared()
    on = run(executor, reqs, mode=mode, k=k, enable_prefix_caching=True)
    off = run(executor, reqs, mode=mode, k=k, enable_prefix_caching=False)
    assert on.output_token_ids == off.output_token_ids
    pc = on.result["config"]["prefix_cache"]
    assert pc["hits"] > 0
    assert "prefix_cache" not in off.result["config"]
    assert on.num_free_blocks == on.num_blocks and off.num_free_blocks == off.num_blocks


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("k", [0, 3])
def test_preempted_requests_resume_from_their_cached_blocks_losslessly(executor, mode, k):
    reqs = [TraceRequest(f"p{i}", 0.0, 60 + 5 * i, 40) for i in range(6)]
    small = dict(num_blocks=20, max_num_seqs=4, max_num_batched_tokens=64)
    on = run(executor, reqs, mode=mode, k=k, enable_prefix_caching=True, **small)
    off = run(executor, reqs, mode=mode, k=k, enable_prefix_caching=False, **small)
    assert on.result["config"]["num_preemptions"] > 0
    assert on.output_token_ids == off.output_token_ids
    assert on.num_free_blocks == on.num_blocks


def test_the_engine_finds_the_hits_the_simulator_finds(executor, tmp_path):
    paths = tiny_checkpoints()
    reqs = shared(n=16, prefix=48, groups=4)
    eng = run(executor, reqs, mode="async", k=3, max_num_seqs=4, enable_prefix_caching=True)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in reqs))
    sim, _ = simulate(SimConfig(workload=str(trace), mode="async", k=3, max_num_seqs=4,
                                num_gpu_blocks_override=512, max_model_len=512,
                                model=paths["target"], draft=paths["eagle3-yuhuili"]))
    assert eng.result["config"]["prefix_cache"]["hits"] == \
        sim["config"]["resolved"]["prefix_cache"]["hits"] > 0
