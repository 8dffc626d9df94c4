"""Model configurations, shared by the simulator's cost model and the engine's model builder.

A target is a Llama-family decoder described by a Hugging Face `config.json`. An EAGLE-3 head is
one Llama decoder layer over [token embedding ‖ fused target hidden states], in one of the two
checkpoint layouts of DESIGN.md §4:

- yuhuili: `architectures: ["LlamaForCausalLMEagle3"]`, Llama fields at the top, `draft_vocab_size`;
- speculators: `speculators_model_type: "eagle3"`, Llama fields under `transformer_layer_config`,
  `eagle_aux_hidden_state_layer_ids` at the top.

Named presets stand for well-known models, so nothing is downloaded.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from common.errors import UserError, where
from common.fileio import read_json

LLAMA3_ROPE_8K = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA32_ROPE = {**LLAMA3_ROPE_8K, "factor": 32.0}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A Llama-family target model."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None

    def __post_init__(self):
        who = f"model {self.name!r}"
        check_layer_fields(self, who, ("num_layers",))
        if not isinstance(self.tie_word_embeddings, bool):
            raise UserError(f"{who}: field 'tie_word_embeddings' must be true or false, got "
                            f"{self.tie_word_embeddings!r}")
        if not isinstance(self.torch_dtype, str):
            raise UserError(f"{who}: field 'torch_dtype' must be a string, got "
                            f"{self.torch_dtype!r}")
        for f in ("bos_token_id", "eos_token_id"):
            check_token_ids(getattr(self, f), f"{who}: field '{f}'", lists=f == "eos_token_id")

    # Parameter counts, used by the roofline and by the engine's checks.
    @property
    def layer_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        return attn + 3 * h * self.intermediate_size + 2 * h

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        return self.num_layers * self.layer_params + emb + head + self.hidden_size

    def default_aux_layers(self) -> tuple[int, int, int]:
        """EAGLE-3's default taps: the inputs of layers 2, L/2 and L-3 (vLLM's choice)."""
        n = self.num_layers
        return (min(2, n - 1), n // 2, max(n - 3, 0))

    def to_hf_dict(self) -> dict:
        d = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
             "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
             "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
             "vocab_size": self.vocab_size, "rope_theta": self.rope_theta,
             "rope_scaling": self.rope_scaling, "rms_norm_eps": self.rms_norm_eps,
             "max_position_embeddings": self.max_position_embeddings,
             "tie_word_embeddings": self.tie_word_embeddings, "torch_dtype": self.torch_dtype,
             "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            d["eos_token_id"] = self.eos_token_id
        return d

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json", name: str | None = None):
        check_config_object(d, source)
        if "speculators_model_type" in d or "LlamaForCausalLMEagle3" in architectures(d, source):
            raise UserError(f"{source}: this is an EAGLE-3 draft head, not a target model")
        model_type = d.get("model_type", "llama")
        if model_type != "llama":
            raise UserError(f"{where(source, field='model_type')}: {model_type!r} is not "
                            "supported (stepgap models Llama-family targets: model_type 'llama')")
        dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        if not isinstance(dtype, str):
            raise UserError(f"{where(source, field='torch_dtype')}: expected a dtype name such "
                            f"as \"bfloat16\", got {dtype!r}")
        for key in ("bos_token_id", "eos_token_id"):
            check_token_ids(d.get(key), where(source, field=key), lists=key == "eos_token_id")
        with named(source):
            return cls(name=name or d.get("_name_or_path") or str(source),
                       **_llama_fields(d, source),
                       tie_word_embeddings=bool_field(d, "tie_word_embeddings", source),
                       torch_dtype=dtype, bos_token_id=d.get("bos_token_id"),
                       eos_token_id=d.get("eos_token_id"))


@dataclass(frozen=True, slots=True)
class Eagle3Config:
    """An EAGLE-3 draft head for a target of hidden size `target_hidden_size`."""

    name: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int           # the target's vocabulary (the shared embedding)
    draft_vocab_size: int     # the head's own lm_head; d2t maps it into the target's
    target_hidden_size: int
    head_dim: int = 0
    aux_layer_ids: tuple[int, ...] | None = None  # None: the target's default_aux_layers()
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    norm_before_residual: bool = False
    layout: str = "yuhuili"

    def __post_init__(self):
        who = f"draft {self.name!r}"
        check_layer_fields(self, who, ("draft_vocab_size", "target_hidden_size"))
        if self.draft_vocab_size > self.vocab_size:
            raise UserError(f"{who}: draft_vocab_size ({self.draft_vocab_size}) "
                            f"exceeds vocab_size ({self.vocab_size})")
        if self.layout not in ("yuhuili", "speculators"):
            raise UserError(f"{who}: layout must be 'yuhuili' or 'speculators'")
        if not isinstance(self.norm_before_residual, bool):
            raise UserError(f"{who}: field 'norm_before_residual' must be true or false, got "
                            f"{self.norm_before_residual!r}")
        if self.aux_layer_ids is not None:
            aux = tuple(self.aux_layer_ids)
            if len(aux) != 3 or not all(_is_int(i) and i >= 0 for i in aux):
                raise UserError(f"{who}: field 'aux_layer_ids' must be three layer indices, got "
                                f"{self.aux_layer_ids!r}")
            object.__setattr__(self, "aux_layer_ids", aux)

    @property
    def num_params(self) -> int:
        """Parameters without the (shared) embedding: fc, the layer, norms and lm_head."""
        h, d = self.hidden_size, self.head_dim
        fc = 3 * self.target_hidden_size * h
        attn = 2 * h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return fc + attn + mlp + 4 * h + self.draft_vocab_size * h

    def aux_layers_for(self, target: ModelConfig) -> tuple[int, ...]:
        return self.aux_layer_ids or target.default_aux_layers()

    def check_target(self, target: ModelConfig, source: str = "draft") -> None:
        if self.target_hidden_size != target.hidden_size:
            raise UserError(f"{source}: the draft head expects target hidden size "
                            f"{self.target_hidden_size}, but the target has {target.hidden_size}")
        if self.vocab_size != target.vocab_size:
            raise UserError(f"{source}: the draft head's vocab_size {self.vocab_size} differs "
                            f"from the target's {target.vocab_size}")
        bad = [i for i in self.aux_layers_for(target) if not 0 <= i < target.num_layers]
        if bad:
            raise UserError(f"{source}: aux hidden-state layers {bad} are outside the target's "
                            f"{target.num_layers} layers")

    def llama_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "num_hidden_layers": 1,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
                "vocab_size": self.vocab_size, "rope_theta": self.rope_theta,
                "rope_scaling": self.rope_scaling, "rms_norm_eps": self.rms_norm_eps,
                "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
                "model_type": "llama"}

    def to_hf_dict(self, layout: str | None = None) -> dict:
        layout = layout or self.layout
        aux = list(self.aux_layer_ids) if self.aux_layer_ids else None
        if layout == "yuhuili":
            d = {"architectures": ["LlamaForCausalLMEagle3"], **self.llama_dict(),
                 "draft_vocab_size": self.draft_vocab_size,
                 "target_hidden_size": self.target_hidden_size, "torch_dtype": "float32",
                 "tie_word_embeddings": False}
            if aux:
                d["eagle_aux_hidden_state_layer_ids"] = aux
            return d
        d = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
             "transformer_layer_config": {**self.llama_dict(), "architectures":
                                          ["LlamaForCausalLM"]},
             "draft_vocab_size": self.draft_vocab_size,
             "target_hidden_size": self.target_hidden_size,
             "norm_before_residual": self.norm_before_residual,
             "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy"}}
        if aux:
            d["eagle_aux_hidden_state_layer_ids"] = aux
        return d

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json", name: str | None = None):
        check_config_object(d, source)
        if d.get("speculators_model_type") is not None:
            if d["speculators_model_type"] != "eagle3":
                raise UserError(f"{where(source, field='speculators_model_type')}: "
                                f"{d['speculators_model_type']!r} is not supported (eagle3 is)")
            layer = d.get("transformer_layer_config")
            if not isinstance(layer, dict):
                raise UserError(f"{where(source, field='transformer_layer_config')}: missing or "
                                "not an object")
            layout, fields = "speculators", _llama_fields(layer, f"{source} "
                                                                 "(transformer_layer_config)")
        elif "LlamaForCausalLMEagle3" in architectures(d, source) or "draft_vocab_size" in d:
            layout, fields = "yuhuili", _llama_fields(d, source)
        else:
            raise UserError(f"{source}: not an EAGLE-3 head (expected architectures "
                            "['LlamaForCausalLMEagle3'] or speculators_model_type 'eagle3')")
        fields.pop("num_layers")
        aux = d.get("eagle_aux_hidden_state_layer_ids")
        if aux is not None and (not isinstance(aux, list) or len(aux) != 3
                                or not all(_is_int(i) and i >= 0 for i in aux)):
            raise UserError(f"{where(source, field='eagle_aux_hidden_state_layer_ids')}: "
                            f"expected three layer indices, got {aux!r}")
        with named(source):
            return cls(name=name or str(source),
                       draft_vocab_size=int_field(d, "draft_vocab_size", source,
                                                  fields["vocab_size"]),
                       target_hidden_size=int_field(d, "target_hidden_size", source,
                                                    fields["hidden_size"]),
                       aux_layer_ids=tuple(aux) if aux else None,
                       norm_before_residual=bool_field(d, "norm_before_residual", source),
                       layout=layout, **fields)


def _llama_fields(d: dict, source) -> dict:
    """The Llama fields every config has, validated with errors naming the field."""
    def need(key, kind=int, default=None):
        v = d.get(key, default)
        if v is None:
            raise UserError(f"{where(source, field=key)}: missing")
        if kind is int:
            return int_field(d, key, source, default)
        if not _is_number(v) or not math.isfinite(v) or v <= 0:
            raise UserError(f"{where(source, field=key)}: expected a positive number, got {v!r}")
        return v

    heads = need("num_attention_heads")
    head_dim = d.get("head_dim")
    return {"hidden_size": need("hidden_size"), "num_layers": need("num_hidden_layers"),
            "num_heads": heads, "num_kv_heads": need("num_key_value_heads", default=heads),
            "intermediate_size": need("intermediate_size"), "vocab_size": need("vocab_size"),
            "head_dim": 0 if head_dim is None else int_field(d, "head_dim", source),
            "rope_theta": float(need("rope_theta", float, 10000.0)),
            "rope_scaling": check_rope_scaling(d.get("rope_scaling"),
                                               where(source, field="rope_scaling")),
            "rms_norm_eps": float(need("rms_norm_eps", float, 1e-5)),
            "max_position_embeddings": need("max_position_embeddings", default=8192)}


# -- checks of single fields, shared by the configs and by their config.json readers ------------


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
    if not _is_int(v) or v < 1:
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


def check_token_ids(v, what: str, lists: bool = False) -> None:
    """A token id (an integer >= 0), None, or with `lists` a list of them (eos_token_id)."""
    ok = v is None or (_is_int(v) and v >= 0) or (
        lists and isinstance(v, list) and all(_is_int(t) and t >= 0 for t in v))
    if not ok:
        raise UserError(f"{what}: expected a token id{' or a list of them' if lists else ''}, "
                        f"got {v!r}")


ROPE_KEYS = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings")}


def check_rope_scaling(scaling, what: str) -> dict | None:
    """`rope_scaling`: null, or an object of a supported rope_type with every key that type
    needs, each a positive number (llama3's original_max_position_embeddings an integer, its
    high_freq_factor above its low_freq_factor)."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise UserError(f"{what}: expected an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ("llama3", "linear", "default", None):
        raise UserError(f"{what}: rope_type {kind!r} is not supported (llama3, linear, "
                        "default)")
    for key in ROPE_KEYS.get(kind, ()):
        v = scaling.get(key)
        if v is None:
            raise UserError(f"{what}: rope_type {kind} needs '{key}' "
                            f"({', '.join(ROPE_KEYS[kind])})")
        integral = key == "original_max_position_embeddings"
        if not (_is_int(v) if integral else _is_number(v)) or not math.isfinite(v) or v <= 0:
            raise UserError(f"{what}: '{key}' must be {'an integer' if integral else 'a number'}"
                            f" > 0, got {v!r}")
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise UserError(f"{what}: high_freq_factor ({scaling['high_freq_factor']}) must exceed "
                        f"low_freq_factor ({scaling['low_freq_factor']})")
    return scaling


def check_layer_fields(cfg, who: str, extra_ints: tuple[str, ...] = ()) -> None:
    """The fields a target and a head share (their decoder layers), in __post_init__: sizes
    are integers >= 1, head_dim 0 (derived) or an even integer, GQA divides, RoPE and the norm
    are positive numbers."""
    for f in ("hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings") + extra_ints:
        v = getattr(cfg, f)
        if not _is_int(v) or v < 1:
            raise UserError(f"{who}: field '{f}' must be an integer >= 1, got {v!r}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise UserError(f"{who}: num_heads ({cfg.num_heads}) must be a multiple of "
                        f"num_kv_heads ({cfg.num_kv_heads})")
    if not _is_int(cfg.head_dim) or cfg.head_dim < 0:
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
        if not _is_number(v) or not math.isfinite(v) or v <= 0:
            raise UserError(f"{who}: field '{f}' must be a positive number, got {v!r}")
    check_rope_scaling(cfg.rope_scaling, f"{who}: field 'rope_scaling'")


def eagle3_for(target: ModelConfig, draft_vocab_size: int | None = None,
               name: str | None = None) -> Eagle3Config:
    """An EAGLE-3 head shaped for `target`, as the published heads are (one target-sized layer)."""
    return Eagle3Config(
        name=name or f"{target.name}-eagle3", hidden_size=target.hidden_size,
        num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
        intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size or min(32000, target.vocab_size),
        target_hidden_size=target.hidden_size, head_dim=target.head_dim,
        rope_theta=target.rope_theta, rope_scaling=target.rope_scaling,
        rms_norm_eps=target.rms_norm_eps, max_position_embeddings=target.max_position_embeddings)


# Named presets. Values from the models' published config.json files (DESIGN.md §6).
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
# The yuhuili/EAGLE3-LLaMA3.1-Instruct-8B head: one 4096-wide layer, draft vocab 32000,
# taps before layers 2, 16 and 29.
DRAFT_PRESETS: dict[str, Eagle3Config] = {
    "llama-3.1-8b-eagle3": Eagle3Config(
        "llama-3.1-8b-eagle3", hidden_size=4096, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=128256, draft_vocab_size=32000,
        target_hidden_size=4096, aux_layer_ids=(2, 16, 29), rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE_8K, max_position_embeddings=2048),
}


def _read_config(spec: str) -> tuple[dict, str]:
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: no config.json there")
    return read_json(path), str(path)


def load_model_config(spec: str) -> ModelConfig:
    """A target by preset name, model folder, or config.json path."""
    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    if not Path(spec).exists():
        raise UserError(f"unknown model {spec!r}: expected a preset "
                        f"({', '.join(MODEL_PRESETS)}), a model folder or a config.json")
    d, source = _read_config(spec)
    return ModelConfig.from_hf_dict(d, source, name=Path(spec).name)


def load_draft_config(spec: str, target: ModelConfig | None = None) -> Eagle3Config:
    """An EAGLE-3 head by preset name, folder or config.json; `eagle3` derives one from target."""
    if spec in DRAFT_PRESETS:
        return DRAFT_PRESETS[spec]
    if spec == "eagle3":
        if target is None:
            raise UserError("draft 'eagle3' derives a head from the target; give a target")
        return eagle3_for(target)
    if not Path(spec).exists():
        raise UserError(f"unknown draft {spec!r}: expected a preset "
                        f"({', '.join(DRAFT_PRESETS)}, or 'eagle3' for one shaped like the "
                        "target), a head folder or a config.json")
    d, source = _read_config(spec)
    return Eagle3Config.from_hf_dict(d, source, name=Path(spec).name)


def config_dict(cfg) -> dict:
    """A plain dict of a config, for run results."""
    return asdict(cfg)
