"""Model configurations, shared by the simulator's cost model and the engine's model builder.

A target is a decoder described by a Hugging Face `config.json`. The engine builds Llama-family
targets only (`model_type` llama); the simulator also reads the families whose costs it models,
each from the fields that family's config uses (`from_hf_dict`; the readers are
common/model_families.py's):

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
one clear error naming the file and the field: nothing is guessed. The checks of single fields
(common/model_fields.py) serve every family, the heads and both halves alike
(docs/reference/robustness.md).

`check_tensor_parallel` holds vLLM's sharding rules (attention heads, KV heads, MLP widths), and
`weight_bytes(tp)` / `kv_bytes_per_token(tp)` say what one GPU of a tensor-parallel group holds.

The drafters are common/model_heads.py's (EAGLE heads) and common/drafters.py's (which drafts
for each speculation method); named presets are common/model_presets.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepgap.common.errors import UserError, where
from stepgap.common.model_families import (FAMILIES, FAMILY_COUNTS, QUANTIZATIONS, llama_fields,
                                           quantization_fields)
from stepgap.common.limits import is_finite, is_int
from stepgap.common.model_fields import (LLAMA_ROPES, architectures, bool_field,
                                         check_config_object, check_layer_fields,
                                         check_layer_kind, check_token_ids, named)

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
            check_token_ids(getattr(self, f), f"{who}: field '{f}'", lists=f == "eos_token_id",
                            vocab=self.vocab_size)
        for f in FAMILY_COUNTS:
            v = getattr(self, f)
            if not is_int(v) or v < 0:
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
            if not is_finite(v) or v <= 0:
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

    def weight_bytes_per_rank(self, tp: int = 1, moe_shards: int | None = None) -> float:
        """Bytes of weights one of tp GPUs holds: embedding and lm_head split over the
        vocabulary, attention and MLP widths split (column- or row-parallel), norms, the router
        and MLA's down-projections replicated; KV projections replicated past num_kv_heads.
        `moe_shards`: the GPUs the routed experts are spread over (data parallelism spreads
        them over dp x tp, by count or by width); None: tp."""
        h, w = self.hidden_size, self.weight_bytes
        emb = BF16 * self.vocab_size * h / tp
        total = emb + (0 if self.tie_word_embeddings else emb) + BF16 * h
        dense = self.num_layers - self.num_moe_layers
        total += dense * (self.attn_bytes(tp) + w * 3 * h * self.intermediate_size / tp
                          + BF16 * 2 * h)
        if self.is_moe:
            total += self.num_moe_layers * (self.attn_bytes(tp) + self.moe_bytes(tp, moe_shards)
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

    def moe_bytes(self, tp: int = 1, shards: int | None = None) -> float:
        """One MoE layer's MLP on one rank: the routed experts spread over `shards` GPUs (None:
        the tp ranks, each expert's width split), the router replicated, the shared experts
        split over tp."""
        h = self.hidden_size
        return (self.expert_weight_bytes * self.num_experts * 3 * h * self.moe_intermediate_size
                / (shards or tp) + BF16 * h * self.num_experts
                + self.weight_bytes * 3 * h * self.shared_expert_intermediate_size / tp)

    def mtp_bytes_per_rank(self, tp: int = 1, moe_shards: int | None = None) -> float:
        """The MTP module on one rank (`mtp_params`): its layers split as the model's, eh_proj
        replicated, its embedding and head split over the vocabulary."""
        if not self.num_mtp_layers:
            return 0.0
        h = self.hidden_size
        if self.is_moe:
            layer = self.attn_bytes(tp) + self.moe_bytes(tp, moe_shards) + BF16 * 2 * h
        else:
            layer = self.attn_bytes(tp) + self.weight_bytes * 3 * h * self.intermediate_size \
                / tp + BF16 * 2 * h
        return self.num_mtp_layers * (layer + BF16 * (2 * h * h + 3 * h)
                                      + 2 * BF16 * self.vocab_size * h / tp)

    def kv_bytes_per_layer(self, tp: int = 1, dtype_bytes: int = BF16) -> int:
        """KV-cache bytes per token of one layer on one rank, `dtype_bytes` an element (bf16 by
        default): MLA's latent is replicated on every rank."""
        if self.is_mla:
            return dtype_bytes * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int = BF16) -> int:
        return self.num_layers * self.kv_bytes_per_layer(tp, dtype_bytes)

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
        # model_type llama is what the engine builds: its RoPE scalings, SiLU, no biases
        engine = model_type == "llama"
        fields = {**llama_fields(d, source, LLAMA_ROPES if engine else None),
                  **reader(d, source), **quantization_fields(d, source, model_type)}
        check_layer_kind(d, source, engine)
        for key in ("bos_token_id", "eos_token_id"):
            check_token_ids(d.get(key), where(source, field=key), lists=key == "eos_token_id",
                            vocab=fields["vocab_size"])
        hf_name = d.get("_name_or_path")
        with named(source):
            return cls(name=name or (hf_name if isinstance(hf_name, str) and hf_name else None)
                       or str(source), model_type=model_type,
                       tie_word_embeddings=bool_field(d, "tie_word_embeddings", source),
                       torch_dtype=dtype, bos_token_id=d.get("bos_token_id"),
                       eos_token_id=d.get("eos_token_id"), **fields)
