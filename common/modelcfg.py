"""Model configurations, shared by the simulator's cost model and the engine's model builder.

A target is a decoder described by a Hugging Face `config.json`. The engine builds Llama-family
targets only (`model_type` llama); the simulator also reads the families whose costs it models,
each from the fields that family's config uses (`from_hf_dict`):

- `llama`, `qwen3`: dense GQA decoders (`head_dim`, `tie_word_embeddings`);
- `qwen3_moe`: every layer a mixture of experts (`num_experts`, `num_experts_per_tok`,
  `moe_intermediate_size`; `decoder_sparse_step` and `mlp_only_layers` say which layers);
- `gpt_oss`: MoE (`num_local_experts`, `num_experts_per_tok`, `intermediate_size` per expert),
  sliding-window attention on the layers `layer_types` names, MXFP4 experts;
- `deepseek_v3`: multi-head latent attention (`kv_lora_rank`, `q_lora_rank`,
  `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`), MoE after `first_k_dense_replace`
  dense layers (`n_routed_experts`, `n_shared_experts`, `moe_intermediate_size`), FP8 weights,
  and `num_nextn_predict_layers` multi-token-prediction layers (the `mtp` drafter).

Any other family, a field it needs that is missing, or a quantization that is not modelled is
one clear error naming the file and the field: nothing is guessed. `quantization_config` is read
for `fp8` (one byte per weight of the decoder's linear layers) and `mxfp4` (4.25 bits per expert
weight; the modules it names as not converted stay bf16). The checks of single fields
(`int_field`, `bool_field`, `check_token_ids`, `check_rope_scaling`, `check_layer_fields`) serve
every family, the heads and both halves alike (docs/robustness.md).

An EAGLE-3 head is one Llama decoder layer over [token embedding ‖ fused target hidden states],
in one of the two checkpoint layouts of DESIGN.md §4:

- yuhuili: `architectures: ["LlamaForCausalLMEagle3"]`, Llama fields at the top, `draft_vocab_size`;
- speculators: `speculators_model_type: "eagle3"`, Llama fields under `transformer_layer_config`,
  `eagle_aux_hidden_state_layer_ids` at the top.

An EAGLE (-1) head (`kind="eagle"`, simulator only) is one decoder layer over fc([embedding ‖
the target's last hidden state]) with the target's own lm_head.

`check_tensor_parallel` holds vLLM's sharding rules (attention heads, KV heads, MLP widths), and
`weight_bytes(tp)` / `kv_bytes_per_token(tp)` say what one GPU of a tensor-parallel group holds.

Named presets stand for well-known models, so nothing is downloaded.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json

LLAMA3_ROPE_8K = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA32_ROPE = {**LLAMA3_ROPE_8K, "factor": 32.0}
# The RoPE scalings the engine implements (its Llama rotary embedding); the simulator's costs do
# not depend on RoPE, so the other families take any (their known keys still checked).
LLAMA_ROPES = ("llama3", "linear", "default", None)
BF16 = 2  # bytes per bf16 element


def shard_problem(tp: int, heads: int, kv_heads: int | None, widths) -> str | None:
    """Why tp GPUs cannot shard these heads and widths as vLLM does, or None."""
    if kv_heads is not None and (kv_heads % tp if tp <= kv_heads else tp % kv_heads):
        return (f"has {kv_heads} KV heads, which {tp} neither divides nor is a multiple of "
                "(vLLM shards KV heads over the ranks, or replicates them when there are "
                "fewer than ranks)")
    if heads % tp:
        return f"has {heads} attention heads, which {tp} does not divide"
    for name, w in widths:
        if w % tp:
            return f"has {name} {w}, which {tp} does not divide"
    return None


def check_shards(what: str, tp: int, heads: int, kv_heads: int | None, widths=()) -> None:
    why = shard_problem(tp, heads, kv_heads, widths)
    if why is not None:
        ok = [n for n in range(1, 9) if shard_problem(n, heads, kv_heads, widths) is None]
        raise UserError(f"--tensor-parallel-size {tp}: {what} {why} (sizes that shard it: "
                        f"{', '.join(map(str, ok))})")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder-only target (or draft) model. The defaults of the fields after `eos_token_id`
    describe a dense bf16 GQA model; the other families set what they use (module docstring)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int      # the dense MLP's width (dense layers of a MoE model too)
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
    model_type: str = "llama"
    # mixture of experts (num_experts 0: a dense model)
    num_experts: int = 0                  # routed experts per MoE layer
    num_experts_per_tok: int = 0          # top-k
    moe_intermediate_size: int = 0        # one routed expert's width
    shared_expert_intermediate_size: int = 0   # all shared experts together (DeepSeek)
    num_moe_layers: int = 0               # layers whose MLP is the MoE
    # multi-head latent attention (kv_lora_rank 0: plain GQA)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # sliding-window attention on some layers (gpt-oss)
    sliding_window: int = 0
    num_sliding_layers: int = 0
    num_mtp_layers: int = 0               # multi-token-prediction layers (DeepSeek)
    weight_bytes: float = 2.0             # per weight of the decoder's linear layers
    expert_weight_bytes: float = 2.0      # per weight of a routed expert
    quantization: str | None = None

    def __post_init__(self):
        who = f"model {self.name!r}"
        if not isinstance(self.model_type, str) or self.model_type not in FAMILIES:
            raise UserError(f"{who}: model_type {self.model_type!r} is not modelled "
                            f"(families: {', '.join(FAMILIES)})")
        check_layer_fields(self, who, ("num_layers",),
                           LLAMA_ROPES if self.model_type == "llama" else None)
        if not isinstance(self.tie_word_embeddings, bool):
            raise UserError(f"{who}: field 'tie_word_embeddings' must be true or false, got "
                            f"{self.tie_word_embeddings!r}")
        if not isinstance(self.torch_dtype, str):
            raise UserError(f"{who}: field 'torch_dtype' must be a string, got "
                            f"{self.torch_dtype!r}")
        for f in ("bos_token_id", "eos_token_id"):
            check_token_ids(getattr(self, f), f"{who}: field '{f}'", lists=f == "eos_token_id")
        for f in FAMILY_COUNTS:
            v = getattr(self, f)
            if not _is_int(v) or v < 0:
                raise UserError(f"{who}: field '{f}' must be an integer >= 0, got {v!r}")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise UserError(f"{who}: num_experts_per_tok ({self.num_experts_per_tok}) "
                                f"must be in 1..num_experts ({self.num_experts})")
            if self.moe_intermediate_size < 1 or not 1 <= self.num_moe_layers <= self.num_layers:
                raise UserError(f"{who}: a MoE model needs moe_intermediate_size >= 1 and "
                                f"1..{self.num_layers} MoE layers")
        if self.kv_lora_rank and min(self.qk_nope_head_dim, self.qk_rope_head_dim,
                                     self.v_head_dim) < 1:
            raise UserError(f"{who}: latent attention needs qk_nope_head_dim, "
                            "qk_rope_head_dim and v_head_dim")
        if not 0 <= self.num_sliding_layers <= self.num_layers or \
                (self.num_sliding_layers and self.sliding_window < 1):
            raise UserError(f"{who}: sliding layers need a sliding_window >= 1")
        for f in ("weight_bytes", "expert_weight_bytes"):
            v = getattr(self, f)
            if not _is_number(v) or not math.isfinite(v) or v <= 0:
                raise UserError(f"{who}: field '{f}' (bytes per weight) must be a number > 0, "
                                f"got {v!r}")
        if self.quantization not in QUANTIZATIONS:
            raise UserError(f"{who}: quantization {self.quantization!r} is not modelled "
                            f"({', '.join(q for q in QUANTIZATIONS if q)})")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    # -- parameters (the roofline's bytes, the engine's checks) ------------------------------

    @property
    def attn_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        if not self.is_mla:
            return h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk + self.q_lora_rank
             if self.q_lora_rank else h * self.num_heads * qk)
        kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + self.num_heads * self.v_head_dim * h

    @property
    def moe_params(self) -> int:
        """One MoE layer's MLP: routed experts, router, shared experts."""
        h = self.hidden_size
        return (self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts
                + 3 * h * self.shared_expert_intermediate_size)

    @property
    def layer_params(self) -> int:
        """A dense layer's parameters."""
        return self.attn_params + 3 * self.hidden_size * self.intermediate_size \
            + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        layers = self.num_layers * self.layer_params
        if self.is_moe:
            layers = ((self.num_layers - self.num_moe_layers) * self.layer_params
                      + self.num_moe_layers * self.moe_layer_params)
        return layers + emb + head + self.hidden_size

    @property
    def moe_layer_params(self) -> int:
        return self.attn_params + self.moe_params + 2 * self.hidden_size

    @property
    def mtp_params(self) -> int:
        """The multi-token-prediction module: its layers (the model's last layer's kind), eh_proj
        (2h -> h), its norms, and its own embedding and head (as DeepSeek-V3's checkpoint holds
        them: 14 B parameters)."""
        if not self.num_mtp_layers:
            return 0
        h = self.hidden_size
        layer = self.moe_layer_params if self.is_moe else self.layer_params
        return self.num_mtp_layers * (layer + 2 * h * h + 3 * h + 2 * self.vocab_size * h)

    # -- tensor parallelism (vLLM's sharding) -------------------------------------------------

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one rank holds: vLLM shards them, or replicates each over tp / kv ranks."""
        return max(1, self.num_kv_heads // tp)

    def check_tensor_parallel(self, tp: int, what: str = "model") -> None:
        """vLLM's rules for sharding this model over tp GPUs, as one clear error."""
        widths = [("intermediate_size", self.intermediate_size
                   if self.num_moe_layers < self.num_layers else 0),
                  ("moe_intermediate_size", self.moe_intermediate_size),
                  ("the shared experts' width", self.shared_expert_intermediate_size)]
        check_shards(f"{what} {self.name!r}", tp, self.num_heads,
                     None if self.is_mla else self.num_kv_heads, widths)

    def weight_bytes_per_rank(self, tp: int = 1) -> float:
        """Bytes of weights one of tp GPUs holds: embedding and lm_head split over the
        vocabulary, attention and MLP widths split (column- or row-parallel), norms, the router
        and MLA's down-projections replicated; KV projections replicated past num_kv_heads."""
        h, w = self.hidden_size, self.weight_bytes
        emb = BF16 * self.vocab_size * h / tp
        total = emb + (0 if self.tie_word_embeddings else emb) + BF16 * h
        dense = self.num_layers - self.num_moe_layers
        total += dense * (self.attn_bytes(tp) + w * 3 * h * self.intermediate_size / tp
                          + BF16 * 2 * h)
        if self.is_moe:
            total += self.num_moe_layers * (self.attn_bytes(tp) + self.moe_bytes(tp)
                                            + BF16 * 2 * h)
        return total

    def attn_bytes(self, tp: int = 1) -> float:
        """One layer's attention weights on one rank."""
        h, d, w = self.hidden_size, self.head_dim, self.weight_bytes
        if not self.is_mla:
            q = self.num_heads * d * h * w / tp
            return 2 * q + 2 * h * d * self.kv_heads_per_rank(tp) * w
        return w * (self.attn_params - self.mla_replicated_params) / tp \
            + w * self.mla_replicated_params

    @property
    def mla_replicated_params(self) -> int:
        """MLA's q_a and kv_a projections and their norms: every rank holds them whole."""
        h = self.hidden_size
        return (h * self.q_lora_rank + self.q_lora_rank + h * (self.kv_lora_rank
                + self.qk_rope_head_dim) + self.kv_lora_rank)

    def moe_bytes(self, tp: int = 1) -> float:
        """One MoE layer's MLP on one rank: every expert's width split over the ranks."""
        h = self.hidden_size
        return (self.expert_weight_bytes * self.num_experts * 3 * h * self.moe_intermediate_size
                / tp + BF16 * h * self.num_experts
                + self.weight_bytes * 3 * h * self.shared_expert_intermediate_size / tp)

    def mtp_bytes_per_rank(self, tp: int = 1) -> float:
        """The MTP module on one rank (`mtp_params`): its layers split as the model's, eh_proj
        replicated, its embedding and head split over the vocabulary."""
        if not self.num_mtp_layers:
            return 0.0
        h = self.hidden_size
        if self.is_moe:
            layer = self.attn_bytes(tp) + self.moe_bytes(tp) + BF16 * 2 * h
        else:
            layer = self.attn_bytes(tp) + self.weight_bytes * 3 * h * self.intermediate_size \
                / tp + BF16 * 2 * h
        return self.num_mtp_layers * (layer + BF16 * (2 * h * h + 3 * h)
                                      + 2 * BF16 * self.vocab_size * h / tp)

    def kv_bytes_per_layer(self, tp: int = 1) -> int:
        """KV-cache bytes per token of one layer on one rank (bf16): MLA's latent is replicated
        on every rank."""
        if self.is_mla:
            return BF16 * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * BF16

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        return self.num_layers * self.kv_bytes_per_layer(tp)

    def default_aux_layers(self) -> tuple[int, int, int]:
        """EAGLE-3's default taps: the inputs of layers 2, L/2 and L-3 (vLLM's choice)."""
        n = self.num_layers
        return (min(2, n - 1), n // 2, max(n - 3, 0))

    def check_engine(self, source: str = "model") -> None:
        """The engine builds Llama-family bf16 targets only."""
        if self.model_type != "llama" or self.is_moe or self.quantization:
            raise UserError(f"{source}: model_type {self.model_type!r}"
                            + (f" with {self.quantization} weights" if self.quantization else "")
                            + " is modelled by the simulator only; the engine runs Llama-family "
                              "targets (model_type 'llama', bf16)")

    def to_hf_dict(self) -> dict:
        self.check_engine(self.name)
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
        reader = FAMILIES.get(model_type) if isinstance(model_type, str) else None
        if reader is None:
            raise UserError(f"{where(source, field='model_type')}: {model_type!r} is not "
                            f"modelled (families: {', '.join(FAMILIES)})")
        dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        if not isinstance(dtype, str):
            raise UserError(f"{where(source, field='torch_dtype')}: expected a dtype name such "
                            f"as \"bfloat16\", got {dtype!r}")
        for key in ("bos_token_id", "eos_token_id"):
            check_token_ids(d.get(key), where(source, field=key), lists=key == "eos_token_id")
        rope_ok = LLAMA_ROPES if model_type == "llama" else None
        fields = {**_llama_fields(d, source, rope_ok), **reader(d, source),
                  **_quantization(d, source, model_type)}
        hf_name = d.get("_name_or_path")
        with named(source):
            return cls(name=name or (hf_name if isinstance(hf_name, str) and hf_name else None)
                       or str(source), model_type=model_type,
                       tie_word_embeddings=bool_field(d, "tie_word_embeddings", source),
                       torch_dtype=dtype, bos_token_id=d.get("bos_token_id"),
                       eos_token_id=d.get("eos_token_id"), **fields)


@dataclass(frozen=True, slots=True)
class Eagle3Config:
    """An EAGLE-3 draft head for a target of hidden size `target_hidden_size`; with
    kind="eagle", an EAGLE (-1) head: fc(2h -> h) over [embedding ‖ the target's last hidden
    state] at every pass, one decoder layer, the target's lm_head (simulator only)."""

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
        # engine's (_llama_fields).
        check_layer_fields(self, who, ("draft_vocab_size", "target_hidden_size"), None)
        if self.draft_vocab_size > self.vocab_size:
            raise UserError(f"{who}: draft_vocab_size ({self.draft_vocab_size}) "
                            f"exceeds vocab_size ({self.vocab_size})")
        if self.layout not in ("yuhuili", "speculators"):
            raise UserError(f"{who}: layout must be 'yuhuili' or 'speculators'")
        if self.kind not in ("eagle3", "eagle"):
            raise UserError(f"{who}: kind must be 'eagle3' or 'eagle'")
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
        """Parameters without the (shared) embedding: fc, the layer, norms and lm_head (an
        EAGLE-1 head uses the target's lm_head)."""
        h, d = self.hidden_size, self.head_dim
        if self.kind == "eagle":
            attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
            return 2 * self.target_hidden_size * h + attn + 3 * h * self.intermediate_size + 2 * h
        fc = 3 * self.target_hidden_size * h
        attn = 2 * h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return fc + attn + mlp + 4 * h + self.draft_vocab_size * h

    @property
    def fc_inputs(self) -> int:
        """Target-width inputs of fc: three tapped hidden states (EAGLE-3), or the embedding
        and the last hidden state (EAGLE)."""
        return 3 if self.kind == "eagle3" else 2

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

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * BF16

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
    if not _is_number(v) or not math.isfinite(v) or v <= 0:
        raise UserError(f"{where(source, field=key)}: expected a positive number, got {v!r}")
    return v


def _count(d: dict, source, key) -> int:
    """An integer >= 0; missing or null is 0."""
    v = d.get(key)
    if v is None:
        return 0
    if not _is_int(v) or v < 0:
        raise UserError(f"{where(source, field=key)}: expected an integer >= 0, got {v!r}")
    return v


def _llama_fields(d: dict, source, rope_kinds=LLAMA_ROPES) -> dict:
    """The Llama fields every config has, validated with errors naming the field. `rope_kinds`:
    the RoPE scalings accepted (None: any; the simulator's costs do not depend on it)."""
    def need(key, kind=int, default=None):
        return _need(d, source, key, kind, default)

    heads = need("num_attention_heads")
    head_dim = d.get("head_dim")
    return {"hidden_size": need("hidden_size"), "num_layers": need("num_hidden_layers"),
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
    if not isinstance(dense, list) or not all(_is_int(i) and i >= 0 for i in dense):
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
FAMILIES = {"llama": _dense, "qwen3": _dense, "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss,
            "deepseek_v3": _deepseek_v3}
# ModelConfig's fields of the other families: counts, 0 where the family has none.
FAMILY_COUNTS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "num_moe_layers", "kv_lora_rank",
                 "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "sliding_window", "num_sliding_layers", "num_mtp_layers")
QUANTIZATIONS = (None, "fp8", "mxfp4")
MXFP4_BYTES = 4.25 / 8   # 4-bit values plus one 8-bit scale per 32


def _quantization(d: dict, source, model_type: str) -> dict:
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
        if not (_is_int(v) if integral else _is_number(v)) or not math.isfinite(v) or v <= 0:
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
    check_rope_scaling(cfg.rope_scaling, f"{who}: field 'rope_scaling'", rope_kinds)


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


def eagle_for(target: ModelConfig, name: str | None = None) -> Eagle3Config:
    """An EAGLE (-1) head shaped for `target`: one target-sized layer, the target's lm_head."""
    head = eagle3_for(target, draft_vocab_size=target.vocab_size, name=name or
                      f"{target.name}-eagle")
    return replace(head, kind="eagle")


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
# Simulator presets, as the fields of each model's published config.json that its family's
# reader uses (copies in ai-dynamo/aiconfigurator's model_configs/, docs/sim.md), so that a
# preset and the real file give the same config.
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
                                              ("qwen3-8b", 4096, 36, 32, 12288, False))},
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
MODEL_PRESETS.update({name: ModelConfig.from_hf_dict(d, f"preset {name}", name)
                      for name, d in HF_PRESETS.items()})
# The yuhuili/EAGLE3-LLaMA3.1-Instruct-8B head: one 4096-wide layer, draft vocab 32000,
# taps before layers 2, 16 and 29.
DRAFT_PRESETS: dict[str, Eagle3Config] = {
    "llama-3.1-8b-eagle3": Eagle3Config(
        "llama-3.1-8b-eagle3", hidden_size=4096, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=128256, draft_vocab_size=32000,
        target_hidden_size=4096, aux_layer_ids=(2, 16, 29), rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE_8K, max_position_embeddings=2048),
    # One target-sized layer and a 32000-token draft vocabulary: the shape of SpecForge's
    # llama3-70B-eagle3.json and of the speculators-format heads (RedHatAI); yuhuili's 70B head
    # is narrower, but its config was not found in a source we could read (docs/sim.md).
    "llama-3.3-70b-eagle3": eagle3_for(MODEL_PRESETS["llama-3.3-70b"],
                                       name="llama-3.3-70b-eagle3"),
    # AngelSlim's qwen3-8b-eagle3.json: hidden 4096, intermediate 12288, 32/8 heads of 128,
    # draft vocab 32000 (the RedHatAI head's config was not found).
    "qwen3-8b-eagle3": eagle3_for(MODEL_PRESETS["qwen3-8b"], name="qwen3-8b-eagle3"),
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


SPEC_METHODS = ("eagle3", "eagle", "mtp", "draft_model", "ngram", "ngram_gpu")
DERIVED_HEADS = {"eagle3": eagle3_for, "eagle": eagle_for}


def default_draft_model(target: ModelConfig) -> str:
    """The smallest dense preset with the target's vocabulary (Llama-3.2-1B for Llama-3
    targets, Qwen3-0.6B for Qwen3 ones), for draft_model without a model."""
    same = [n for n, m in MODEL_PRESETS.items() if m.vocab_size == target.vocab_size
            and not m.is_moe and m.num_params < target.num_params]
    if not same:
        raise UserError(f"--speculative-config method draft_model needs the draft model "
                        f"(speculative_config's model): no preset shares {target.name}'s "
                        f"vocabulary of {target.vocab_size}")
    return min(same, key=lambda n: MODEL_PRESETS[n].num_params)


def load_drafter(method: str, spec: str | None, target: ModelConfig,
                 k: int = 1) -> Eagle3Config | ModelConfig | None:
    """What drafts for `method` (speculative_config's model `spec`), checked against the
    target: an EAGLE head (None, or the method's name, shapes one from the target), the draft
    model of `draft_model`, or None (mtp drafts with the target's own MTP layers; n-gram needs
    no model)."""
    src = f"--speculative-config method {method}"
    if method not in SPEC_METHODS:
        raise UserError(f"{src}: not modelled (methods: {', '.join(SPEC_METHODS)})")
    if method in DERIVED_HEADS:
        if spec is None or spec == method:
            head = DERIVED_HEADS[method](target)
        elif method == "eagle" and spec not in DRAFT_PRESETS and Path(spec).exists():
            d, source = _read_config(spec)   # an EAGLE head's config is a 1-layer Llama's
            check_config_object(d, source)
            fields = _llama_fields(d, source)
            fields.pop("num_layers")
            with named(source):
                head = Eagle3Config(name=Path(spec).name, draft_vocab_size=fields["vocab_size"],
                                    target_hidden_size=fields["hidden_size"], kind="eagle",
                                    **fields)
        else:
            head = load_draft_config(spec, target)
            if method == "eagle":
                raise UserError(f"{src}: {spec} is an EAGLE-3 head (use method eagle3)")
        head.check_target(target, f"--draft {spec or method}")
        return head
    if method == "draft_model":
        if spec is None:
            raise UserError(f"{src} needs the draft model: speculative_config's model "
                            "(or --draft), a preset or a model folder")
        draft = load_model_config(spec)
        if draft.vocab_size != target.vocab_size:
            raise UserError(f"{src}: the draft model {spec} has vocab_size {draft.vocab_size}, "
                            f"the target {target.vocab_size} (vLLM requires the same "
                            "vocabulary)")
        return draft
    if spec is not None and spec != target.name:
        raise UserError(f"{src} takes no draft model (got {spec})")
    if method == "mtp":
        if not target.num_mtp_layers:
            raise UserError(f"{src}: model {target.name!r} has no MTP layers "
                            "(num_nextn_predict_layers); mtp drafts with the target's own "
                            "next-token layers")
        n = target.num_mtp_layers
        if k > n and k % n:
            raise UserError(f"{src}: num_speculative_tokens {k} must be divisible by the "
                            f"model's {n} MTP layers (vLLM reuses them in turn)")
    return None


def config_dict(cfg) -> dict:
    """A plain dict of a config, for run results."""
    return asdict(cfg)
