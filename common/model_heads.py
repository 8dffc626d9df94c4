"""EAGLE draft heads: their configuration, read from either checkpoint layout, or shaped from
a target.

An EAGLE-3 head is one Llama decoder layer over [token embedding ‖ fused target hidden states],
in one of the two checkpoint layouts of docs/explanation/design.md §4:

- yuhuili: `architectures: ["LlamaForCausalLMEagle3"]`, Llama fields at the top, `draft_vocab_size`;
- speculators: `speculators_model_type: "eagle3"`, Llama fields under `transformer_layer_config`,
  `eagle_aux_hidden_state_layer_ids` at the top.

An EAGLE (-1) head (`kind="eagle"`, simulator only) is one decoder layer over fc([embedding ‖
the target's last hidden state]) with the target's own lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stepgap.common.errors import UserError, where
from stepgap.common.model_families import llama_fields
from stepgap.common.limits import is_int
from stepgap.common.model_fields import (architectures, bool_field, check_config_object,
                                         check_layer_fields, check_layer_kind, check_token_ids,
                                         int_field, named)
from stepgap.common.modelcfg import BF16, ModelConfig, check_shards

# An EAGLE head's kinds (its `kind`, the speculation method it drafts for), and whether its fc
# fuses the target's three tapped hidden states once, on the first pass (EAGLE-3), or runs
# over [embedding ‖ last hidden state] every pass (EAGLE-1).
FUSES_TAPS = {"eagle3": True, "eagle": False}


@dataclass(frozen=True, slots=True)
class EagleHeadConfig:
    """An EAGLE draft head for a target of hidden size `target_hidden_size`, of either kind:
    kind="eagle3" (the engine's and the simulator's): one decoder layer over [embedding ‖ the
    target's three tapped hidden states fused by fc], its own draft vocabulary; kind="eagle",
    an EAGLE (-1) head: fc(2h -> h) over [embedding ‖ the target's last hidden state] at every
    pass, one decoder layer, the target's lm_head (simulator only)."""

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
    kind: str = "eagle3"

    def __post_init__(self):
        who = f"draft {self.name!r}"
        # Any RoPE here: a head shaped from a target (eagle3_for) takes the target's, which the
        # simulator's families need not share with Llama; a head's config.json is held to the
        # engine's (llama_fields).
        check_layer_fields(self, who, ("draft_vocab_size", "target_hidden_size"), None)
        if self.draft_vocab_size > self.vocab_size:
            raise UserError(f"{who}: draft_vocab_size ({self.draft_vocab_size}) "
                            f"exceeds vocab_size ({self.vocab_size})")
        if self.layout not in ("yuhuili", "speculators"):
            raise UserError(f"{who}: layout must be 'yuhuili' or 'speculators'")
        if self.kind not in FUSES_TAPS:
            raise UserError(f"{who}: kind must be 'eagle3' or 'eagle'")
        if not isinstance(self.norm_before_residual, bool):
            raise UserError(f"{who}: field 'norm_before_residual' must be true or false, got "
                            f"{self.norm_before_residual!r}")
        if self.aux_layer_ids is not None:
            aux = tuple(self.aux_layer_ids)
            if len(aux) != 3 or not all(is_int(i) and i >= 0 for i in aux):
                raise UserError(f"{who}: field 'aux_layer_ids' must be three layer indices, got "
                                f"{self.aux_layer_ids!r}")
            object.__setattr__(self, "aux_layer_ids", aux)

    @property
    def num_params(self) -> int:
        """Parameters without the (shared) embedding: fc, the layer, norms and lm_head (an
        EAGLE-1 head uses the target's lm_head)."""
        h, d = self.hidden_size, self.head_dim
        if not self.fuses_taps:   # EAGLE-1
            attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
            return 2 * self.target_hidden_size * h + attn + 3 * h * self.intermediate_size + 2 * h
        fc = 3 * self.target_hidden_size * h
        attn = 2 * h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return fc + attn + mlp + 4 * h + self.draft_vocab_size * h

    @property
    def fuses_taps(self) -> bool:
        """EAGLE-3: fc fuses three tapped hidden states once, on the first pass, and the layer
        runs over [embedding ‖ fused hidden]; EAGLE's fc runs every pass."""
        return FUSES_TAPS[self.kind]

    @property
    def fc_inputs(self) -> int:
        """Target-width inputs of fc: three tapped hidden states (EAGLE-3), or the embedding
        and the last hidden state (EAGLE)."""
        return 3 if self.fuses_taps else 2

    def check_tensor_parallel(self, tp: int) -> None:
        check_shards(f"draft head {self.name!r}", tp, self.num_heads, self.num_kv_heads,
                     [("intermediate_size", self.intermediate_size)])

    def weight_bytes_per_rank(self, tp: int = 1) -> float:
        """fc is replicated on every rank (vLLM's ReplicatedLinear); the layer and the lm_head
        are split."""
        h = self.hidden_size
        fc = self.fc_inputs * self.target_hidden_size * h
        return BF16 * fc + BF16 * (self.num_params - fc) / tp if tp > 1 \
            else BF16 * self.num_params

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int = BF16) -> int:
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * dtype_bytes

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
        archs = architectures(d, source)
        if d.get("speculators_model_type") is not None:
            if d["speculators_model_type"] != "eagle3":
                raise UserError(f"{where(source, field='speculators_model_type')}: "
                                f"{d['speculators_model_type']!r} is not supported (eagle3 is)")
            layer = d.get("transformer_layer_config")
            if not isinstance(layer, dict):
                raise UserError(f"{where(source, field='transformer_layer_config')}: missing or "
                                "not an object")
            layout, layer_source = "speculators", f"{source} (transformer_layer_config)"
        elif "LlamaForCausalLMEagle3" in archs or "draft_vocab_size" in d:
            layout, layer, layer_source = "yuhuili", d, source
        else:
            raise UserError(f"{source}: not an EAGLE-3 head (expected architectures "
                            "['LlamaForCausalLMEagle3'] or speculators_model_type 'eagle3')")
        fields = check_head_layer(layer, layer_source)
        aux = d.get("eagle_aux_hidden_state_layer_ids")
        if aux is not None and (not isinstance(aux, list) or len(aux) != 3
                                or not all(is_int(i) and i >= 0 for i in aux)):
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


def check_head_layer(layer: dict, source) -> dict:
    """The Llama fields of a head's one decoder layer (the config itself in the yuhuili layout,
    its transformer_layer_config in the speculators one), held to what the engine builds as a
    target's are (common/modelcfg.py) and to a head's shape: one layer (num_hidden_layers 1 or
    missing), model_type llama, SiLU and no biases, an lm_head of its own (tie_word_embeddings
    false), token ids in the vocabulary. ModelConfig's fields without num_layers."""
    fields = llama_fields(layer, source, layers=1)
    if fields.pop("num_layers") != 1:
        raise UserError(f"{where(source, field='num_hidden_layers')}: expected 1, got "
                        f"{layer['num_hidden_layers']} (an EAGLE-3 head is one decoder layer, "
                        "as the engine builds it and the simulator times it)")
    model_type = layer.get("model_type")
    if model_type is not None and model_type != "llama":
        raise UserError(f"{where(source, field='model_type')}: expected \"llama\" (a head's "
                        f"layer is a Llama decoder layer), got {model_type!r}")
    check_layer_kind(layer, source, engine=True)
    if bool_field(layer, "tie_word_embeddings", source):
        raise UserError(f"{where(source, field='tie_word_embeddings')}: true is not supported "
                        "(an EAGLE-3 head has an lm_head of its own, of draft_vocab_size rows)")
    dtype = layer.get("torch_dtype")
    if dtype is not None and not isinstance(dtype, str):
        raise UserError(f"{where(source, field='torch_dtype')}: expected a dtype name such as "
                        f"\"bfloat16\", got {dtype!r}")
    for key in ("bos_token_id", "eos_token_id"):
        check_token_ids(layer.get(key), where(source, field=key), lists=key == "eos_token_id",
                        vocab=fields["vocab_size"])
    return fields


def eagle3_for(target: ModelConfig, draft_vocab_size: int | None = None,
               name: str | None = None) -> EagleHeadConfig:
    """An EAGLE-3 head shaped for `target`, as the published heads are (one target-sized layer)."""
    return EagleHeadConfig(
        name=name or f"{target.name}-eagle3", hidden_size=target.hidden_size,
        num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
        intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size or min(32000, target.vocab_size),
        target_hidden_size=target.hidden_size, head_dim=target.head_dim,
        rope_theta=target.rope_theta, rope_scaling=target.rope_scaling,
        rms_norm_eps=target.rms_norm_eps, max_position_embeddings=target.max_position_embeddings)


def eagle_for(target: ModelConfig, name: str | None = None) -> EagleHeadConfig:
    """An EAGLE (-1) head shaped for `target`: one target-sized layer, the target's lm_head."""
    head = eagle3_for(target, draft_vocab_size=target.vocab_size, name=name or
                      f"{target.name}-eagle")
    return replace(head, kind="eagle")

