"""The paged KV cache: block tables, slot mapping, and attention over paged blocks.

Every attention layer (the target's L layers and the EAGLE-3 head's one) owns a key and a value
tensor of shape [num_blocks + 1, block_size, num_kv_heads, head_dim] (`--block-size`, 16 by
default as in vLLM). Block ids come from the
shared scheduler's block pool, and one block table per request serves all layers, as in vLLM.
The extra last block is a scratch block: padded tokens (CUDA-graph batch padding, drafts of rows
that do not sample) write there, so no real slot is ever touched by them.

Kernel path: gather, then SDPA. For each request, its blocks are gathered through the block table
into a dense [T = W * block_size] key/value window, the queries are laid out as a padded [batch, Q]
grid, and `torch.nn.functional.scaled_dot_product_attention` runs with an additive mask that lets a
query at position p see keys at positions <= p. Grouped-query attention folds the G query heads of
each KV head into the query axis, so KV is never repeated. Why: it is plain torch, so the same code
runs on the CPU and on CUDA; every index it needs is computed on the device from positions and block
tables, so it runs with no host sync and can be captured in a CUDA graph at fixed (batch, W)
buckets; and the zero-bubble fix-up only has to correct positions. What it costs: the gather copies
each request's window once per layer, and the padded grid wastes attention work on mixed batches (a
long prefill chunk next to decodes). At decode the copy is a few percent of the weight traffic for
contexts up to ~2k; docs/explanation/engine.md has the numbers.

The attention metadata travels in a small `Context`, set once per forward (as nano-vllm does).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from stepgap.common.scheduler import BLOCK_SIZE   # tokens per block by default, as vLLM's


@dataclass(slots=True)
class Context:
    """Attention metadata of one forward over a flattened batch of N tokens in B rows."""

    positions: torch.Tensor     # [N] position of each token
    slot_mapping: torch.Tensor  # [N] cache slot each token's K/V is written to
    block_tables: torch.Tensor  # [B, W] block ids, padded with the scratch block
    block_size: int             # tokens per block
    pad_idx: torch.Tensor       # [B, Q] token index of each query slot of the padded grid
    unpad_idx: torch.Tensor     # [N] grid slot (b * Q + q) of each token
    bias: torch.Tensor          # [B, 1, Q, T] additive mask: 0 where visible, -inf elsewhere
    _bias_g: dict = field(default_factory=dict)

    def bias_for(self, group: int) -> torch.Tensor:
        """The mask with the G query heads of a KV head folded into the query axis."""
        if group == 1:
            return self.bias
        if group not in self._bias_g:
            b, _, q, t = self.bias.shape
            self._bias_g[group] = self.bias.unsqueeze(2).expand(b, 1, group, q, t) \
                .reshape(b, 1, group * q, t)
        return self._bias_g[group]


_CONTEXT: Context | None = None


def set_context(ctx: Context | None) -> None:
    global _CONTEXT
    _CONTEXT = ctx


def get_context() -> Context | None:
    return _CONTEXT


@contextmanager
def attention_context(ctx: Context):
    """The forwards in the block attend with `ctx`; none after it, whatever happens inside."""
    set_context(ctx)
    try:
        yield ctx
    finally:
        set_context(None)


def make_context(positions: torch.Tensor, block_tables: torch.Tensor, pad_idx: torch.Tensor,
                 unpad_idx: torch.Tensor, scratch_block: int, dtype: torch.dtype,
                 write_mask: torch.Tensor | None = None, block_size: int = BLOCK_SIZE
                 ) -> Context:
    """Build the metadata on the device from positions and block tables (no host sync).

    `write_mask` ([N] bool), when given, sends the K/V of tokens where it is False to the
    scratch block.
    """
    bs = block_size
    b, q = pad_idx.shape
    t = block_tables.shape[1] * bs
    rows = torch.div(unpad_idx, q, rounding_mode="floor")
    col = torch.div(positions, bs, rounding_mode="floor").clamp(max=block_tables.shape[1] - 1)
    slots = block_tables[rows, col] * bs + positions % bs
    if write_mask is not None:
        slots = torch.where(write_mask, slots, torch.full_like(slots, scratch_block * bs))
    q_pos = positions[pad_idx]  # [B, Q]
    key_pos = torch.arange(t, device=positions.device)
    visible = key_pos.view(1, 1, t) <= q_pos.unsqueeze(-1)
    bias = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
    bias.masked_fill_(~visible, float("-inf"))
    return Context(positions, slots, block_tables, bs, pad_idx, unpad_idx, bias.unsqueeze(1))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, ctx: Context, scale: float) -> torch.Tensor:
    """Write this forward's K/V into the cache, then attend over each request's blocks.

    q [N, H, D], k and v [N, Hkv, D]; caches [num_blocks + 1, block_size, Hkv, D].
    Returns [N, H, D].
    """
    n, h, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    k_cache.view(-1, hkv, d).index_copy_(0, ctx.slot_mapping, k)
    v_cache.view(-1, hkv, d).index_copy_(0, ctx.slot_mapping, v)
    b, qlen = ctx.pad_idx.shape
    t = ctx.block_tables.shape[1] * ctx.block_size
    keys = k_cache[ctx.block_tables].view(b, t, hkv, d).transpose(1, 2)      # [B, Hkv, T, D]
    values = v_cache[ctx.block_tables].view(b, t, hkv, d).transpose(1, 2)
    qg = q[ctx.pad_idx].view(b, qlen, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * qlen, d)
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=ctx.bias_for(g), scale=scale)
    out = out.view(b, hkv, g, qlen, d).permute(0, 3, 1, 2, 4).reshape(b * qlen, h, d)
    return out[ctx.unpad_idx]


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           positions: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention with no cache (training and reference paths).

    The N tokens may hold several sequences back to back: a new one starts wherever the position
    does not increase, and a token sees the earlier tokens of its own sequence. Sequences of
    equal length run as one batch.
    """
    n, h, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    starts = torch.ones(n, dtype=torch.bool, device=q.device)
    starts[1:] = positions[1:] <= positions[:-1]
    first = starts.nonzero().flatten().tolist()
    lengths = {b - a for a, b in zip(first, first[1:] + [n])}
    if len(lengths) != 1:  # unequal sequences: one by one
        return torch.cat([dense_causal_attention(q[a:b], k[a:b], v[a:b], positions[a:b], scale)
                          for a, b in zip(first, first[1:] + [n])])
    t = lengths.pop()
    s = n // t
    qg = q.view(s, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(s, hkv, g * t, d)
    keys = k.view(s, t, hkv, d).transpose(1, 2)
    values = v.view(s, t, hkv, d).transpose(1, 2)
    idx = torch.arange(t, device=q.device)
    bias = torch.zeros(t, t, dtype=q.dtype, device=q.device)
    bias.masked_fill_(idx.view(1, t) > idx.view(t, 1), float("-inf"))
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=bias.repeat(g, 1),
                                         scale=scale)
    return out.view(s, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(n, h, d)


class KVCache:
    """K/V tensors for every attention layer, indexed by the scheduler's block ids."""

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, block_size: int = BLOCK_SIZE):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks  # the extra last block
        shape = (num_layers, 2, num_blocks + 1, block_size, num_kv_heads, head_dim)
        # Zeros, not empty: padded queries may read the scratch block, and garbage there could be
        # NaN, which a masked softmax would still propagate through 0 * NaN.
        self.data = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, 0], self.data[i, 1]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()
