"""Checkpoints: both EAGLE-3 layouts, and one clear error naming the tensor for a bad one."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from stepgap.engine.checkpoint import load_draft, load_target
from tests.helpers import tiny_checkpoints
from stepgap.common.errors import UserError

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def paths():
    return tiny_checkpoints()


@pytest.fixture
def copy(tmp_path, paths):
    def make(name):
        dst = tmp_path / name
        shutil.copytree(paths[name], dst)
        return dst
    return make


def rewrite(folder, edit):
    f = folder / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f))


def test_both_layouts_load_the_same_head(paths):
    target, _ = load_target(paths["target"], CPU, torch.float32)
    a, cfg_a = load_draft(paths["eagle3-yuhuili"], target, CPU, torch.float32)
    b, cfg_b = load_draft(paths["eagle3-speculators"], target, CPU, torch.float32)
    assert (cfg_a.layout, cfg_b.layout) == ("yuhuili", "speculators")
    ids, pos = torch.arange(10, 30), torch.arange(20)
    hidden = torch.randn(20, 64)
    with torch.no_grad():
        assert torch.equal(a(ids, pos, hidden), b(ids, pos, hidden))
        assert torch.equal(a.propose(a(ids, pos, hidden)), b.propose(b(ids, pos, hidden)))
    assert a.embed_tokens is target.embed_tokens  # no embedding in the file: shared


def test_d2t_maps_draft_ids_into_the_target_vocabulary(paths):
    target, _ = load_target(paths["target"], CPU, torch.float32)
    head, cfg = load_draft(paths["eagle3-yuhuili"], target, CPU, torch.float32)
    t2d = load_file(f"{paths['eagle3-yuhuili']}/model.safetensors")["t2d"]
    ids = torch.arange(cfg.draft_vocab_size) + head.d2t
    assert cfg.draft_vocab_size < cfg.vocab_size
    assert t2d[ids].all() and t2d.sum() == cfg.draft_vocab_size


def test_missing_target_tensor_is_named(copy):
    folder = copy("target")
    rewrite(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(UserError, match=r"tensor 'model\.layers\.1\.mlp\.up_proj\.weight' is "
                                        r"missing \(expected shape \[128, 64\]\)"):
        load_target(str(folder), CPU, torch.float32)


def test_wrong_shape_is_named(copy):
    folder = copy("target")
    rewrite(folder, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight":
                                        torch.zeros(16, 64)}))
    with pytest.raises(UserError, match=r"tensor 'model\.layers\.0\.self_attn\.k_proj\.weight' "
                                        r"has shape \[16, 64\], but the config needs \[32, 64\]"):
        load_target(str(folder), CPU, torch.float32)


@pytest.mark.parametrize("layout, name", [("eagle3-yuhuili", "midlayer.hidden_norm.weight"),
                                          ("eagle3-speculators", "layers.0.hidden_norm.weight")])
def test_missing_draft_tensor_is_named_in_either_layout(copy, paths, layout, name):
    folder = copy(layout)
    rewrite(folder, lambda t: t.pop(name))
    target, _ = load_target(paths["target"], CPU, torch.float32)
    with pytest.raises(UserError, match=f"tensor '{name}' is missing"):
        load_draft(str(folder), target, CPU, torch.float32)


def test_draft_made_for_another_target_size_names_fc(copy, paths):
    folder = copy("eagle3-yuhuili")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["target_hidden_size"] = 128
    (folder / "config.json").write_text(json.dumps(cfg))
    target, _ = load_target(paths["target"], CPU, torch.float32)
    with pytest.raises(UserError, match=r"tensor 'fc\.weight' takes 3 x 128 inputs, but the "
                                        r"target's hidden size is 64"):
        load_draft(str(folder), target, CPU, torch.float32)


def test_unexpected_tensor_is_named(copy):
    folder = copy("target")
    rewrite(folder, lambda t: t.update({"model.layers.9.mlp.up_proj.weight": torch.zeros(1)}))
    with pytest.raises(UserError, match=r"unexpected tensor 'model\.layers\.9\.mlp\.up_proj"):
        load_target(str(folder), CPU, torch.float32)


def test_corrupt_file_is_named(copy):
    folder = copy("target")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(UserError, match=r"model\.safetensors: not a readable safetensors file"):
        load_target(str(folder), CPU, torch.float32)


def test_bad_d2t_is_named(copy, paths):
    folder = copy("eagle3-yuhuili")
    rewrite(folder, lambda t: t.update({"d2t": t["d2t"] + 10_000}))
    target, _ = load_target(paths["target"], CPU, torch.float32)
    with pytest.raises(UserError, match=r"tensor 'd2t' maps draft ids outside"):
        load_draft(str(folder), target, CPU, torch.float32)


def test_target_folder_loads_in_transformers(paths):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(paths["target"])
    assert hf.config.num_hidden_layers == 4


def test_the_tests_cached_checkpoints_are_made_again_when_a_byte_changes(paths, tmp_path):
    """tests/helpers.py keeps the tiny checkpoints between runs; a kept folder whose files
    were changed (a test that wrote into it) is not used but made again."""
    from pathlib import Path
    from tests.helpers import TRAIN_STEPS, read_made, tiny_key
    cached = Path(paths["target"]).parent
    shutil.copytree(cached, tmp_path / "c")
    assert read_made(tmp_path / "c")["target"] == "target"
    f = tmp_path / "c" / "eagle3-yuhuili" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    assert read_made(tmp_path / "c") is None
    assert tiny_key(TRAIN_STEPS) == cached.name != tiny_key(TRAIN_STEPS - 1)
