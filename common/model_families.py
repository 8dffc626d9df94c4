"""The model families the simulator reads: each family's `config.json` fields, validated, as
ModelConfig's fields (common/modelcfg.py), and the quantizations it models.

`quantization_config` is read for `fp8` (one byte per weight of the decoder's linear layers) and
`mxfp4` (4.25 bits per expert weight; the modules it names as not converted stay bf16).
"""

from __future__ import annotations


from stepgap.common.errors import UserError, where
from stepgap.common.limits import is_finite, is_int
from stepgap.common.model_fields import LLAMA_ROPES, bool_field, check_rope_scaling, int_field


def _need(d: dict, source, key, kind=int, default=None):
    """A config field, validated, with an error naming the file and the field: an integer
    >= 1 (`int_field`) or a positive number; missing or null takes `default`."""
    if kind is int:
        return int_field(d, key, source, default)
    v = d.get(key)
    if v is None:
        v = default
    if v is None:
        raise UserError(f"{where(source, field=key)}: missing")
    if not is_finite(v) or v <= 0:
        raise UserError(f"{where(source, field=key)}: expected a positive number, got {v!r}")
    return v


def _count(d: dict, source, key) -> int:
    """An integer >= 0; missing or null is 0."""
    v = d.get(key)
    if v is None:
        return 0
    if not is_int(v) or v < 0:
        raise UserError(f"{where(source, field=key)}: expected an integer >= 0, got {v!r}")
    return v


def llama_fields(d: dict, source, rope_kinds=LLAMA_ROPES, layers: int | None = None) -> dict:
    """The Llama fields every config has, validated with errors naming the field. `rope_kinds`:
    the RoPE scalings accepted (None: any; the simulator's costs do not depend on it); `layers`:
    num_hidden_layers when it is missing (None: it is required)."""
    def need(key, kind=int, default=None):
        return _need(d, source, key, kind, default)

    heads = need("num_attention_heads")
    head_dim = d.get("head_dim")
    return {"hidden_size": need("hidden_size"),
            "num_layers": need("num_hidden_layers", default=layers),
            "num_heads": heads, "num_kv_heads": need("num_key_value_heads", default=heads),
            "intermediate_size": need("intermediate_size"), "vocab_size": need("vocab_size"),
            "head_dim": 0 if head_dim is None else int_field(d, "head_dim", source),
            "rope_theta": float(need("rope_theta", float, 10000.0)),
            "rope_scaling": check_rope_scaling(d.get("rope_scaling"),
                                               where(source, field="rope_scaling"), rope_kinds),
            "rms_norm_eps": float(need("rms_norm_eps", float, 1e-5)),
            "max_position_embeddings": need("max_position_embeddings", default=8192)}


def _dense(d: dict, source) -> dict:
    if bool_field(d, "use_sliding_window", source):
        raise UserError(f"{where(source, field='use_sliding_window')}: sliding-window "
                        "attention is not modelled for this family")
    return {}


def _qwen3_moe(d: dict, source) -> dict:
    n = _need(d, source, "num_hidden_layers")
    step = _need(d, source, "decoder_sparse_step", default=1)
    dense = d.get("mlp_only_layers")
    if dense is None:
        dense = []
    if not isinstance(dense, list) or not all(is_int(i) and i >= 0 for i in dense):
        raise UserError(f"{where(source, field='mlp_only_layers')}: expected a list of layer "
                        f"indices, got {dense!r}")
    moe = sum(1 for i in range(n) if i not in dense and (i + 1) % step == 0)
    if not moe:
        raise UserError(f"{where(source, field='decoder_sparse_step')}: no layer is a MoE layer")
    return {**_dense(d, source), "num_experts": _need(d, source, "num_experts"),
            "num_experts_per_tok": _need(d, source, "num_experts_per_tok"),
            "moe_intermediate_size": _need(d, source, "moe_intermediate_size"),
            "num_moe_layers": moe}


LAYER_TYPES = ("sliding_attention", "full_attention")


def _gpt_oss(d: dict, source) -> dict:
    n = _need(d, source, "num_hidden_layers")
    types = d.get("layer_types")
    if not isinstance(types, list) or len(types) != n or \
            not all(isinstance(t, str) and t in LAYER_TYPES for t in types):
        raise UserError(f"{where(source, field='layer_types')}: expected {n} entries of "
                        "sliding_attention or full_attention")
    sliding = types.count("sliding_attention")
    # gpt-oss's own name for top-k, read where the HF name is absent
    top_k = "experts_per_token" if d.get("num_experts_per_tok") is None \
        and d.get("experts_per_token") is not None else "num_experts_per_tok"
    return {"num_experts": _need(d, source, "num_local_experts"),
            "num_experts_per_tok": _need(d, source, top_k),
            "moe_intermediate_size": _need(d, source, "intermediate_size"),
            "num_moe_layers": n, "num_sliding_layers": sliding,
            "sliding_window": _need(d, source, "sliding_window") if sliding else 0,
            "head_dim": _need(d, source, "head_dim")}


def _deepseek_v3(d: dict, source) -> dict:
    n = _need(d, source, "num_hidden_layers")
    if d.get("moe_layer_freq", 1) != 1:
        raise UserError(f"{where(source, field='moe_layer_freq')}: only 1 (every layer after "
                        "first_k_dense_replace) is modelled")
    first_dense = _count(d, source, "first_k_dense_replace")
    if first_dense >= n:
        raise UserError(f"{where(source, field='first_k_dense_replace')}: expected 0..{n - 1}, "
                        f"got {first_dense}")
    shared = _count(d, source, "n_shared_experts")
    moe_inter = _need(d, source, "moe_intermediate_size")
    return {"num_experts": _need(d, source, "n_routed_experts"),
            "num_experts_per_tok": _need(d, source, "num_experts_per_tok"),
            "moe_intermediate_size": moe_inter,
            "shared_expert_intermediate_size": shared * moe_inter,
            "num_moe_layers": n - first_dense,
            "num_mtp_layers": _count(d, source, "num_nextn_predict_layers"),
            "kv_lora_rank": _need(d, source, "kv_lora_rank"),
            "q_lora_rank": _count(d, source, "q_lora_rank"),   # 0 or null: no q compression
            "qk_nope_head_dim": _need(d, source, "qk_nope_head_dim"),
            "qk_rope_head_dim": _need(d, source, "qk_rope_head_dim"),
            "v_head_dim": _need(d, source, "v_head_dim")}


# The families the simulator models, each with the reader of the fields it adds.
# Qwen2 (and Qwen2.5, QwQ) is Llama's dense GQA layer with biases on q, k and v, which add no
# GEMM and are not modelled.
FAMILIES = {"llama": _dense, "qwen2": _dense, "qwen3": _dense, "qwen3_moe": _qwen3_moe,
            "gpt_oss": _gpt_oss, "deepseek_v3": _deepseek_v3}
# ModelConfig's fields of the other families: counts, 0 where the family has none.
FAMILY_COUNTS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "num_moe_layers", "kv_lora_rank",
                 "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "sliding_window", "num_sliding_layers", "num_mtp_layers")
QUANTIZATIONS = (None, "fp8", "mxfp4")
MXFP4_BYTES = 4.25 / 8   # 4-bit values plus one 8-bit scale per 32


def quantization_fields(d: dict, source, model_type: str) -> dict:
    q = d.get("quantization_config")
    if q is None:
        return {}
    if not isinstance(q, dict):
        raise UserError(f"{where(source, field='quantization_config')}: expected an object or "
                        f"null, got {q!r}")
    method = q.get("quant_method")
    if method == "fp8":
        return {"quantization": "fp8", "weight_bytes": 1.0, "expert_weight_bytes": 1.0}
    if method == "mxfp4" and model_type == "gpt_oss":
        # vLLM's Mxfp4Config quantizes the experts; attention, router, embedding and lm_head
        # are the checkpoint's modules_to_not_convert and stay bf16.
        return {"quantization": "mxfp4", "expert_weight_bytes": MXFP4_BYTES}
    raise UserError(f"{where(source, field='quantization_config')}: quant_method {method!r} is "
                    "not modelled (fp8; mxfp4 for gpt_oss)")
