"""The Llama target and the paged KV cache, checked against transformers' LlamaForCausalLM."""

from dataclasses import replace

import pytest
import torch

import tests.helpers  # noqa: F401  (one torch thread)

from stepgap.engine.checkpoint import load_target, save_target
from stepgap.engine.kv_cache import BLOCK_SIZE, KVCache, make_context, set_context
from stepgap.engine.model import Llama, init_weights
from stepgap.engine.tiny import TINY_TARGET

transformers = pytest.importorskip("transformers")

ROPES = {
    "llama3": TINY_TARGET.rope_scaling,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "none": None,
}


@pytest.fixture(scope="module", params=list(ROPES))
def checkpoint(request, tmp_path_factory):
    cfg = replace(TINY_TARGET, rope_scaling=ROPES[request.param])
    model = Llama(cfg)
    init_weights(model, seed=3)
    with torch.no_grad():
        model.embed_tokens.weight.mul_(10.0)  # as make-tiny does: a non-trivial residual stream
    path = tmp_path_factory.mktemp(f"target-{request.param}")
    save_target(model, path)
    return path


def paged_forward(model: Llama, prompts: list[list[int]], chunks: list[list[int]]):
    """Run the prompts through the paged path in steps; chunks[s][r] tokens of request r at step
    s (0 = not scheduled). Returns each request's logits at every position, [len(prompt), V]."""
    cfg = model.cfg
    kv = KVCache(cfg.num_layers, 64, cfg.num_kv_heads, cfg.head_dim, torch.float32,
                 torch.device("cpu"))
    for i, attn in enumerate(model.attention_layers()):
        attn.k_cache, attn.v_cache = kv.layer(i)
    per_req = -(-max(len(p) for p in prompts) // BLOCK_SIZE)
    tables = [list(range(r * per_req, (r + 1) * per_req)) for r in range(len(prompts))]
    done = [0] * len(prompts)
    out = [[] for _ in prompts]
    for step in chunks:
        rows = [(r, n) for r, n in enumerate(step) if n]
        q = max(n for _, n in rows)
        ids, pos, pad, unpad = [], [], [], []
        for b, (r, n) in enumerate(rows):
            off = len(ids)
            ids += prompts[r][done[r]:done[r] + n]
            pos += range(done[r], done[r] + n)
            pad.append([off + min(j, n - 1) for j in range(q)])
            unpad += [b * q + j for j in range(n)]
        ctx = make_context(torch.tensor(pos), torch.tensor([tables[r] for r, _ in rows]),
                           torch.tensor(pad), torch.tensor(unpad), kv.scratch_block,
                           torch.float32)
        set_context(ctx)
        with torch.no_grad():
            hidden, _ = model(torch.tensor(ids), torch.tensor(pos), return_aux=False)
            logits = model.compute_logits(hidden)
        set_context(None)
        off = 0
        for r, n in rows:
            out[r].append(logits[off:off + n])
            off += n
            done[r] += n
    return [torch.cat(o) for o in out]


def hf_logits(path, prompt):
    hf = transformers.LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0]


def test_paged_logits_match_transformers_across_many_blocks(checkpoint):
    model, _ = load_target(str(checkpoint), torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (150,), generator=gen).tolist(),   # ten blocks
               torch.randint(0, 512, (37,), generator=gen).tolist()]
    # Chunked prefill next to a shorter request, then decode-sized steps reading cached blocks.
    chunks = [[70, 30], [50, 7]] + [[1, 0]] * 30
    ours = paged_forward(model, prompts, chunks)
    for prompt, got in zip(prompts, ours):
        ref = hf_logits(checkpoint, prompt)
        assert got.shape == ref.shape
        assert (got - ref).abs().max().item() <= 1e-4


def test_dense_path_matches_transformers(checkpoint):
    model, _ = load_target(str(checkpoint), torch.device("cpu"), torch.float32)
    prompt = list(range(3, 203))
    with torch.no_grad():
        hidden, _ = model(torch.tensor(prompt), torch.arange(len(prompt)), return_aux=False)
        ours = model.compute_logits(hidden)
    assert (ours - hf_logits(checkpoint, prompt)).abs().max().item() <= 1e-4


def test_aux_hidden_states_are_the_inputs_of_the_tapped_layers(checkpoint):
    model, _ = load_target(str(checkpoint), torch.device("cpu"), torch.float32,
                           aux_layers=(1, 2, 3))
    hf = transformers.LlamaForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    prompt = torch.arange(5, 45)
    with torch.no_grad():
        _, aux = model(prompt, torch.arange(40))
        states = hf(prompt[None], output_hidden_states=True).hidden_states  # [i] = input of layer i
    want = torch.cat([states[1][0], states[2][0], states[3][0]], dim=-1)
    assert (aux - want).abs().max().item() <= 1e-5


def test_default_aux_layers_are_2_half_and_l_minus_3():
    cfg = replace(TINY_TARGET, num_layers=32)
    assert Llama(cfg).aux_layers == (2, 16, 29)
