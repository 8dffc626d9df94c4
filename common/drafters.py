"""What drafts for each speculation method (speculative_config's method and model), checked
against the target: an EAGLE head, a draft model, the target's own MTP layers, or nothing."""

from __future__ import annotations

from pathlib import Path

from stepgap.common.errors import UserError
from stepgap.common.model_families import llama_fields
from stepgap.common.model_fields import check_config_object, named
from stepgap.common.model_heads import EagleHeadConfig
from stepgap.common.model_presets import (DRAFT_PRESETS, EAGLE_IDS, MODEL_PRESETS,
                                          load_draft_config, load_model_config, preset_of,
                                          read_config)
from stepgap.common.modelcfg import ModelConfig
from stepgap.common.speculation import METHODS


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
                 k: int = 1) -> EagleHeadConfig | ModelConfig | None:
    """What drafts for `method` (speculative_config's model `spec`), checked against the
    target: an EAGLE head (None, or the method's name, shapes one from the target), the draft
    model of `draft_model`, or None (mtp drafts with the target's own MTP layers; n-gram and
    suffix decoding need no model)."""
    src = f"--speculative-config method {method}"
    if method not in METHODS:
        raise UserError(f"{src}: not modelled (methods: {', '.join(METHODS)})")
    m = METHODS[method]
    if m.derive_head is not None:
        if spec is None or spec == method or (m.eagle1_heads and spec in EAGLE_IDS):
            if spec in EAGLE_IDS and preset_of(target.name) != EAGLE_IDS[spec]:
                raise UserError(f"{src}: {spec} is a head of {EAGLE_IDS[spec]}, not of "
                                f"{target.name}")
            head = m.derive_head(target)
        elif m.eagle1_heads and spec not in DRAFT_PRESETS and Path(spec).exists():
            d, source = read_config(spec)   # an EAGLE head's config is a 1-layer Llama's
            check_config_object(d, source)
            fields = llama_fields(d, source)
            fields.pop("num_layers")
            with named(source):
                head = EagleHeadConfig(name=Path(spec).name, draft_vocab_size=fields["vocab_size"],
                                    target_hidden_size=fields["hidden_size"], kind="eagle",
                                    **fields)
        else:
            head = load_draft_config(spec, target)
            if m.eagle1_heads:
                raise UserError(f"{src}: {spec} is an EAGLE-3 head (use method eagle3)")
        head.check_target(target, f"--draft {spec or method}")
        return head
    if m.needs_checkpoint:
        if spec is None:
            raise UserError(f"{src} needs the draft model: speculative_config's model "
                            "(or --draft), a preset or a model folder")
        draft = load_model_config(spec)
        if draft.vocab_size != target.vocab_size:
            raise UserError(f"{src}: the draft model {spec} has vocab_size {draft.vocab_size}, "
                            f"the target {target.vocab_size} (vLLM requires the same "
                            "vocabulary)")
        return draft
    if spec is not None and spec != target.name and preset_of(spec) != target.name:
        raise UserError(f"{src} takes no draft model (got {spec})")
    if m.uses_mtp_layers:
        if not target.num_mtp_layers:
            raise UserError(f"{src}: model {target.name!r} has no MTP layers "
                            "(num_nextn_predict_layers); mtp drafts with the target's own "
                            "next-token layers")
        n = target.num_mtp_layers
        if k > n and k % n:
            raise UserError(f"{src}: num_speculative_tokens {k} must be divisible by the "
                            f"model's {n} MTP layers (vLLM reuses them in turn)")
    return None
