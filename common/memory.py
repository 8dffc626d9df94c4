"""What one GPU holds, sized alike by both halves: the weights, a reserve, and in what is left
the KV cache's blocks (sim/plan.py `scheduler_config`, engine/args.py `EngineSetup`)."""

from __future__ import annotations

from stepgap.common.modelcfg import BF16, ModelConfig
from stepgap.common.speculation import METHODS

RESERVED_BYTES = 2 * 2 ** 30   # per GPU: CUDA context, CUDA graphs and peak activations, kept
                               # out of the KV cache


def kv_bytes_per_token(target: ModelConfig, draft, tp: int = 1, method: str | None = "eagle3",
                       dtype_bytes: int = BF16) -> int:
    """KV-cache bytes one GPU holds per token, `dtype_bytes` an element: the target's layers,
    and the drafter's (an EAGLE head's one layer, a draft model's layers, the MTP layers)."""
    per = target.kv_bytes_per_token(tp, dtype_bytes)
    if draft is not None:
        per += draft.kv_bytes_per_token(tp, dtype_bytes)
    elif method is not None and METHODS[method].uses_mtp_layers:
        per += target.num_mtp_layers * target.kv_bytes_per_layer(tp, dtype_bytes)
    return per


def weight_bytes(target: ModelConfig, draft, tp: int = 1, method: str | None = "eagle3",
                 moe_shards: int | None = None) -> float:
    """Weight bytes one GPU holds: the target's and the drafter's (`moe_shards`: the GPUs a
    MoE target's routed experts are spread over, data parallelism's dp x tp; None: tp)."""
    w = target.weight_bytes_per_rank(tp, moe_shards)
    if draft is not None:
        w += draft.weight_bytes_per_rank(tp)
    elif method is not None and METHODS[method].uses_mtp_layers:
        w += target.mtp_bytes_per_rank(tp, moe_shards)
    return w


def kv_cache_blocks(memory: float, utilization: float, weights: float, reserved: float,
                    block_size: int, per_token: int) -> int:
    """KV blocks of `block_size` tokens (`per_token` bytes each) in `utilization` of `memory`
    once the weights and the reserve are out (< 1: no room)."""
    return int((memory * utilization - weights - reserved) // (block_size * per_token))
