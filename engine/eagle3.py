"""The EAGLE-3 draft head: one Llama decoder layer over [token embedding ‖ fused hidden state].

- `fc` fuses the target's three aux hidden states (3·H_target → H) for the first draft step;
- the layer normalizes the embedding (`input_layernorm`) and the hidden state (`hidden_norm`),
  concatenates them (2·H) into the attention's q/k/v projection, and keeps the hidden state as
  the residual (or its normed form, with `norm_before_residual`);
- the pre-norm output (residual + MLP) is fed back as the hidden state of steps 2..k;
- `lm_head` scores the draft vocabulary, and `d2t[i]` is the offset that maps draft id i to the
  target id i + d2t[i].

Drafting is greedy. The head shares the target's token embedding unless its checkpoint has one.
"""

from __future__ import annotations

import torch
from torch import nn

from stepgap.engine.model import MLP, Attention, RMSNorm, Rope
from stepgap.common.model_heads import EagleHeadConfig


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: EagleHeadConfig, rope: Rope):
        super().__init__()
        h = cfg.hidden_size
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Attention(2 * h, h, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, rope)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size)

    def forward(self, positions, embeds, hidden):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        residual = residual + self.self_attn(positions, x)
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Head(nn.Module):
    def __init__(self, cfg: EagleHeadConfig, target_hidden_size: int,
                 max_positions: int | None = None, own_embedding: bool = False):
        super().__init__()
        self.cfg = cfg
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                         max_positions or cfg.max_position_embeddings)
        self.fc = nn.Linear(3 * target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg, self.rope)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        # Shared with the target (set by the loader) unless the checkpoint brings its own.
        self.owns_embedding = own_embedding
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if own_embedding else None

    def combine(self, aux_hidden):
        """The first step's hidden state: fc over the three target hidden states."""
        return self.fc(aux_hidden)

    def forward(self, input_ids, positions, hidden):
        """Pre-norm output [N, H]: fed back as the next step's hidden state."""
        return self.midlayer(positions, self.embed_tokens(input_ids), hidden)

    def draft_logits(self, prenorm):
        return self.lm_head(self.norm(prenorm))

    def propose(self, prenorm):
        """Greedy draft tokens, as target vocabulary ids."""
        best = self.draft_logits(prenorm).argmax(dim=-1)
        return best + self.d2t[best]

    def attention_layers(self) -> list[Attention]:
        return [self.midlayer.self_attn]

