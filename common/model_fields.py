"""Checks of single config fields, shared by the model configs and their config.json readers.

Every family, the heads and both halves alike (docs/reference/robustness.md): `int_field`,
`bool_field`, `check_token_ids`, `check_layer_kind`, `check_rope_scaling`, `check_layer_fields`,
each error naming the file and the field.
"""

from __future__ import annotations

from contextlib import contextmanager

from stepgap.common.errors import UserError, where
from stepgap.common.limits import is_finite, is_int

# The RoPE scalings the engine implements (its Llama rotary embedding); the simulator's costs do
# not depend on RoPE, so the other families take any (their known keys still checked).
LLAMA_ROPES = ("llama3", "linear", "default", None)


@contextmanager
def named(source):
    """A config's own checks (its __post_init__) name the file they came from."""
    try:
        yield
    except UserError as e:
        if str(source) in str(e):
            raise
        raise UserError(f"{source}: {e}") from None


def check_config_object(d, source) -> None:
    if not isinstance(d, dict):
        raise UserError(f"{source}: expected a JSON object (a model config), got "
                        f"{type(d).__name__}")


def architectures(d: dict, source) -> list[str]:
    """`architectures`: a list of class names; missing or null is none."""
    archs = d.get("architectures")
    if archs is None:
        return []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise UserError(f"{where(source, field='architectures')}: expected a list of class "
                        f"names, got {archs!r}")
    return archs


def int_field(d: dict, key: str, source, default=None) -> int:
    """An integer >= 1 (not a float, a string or a bool); missing or null takes `default`."""
    v = d.get(key)
    if v is None:
        if default is None:
            raise UserError(f"{where(source, field=key)}: missing")
        return default
    if not is_int(v) or v < 1:
        raise UserError(f"{where(source, field=key)}: expected an integer >= 1, got {v!r}")
    return v


def bool_field(d: dict, key: str, source, default: bool = False) -> bool:
    """true or false (a string "false" is not false); missing or null takes `default`."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise UserError(f"{where(source, field=key)}: expected true or false, got {v!r}")
    return v


def check_token_ids(v, what: str, lists: bool = False, vocab: int | None = None) -> None:
    """A token id (an integer >= 0, below `vocab` when given), None, or with `lists` a list of
    them (eos_token_id)."""
    ok = v is None or (is_int(v) and v >= 0) or (
        lists and isinstance(v, list) and all(is_int(t) and t >= 0 for t in v))
    if not ok:
        raise UserError(f"{what}: expected a token id{' or a list of them' if lists else ''}, "
                        f"got {v!r}")
    if vocab is not None and v is not None:
        past = [t for t in (v if isinstance(v, list) else [v]) if t >= vocab]
        if past:
            raise UserError(f"{what}: token id {past[0]} is past the vocabulary (vocab_size "
                            f"{vocab}: ids 0..{vocab - 1})")


# What the engine's Llama decoder layer computes (engine/model.py), an EAGLE-3 head's included:
# a SiLU-gated MLP (HF's ACT2FN spells SiLU silu or swish) and no biases.
LLAMA_ACTS = ("silu", "swish")


def check_layer_kind(d: dict, source, engine: bool) -> None:
    """`hidden_act` a name and `attention_bias`, `mlp_bias` true or false; with `engine` (a
    config the engine could build: model_type llama, an EAGLE-3 head), what its layers compute:
    SiLU and no biases. (The simulator's costs depend on neither, so its other families take
    any.) Missing or null is Llama's default: silu, no biases."""
    act = d.get("hidden_act")
    if act is not None and not isinstance(act, str):
        raise UserError(f"{where(source, field='hidden_act')}: expected an activation name such "
                        f"as \"silu\", got {act!r}")
    if engine and act is not None and act not in LLAMA_ACTS:
        raise UserError(f"{where(source, field='hidden_act')}: {act!r} is not supported (the "
                        "engine's Llama layers compute silu)")
    for key in ("attention_bias", "mlp_bias"):
        if bool_field(d, key, source) and engine:
            raise UserError(f"{where(source, field=key)}: true is not supported (the engine's "
                            "Llama layers have no biases)")


# The keys each RoPE scaling needs (HF's rope_config_validation); others are not checked.
ROPE_KEYS = {"linear": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings")}


def check_rope_scaling(scaling, what: str, kinds=LLAMA_ROPES) -> dict | None:
    """`rope_scaling`: null, or an object of a supported rope_type (`kinds`; None: any) with
    every key that type needs (ROPE_KEYS), each a positive number (llama3's
    original_max_position_embeddings an integer, its high_freq_factor above its
    low_freq_factor)."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise UserError(f"{what}: expected an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind is not None and not isinstance(kind, str):
        raise UserError(f"{what}: rope_type must be a name, got {kind!r}")
    if kinds is not None and kind not in kinds:
        raise UserError(f"{what}: rope_type {kind!r} is not supported "
                        f"({', '.join(k for k in kinds if k)})")
    for key in ROPE_KEYS.get(kind, ()):
        v = scaling.get(key)
        if v is None:
            raise UserError(f"{what}: rope_type {kind} needs '{key}' "
                            f"({', '.join(ROPE_KEYS[kind])})")
        integral = key == "original_max_position_embeddings"
        if (integral and not is_int(v)) or not is_finite(v) or v <= 0:
            raise UserError(f"{what}: '{key}' must be {'an integer' if integral else 'a number'}"
                            f" > 0, got {v!r}")
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise UserError(f"{what}: high_freq_factor ({scaling['high_freq_factor']}) must exceed "
                        f"low_freq_factor ({scaling['low_freq_factor']})")
    return scaling


def check_layer_fields(cfg, who: str, extra_ints: tuple[str, ...] = (),
                       rope_kinds=LLAMA_ROPES) -> None:
    """The fields a target and a head share (their decoder layers), in __post_init__: sizes
    are integers >= 1, head_dim 0 (derived) or an even integer, GQA divides, RoPE (of
    `rope_kinds`) and the norm are positive numbers."""
    for f in ("hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings") + extra_ints:
        v = getattr(cfg, f)
        if not is_int(v) or v < 1:
            raise UserError(f"{who}: field '{f}' must be an integer >= 1, got {v!r}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise UserError(f"{who}: num_heads ({cfg.num_heads}) must be a multiple of "
                        f"num_kv_heads ({cfg.num_kv_heads})")
    if not is_int(cfg.head_dim) or cfg.head_dim < 0:
        raise UserError(f"{who}: field 'head_dim' must be an integer >= 1, got {cfg.head_dim!r}")
    if cfg.head_dim == 0:
        if cfg.hidden_size % cfg.num_heads:
            raise UserError(f"{who}: hidden_size ({cfg.hidden_size}) must be a multiple of "
                            f"num_heads ({cfg.num_heads}) or head_dim given")
        object.__setattr__(cfg, "head_dim", cfg.hidden_size // cfg.num_heads)
    if cfg.head_dim % 2:
        raise UserError(f"{who}: head_dim ({cfg.head_dim}) must be even (RoPE rotates pairs)")
    for f in ("rope_theta", "rms_norm_eps"):
        v = getattr(cfg, f)
        if not is_finite(v) or v <= 0:
            raise UserError(f"{who}: field '{f}' must be a positive number, got {v!r}")
    check_rope_scaling(cfg.rope_scaling, f"{who}: field 'rope_scaling'", rope_kinds)
