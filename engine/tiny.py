"""The tiny random pair: a small Llama target and a matching EAGLE-3 head, built in memory.

`--model tiny` and the draft `tiny-eagle3` name this pair (engine/checkpoint.py): random weights,
the same on every device, no files. `training/tiny.py` distills the head and writes the pair as
checkpoints (`stepgap make-tiny`).
"""

from __future__ import annotations

import torch

from stepgap.engine.eagle3 import Eagle3Head
from stepgap.engine.model import Llama, init_weights
from stepgap.common.model_heads import EagleHeadConfig
from stepgap.common.modelcfg import ModelConfig

TINY_TARGET = ModelConfig(
    "tiny-llama", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
    intermediate_size=128, vocab_size=512, rope_theta=10000.0,
    rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    max_position_embeddings=4096, torch_dtype="float32", bos_token_id=1, eos_token_id=2)
TINY_AUX_LAYERS = (1, 2, 3)  # distinct taps (the default (2, L/2, L-3) repeats layer 2 at L = 4)


def tiny_aux_layers(cfg: ModelConfig) -> tuple[int, int, int]:
    return tuple(min(i, cfg.num_layers - 1) for i in TINY_AUX_LAYERS)


def tiny_draft_config(target: ModelConfig = TINY_TARGET, draft_vocab_size: int | None = None,
                      name: str = "tiny-eagle3") -> EagleHeadConfig:
    return EagleHeadConfig(
        name, hidden_size=target.hidden_size, num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads, intermediate_size=target.intermediate_size,
        vocab_size=target.vocab_size, draft_vocab_size=draft_vocab_size or target.vocab_size // 2,
        target_hidden_size=target.hidden_size, head_dim=target.head_dim,
        aux_layer_ids=tiny_aux_layers(target), rope_theta=target.rope_theta,
        rope_scaling=target.rope_scaling, rms_norm_eps=target.rms_norm_eps,
        max_position_embeddings=target.max_position_embeddings)


TINY_EMBED_STD = 0.3  # not 0.02: the current token then dominates the residual stream


def build_tiny(target_cfg: ModelConfig = TINY_TARGET, seed: int = 0,
               draft_vocab_size: int | None = None,
               max_positions: int | None = None) -> tuple[Llama, Eagle3Head]:
    """A random float32 target and head on the CPU; the head shares the target's embedding.

    The target's embedding has std TINY_EMBED_STD, so the target is mostly (about 70%) a bigram
    model: predictable enough for a distilled head, context-dependent enough for rejections.
    """
    torch.manual_seed(seed)
    target = Llama(target_cfg, tiny_aux_layers(target_cfg), max_positions)
    init_weights(target, seed=seed)
    with torch.no_grad():
        target.embed_tokens.weight.mul_(TINY_EMBED_STD / 0.02)
    head = Eagle3Head(tiny_draft_config(target_cfg, draft_vocab_size), target_cfg.hidden_size,
                      max_positions)
    init_weights(head, seed=seed + 1)
    head.embed_tokens = target.embed_tokens
    return target.eval(), head
