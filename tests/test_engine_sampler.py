"""The rejection sampler: greedy, random (checked statistically) and synthetic."""

import math

import pytest
import torch

import tests.helpers  # noqa: F401  (one torch thread)

from stepgap.engine.sampler import SamplingConfig, rejection_sample, target_probs
from stepgap.common.errors import UserError


def logits_for(rows):
    """Logits [B, 1+k, V] whose argmax at each position is the given token."""
    t = torch.tensor(rows)
    out = torch.zeros(*t.shape, 8)
    out.scatter_(-1, t.unsqueeze(-1), 5.0)
    return out


def test_greedy_accepts_matching_prefix_then_emits_the_target_token():
    logits = logits_for([[3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 5, 6]])
    drafts = torch.tensor([[3, 4, 5], [3, 7, 5], [1, 4, 5]])
    tokens, acc = rejection_sample(logits, drafts, torch.tensor([3, 3, 3]), SamplingConfig())
    assert acc.tolist() == [3, 1, 0]
    assert [t[:a + 1] for t, a in zip(tokens.tolist(), acc.tolist())] == \
        [[3, 4, 5, 6], [3, 4], [3]]


def test_rows_verify_only_their_real_drafts():
    logits = logits_for([[3, 4, 5, 6], [2, 4, 5, 6]])
    drafts = torch.tensor([[3, 4, 5], [4, 5, 6]])
    tokens, acc = rejection_sample(logits, drafts, torch.tensor([1, 0]), SamplingConfig())
    assert acc.tolist() == [1, 0]  # row 0: one real draft, then its bonus; row 1: a prefill
    assert tokens[0, :2].tolist() == [3, 4] and tokens[1, 0].item() == 2


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of counts against probabilities (Wilson-Hilferty)."""
    n = counts.sum()
    keep = probs > 0
    expected = probs[keep] * n
    stat = (((counts[keep] - expected) ** 2) / expected).sum().item()
    dof = int(keep.sum()) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("num_spec", [1, 3])
def test_random_sampling_keeps_the_target_distribution(num_spec):
    # A small vocabulary; the draft proposes the same tokens in every row, some likely under the
    # target and some not. Speculative sampling must emit, at each position, the target's p.
    gen = torch.Generator().manual_seed(1)
    v, k, rows = 6, 3, 60_000
    base = torch.randn(k + 1, v, generator=gen) * 1.5
    logits = base.expand(rows, k + 1, v)
    likely, unlikely = base.argmax(-1), base.argmin(-1)
    drafts = torch.stack([likely[0], unlikely[1], likely[2]]).expand(rows, k)
    cfg = SamplingConfig(temperature=1.0, seed=0)
    tokens, acc = rejection_sample(logits, drafts, torch.full((rows,), num_spec), cfg, gen)
    p = target_probs(base, cfg)
    first = torch.bincount(tokens[:, 0], minlength=v).float()
    assert chi_square_p(first, p[0]) > 1e-3
    # Given the first draft was accepted, the next token follows p at position 1.
    took = acc >= 1
    second = torch.bincount(tokens[took, 1], minlength=v).float()
    assert chi_square_p(second, p[1]) > 1e-3
    assert 0.3 < took.float().mean().item() < 0.99  # both paths were exercised
    assert (acc <= num_spec).all()


def test_random_sampling_detects_a_wrong_distribution():
    # The same test must reject a sampler that ignores rejections (emits the draft always).
    p = torch.tensor([0.5, 0.3, 0.2])
    biased = torch.tensor([30000.0, 20000.0, 10000.0])
    assert chi_square_p(biased, p) < 1e-6


def test_top_k_and_top_p_restrict_the_distribution():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    p = target_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[4 / 7, 3 / 7, 0, 0]]))
    p = target_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([[4 / 9, 3 / 9, 2 / 9, 0]]))


def test_synthetic_rates_set_per_position_acceptance():
    # The engine core draws the counts (the simulator's model); the sampler then forces them.
    from stepgap.common.formats import TraceRequest
    from stepgap.engine.loop import EngineConfig, acceptance_plans
    reqs = [TraceRequest(f"r{i}", 0.0, 4, 20) for i in range(2000)]
    plans = acceptance_plans(reqs, EngineConfig(k=3, sampling=SamplingConfig(
        synthetic=(0.8, 0.5, 0.2))))
    acc = torch.tensor([a for r in reqs for a in plans[r.request_id]])
    per_pos = [(acc > j).float().mean().item() for j in range(3)]
    assert per_pos == pytest.approx([0.8, 0.5, 0.2], abs=0.01)
    logits = torch.zeros(len(acc), 4, 8)
    _, got = rejection_sample(logits, torch.randint(0, 8, (len(acc), 3)),
                              torch.full((len(acc),), 3), SamplingConfig(replay=True),
                              forced=acc)
    assert torch.equal(got, acc)


def test_replay_accepts_the_recorded_counts_within_each_rows_drafts():
    logits = torch.zeros(3, 4, 8)
    tokens, acc = rejection_sample(logits, torch.tensor([[1, 2, 3]] * 3), torch.tensor([3, 3, 1]),
                                   SamplingConfig(replay=True), forced=torch.tensor([2, 0, 3]))
    assert acc.tolist() == [2, 0, 1]
    assert tokens[0, :2].tolist() == [1, 2]


@pytest.mark.parametrize("kwargs, field", [({"temperature": -1}, "--temperature"),
                                           ({"top_p": 0.0}, "--top-p"),
                                           ({"synthetic": (0.5, 0.7)}, "cannot increase")])
def test_bad_sampling_settings_are_user_errors(kwargs, field):
    with pytest.raises(UserError, match=field):
        SamplingConfig(**kwargs)
