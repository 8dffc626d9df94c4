"""Which model a perf bundle's tables are of (sim/tables.py reads them): a model's per-rank
shapes against meta.yaml's, the refusal of another model's tables, and the bundles this
repository commits (traces/peers/) that price a catalog GPU by default.
"""

from __future__ import annotations

import functools
from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.sim.tables import PEERS, VOCAB_PADDING, BundleMeta, OpTables, bundle_meta, read_meta


@functools.cache   # (committed files: the glob and the reads are the same in a process;
# advise resolves a plan per cell, and the glob alone is about 11 ms)
def committed_bundles(gpu: str) -> tuple[Path, ...]:
    """The perf bundles committed under traces/peers/ that were measured on catalog GPU `gpu`
    (meta.yaml's `gpu`, the device as CUDA names it, is that entry's): variant folders, those
    that measured more of a step first (fewer `not_measured`), then by path."""
    from stepgap.sim.hardware import catalog_entry
    found = []
    for meta in sorted(PEERS.glob("*/**/profiler/perf/*/*/*/*/meta.yaml")):
        m = read_meta(meta.parent)
        if catalog_entry(str(m.get("gpu") or "")) == gpu:
            found.append((len(m.get("not_measured") or ()), str(meta.parent), meta.parent))
    return tuple(p for *_, p in sorted(found))


@functools.cache   # (a committed bundle's: read once a process, as committed_bundles)
def committed_meta(root: Path) -> tuple[dict, BundleMeta]:
    """A committed bundle's meta.yaml, as read and as its tables read it."""
    return read_meta(root), bundle_meta(root)


# The GEMMs of a layer, which stream its weights: a committed bundle prices a model by default
# only where it timed all of them (one that times fewer is fit data of the GPU's roofline, and
# prices a run that names it with --device-profile).
LAYER_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def committed_bundle(gpu: str, target, tp: int, fp8_weights: bool, fp8_kv: bool) -> Path | None:
    """The committed bundle (committed_bundles) that prices `target` on `gpu` at this TP: it
    timed every GEMM of a layer (LAYER_GEMMS), the model's family and per-rank shapes
    (shape_mismatch), a tp<N>/ folder, and weights and KV cache of the bundle's precision (a
    bundle that names no fp8 is taken for bf16 or fp16); None where none does."""
    for root in committed_bundles(gpu):
        meta, bm = committed_meta(root)
        if set(LAYER_GEMMS) & set(meta.get("not_measured") or ()):
            continue
        weight, _, kv = str(meta.get("variant") or root.name).partition("-kv")
        if (weight == "fp8", kv.startswith("fp8")) != (fp8_weights, fp8_kv):
            continue
        if tp in bm.tp_folders and shape_mismatch(bm, target, target.hidden_size) is None:
            return root
    return None


def per_rank(c, tp: int) -> dict[str, int]:
    """A model's shapes on one of tp ranks, as vLLM shards them (and as the profiler's
    hf_overrides write them): heads, MLP and the padded vocabulary split; KV heads split, one
    per rank at least (replicated past their number)."""
    vocab = -(-c.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    return {"num_attention_heads": c.num_heads // tp,
            "num_key_value_heads": max(1, c.num_kv_heads // tp),
            "intermediate_size": c.intermediate_size // tp, "vocab_size": vocab // tp,
            "head_dim": c.head_dim, "hidden_size": c.hidden_size}


def shape_mismatch(tables: OpTables | BundleMeta, c, hidden: int,
                   family: bool = True) -> str | None:
    """None where a model (or a drafter's decoder layer) has the shapes the tables were
    measured at, else which do not match, field by field: its family against meta.yaml's
    `architecture` (not for an EAGLE head, whose one layer is priced kernel by kernel), its
    width against the target's `hidden`, and its shapes per rank at the tables' TP degree
    against meta.yaml's hf_overrides (heads, KV heads, MLP width, vocabulary; head_dim and
    hidden_size where the overrides give them: Qwen3's head_dim is not hidden / heads, so each
    field is taken as it is). A MoE bundle's expert counts in hf_overrides are the profiler's
    own (it shrinks the experts to one rank's share to measure moe.csv), so they are not
    compared. `tables`: the tables, or a bundle's meta.yaml alone (sim/moe_tables.py)."""
    r, s, out = tables.shapes_tp, tables.shapes, []
    kind = getattr(c, "model_type", "llama")
    if family and kind != tables.family:
        out.append(f"architecture is {tables.family!r}, --model is a {kind!r} model")
    if c.hidden_size != hidden:
        out.append(f"hidden_size {c.hidden_size}, not the target's {hidden}")
    mine = per_rank(c, r)
    for key, want in mine.items():
        have = s.get(key)
        if key in ("head_dim", "hidden_size") and have is None:
            continue   # the profiler overrides only what sharding changes
        if have != want:
            total = f" ({have * r} in all)" if isinstance(have, int) and r > 1 \
                and key not in ("head_dim", "hidden_size") else ""
            out.append(f"engine_effective.hf_overrides.{key} is {have!r} per rank at TP {r}"
                       f"{total}, --model {c.name} has {want}")
    return "; ".join(out) or None


def refuse_another_model(tables: OpTables | BundleMeta, target) -> None:
    """One line naming each field where the tables were measured for another model; and where
    meta.yaml's `model` is one stepgap knows (a preset, or its Hugging Face id), that model's
    shapes against the target's (a MoE bundle's expert counts are the profiler's own, so its
    shapes alone let a bundle that names another model through)."""
    why = shape_mismatch(tables, target, target.hidden_size)
    if why is not None:
        raise UserError(f"{Path(tables.path) / 'meta.yaml'}: tables of {tables.model}, not "
                        f"of --model {target.name}: {why}")
    from stepgap.common.model_presets import load_model_config, preset_of
    named = preset_of(str(tables.model))
    if named is None or named == target.name:
        return
    other = load_model_config(named)
    differ = [f"{k} {getattr(other, k)} vs {getattr(target, k)}" for k in MODEL_SHAPE
              if getattr(other, k) != getattr(target, k)]
    if differ:
        raise UserError(f"{where(Path(tables.path) / 'meta.yaml', field='model')}: "
                        f"{tables.model!r} ({named}), not --model {target.name}: "
                        f"{', '.join(differ)}")


MODEL_SHAPE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size",
               "num_experts")
