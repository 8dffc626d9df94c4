"""The simulator past one GPU and one 8B model: tensor parallelism, MoE and latent-attention
targets read from config.json, and the speculation methods (docs/sim.md), pinned by closed
forms and by numbers worked out by hand."""

import json

import pytest

from stepgap.common.errors import UserError
from stepgap.common.formats import LANES, OPS
from stepgap.common.drafters import load_drafter
from stepgap.common.model_presets import MODEL_PRESETS, load_model_config
from stepgap.common.modelcfg import ModelConfig
from stepgap.sim.config import SimConfig, resolve
from stepgap.sim.costs import Batch
from stepgap.sim.roofline import RooflineCosts, expected_experts
from stepgap.sim.hardware import Hardware, Interconnect
from stepgap.sim.loop import simulate
from stepgap.sim.presets import PRESETS
from stepgap.cli import main

LINK = Interconnect("test", bw=1e11, latency_us=5.0, one_shot=True, source="test")
# Bandwidth only: infinite compute, no kernel overhead, 1 TB/s at 100 %, a 100 GB/s link.
BW_ONLY = Hardware("bw", "gpu", flops=1e30, mem_bw=1e12, flop_eff=1.0, bw_eff=1.0,
                   kernel_us=0.0, d2h_us=0.0, mem_bytes=1e12, source="test", interconnect=LINK)


def decode(tokens=1, ctx=0, reqs=1) -> Batch:
    return Batch(tokens, reqs, reqs, tokens, tokens - reqs, ctx + tokens, tokens * (ctx + 1))


# -- TP = 1 is what it was ----------------------------------------------------------------

@pytest.mark.parametrize("mode, tpot, itl", [("sync", 9.711165559914344, 28.140309292933605),
                                             ("async", 9.382561845435792, 27.18810534756962)])
def test_one_gpu_reproduces_the_seed_to_the_last_bit(mode, tpot, itl):
    # The values the simulator gave before tensor parallelism existed (the seed table).
    for tp in ({}, {"tensor_parallel_size": 1}):
        res, _ = simulate(SimConfig(**PRESETS["seed-l20"].settings, mode=mode, **tp))
        assert (res["mean_tpot_ms"], res["mean_itl_ms"]) == (tpot, itl)
        assert res["config"]["executor"] == "inline"


# -- tensor parallelism -------------------------------------------------------------------

def test_all_reduce_is_the_better_of_one_shot_and_two_shot():
    small, big = 16 * 1024, 64 * 2 ** 20
    assert LINK.all_reduce_us(small, 1) == 0.0
    assert LINK.all_reduce_us(small, 4) == pytest.approx(5.0 + 3 * small / 1e5)   # one-shot
    assert LINK.all_reduce_us(big, 4) == pytest.approx(10.0 + 1.5 * big / 1e5)    # two-shot
    ring = Interconnect("pcie", bw=1e10, latency_us=20.0, one_shot=False, source="test")
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
                "gpt-oss-20b": 20.9, "deepseek-v3": 671.0}
    for name, b in billions.items():
        assert MODEL_PRESETS[name].num_params / 1e9 == pytest.approx(b, rel=0.01), name
    # DeepSeek-V3: 671 B + 14 B of MTP module; gpt-oss-20b's MXFP4 checkpoint about 13 GB
    assert MODEL_PRESETS["deepseek-v3"].mtp_params / 1e9 == pytest.approx(14, rel=0.05)
    assert MODEL_PRESETS["gpt-oss-20b"].weight_bytes_per_rank(1) / 1e9 == \
        pytest.approx(13.7, abs=0.1)


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


# -- bad input at the command line: one clear message, before any work ---------------------

def moe_without_experts(tmp_path):
    d = dict(QWEN_MOE)
    d.pop("num_experts")
    (tmp_path / "config.json").write_text(json.dumps(d))
    return str(tmp_path)


@pytest.mark.parametrize("argv, needle", [
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
