"""One acceptance model for both halves (common/acceptance.py): the simulator's draws and the
engine's synthetic acceptance are the same model, beyond the given rates too."""

import math

import pytest

from stepgap.common.acceptance import PROFILES, Acceptance, AcceptanceProfile
from stepgap.common.formats import TraceRequest
from stepgap.engine.args import EngineArgs
from stepgap.engine.loop import run_trace
from stepgap.engine.sampler import SamplingConfig
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate

RATES = (0.8, 0.5)     # given for two positions; k = 4 goes beyond them
K = 4
REQS = [TraceRequest(f"r{i}", 0.0, 8 + i % 5, 60) for i in range(32)]


def conditionals(per_pos: list[float]) -> list[float]:
    return [r / p for r, p in zip(per_pos, [1.0, *per_pos[:-1]])]


@pytest.fixture(scope="module")
def both():
    ea = EngineArgs(model="tiny", draft="tiny-eagle3", k=K, num_gpu_blocks_override=400,
                    max_model_len=128, max_num_seqs=8, sampling=SamplingConfig(synthetic=RATES))
    with ea.make_executor() as ex:
        engine = run_trace(ex, REQS, ea.engine_config(), vocab_size=512, max_concurrency=8)
    sim, _ = simulate(SimConfig(k=K, acceptance_rates=RATES, model="llama-3.2-1b", gpu="h100",
                                max_concurrency=8, max_model_len=128), REQS)
    return engine.result["spec_decode"], sim["spec_decode"]


def test_the_last_given_rate_s_conditional_carries_on():
    assert AcceptanceProfile("x", RATES).conditional(K) == pytest.approx([0.8, 0.625, 0.625,
                                                                          0.625])


def test_both_halves_accept_with_the_same_conditionals_beyond_the_given_rates(both):
    for spec in both:
        n = spec["num_drafts"]
        assert n > 400
        got = conditionals(spec["acceptance_rate_per_pos"])
        for want, c, reached in zip([0.8, 0.625, 0.625, 0.625], got,
                                    [1.0, *spec["acceptance_rate_per_pos"][:-1]]):
            se = math.sqrt(want * (1 - want) / (n * reached))
            assert abs(c - want) < 4 * se, (got, spec)


def test_both_halves_have_the_same_mean_acceptance(both):
    engine, sim = both
    expected = AcceptanceProfile("x", RATES).acceptance_length(K)   # 1 + 0.8 + 0.5 + ...
    se = 1.5 / math.sqrt(engine["num_drafts"])
    assert engine["acceptance_length"] == pytest.approx(sim["acceptance_length"], abs=3 * se)
    assert engine["acceptance_length"] == pytest.approx(expected, abs=4 * se)
    # the same draws, in fact: the same requests, k and seed give the same counts
    assert engine["num_accepted_tokens"] == sim["num_accepted_tokens"]


def test_the_engine_applies_a_profile_s_per_request_spread():
    ea = EngineArgs(model="tiny", draft="tiny-eagle3", k=3, num_gpu_blocks_override=400,
                    max_model_len=128, max_num_seqs=8,
                    sampling=SamplingConfig(synthetic=PROFILES["mtbench"]))
    with ea.make_executor() as ex:
        out = run_trace(ex, REQS, ea.engine_config(), vocab_size=512, max_concurrency=8)
    means = sorted(sum(a) / len(a) for a in out.accepted.values())
    assert means[-1] - means[0] > 0.8     # spread 0.5 on the logit scale: easy and hard requests


# -- by dataset (common/acceptance.py DATASETS) ---------------------------------------------

DS = dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=3, num_prompts=2,
          output_len=16)


def test_a_workload_picks_its_datasets_acceptance_and_the_result_says_which():
    from stepgap.sim.plan import resolve
    for workload, dataset in (("random", "random"), ("mtbench", "mtbench"),
                              ("sharegpt", "sharegpt")):
        r = resolve(SimConfig(**DS, workload=workload))
        assert any(f"for the {dataset} dataset (the workload {workload})" in n for n in r.notes)


def test_a_trace_takes_mtbench_and_asks_for_its_dataset(tmp_path):
    from stepgap.sim.plan import resolve
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"request_id": "a", "arrival_s": 0, "prompt_len": 8, "output_len": 8}\n')
    notes = resolve(SimConfig(**DS, workload=str(trace))).notes
    assert any("mtbench dataset" in n and "give --acceptance-dataset" in n for n in notes)


@pytest.mark.parametrize("dataset, ratio", [("math", 1.04), ("sharegpt", 0.98), ("mtbench", 1.0)])
def test_a_drafter_models_dataset_scales_its_mtbench_length_at_k3(dataset, ratio):
    from stepgap.sim.plan import resolve
    r = resolve(SimConfig(**DS, acceptance_dataset=dataset))
    assert r.profile.acceptance_length(3) == pytest.approx(
        ratio * PROFILES["mtbench"].acceptance_length(3), rel=1e-6)


def test_the_dataset_band_spans_the_published_spread_for_that_dataset():
    from stepgap.common.acceptance import DATASETS
    from stepgap.sim.bands import band_inputs
    inp = {i.name: i for i in band_inputs(SimConfig(**DS, acceptance_dataset="code").to_dict())}
    mt = PROFILES["mtbench"].acceptance_length(3)
    lengths = [1 + sum(inp["dataset"].settings({}, end)["acceptance_rates"][:3])
               for end in ("low", "high")]
    _, low, high = DATASETS["code"].ratio
    assert lengths == pytest.approx([low * mt, high * mt], rel=1e-6)


def test_ngram_takes_the_datasets_own_matching_profile():
    from stepgap.sim.plan import resolve
    settings = {**DS, "draft": None, "method": "ngram"}
    code = resolve(SimConfig(**settings, acceptance_dataset="code")).profile
    math_ = resolve(SimConfig(**settings, acceptance_dataset="math")).profile
    assert (code.name, math_.name) == ("sdb-ngram-instructcoder", "sdb-ngram-gsm8k")
    assert code.acceptance_length(3) > 1.5 > 1.2 > math_.acceptance_length(3)


def test_a_requests_draws_count_the_leading_accepted_positions_of_its_own_stream():
    """Each decode step's count is the number of positions accepted before the first one
    rejected, from the request's own seeded uniforms against its rates (counted here a position
    at a time), and at most the drafts the step verified."""
    import numpy as np
    profile = AcceptanceProfile(name="t", rates=(0.9, 0.7, 0.5, 0.3), spread=0.5)
    reqs = [TraceRequest(f"r{i}", 0.0, 8, 300) for i in range(5)]
    acc = Acceptance(profile, K, reqs, seed=7)
    for i, r in enumerate(reqs):
        u = np.random.default_rng([7, 1, i]).random((2 * Acceptance.BLOCK, K))
        rates = acc.rates_for(r.request_id)
        want = [next((j for j in range(K) if not row[j] < rates[j]), K) for row in u]
        assert [acc.next(r.request_id, K) for _ in want] == want
    assert acc.next("r0", 1) <= 1
