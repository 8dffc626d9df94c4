"""The rejection sampler: greedy, random and synthetic, with no host sync inside.

Each row (request) brings the target's logits at its 1 + k verify positions and its k draft
tokens, of which the first `num_spec` are real (0 for a prefill chunk). With a greedy draft the
draft distribution is one-hot, so speculative sampling reduces to:

- greedy (temperature 0): accept draft j while it equals the target's argmax; then emit the
  target's argmax at the first mismatch (or the bonus position k);
- random: accept draft x at position j with probability p_j(x) (accept if p_j(x) >= u); at the
  first rejection emit a sample of the residual, p_j with x removed and renormalized; if all are
  accepted, emit a bonus sample of p_k. p is the target's distribution after temperature, top-k
  and top-p;
- forced: accept a given number of drafts per row (`forced`), while the real target and draft
  still run. The emitted tokens are the drafts and the target's sample after them, so timing is
  real and only acceptance is scripted. The counts are a replay of recorded ones, or synthetic:
  drawn by the engine core from an acceptance profile (common/acceptance.py, the simulator's own
  model), so that both halves accept alike.

Sampling draws use the exponential trick (argmax p / E, E ~ Exp(1)), as gpt-fast does.
"""

from __future__ import annotations

import torch

from stepgap.engine.sampling_params import SamplingConfig


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The target's sampling distribution: temperature, then top-k, then top-p. [..., V] float32."""
    logits = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = logits.topk(cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= cfg.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _draw(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    e = torch.empty_like(probs).exponential_(1.0, generator=gen)
    return (probs / e).argmax(dim=-1)


def _uniform(shape, device, gen) -> torch.Tensor:
    return torch.rand(shape, device=device, generator=gen)


def rejection_sample(logits: torch.Tensor, drafts: torch.Tensor, num_spec: torch.Tensor,
                     cfg: SamplingConfig, gen: torch.Generator | None = None,
                     forced: torch.Tensor | None = None):
    """Verify drafts and sample. Returns (tokens [B, 1 + k], num_accepted [B]).

    logits [B, 1 + k, V] at each row's verify positions; drafts [B, k] target ids; num_spec [B]
    real drafts per row; forced [B] accepted counts (replayed or synthetic), which replace the
    comparison with the target. A row emits tokens[:a + 1] where a = num_accepted.
    """
    b, width, _ = logits.shape
    k = width - 1
    device = logits.device
    if cfg.greedy:
        probs = None
        samples = logits.argmax(dim=-1)
    else:
        probs = target_probs(logits, cfg)
        samples = _draw(probs, gen)  # the bonus (and, synthetic, the post-draft) samples
    if k == 0:
        return samples, torch.zeros(b, dtype=torch.long, device=device)
    j = torch.arange(k, device=device)
    real = j.unsqueeze(0) < num_spec.unsqueeze(1)
    if forced is not None:
        match = j.unsqueeze(0) < forced.unsqueeze(1)
    elif probs is None:
        match = drafts == samples[:, :k]
    else:
        p_draft = probs[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        match = p_draft >= 1.0 - _uniform((b, k), device, gen)  # u in (0, 1]: P(accept) = p(x)
        # At a rejection, emit a sample of the residual: p with the rejected draft removed. Past a
        # row's real drafts, the position is its bonus: a sample of p itself.
        residual = probs[:, :k].scatter(-1, drafts.unsqueeze(-1), 0.0)
        residual = torch.where(real.unsqueeze(-1), residual, probs[:, :k])
        samples = torch.cat([_draw(residual, gen), samples[:, k:]], dim=1)
    num_accepted = (match & real).long().cumprod(dim=1).sum(dim=1)
    tokens = torch.where(j.unsqueeze(0) < num_accepted.unsqueeze(1), drafts, samples[:, :k])
    return torch.cat([tokens, samples[:, k:]], dim=1), num_accepted
