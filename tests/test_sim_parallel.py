"""The simulator past one GPU and one 8B model: tensor parallelism, MoE and latent-attention
targets read from config.json, and the speculation methods (docs/explanation/past-one-gpu.md),
pinned by closed
forms and by numbers worked out by hand."""

import json
import re
from pathlib import Path

import pytest

from stepgap.common.errors import UserError
from stepgap.common.formats import LANES, OPS
from stepgap.common.drafters import load_drafter
from stepgap.common.model_presets import MODEL_PRESETS, load_model_config
from stepgap.common.modelcfg import ModelConfig
from stepgap.sim.config import SimConfig
from stepgap.sim.plan import resolve
from stepgap.sim.costs import Batch
from stepgap.sim.roofline import RooflineCosts, expected_experts
from stepgap.sim.hardware import (CATALOG, Hardware, Interconnect, MeasuredLink,
                                  all_reduce_path, catalog_entry)
from stepgap.sim.hardware_file import load_collectives, load_gpu, with_link
from stepgap.sim.loop import simulate
from stepgap.sim.presets import PRESETS
from stepgap.cli import main

LINK = Interconnect("test", bw=1e11, latency_us=5.0, fully_connected=True, source="test")
# Bandwidth only: infinite compute, no kernel overhead, 1 TB/s at 100 %, a 100 GB/s link.
BW_ONLY = Hardware("bw", "gpu", flops=1e30, mem_bw=1e12, flop_eff=1.0, bw_eff=1.0,
                   kernel_us=0.0, d2h_us=0.0, mem_bytes=1e12, source="test", interconnect=LINK)


def decode(tokens=1, ctx=0, reqs=1) -> Batch:
    return Batch(tokens, reqs, reqs, tokens, tokens - reqs, ctx + tokens, tokens * (ctx + 1))


# -- TP = 1 is what it was ----------------------------------------------------------------

@pytest.mark.parametrize("mode, tpot, itl", [("sync", 9.711165559914344, 28.140309292933605),
                                             ("async", 9.38398563182831, 27.19223109222977)])
def test_one_gpu_reproduces_the_seed_to_the_last_bit(mode, tpot, itl):
    # The values the simulator gave before tensor parallelism existed (the seed table); async
    # +0.015 % since the drafter's host pass (sim/drafter_costs.py, issue 49) was priced.
    for tp in ({}, {"tensor_parallel_size": 1}):
        res, _ = simulate(SimConfig(**PRESETS["seed-l20"].settings, mode=mode, **tp))
        assert (res["mean_tpot_ms"], res["mean_itl_ms"]) == (tpot, itl)
        assert res["config"]["executor"] == "inline"


# -- tensor parallelism -------------------------------------------------------------------

@pytest.mark.parametrize("nbytes, n, nvlink, p2p, path", [
    (7 * 2 ** 20, 2, False, True, "one_shot"),     # 2 GPUs with peer access: one-shot, PCIe too
    (9 * 2 ** 20, 2, True, True, "nccl"),          # 8 MiB and above: NCCL
    (7 * 2 ** 20, 2, False, False, "nccl"),        # no peer access (GeForce): NCCL
    (500 * 1024, 4, True, True, "one_shot"),       # NVLink, up to 4 GPUs: one-shot under 512 KiB
    (600 * 1024, 4, True, True, "two_shot"),
    (250 * 1024, 8, True, True, "one_shot"),       # up to 8 GPUs: under 256 KiB
    (300 * 1024, 8, True, True, "two_shot"),
    (16 * 1024, 4, False, True, "nccl"),           # more than 2 on PCIe: NCCL
    (16 * 1024, 3, True, True, "nccl"),            # a world size vLLM's kernel does not take
])
def test_all_reduce_takes_the_path_vllm_takes(nbytes, n, nvlink, p2p, path):
    assert all_reduce_path(nbytes, n, nvlink, p2p) == path


def test_each_all_reduce_path_costs_its_algorithm():
    small, mid, big = 16 * 1024, 2 ** 20, 64 * 2 ** 20
    assert LINK.all_reduce_us(small, 1) == 0.0
    assert LINK.all_reduce_us(small, 4) == pytest.approx(5.0 + 3 * small / 1e5)   # one-shot
    assert LINK.all_reduce_us(mid, 4) == pytest.approx(10.0 + 1.5 * mid / 1e5)    # two-shot
    assert LINK.all_reduce_us(big, 4) == pytest.approx(5.0 + 1.5 * big / 1e5)     # NCCL ring
    ring = Interconnect("pcie", bw=1e10, latency_us=20.0, fully_connected=False, source="test")
    assert ring.all_reduce_us(small, 8) == pytest.approx(20.0 + 2 * 7 / 8 * small / 1e4)
    assert LINK.all_gather_us(big, 8) == pytest.approx(5.0 + 7 / 8 * big / 1e5)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_decode_at_tp_n_is_the_weight_time_over_n_plus_the_all_reduces(tp):
    target = load_model_config("llama-3.1-8b")
    one = RooflineCosts(target, None, BW_ONLY, k=0).target_forward(decode())
    many = RooflineCosts(target, None, BW_ONLY, k=0, tp=tp).target_forward(decode())
    # weights streamed at decode (the embedding is only gathered): every GEMM splits over tp
    weights = 2 * (target.num_params - target.vocab_size * target.hidden_size) / 1e6
    assert one == pytest.approx(weights, rel=2e-3)
    h = target.hidden_size
    collectives = ((2 * target.num_layers + 1) * LINK.all_reduce_us(2 * h, tp)  # embedding,
                   + LINK.all_gather_us(2 * target.vocab_size, tp))   # attention, MLP; logits
    # (within the activations' few microseconds, which do not split)
    assert many - collectives == pytest.approx(weights / tp, abs=2e-3 * weights)
    assert collectives == pytest.approx(65 * (5.0 + (tp - 1) * 8192 / 1e5)
                                        + 5.0 + (tp - 1) / tp * 256512 / 1e5)


def test_kv_capacity_per_gpu_of_70b_at_tp4_on_h100_by_hand():
    # Llama-3.3-70B over 4 H100s (80 GB in the catalog, --gpu-memory-utilization 0.9):
    emb = 128256 * 8192                                    # embedding; the lm_head as big
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672   # q, o, k, v, MLP
    norms = 80 * 2 * 8192 + 8192                           # replicated on every GPU
    weights = 2 * ((2 * emb + 80 * layer) / 4 + norms)     # bf16 bytes on one GPU
    assert weights == 35_278_831_616
    free = 80e9 * 0.9 - weights - 2 * 2 ** 30              # less 2 GiB for context and graphs
    kv_token = 80 * 2 * (8 // 4) * 128 * 2                 # 80 layers, K and V, 2 KV heads/GPU
    assert kv_token == 81_920
    blocks = int(free // (16 * kv_token))
    assert blocks == 26_377                                # 422,032 tokens per GPU
    r = resolve(SimConfig(model="llama-3.3-70b", gpu="h100", tensor_parallel_size=4, k=0))
    assert r.scheduler.num_blocks == blocks
    # the EAGLE-3 head adds its (replicated) fc, a quarter of the rest, and one layer's KV
    r = resolve(SimConfig(model="llama-3.3-70b", gpu="h100", tensor_parallel_size=4, k=3,
                          draft="llama-3.3-70b-eagle3"))
    head = r.draft
    fc = 3 * 8192 * 8192
    assert r.scheduler.num_blocks == int(
        (free - 2 * fc - 2 * (head.num_params - fc) / 4) // (16 * (kv_token + 2 * 2 * 128 * 2)))


def test_one_gpu_cannot_hold_70b_and_says_what_to_change():
    with pytest.raises(UserError, match=r"weights \(70\.6 GB per GPU at --tensor-parallel-size "
                                        r"2\) leave no room.*--tensor-parallel-size"):
        resolve(SimConfig(model="llama-3.3-70b", gpu="h100", tensor_parallel_size=2))


def test_kv_heads_are_replicated_past_their_number():
    qwen = load_model_config("qwen3-30b-a3b")                 # 4 KV heads
    assert [qwen.kv_heads_per_rank(n) for n in (1, 2, 4, 8)] == [4, 2, 1, 1]
    qwen.check_tensor_parallel(8)                             # 8 ranks, each KV head twice
    with pytest.raises(UserError, match="has 4 KV heads, which 3 neither divides"):
        qwen.check_tensor_parallel(3)
    # latent attention keeps its whole latent cache on every rank
    ds = load_model_config("deepseek-v3")
    assert ds.kv_bytes_per_token(8) == ds.kv_bytes_per_token(1) == 61 * (512 + 64) * 2


def test_tp_runs_the_multiprocess_executor_and_draws_its_broadcast():
    c = dict(model="llama-3.1-8b", gpu="h100", k=2, draft="llama-3.1-8b-eagle3",
             acceptance="mtbench", num_prompts=3, output_len=24, timeline=True,
             tensor_parallel_size=2)
    with pytest.raises(UserError, match="--executor: tensor parallelism runs vLLM's "
                                        "multiprocess executor"):
        SimConfig(executor="inline", **c)
    for mode in ("sync", "async"):
        res, spans = simulate(SimConfig(mode=mode, **c))
        assert res["config"]["executor"] == "process"
        worker = [s.op for s in spans if s.lane == "cpu.worker" and s.step == 5]
        assert worker[0] == "broadcast" and "prepare_inputs" in worker
        assert ("collect" in worker) == (mode == "sync")  # async: on rank 0's output thread


# -- MoE ----------------------------------------------------------------------------------

@pytest.mark.parametrize("skew", [0.0, 0.5, 1.5])
def test_one_token_touches_exactly_top_k_experts_and_many_touch_them_all(skew):
    assert expected_experts(128, 8, 1, skew) == pytest.approx(8.0)
    assert expected_experts(128, 8, 100_000, skew) == pytest.approx(128.0, rel=1e-3)
    counts = [expected_experts(128, 8, t, skew) for t in (1, 2, 4, 16, 64, 256)]
    assert counts == sorted(counts) and all(c <= 128 for c in counts)


def test_uniform_routing_is_the_closed_form_and_skew_touches_fewer():
    for t in (2, 4, 8, 16, 64):
        assert expected_experts(128, 8, t) == pytest.approx(128 * (1 - (1 - 8 / 128) ** t))
        assert expected_experts(128, 8, t, 1.0) < expected_experts(128, 8, t)
    assert expected_experts(128, 8, 8) == pytest.approx(51.6, abs=0.05)


def test_moe_decode_reads_the_experts_its_tokens_touch():
    c = load_model_config("qwen3-30b-a3b")
    costs = RooflineCosts(c, None, BW_ONLY, k=0)
    h, mi = c.hidden_size, c.moe_intermediate_size
    expert = 2 * 3 * h * mi
    rest = c.weight_bytes_per_rank(1) - 48 * c.num_experts * expert - 2 * c.vocab_size * h
    for tokens in (1, 4):
        touched = expected_experts(128, 8, tokens)
        want = (rest + 48 * touched * expert) / 1e6
        assert costs.target_forward(decode(tokens)) == pytest.approx(want, rel=0.01)


# -- families from config.json -------------------------------------------------------------

def test_published_parameter_counts():
    billions = {"llama-3.3-70b": 70.55, "qwen3-8b": 8.19, "qwen3-30b-a3b": 30.5,
                "gpt-oss-20b": 20.9, "gpt-oss-120b": 116.8, "deepseek-v3": 671.0}
    for name, b in billions.items():
        assert MODEL_PRESETS[name].num_params / 1e9 == pytest.approx(b, rel=0.01), name
    # DeepSeek-V3: 671 B + 14 B of MTP module; gpt-oss-20b's MXFP4 checkpoint about 13 GB
    assert MODEL_PRESETS["deepseek-v3"].mtp_params / 1e9 == pytest.approx(14, rel=0.05)
    assert MODEL_PRESETS["gpt-oss-20b"].weight_bytes_per_rank(1) / 1e9 == \
        pytest.approx(13.7, abs=0.1)


# openai/gpt-oss-20b's config.json as published (every field, gpt-oss's own names included)
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0",
    "use_cache": True, "vocab_size": 201088}


def test_gpt_oss_config_json_and_ids_run_as_vllms_spec_decode_threads_name_them(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B))
    read = load_model_config(str(tmp_path))
    assert (read.num_params, read.weight_bytes_per_rank(1)) == \
        (MODEL_PRESETS["gpt-oss-20b"].num_params,
         MODEL_PRESETS["gpt-oss-20b"].weight_bytes_per_rank(1))
    big = load_model_config("openai/gpt-oss-120b")
    assert (big.num_layers, big.num_experts, big.num_sliding_layers) == (36, 128, 18)
    cfg = SimConfig(model="openai/gpt-oss-120b", draft="nvidia/gpt-oss-120b-Eagle3-v2", k=3,
                    num_prompts=2)
    assert simulate(cfg)[0]["completed"] == 2


QWEN_MOE = {"model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "intermediate_size": 512, "vocab_size": 1000, "num_experts": 16,
            "num_experts_per_tok": 2, "moe_intermediate_size": 128, "decoder_sparse_step": 2}


def test_a_moe_config_json_is_read_with_the_fields_its_family_uses():
    m = ModelConfig.from_hf_dict(QWEN_MOE, "c.json")
    assert (m.num_experts, m.num_experts_per_tok, m.num_moe_layers) == (16, 2, 2)
    assert m.num_params == (2 * (m.attn_params + 3 * 256 * 512 + 512)
                            + 2 * (m.attn_params + 16 * 3 * 256 * 128 + 256 * 16 + 512)
                            + 2 * 1000 * 256 + 256)


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.pop("moe_intermediate_size"), "field 'moe_intermediate_size': missing"),
    (lambda d: d.update(model_type="mixtral"), "'mixtral' is not modelled (families: llama"),
    (lambda d: d.update(quantization_config={"quant_method": "awq"}),
     "quant_method 'awq' is not modelled"),
    (lambda d: d.update(mlp_only_layers="all"), "field 'mlp_only_layers': expected a list"),
])
def test_what_is_not_modelled_is_refused_naming_the_field(edit, needle):
    d = json.loads(json.dumps(QWEN_MOE))
    edit(d)
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        ModelConfig.from_hf_dict(d, "c.json")


# -- speculation methods -------------------------------------------------------------------

METHOD_CASES = {
    "eagle3": dict(model="llama-3.1-8b"),
    "eagle": dict(model="llama-3.1-8b"),
    "draft_model": dict(model="llama-3.1-8b", draft="llama-3.2-1b"),
    "mtp": dict(model="deepseek-v3", gpu="h200", tensor_parallel_size=8),
    "ngram_gpu": dict(model="llama-3.1-8b"),
    "ngram": dict(model="llama-3.1-8b"),
}


def method_run(method, k=3, mode="sync", **kw):
    c = dict(gpu="h100", method=method, k=k, mode=mode, acceptance="mtbench",
             num_gpu_blocks_override=2000, num_prompts=2, output_len=30, timeline=True)
    c.update(METHOD_CASES[method], **kw)
    return simulate(SimConfig(**c))


@pytest.mark.parametrize("method", list(METHOD_CASES))
def test_every_method_runs_exactly_its_ops(method):
    k = 1 if method == "mtp" else 3
    res, spans = method_run(method, k)
    step = 6   # a decode step of both requests
    device = [s.op for s in sorted(spans, key=lambda s: s.start_us)
              if s.lane == "device" and s.step == step]
    drafts = {"ngram": 0, "ngram_gpu": 1}.get(method, k)
    assert device == ["target_forward", "rejection_sample", *["draft_forward"] * drafts, "d2h"]
    worker = [s.op for s in spans if s.lane == "cpu.worker" and s.step == step]
    assert ("propose" in worker) == (method == "ngram")
    assert ("broadcast" in worker) == (method == "mtp")         # the TP 8 case
    assert {s.lane for s in spans} <= set(LANES)
    assert all(s.op in OPS[s.lane] for s in spans)
    assert res["completed"] == 2 and res["spec_decode"]["num_drafts"] > 0


def test_ngram_falls_back_to_sync_as_vllm_does_and_says_so():
    a, _ = method_run("ngram", mode="async")
    s, _ = method_run("ngram", mode="sync")
    assert a["config"]["mode"] == "async" and a["config"]["resolved"]["mode"] == "sync"
    assert any("simulated as sync" in n for n in a["config"]["resolved"]["notes"])
    assert a["mean_tpot_ms"] == s["mean_tpot_ms"]
    g, _ = method_run("ngram_gpu", mode="async")   # on the device: async as asked
    assert g["config"]["resolved"]["mode"] == "async"


def test_draft_heads_and_models_are_checked_against_the_target():
    llama = load_model_config("llama-3.1-8b")
    with pytest.raises(UserError, match="vocab_size 151936, the target 128256"):
        load_drafter("draft_model", "qwen3-0.6b", llama)
    with pytest.raises(UserError, match="takes no draft model"):
        load_drafter("ngram", "llama-3.2-1b", llama)
    ds = load_model_config("deepseek-v3")
    assert load_drafter("mtp", None, ds, k=3) is None       # one MTP layer, run 3 times
    r = resolve(SimConfig(model="qwen3-30b-a3b", method="draft_model", k=2))
    assert r.draft.name == "qwen3-0.6b" and "smallest preset" in r.notes[0]


def test_published_acceptance_is_the_default_of_its_model_and_method():
    assert resolve(SimConfig(model="qwen3-8b", k=3)).profile.name == "vllm-qwen3-8b-eagle3"
    r = resolve(SimConfig(model="deepseek-v3", gpu="h200", tensor_parallel_size=8,
                          method="mtp", k=1))
    assert r.profile.rates == (0.882,) and r.profile.acceptance_length(1) == pytest.approx(1.882)
    assert resolve(SimConfig(k=4)).profile.name == "mtbench"   # the seed's, as before


def test_a_measured_profile_is_one_device_with_eagle3():
    with pytest.raises(UserError, match="a measured profile times one device"):
        resolve(SimConfig(k=2, method="ngram_gpu",
                          profile="traces/measured/cpu/profile.json"))


# -- measured collectives and GPU files (LLMServingSim's hardware.yaml) --------------------

ROOT = Path(__file__).resolve().parents[1]
HW_1B2CC02 = ROOT / "traces/peers/llmservingsim/profiler/perf/RTXPRO6000/hardware.yaml"
# A hardware.yaml of round numbers: all_reduce 10 + bytes/1e5 us, all_gather 5 + bytes/1e5,
# reduce_scatter 4 + bytes/1e5, at 1 KB, 1 MB and 10 MB (bytes as 1e3, 1e6, 1e7).
HW_YAML = """\
hardware: TESTGPU
spec:
  gpu_name: NVIDIA H100 80GB HBM3
  memory_total_gib: 40.0
measured:
  at: '2026-01-01'
  interconnect:
    npus: 2
    samples:
""" + "".join(f"    - collective: {c}\n      bytes: {b}\n      us: {a + b / 1e5}\n"
              for c, a in (("all_reduce", 10), ("all_gather", 5), ("reduce_scatter", 4))
              for b in (1000, 1000000, 10000000))


def hw_file(tmp_path, text=HW_YAML, name="hardware.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_hardware_yaml_is_read_as_it_is_and_prices_what_vllm_issues(tmp_path):
    link = load_collectives(hw_file(tmp_path))
    assert link.npus == 2
    # under 8 MiB at 2 GPUs vLLM runs its one-shot kernel: each GPU reads its peer's buffer,
    # which is what an all-gather of the same bytes per GPU moves
    assert link.all_reduce_us(5e5, 2) == pytest.approx(5 + 5e5 / 1e5)    # between points
    assert link.all_reduce_us(10, 2) == pytest.approx(5 + 1000 / 1e5)     # below: the first
    # from 8 MiB, NCCL's all_reduce as measured, and above the top two points' slope
    assert link.all_reduce_us(9e6, 2) == pytest.approx(10 + 9e6 / 1e5)
    assert link.all_reduce_us(2e7, 2) == pytest.approx(10 + 2e7 / 1e5)
    # the logits' all-gather: 2e6 bytes in all are 1e6 a GPU
    assert link.all_gather_us(2e6, 2) == pytest.approx(5 + 1e6 / 1e5)
    nccl = with_link(load_gpu("rtx4090"), link).interconnect   # GeForce: no peer access
    assert nccl.all_reduce_us(5e5, 2) == pytest.approx(10 + 5e5 / 1e5)


def test_the_committed_measurement_holds_the_numbers_the_issue_quotes():
    link = load_collectives(HW_1B2CC02)   # LLMServingSim's, at 1b2cc02
    assert (link.npus, link.sizes["all_reduce"][0], link.sizes["all_reduce"][-1]) == \
        (2, 4096, 20971520)
    for nbytes, us in ((10240, 12.9), (2 ** 20, 41.0), (4 * 2 ** 20, 125.0)):
        assert link.at("all_reduce", nbytes) == pytest.approx(us, abs=0.15)


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("    npus: 2\n", ""), "field 'measured.interconnect.npus': missing"),
    (lambda t: t.replace("collective: all_gather", "collective: reduce_scatter")
     .replace("bytes: 1000\n      us: 5.01", "bytes: 2000\n      us: 5.01")
     .replace("bytes: 1000000\n      us: 15.0", "bytes: 2000000\n      us: 15.0")
     .replace("bytes: 10000000\n      us: 105.0", "bytes: 20000000\n      us: 105.0"),
     "field 'measured.interconnect.samples': no all_gather samples"),
    (lambda t: t.replace("us: 10.01", "us: -1"),
     "field 'measured.interconnect.samples[0].us': expected a number > 0"),
])
def test_a_hardware_yaml_without_its_gpu_count_or_a_collective_names_the_field(tmp_path, edit,
                                                                             field):
    path = hw_file(tmp_path, edit(HW_YAML))
    with pytest.raises(UserError, match=re.escape(f"{path}: {field}")):
        load_collectives(path)


def test_a_gpu_file_takes_the_catalog_entry_of_its_device_and_its_own_memory(tmp_path):
    hw = load_gpu(str(hw_file(tmp_path)))
    h100 = load_gpu("h100")
    assert (hw.flops, hw.mem_bw, hw.interconnect.npus) == (h100.flops, h100.mem_bw, 2)
    assert hw.mem_bytes == 40 * 2 ** 30 and "catalog's h100" in hw.source


def test_a_gpu_file_of_stepgaps_fields_describes_a_gpu_the_catalog_lacks(tmp_path):
    hw = load_gpu(str(hw_file(tmp_path, "name: mygpu\nbf16_tflops: 100\nmemory_gb: 32\n"
                                        "memory_bw_gbps: 1000\ninterconnect: pcie4\n",
                              "mine.yaml")))
    assert (hw.name, hw.flops, hw.mem_bytes, hw.mem_bw) == ("mygpu", 1e14, 32e9, 1e12)
    assert hw.interconnect.name == "pcie4" and hw.flop_eff == 0.70
    with pytest.raises(UserError, match=r"mine.yaml: field 'bf16_tflops': missing"):
        load_gpu(str(hw_file(tmp_path, "memory_gb: 32\nmemory_bw_gbps: 1000\n", "mine.yaml")))


MINE = "name: mygpu\nbf16_tflops: 100\nmemory_gb: 32\nmemory_bw_gbps: 1000\n"


@pytest.mark.parametrize("edit, field", [
    # a typo of 1e-300 made every time infinite, one of 1e308 every KV cache NaN (exit 0)
    (lambda t: t.replace("bf16_tflops: 100", "bf16_tflops: 1.0e-300"), "bf16_tflops"),
    (lambda t: t.replace("memory_gb: 32", "memory_gb: 1.0e+308"), "memory_gb"),
    (lambda t: t.replace("memory_bw_gbps: 1000", "memory_bw_gbps: 1.0e+308"), "memory_bw_gbps"),
    (lambda t: t + "flop_eff: 2.0\n", "flop_eff"),
    (lambda t: t + "d2h_us: 1.0e+12\n", "d2h_us"),
    (lambda t: t + "interconnect: {bw_gbps: 100, latency_us: 1.0e+308}\n",
     "interconnect.latency_us"),
    (lambda t: t + "base: [h100]\n", "base"),
    (lambda t: t.replace("name: mygpu", "name: {a: 1}"), "name"),
])
def test_a_gpu_file_number_past_any_device_or_a_name_not_a_name_is_refused(tmp_path, edit,
                                                                           field):
    path = hw_file(tmp_path, edit(MINE), "mine.yaml")
    with pytest.raises(UserError, match=re.escape(f"{path}: field '{field}': expected")):
        load_gpu(str(path))


def test_a_yaml_whose_aliases_expand_past_the_limit_is_refused_at_once(tmp_path):
    from stepgap.common.limits import MAX_YAML_NODES
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join(['*' + a] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
    path = hw_file(tmp_path, laughs + "name: *i\n", "laughs.yaml")   # 10^9 values
    with pytest.raises(UserError, match=f"expand to more than {MAX_YAML_NODES:,} values"):
        load_gpu(str(path))
    # LLMServingSim's own file holds aliases (PyYAML writes them) and is read as it is
    assert "&id001" in HW_1B2CC02.read_text() and load_collectives(HW_1B2CC02).npus == 2


def test_tables_at_tp2_take_the_hardware_yaml_kept_beside_them(tmp_path):
    perf = tmp_path / "profiler/perf/TESTGPU"
    bundle = perf / "meta-llama/Llama-3.1-8B/bf16"
    bundle.mkdir(parents=True)
    hw_file(perf)
    meta = json.loads(json.dumps({"hardware": "TESTGPU", "architecture": "llama",
                                  "tp_degrees": [2], "engine_effective": {"hf_overrides": {
                                      "num_attention_heads": 16, "num_key_value_heads": 4,
                                      "intermediate_size": 7168, "vocab_size": 64128}}}))
    (bundle / "meta.yaml").write_text(json.dumps(meta))
    (bundle / "tp2").mkdir()
    from stepgap.sim.tables import DENSE_LAYERS
    (bundle / "tp2/dense.csv").write_text("layer,tokens,time_us\n" + "".join(
        f"{layer},{n},{n}\n" for layer in DENSE_LAYERS for n in (1, 100)))
    (bundle / "tp2/per_sequence.csv").write_text(
        "layer,sequences,time_us\nlm_head,1,10\nsampler,1,1\n")
    (bundle / "tp2/attention.csv").write_text(
        "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,100,5\n100,0,0,0,9\n")
    res = resolve(SimConfig(gpu="h100", tensor_parallel_size=2, device_profile=str(bundle)))
    assert isinstance(res.hw.interconnect, MeasuredLink)
    assert any(n.startswith("collectives: ") and "hardware.yaml" in n for n in res.notes)
    costs = res.device_costs
    one = costs._collectives(1, 1, costs.t)     # 65 one-shot all-reduces of 8 KiB, a gather
    assert one == pytest.approx(65 * (5 + 8192 / 1e5) + 5 + 128256 / 1e5)
    assert "measured (" in costs.sources["target_forward"]
    with pytest.raises(UserError, match=r"--all-reduce-latency-us: the collectives are "
                                        r"measured"):
        resolve(SimConfig(gpu="h100", tensor_parallel_size=2, device_profile=str(bundle),
                          all_reduce_latency_us=3.0))


def test_catalog_gpus_name_their_sources_and_their_devices_once():
    names = [n for hw in CATALOG.values() for n in hw.device_names]
    assert len(names) == len(set(names))
    for key in ("l40s", "l4", "a10g", "h100-pcie", "h100-nvl", "h20", "b200", "mi300x"):
        assert CATALOG[key].source and CATALOG[key].device_names, key
        assert catalog_entry(CATALOG[key].device_names[0]) == key


# -- bad input at the command line: one clear message, before any work ---------------------

def moe_without_experts(tmp_path):
    d = dict(QWEN_MOE)
    d.pop("num_experts")
    (tmp_path / "config.json").write_text(json.dumps(d))
    return str(tmp_path)


@pytest.mark.parametrize("argv, needle", [
    (["--model", "llama-3.1-8b", "-tp", "4", "--gpu", str(HW_1B2CC02)],
     "hardware.yaml: field 'measured.interconnect.npus': the collectives were measured over 2 "
     "GPUs; --tensor-parallel-size 4 needs them measured over 4"),
    (["--gpu", "nonesuch.yaml"], "--gpu nonesuch.yaml: no such file"),
    (["--model", "llama-3.3-70b", "--gpu", "h100", "--tensor-parallel-size", "3"],
     "--tensor-parallel-size 3: model 'llama-3.3-70b' has 8 KV heads, which 3 neither divides "
     "nor is a multiple of"),
    (["--model", "MOE", "-k", "2"], "config.json: field 'num_experts': missing"),
    (["--spec-method", "mtp", "-k", "1"],
     "method mtp: model 'llama-3.1-8b' has no MTP layers (num_nextn_predict_layers)"),
    (["--model", "llama-3.3-70b", "-tp", "9"], "--tensor-parallel-size: must be an integer "
                                               "from 1 to 8"),
    (["--gpu", "cpu", "-tp", "2", "--model", "llama-3.2-1b"], "--gpu cpu has no interconnect"),
])
def test_bad_parallel_and_model_input_is_one_clear_message(tmp_path, capsys, argv, needle):
    argv = [moe_without_experts(tmp_path) if a == "MOE" else a for a in argv]
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["simulate", *argv, "--result-json", str(out)]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_the_engine_refuses_what_only_the_simulator_models(capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["run", "--model", "qwen3-8b", "--quiet"]))
    assert e.value.code == 2
    assert "modelled by the simulator only" in capsys.readouterr().err


# -- sweeps ---------------------------------------------------------------------------------

def test_tp_model_and_method_are_grid_keys_drawn_as_panels(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "--set", "num_prompts=4", "--set", "output_len=24", "--set",
                 "gpu=h100", "--set", "model=llama-3.1-8b", "--grid", "tensor_parallel_size=1,2",
                 "--grid", "method=eagle3,ngram", "--grid", "mode=sync,async", "--grid", "k=0,2",
                 "--grid", "max_concurrency=1,4", "--out", str(out), "--plot", "--jobs", "1",
                 "--quiet"]) == 0
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert len(rows) == 32
    ngram_async = [r for r in rows if r["method"] == "ngram" and r["mode"] == "async"
                   and r["k"] == 2]
    assert {r["simulated_mode"] for r in ngram_async} == {"sync"}
    for name in ("heatmap", "saving", "speedup"):
        assert (out / "plots" / f"{name}_mean_tpot_ms__panels.png").stat().st_size > 10_000
    assert (out / "plots" / "heatmap_mean_tpot_ms__tensor_parallel_size-2__method-ngram.png"
            ).is_file()
