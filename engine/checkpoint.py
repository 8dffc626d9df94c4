"""Checkpoints: load and save a Llama target and an EAGLE-3 head (both layouts of
docs/explanation/design.md §4).

Files hold the Hugging Face tensor names (`q_proj`, `k_proj`, ... `gate_proj`, `up_proj`); the
modules fuse them (`qkv_proj`, `gate_up_proj`), so each file tensor maps onto a row range of a
module parameter. A checkpoint that does not fit its config fails with one `UserError` that names
the tensor: missing, wrong shape, unexpected, or a draft head made for another target.

Presets (`llama-3.1-8b`, `llama-3.1-8b-eagle3`, `eagle3`) build random weights directly on the
device, in the run's dtype, for timing at full scale without downloading anything. `tiny` and
`tiny-eagle3` are make-tiny's random pair, built in memory on the CPU (the same weights on every
device) and moved: they need no files at all. safetensors is imported only to read or write files.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from stepgap.engine.eagle3 import Eagle3Head
from stepgap.engine.model import Llama, init_weights
from stepgap.engine.tiny import TINY_TARGET, build_tiny, tiny_draft_config
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json_object, write_bytes, write_json
from stepgap.common.model_heads import EagleHeadConfig
from stepgap.common.model_presets import (DERIVED_HEAD, DRAFT_IDS, load_draft_config,
                                          load_model_config, preset_of)
from stepgap.common.modelcfg import ModelConfig


def target_config(spec: str) -> ModelConfig:
    """A target's config: `tiny`, a preset, a folder or a config.json (Llama-family only)."""
    if spec == "tiny":
        return TINY_TARGET
    cfg = load_model_config(spec)
    cfg.check_engine(f"--model {spec}")
    return cfg


def draft_config(spec: str, target: ModelConfig) -> EagleHeadConfig:
    """A head's config: `tiny-eagle3`, a preset, `eagle3`, a folder or a config.json."""
    return tiny_draft_config(target) if spec == "tiny-eagle3" else load_draft_config(spec, target)


IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@contextmanager
def build_on(device: torch.device, dtype: torch.dtype):
    """Create parameters directly on `device` in `dtype` (no float32 copy on the host first)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


# -- name maps: file tensor name -> (module tensor, first row, last row) ------------------------


def _attn_names(prefix: str, attn) -> dict:
    hq, hk = attn.h * attn.d, attn.hkv * attn.d
    w = attn.qkv_proj.weight
    return {f"{prefix}self_attn.q_proj.weight": (w, 0, hq),
            f"{prefix}self_attn.k_proj.weight": (w, hq, hq + hk),
            f"{prefix}self_attn.v_proj.weight": (w, hq + hk, hq + 2 * hk),
            f"{prefix}self_attn.o_proj.weight": (attn.o_proj.weight, None, None)}


def _mlp_names(prefix: str, mlp) -> dict:
    w = mlp.gate_up_proj.weight
    inter = w.shape[0] // 2
    return {f"{prefix}mlp.gate_proj.weight": (w, 0, inter),
            f"{prefix}mlp.up_proj.weight": (w, inter, 2 * inter),
            f"{prefix}mlp.down_proj.weight": (mlp.down_proj.weight, None, None)}


def target_names(model: Llama) -> dict:
    names = {"model.embed_tokens.weight": (model.embed_tokens.weight, None, None),
             "model.norm.weight": (model.norm.weight, None, None)}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        names[p + "input_layernorm.weight"] = (layer.input_layernorm.weight, None, None)
        names[p + "post_attention_layernorm.weight"] = \
            (layer.post_attention_layernorm.weight, None, None)
        names.update(_attn_names(p, layer.self_attn))
        names.update(_mlp_names(p, layer.mlp))
    if model.lm_head is not None:
        names["lm_head.weight"] = (model.lm_head.weight, None, None)
    return names


def draft_names(head: Eagle3Head, layout: str) -> dict:
    p = "midlayer." if layout == "yuhuili" else "layers.0."
    m = head.midlayer
    names = {"fc.weight": (head.fc.weight, None, None),
             "norm.weight": (head.norm.weight, None, None),
             "lm_head.weight": (head.lm_head.weight, None, None),
             "d2t": (head.d2t, None, None),
             p + "input_layernorm.weight": (m.input_layernorm.weight, None, None),
             p + "hidden_norm.weight": (m.hidden_norm.weight, None, None),
             p + "post_attention_layernorm.weight": (m.post_attention_layernorm.weight, None, None)}
    names.update(_attn_names(p, m.self_attn))
    names.update(_mlp_names(p, m.mlp))
    return names


def _shape(t, lo, hi) -> list[int]:
    return [hi - lo, *t.shape[1:]] if lo is not None else list(t.shape)


# -- reading ----------------------------------------------------------------------------------


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index, "a safetensors index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{where(index, field='weight_map')}: missing or not an object "
                            "(tensor name -> file)")
        bad = next((k for k, f in weight_map.items()
                    if not isinstance(f, str) or not f or Path(f).is_absolute()
                    or ".." in Path(f).parts), None)
        if bad is not None:
            raise UserError(f"{where(index, field='weight_map')}: tensor {bad!r} maps to "
                            f"{weight_map[bad]!r}, not a file name in the folder")
        return [folder / f for f in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"{folder}: no *.safetensors weights there")
    return files


def _open_tensors(folder: Path):
    """name -> (file, handle) for every tensor of the checkpoint."""
    where = {}
    for f in _weight_files(folder):
        if not f.is_file():
            raise UserError(f"{f}: listed in the safetensors index but missing")
        from safetensors import safe_open
        try:
            handle = safe_open(str(f), framework="pt")
        except Exception as e:  # safetensors raises its own error types
            raise UserError(f"{f}: not a readable safetensors file ({e})") from None
        for name in handle.keys():
            where[name] = (f, handle)
    return where


def _load_into(folder: Path, names: dict, optional: set[str] = frozenset(),
               ignored: set[str] = frozenset()) -> set[str]:
    """Copy every named tensor into its module tensor. Returns the optional names found."""
    tensors = _open_tensors(folder)
    for name in tensors:
        if name not in names and name not in ignored and not name.endswith(IGNORED_SUFFIXES):
            f, _ = tensors[name]
            raise UserError(f"{f}: unexpected tensor '{name}' (not part of this model's config; "
                            "is this the right checkpoint?)")
    found = set()
    with torch.no_grad():
        for name, (dst, lo, hi) in names.items():
            if name not in tensors:
                if name in optional:
                    continue
                raise UserError(f"{folder}: tensor '{name}' is missing (expected shape "
                                f"{_shape(dst, lo, hi)})")
            f, handle = tensors[name]
            shape = list(handle.get_slice(name).get_shape())
            want = _shape(dst, lo, hi)
            if shape != want:
                raise UserError(f"{f}: tensor '{name}' has shape {shape}, but the config needs "
                                f"{want}")
            t = handle.get_tensor(name)
            if t.is_floating_point() and not torch.isfinite(t).all():
                raise UserError(f"{f}: tensor '{name}' holds NaN or infinite values")
            target = dst if lo is None else dst[lo:hi]
            target.copy_(t.to(target.dtype))
            found.add(name)
    return found


# -- targets ----------------------------------------------------------------------------------


def load_target(spec: str, device: torch.device, dtype: torch.dtype,
                max_positions: int | None = None, aux_layers=None, seed: int = 0,
                random_weights: bool = False):
    """A target from a Hugging Face Llama folder, or a preset name with random weights
    (`random_weights` builds a folder's config with random weights, reading no tensors)."""
    if spec == "tiny":
        target, _ = build_tiny(seed=seed, max_positions=max_positions)
        return target.to(device=device, dtype=dtype).eval(), target.cfg
    cfg = target_config(spec)
    with build_on(device, dtype):
        model = Llama(cfg, aux_layers, max_positions)
    if preset_of(spec) is not None or random_weights:   # a preset or its Hugging Face id
        init_weights(model, seed=seed)
        return model.eval(), cfg
    ignored = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    _load_into(Path(spec), target_names(model), ignored=ignored)
    return model.eval(), cfg


def save_target(model: Llama, folder) -> None:
    folder = Path(folder)
    write_json(folder / "config.json", model.cfg.to_hf_dict())
    _save_tensors(folder / "model.safetensors", _gather(target_names(model)))


def _save_tensors(path: Path, tensors: dict) -> None:
    """model.safetensors, written atomically (common/fileio.py) like every output."""
    from safetensors.torch import save
    write_bytes(path, save(tensors, metadata={"format": "pt"}))


def _gather(names: dict) -> dict:
    return {name: (t if lo is None else t[lo:hi]).detach().contiguous().cpu()
            for name, (t, lo, hi) in names.items()}


# -- draft heads ------------------------------------------------------------------------------


def check_draft_fits(cfg: EagleHeadConfig, target: ModelConfig, source: str) -> None:
    """The head's config against the target's, before any tensor is read."""
    if cfg.target_hidden_size != target.hidden_size:
        raise UserError(f"{source}: tensor 'fc.weight' takes 3 x {cfg.target_hidden_size} "
                        f"inputs, but the target's hidden size is {target.hidden_size}: this "
                        "head was made for another target")
    cfg.check_target(target, source=source)


def load_draft(spec: str, target: Llama, device: torch.device, dtype: torch.dtype,
               max_positions: int | None = None, seed: int = 0, random_weights: bool = False):
    """An EAGLE-3 head for `target` from a folder (yuhuili or speculators layout) or a preset."""
    tcfg = target.cfg
    cfg = draft_config(spec, tcfg)
    check_draft_fits(cfg, tcfg, str(spec))
    if spec == "tiny-eagle3":
        _, head = build_tiny(tcfg, seed=seed, max_positions=max_positions)
        head = head.to(device=device, dtype=dtype)
        head.embed_tokens = target.embed_tokens
        target.aux_layers = tuple(cfg.aux_layers_for(tcfg))
        return head.eval(), cfg
    folder = None if preset_of(spec, DRAFT_IDS) is not None or spec == DERIVED_HEAD \
        or random_weights else Path(spec)
    own_embedding = False
    if folder is not None:
        own_embedding = "embed_tokens.weight" in _open_tensors(folder)
    with build_on(device, dtype):
        head = Eagle3Head(cfg, tcfg.hidden_size, max_positions, own_embedding)
    if folder is None:
        init_weights(head, seed=seed + 1)
        with torch.no_grad():
            head.d2t.zero_()  # the first draft_vocab_size target ids
    else:
        names = draft_names(head, cfg.layout)
        if own_embedding:
            names["embed_tokens.weight"] = (head.embed_tokens.weight, None, None)
        _load_into(folder, names, ignored={"t2d"})
        ids = torch.arange(cfg.draft_vocab_size, device=head.d2t.device) + head.d2t
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise UserError(f"{folder}: tensor 'd2t' maps draft ids outside the target vocabulary "
                            f"[0, {cfg.vocab_size})")
    if head.embed_tokens is None:
        head.embed_tokens = target.embed_tokens
    target_aux = cfg.aux_layers_for(tcfg)
    if tuple(target.aux_layers) != tuple(target_aux):
        target.aux_layers = tuple(target_aux)
    return head.eval(), cfg


def save_draft(head: Eagle3Head, folder, layout: str | None = None,
               aux_layer_ids=None) -> None:
    """Write a head in the yuhuili or speculators layout (config.json + model.safetensors)."""
    folder = Path(folder)
    layout = layout or head.cfg.layout
    cfg_dict = head.cfg.to_hf_dict(layout)
    if aux_layer_ids is not None:
        cfg_dict["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
    write_json(folder / "config.json", cfg_dict)
    tensors = _gather(draft_names(head, layout))
    ids = torch.arange(head.cfg.draft_vocab_size) + tensors["d2t"]
    t2d = torch.zeros(head.cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    if head.owns_embedding:
        tensors["embed_tokens.weight"] = head.embed_tokens.weight.detach().contiguous().cpu()
    _save_tensors(folder / "model.safetensors", tensors)

