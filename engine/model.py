"""A Llama target in plain torch: RMSNorm, RoPE (llama3 or linear scaling), GQA, SwiGLU.

The forward runs over a flattened batch of tokens (every request's chunk, concatenated) with the
attention metadata in `kv_cache.get_context()`; with no context it runs one causal sequence with
no cache (the training and reference path). It returns the final hidden states and, for EAGLE-3,
the residual-stream inputs of the aux layers (by default 2, L/2 and L-3), concatenated.

q/k/v and gate/up projections are fused, as in vLLM and nano-vllm; `checkpoint.py` maps the
Hugging Face tensor names onto them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from stepgap.engine.kv_cache import dense_causal_attention, get_context, paged_attention
from stepgap.common.modelcfg import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float() if dtype != torch.float64 else x
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies, with llama3 or linear scaling, computed as Hugging Face does."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind == "linear":
        return inv / scaling["factor"]
    if kind != "llama3":
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rope(nn.Module):
    """cos/sin tables for positions [0, max_positions), rotate-half convention."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int):
        super().__init__()
        inv = rope_inv_freq(head_dim, theta, scaling)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions, q, k):
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)  # [N, 1, D]
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, rope: Rope):
        super().__init__()
        self.h, self.hkv, self.d = num_heads, num_kv_heads, head_dim
        self.qkv_proj = nn.Linear(in_dim, (num_heads + 2 * num_kv_heads) * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, out_dim, bias=False)
        self.rope = rope
        self.scale = head_dim ** -0.5
        self.k_cache = self.v_cache = None  # set by the worker when it allocates the KV cache

    def forward(self, positions, x):
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q, k = self.rope(positions, q.view(n, self.h, self.d), k.view(n, self.hkv, self.d))
        v = v.view(n, self.hkv, self.d)
        ctx = get_context()
        if ctx is None:
            o = dense_causal_attention(q, k, v, positions, self.scale)
        else:
            o = paged_attention(q, k, v, self.k_cache, self.v_cache, ctx, self.scale)
        return self.o_proj(o.reshape(n, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(dim, 2 * hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: Rope):
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Attention(h, h, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, rope)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size)

    def forward(self, positions, x):
        x = x + self.self_attn(positions, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig, aux_layers: tuple[int, ...] | None = None,
                 max_positions: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.aux_layers = tuple(aux_layers if aux_layers is not None else cfg.default_aux_layers())
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                         max_positions or cfg.max_position_embeddings)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self.rope) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else \
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, positions, return_aux: bool = True):
        """Returns (final normed hidden [N, H], aux hidden [N, len(aux_layers) * H] or None)."""
        x = self.embed_tokens(input_ids)
        aux = []
        for i, layer in enumerate(self.layers):
            if return_aux and i in self.aux_layers:
                aux.extend(x for j in self.aux_layers if j == i)
            x = layer(positions, x)
        return self.norm(x), (torch.cat(aux, dim=-1) if return_aux else None)

    def compute_logits(self, h):
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.layers]


def init_weights(module: nn.Module, std: float = 0.02, seed: int | None = None) -> None:
    """Random weights as Hugging Face initializes a Llama: N(0, std) matrices, unit norms."""
    gen = None
    if seed is not None:
        gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)
