"""Named presets of well-known models and heads, so that nothing is downloaded, the Hugging Face
ids they stand for, and the loaders of a target or a head by preset name, Hugging Face id,
folder or config.json."""

from __future__ import annotations

import re
from pathlib import Path

from stepgap.common.errors import UserError
from stepgap.common.fileio import read_json
from stepgap.common.model_heads import EagleHeadConfig, eagle3_for
from stepgap.common.modelcfg import ModelConfig

LLAMA3_ROPE_8K = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA32_ROPE = {**LLAMA3_ROPE_8K, "factor": 32.0}

# Named presets. Values from the models' published config.json files (docs/explanation/design.md
# §6).
MODEL_PRESETS: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        "llama-3.1-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE_8K, max_position_embeddings=131072, bos_token_id=128000,
        eos_token_id=[128001, 128008, 128009]),
    "llama-3.2-3b": ModelConfig(
        "llama-3.2-3b", hidden_size=3072, num_layers=28, num_heads=24, num_kv_heads=8,
        head_dim=128, intermediate_size=8192, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=LLAMA32_ROPE, max_position_embeddings=131072, tie_word_embeddings=True),
    "llama-3.2-1b": ModelConfig(
        "llama-3.2-1b", hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=LLAMA32_ROPE, max_position_embeddings=131072, tie_word_embeddings=True),
}
# Simulator presets, as the fields of each model's published config.json that its family's reader
# uses (copies in ai-dynamo/aiconfigurator's model_configs/, docs/explanation/past-one-gpu.md), so
# that a preset and the real file give the same config.
HF_PRESETS = {
    "llama-3.3-70b": {
        "model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
        "vocab_size": 128256, "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE_8K,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009]},
    **{name: {"model_type": "qwen3", "hidden_size": h, "num_hidden_layers": n,
              "num_attention_heads": heads, "num_key_value_heads": 8, "head_dim": 128,
              "intermediate_size": inter, "vocab_size": 151936, "rope_theta": 1000000,
              "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": tied, "use_sliding_window": False}
       for name, h, n, heads, inter, tied in (("qwen3-0.6b", 1024, 28, 16, 3072, True),
                                              ("qwen3-1.7b", 2048, 28, 16, 6144, True),
                                              ("qwen3-8b", 4096, 36, 32, 12288, False),
                                              ("qwen3-32b", 5120, 64, 64, 25600, False))},
    # Qwen2.5-72B-Instruct's and QwQ-32B's config.json (model_type qwen2)
    **{name: {"model_type": "qwen2", "hidden_size": h, "num_hidden_layers": n,
              "num_attention_heads": heads, "num_key_value_heads": 8, "intermediate_size": inter,
              "vocab_size": 152064, "rope_theta": 1000000.0, "max_position_embeddings": ctx,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "use_sliding_window": False}
       for name, h, n, heads, inter, ctx in (("qwen2.5-72b", 8192, 80, 64, 29568, 32768),
                                             ("qwq-32b", 5120, 64, 40, 27648, 40960))},
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 151936, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False},
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 12, "sliding_window": 128,
        "vocab_size": 201088, "rope_theta": 150000, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096},
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"]}},
    "deepseek-v3": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1,
        "vocab_size": 129280, "rope_theta": 10000, "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096},
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]}},
}
# gpt-oss-120b: gpt-oss-20b's layers, 36 of them, over 128 experts (its config.json)
HF_PRESETS["gpt-oss-120b"] = {**HF_PRESETS["gpt-oss-20b"], "num_hidden_layers": 36,
                               "num_local_experts": 128,
                               "layer_types": ["sliding_attention", "full_attention"] * 18}
# Qwen3-30B-A3B-Instruct-2507: Qwen3-30B-A3B's layers with a 256K context (its config.json, as
# LLMServingSim's configs/model/Qwen/ copies it: rope_theta 1e7, max_position_embeddings 262144)
HF_PRESETS["qwen3-30b-a3b-instruct-2507"] = {**HF_PRESETS["qwen3-30b-a3b"], "rope_theta": 10000000,
                                             "max_position_embeddings": 262144}
MODEL_PRESETS.update({name: ModelConfig.from_hf_dict(d, f"preset {name}", name)
                      for name, d in HF_PRESETS.items()})
# The yuhuili/EAGLE3-LLaMA3.1-Instruct-8B head: one 4096-wide layer, draft vocab 32000,
# taps before layers 2, 16 and 29.
DRAFT_PRESETS: dict[str, EagleHeadConfig] = {
    "llama-3.1-8b-eagle3": EagleHeadConfig(
        "llama-3.1-8b-eagle3", hidden_size=4096, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=128256, draft_vocab_size=32000,
        target_hidden_size=4096, aux_layer_ids=(2, 16, 29), rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE_8K, max_position_embeddings=2048),
    # One target-sized layer and a 32000-token draft vocabulary: the shape of SpecForge's
    # llama3-70B-eagle3.json and of the speculators-format heads (RedHatAI); yuhuili's 70B head is
    # narrower, but its config was not found in a source we could read
    # (docs/explanation/past-one-gpu.md).
    "llama-3.3-70b-eagle3": eagle3_for(MODEL_PRESETS["llama-3.3-70b"],
                                       name="llama-3.3-70b-eagle3"),
    # AngelSlim's qwen3-8b-eagle3.json: hidden 4096, intermediate 12288, 32/8 heads of 128,
    # draft vocab 32000 (the RedHatAI head's config was not found).
    "qwen3-8b-eagle3": eagle3_for(MODEL_PRESETS["qwen3-8b"], name="qwen3-8b-eagle3"),
    # The heads vLLM's gpt-oss threads run (RedHatAI's speculators head for gpt-oss-20b,
    # NVIDIA's for gpt-oss-120b), shaped from their targets: their own configs were not found
    # in a source we could read.
    **{f"{t}-eagle3": eagle3_for(MODEL_PRESETS[t], name=f"{t}-eagle3")
       for t in ("gpt-oss-20b", "gpt-oss-120b")},
}


# Hugging Face ids: each preset's by the repository its config.json was read from, and the
# common EAGLE-3 heads by theirs (yuhuili's, RedHatAI's speculators, AngelSlim's). A run names
# a model as `vllm serve` does; nothing is downloaded: the id stands for the preset's shapes.
MODEL_IDS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.2-3B-Instruct": "llama-3.2-3b",
    "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b",
    "Qwen/Qwen3-0.6B": "qwen3-0.6b", "Qwen/Qwen3-1.7B": "qwen3-1.7b", "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b-instruct-2507",
    "openai/gpt-oss-20b": "gpt-oss-20b", "openai/gpt-oss-120b": "gpt-oss-120b",
    "Qwen/Qwen2.5-72B-Instruct": "qwen2.5-72b", "Qwen/QwQ-32B": "qwq-32b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
}
DRAFT_IDS = {
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": "llama-3.1-8b-eagle3",
    # the speculators-format heads: one target-sized layer, draft vocabulary 32000 (the shapes
    # of the presets above; their own configs were not found in a source we could read)
    "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3": "llama-3.1-8b-eagle3",
    "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3": "llama-3.3-70b-eagle3",
    "RedHatAI/Qwen3-8B-speculator.eagle3": "qwen3-8b-eagle3",
    "AngelSlim/Qwen3-8B_eagle3": "qwen3-8b-eagle3",
    "RedHatAI/gpt-oss-20b-speculator.eagle3": "gpt-oss-20b-eagle3",
    **{f"nvidia/gpt-oss-120b-Eagle3{v}": "gpt-oss-120b-eagle3"
       for v in ("", "-v2", "-short-context", "-long-context", "-throughput")},
}
# EAGLE (-1) heads, each one layer shaped as its target with the target's lm_head: the head
# `--speculative-config method eagle` shapes from the target (common/model_heads.py eagle_for).
EAGLE_IDS = {"yuhuili/EAGLE-LLaMA3.1-Instruct-8B": "llama-3.1-8b"}


def hf_cache_file(repo_id: str, filename: str) -> Path | None:
    """A file of a Hugging Face repository already in this machine's cache (HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub: where vLLM finds it offline), or None. Nothing
    is downloaded."""
    import os
    if repo_id.count("/") != 1:
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(Path.home(), ".cache", "huggingface"), "hub")
    snapshots = Path(hub) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob(f"*/{filename}")) if snapshots.is_dir() else []
    return found[-1] if found else None


def preset_of(spec: str, ids: dict[str, str] = MODEL_IDS) -> str | None:
    """The preset a name stands for: itself, or the preset of a Hugging Face id (None: neither)."""
    presets = MODEL_PRESETS if ids is MODEL_IDS else DRAFT_PRESETS
    return spec if spec in presets else ids.get(spec)


def _words(name: str) -> set[str]:
    """A model name's words: families, versions and sizes (`Llama-3.1-8B` -> llama, 3.1, 8b)."""
    return set(re.findall(r"\d+(?:\.\d+)*[bm]?|[a-z]+", name.lower()))


def near_presets(spec: str, ids: dict[str, str], presets) -> list[str]:
    """The presets nearest a name stepgap does not know, each with its id, for the one line
    that refuses it: the most words shared with a preset's name or id (none near: every
    preset, by name)."""
    words = _words(spec.rstrip("/").split("/")[-1])
    by_preset = {p: i for i, p in reversed(ids.items())}
    scores = {}
    for name, preset in [*((p, p) for p in presets), *((i.split("/")[-1], p)
                                                      for i, p in ids.items())]:
        other = _words(name)
        score = len(words & other) / len(words | other)
        scores[preset] = max(scores.get(preset, 0.0), score)
    best = max(scores.values(), default=0.0)
    near = sorted((p for p, x in scores.items() if x >= max(0.2, 0.6 * best)),
                  key=lambda p: -scores[p])[:3]
    if not near:
        return list(presets)
    return [f"{p} ({by_preset[p]})" if p in by_preset else p for p in near]


def unknown(spec: str, what: str, ids: dict[str, str], presets, extra: str = "") -> UserError:
    """The one line for a model or head stepgap does not know: near presets, and how to give
    one's config.json (nothing is downloaded)."""
    fp8 = "; its FP8 weights: add --quantization fp8" if "fp8" in spec.lower() else ""
    return UserError(
        f"unknown {what} {spec!r}: not a preset, a Hugging Face id stepgap knows, a folder or a "
        f"config.json (nothing is downloaded); near: {', '.join(near_presets(spec, ids, presets))}"
        f"{extra}{fp8}; for this one, give its config.json (e.g. `huggingface-cli download "
        f"{spec if '/' in spec and spec.isprintable() else 'ORG/NAME'} config.json "
        "--local-dir DIR`, then DIR)")


def read_config(spec: str) -> tuple[dict, str]:
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: no config.json there")
    return read_json(path), str(path)


def not_shadowed(spec: str, preset: str, what: str) -> None:
    """A name that is both a preset (or its Hugging Face id) and a path here: vLLM would read
    the path, stepgap the preset, so neither is taken silently."""
    if Path(spec).exists():
        raise UserError(f"{what} {spec!r}: both the preset {preset} and the "
                        f"{'folder' if Path(spec).is_dir() else 'file'} {spec} here; give "
                        f"./{spec} for the path, or run where no such path is for the preset")


def load_model_config(spec: str) -> ModelConfig:
    """A target by preset name, Hugging Face id (MODEL_IDS, else one in this machine's Hugging
    Face cache), model folder, or config.json path."""
    preset = preset_of(spec)
    if preset is not None:
        not_shadowed(spec, preset, "model")
        return MODEL_PRESETS[preset]
    if not Path(spec).exists():
        cached = hf_cache_file(spec, "config.json")   # a model this machine already has
        if cached is None:
            raise unknown(spec, "model", MODEL_IDS, MODEL_PRESETS)
        return ModelConfig.from_hf_dict(read_json(cached), str(cached), name=spec)
    d, source = read_config(spec)
    return ModelConfig.from_hf_dict(d, source, name=Path(spec).name)


# The draft spec that names no head but asks for one shaped from the target (eagle3_for).
DERIVED_HEAD = "eagle3"


def load_draft_config(spec: str, target: ModelConfig | None = None) -> EagleHeadConfig:
    """An EAGLE-3 head by preset name, Hugging Face id (DRAFT_IDS), folder or config.json;
    `eagle3` derives one from target."""
    preset = preset_of(spec, DRAFT_IDS)
    if preset is not None:
        not_shadowed(spec, preset, "draft")
        return DRAFT_PRESETS[preset]
    if spec == DERIVED_HEAD:
        if target is None:
            raise UserError("draft 'eagle3' derives a head from the target; give a target")
        return eagle3_for(target)
    if not Path(spec).exists():
        model = preset_of(spec)
        if model is not None:   # a model preset, not a head's
            heads = [p for p in DRAFT_PRESETS if p.startswith(f"{model}-")]
            raise UserError(f"draft {spec!r}: the model preset {model}, not an EAGLE head "
                            f"(heads: {', '.join(heads or DRAFT_PRESETS)}, or eagle3, a head "
                            "shaped like the target); a whole model as the drafter is "
                            "--spec-method draft_model")
        raise unknown(spec, "draft", DRAFT_IDS, DRAFT_PRESETS,
                      ", or eagle3 (a head shaped like the target)")
    d, source = read_config(spec)
    return EagleHeadConfig.from_hf_dict(d, source, name=Path(spec).name)
