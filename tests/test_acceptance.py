"""One acceptance model for both halves (common/acceptance.py): the simulator's draws and the
engine's synthetic acceptance are the same model, beyond the given rates too."""

import math

import pytest

from stepgap.common.acceptance import PROFILES, AcceptanceProfile
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
