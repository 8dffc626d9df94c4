"""The sync engine end to end: lossless speculative decoding, acceptance, sampling, records.

The engine runs in float64 here, so that batching a request with different neighbours (or
verifying 1 + k tokens instead of 1) cannot flip a near-tie of the greedy argmax: equality of
token ids then tests the algorithm, not rounding.
"""

import math

import pytest

from stepgap.common.formats import OPS, SIM_ONLY_OPS, VLLM_OPS, TraceRequest
from stepgap.engine.sampler import SamplingConfig
from tests.helpers import REQS, assert_lossless, inline_executor, run


def test_target_alone_matches_the_reference_greedy_decoder():
    assert_lossless(run(inline_executor(), REQS, k=0))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_spec_decode_output_equals_the_targets_greedy_output(k):
    out = run(inline_executor(), REQS, k=k)
    assert_lossless(out)
    assert out.result["spec_decode"]["num_accepted_tokens"] > 0


@pytest.mark.parametrize("k", [1, 3, 5])
def test_lossless_under_preemption(k):
    # 12 blocks of 16 tokens for four running requests of up to ~100 tokens: some are preempted
    # and recomputed.
    out = run(inline_executor(), REQS, k=k, num_blocks=12)
    assert out.result["config"]["num_preemptions"] > 0
    assert_lossless(out)


def test_lossless_with_chunked_prefill():
    out = run(inline_executor(), REQS, k=3, max_num_batched_tokens=24)
    assert_lossless(out)


def test_acceptances_happen_at_every_draft_position():
    out = run(inline_executor(), REQS, k=5)
    spec = out.result["spec_decode"]
    assert all(r > 0 for r in spec["acceptance_rate_per_pos"])
    assert spec["acceptance_rate"] < 1.0  # and rejections too: both paths run
    per_request = out.accepted
    assert sum(len(v) for v in per_request.values()) == spec["num_drafts"]


def test_random_sampling_matches_direct_sampling():
    # The same prompt 300 times; the tokens of the first speculative step (k = 2) must follow
    # the same distribution as sampling the target directly (k = 0). Two-sample chi-square on
    # the second output token, which a spec step emits as an accepted draft, a residual sample
    # or a bonus sample.
    prompt = [7, 300, 12, 45, 99, 3]
    reqs = [TraceRequest(f"s{i}", 0.0, len(prompt), 3, prompt) for i in range(300)]
    sampling = dict(temperature=0.8, top_k=6)
    direct = run(inline_executor(), reqs, k=0, max_num_seqs=64,
                 sampling=SamplingConfig(**sampling, seed=1))
    spec = run(inline_executor(), reqs, k=2, max_num_seqs=64,
               sampling=SamplingConfig(**sampling, seed=2))
    assert spec.result["spec_decode"]["num_accepted_tokens"] > 0
    a = [tuple(v[:2]) for v in direct.output_token_ids.values()]
    b = [tuple(v[:2]) for v in spec.output_token_ids.values()]
    assert two_sample_p(a, b) > 1e-3


def two_sample_p(a: list, b: list) -> float:
    """p-value of a two-sample chi-square test of two lists of categorical outcomes."""
    cats = sorted(set(a) | set(b))
    stat, dof = 0.0, 0
    na, nb = len(a), len(b)
    for c in cats:
        ca, cb = a.count(c), b.count(c)
        if ca + cb < 5:
            continue
        ea, eb = (ca + cb) * na / (na + nb), (ca + cb) * nb / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
        dof += 1
    dof = max(dof - 1, 1)
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_run_result_has_the_benchmark_keys_and_acceptance():
    out = run(inline_executor(), REQS, k=3, detailed=True)
    res = out.result
    for key in ("completed", "duration", "mean_ttft_ms", "p99_tpot_ms", "median_itl_ms",
                "mean_e2el_ms", "output_throughput", "step_gaps", "spec_decode", "config"):
        assert key in res
    assert res["completed"] == len(REQS)
    assert res["output_lens"] == [r.output_len for r in REQS]
    assert res["output_token_ids"] == [out.output_token_ids[r.request_id] for r in REQS]
    assert all(1 <= n <= 4 for chunks in res["chunk_tokens"] for n in chunks)
    assert res["step_gaps"]["count"] > 0
    assert res["spec_decode"]["acceptance_length"] > 1.0


def test_timeline_has_every_op_on_its_lane():
    out = run(inline_executor(), REQS, k=3)
    seen = {(s.lane, s.op) for s in out.spans}
    # fixup: zero-bubble only; wait: a GPU only; SIM_ONLY_OPS: methods and TP the engine
    # lacks; VLLM_OPS: served and vLLM timelines only
    want = {(lane, op) for lane, ops in OPS.items() for op in ops
            if op not in ("fixup", "wait", *SIM_ONLY_OPS) and (lane, op) not in VLLM_OPS}
    assert want <= seen
    drafts = {s.args["i"] for s in out.spans if s.op == "draft_forward"}
    assert drafts == {0, 1, 2}
    for s in out.spans:
        assert s.end_us >= s.start_us >= 0


def test_chunks_are_timed_when_emitted():
    out = run(inline_executor(), REQS[:3], k=2, detailed=True)
    res = out.result
    assert all(t > 0 for t in res["ttfts"])
    assert all(i >= 0 for itls in res["itls"] for i in itls)
    assert res["mean_e2el_ms"] / 1000 <= res["duration"]
