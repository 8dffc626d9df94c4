"""The device roofline, the hardware catalog, the CPU op model and acceptance sampling."""

import numpy as np
import pytest

from stepgap.common.acceptance import Acceptance, AcceptanceProfile, get_profile
from stepgap.sim.config import SimConfig
from stepgap.sim.costs import Batch
from stepgap.sim.cpu_costs import CpuCosts, OpCost
from stepgap.sim.roofline import RooflineCosts
from stepgap.sim.hardware import CATALOG, Hardware, get_hardware
from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest
from stepgap.common.model_presets import load_draft_config, load_model_config

TARGET = load_model_config("llama-3.1-8b")
HEAD = load_draft_config("llama-3.1-8b-eagle3")
# Bandwidth only: infinite compute, no kernel overhead, 1 TB/s at 100%.
BW_ONLY = Hardware("bw", "gpu", flops=1e30, mem_bw=1e12, flop_eff=1.0, bw_eff=1.0,
                   kernel_us=0.0, d2h_us=0.0, mem_bytes=1e11, source="test")


def decode(tokens=1, ctx=0) -> Batch:
    return Batch(tokens, 1, 1, tokens, tokens - 1, ctx + tokens, tokens * (ctx + 1))


def test_at_k0_plain_sampling_is_its_own_op_and_sums_with_the_forward_as_one():
    """The sampler is rejection_sample at k = 0 too; the forward and it sum, bit for bit, to the
    forward with its sampling summed in (as the roofline counted it before), at every shape."""
    from stepgap.sim.roofline import SAMPLE_KERNELS
    h100 = get_hardware("h100")
    costs = RooflineCosts(TARGET, None, h100, k=0)
    for tokens, reqs, ctx in ((1, 1, 0), (64, 64, 900), (300, 8, 2000), (8192, 1, 0)):
        b = Batch(tokens, reqs, reqs, reqs, 0, ctx + tokens, tokens * (ctx + 1.5))
        fwd, sample = costs.target_forward(b), costs.rejection_sample(b)
        dense = costs._forward(TARGET, tokens, reqs)
        plain = costs.streaming(4 * reqs * TARGET.vocab_size, SAMPLE_KERNELS)
        attn = costs._target_attention(b)
        assert fwd + sample == (dense + plain) + attn
        assert sample == pytest.approx(plain, rel=1e-6)
        assert RooflineCosts(TARGET, None, h100, k=0).rejection_sample(b) == sample   # uncached


def test_catalog_holds_the_seed_gpus_and_a_cpu():
    assert {"l20", "a100", "h100", "h200", "b200", "cpu"} <= set(CATALOG)
    assert get_hardware("L20").mem_bw == 864e9 and get_hardware("h200").flops == 989e12
    with pytest.raises(UserError, match="gpu: unknown device 'x100'"):
        get_hardware("x100")


def test_decode_reads_every_target_weight_once():
    # Llama-3.1-8B: layers ~13.96 GB and the untied lm_head 1.05 GB, embedding only gathered.
    costs = RooflineCosts(TARGET, None, BW_ONLY, k=0)
    weights = 2 * (TARGET.num_params - TARGET.vocab_size * TARGET.hidden_size)
    assert costs.target_forward(decode()) == pytest.approx(weights / 1e6, rel=2e-3)


def test_first_draft_pass_reads_the_whole_head_later_passes_skip_fc():
    costs = RooflineCosts(TARGET, HEAD, BW_ONLY, k=4)
    fc = 2 * 3 * 4096 * 4096
    assert costs.draft_forward(decode(5), 0) == pytest.approx(2 * HEAD.num_params / 1e6, rel=5e-3)
    assert costs.draft_forward(decode(5), 1) == pytest.approx(
        (2 * HEAD.num_params - fc) / 1e6, rel=5e-3)


def test_long_prefill_is_compute_bound():
    hw = Hardware("fl", "gpu", flops=1e14, mem_bw=1e15, flop_eff=1.0, bw_eff=1.0,
                  kernel_us=0.0, d2h_us=0.0, mem_bytes=1e11, source="test")
    costs = RooflineCosts(TARGET, None, hw, k=0)
    n = 4096
    b = Batch(n, 1, 1, 1, 0, n, n * (n + 1) / 2)
    dense = 2 * n * (TARGET.num_params - 2 * TARGET.vocab_size * TARGET.hidden_size)
    attn = TARGET.num_layers * 4 * b.attn_pairs * TARGET.num_heads * TARGET.head_dim
    assert costs.target_forward(b) == pytest.approx((dense + attn) / 1e14 * 1e6, rel=0.01)


def test_kernel_overhead_and_context_add_time():
    costs = RooflineCosts(TARGET, HEAD, get_hardware("h100"), k=4)
    short, long = costs.target_forward(decode(5, 100)), costs.target_forward(decode(5, 8000))
    assert long > short
    lean = RooflineCosts(TARGET, HEAD, Hardware(**{**{f: getattr(get_hardware("h100"), f)
                                                      for f in Hardware.__slots__},
                                                   "kernel_us": 0.0}), k=4)
    # 32 layers x 10 kernels + embedding, final norm, lm_head, each the entry's kernel_us
    assert short - lean.target_forward(decode(5, 100)) == \
        pytest.approx(323 * get_hardware("h100").kernel_us)


def test_cpu_op_cost_is_affine_and_scales():
    c = CpuCosts()
    assert c.schedule(10, 100) == pytest.approx(60 + 6 * 10 + 0.02 * 100)
    s = c.scaled(2.0)
    assert s.prepare_inputs(1, 1) == pytest.approx(2 * c.prepare_inputs(1, 1))
    assert s.wake_us == 2 * c.wake_us
    assert c.with_ops({"launch": OpCost(5.0)}).launch(100, 100) == 5.0
    with pytest.raises(UserError, match="unknown op 'nap'"):
        c.with_ops({"nap": OpCost(1.0)})
    with pytest.raises(UserError, match="b must be a number >= 0"):
        OpCost(1.0, -1.0)


# -- acceptance ----------------------------------------------------------------------------

def test_cumulative_rates_become_conditional():
    p = AcceptanceProfile("x", (0.8, 0.4, 0.2))
    assert p.conditional(5) == pytest.approx([0.8, 0.5, 0.5, 0.5, 0.5])
    assert p.acceptance_length(3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    with pytest.raises(UserError, match="cumulative"):
        AcceptanceProfile("bad", (0.4, 0.6))
    with pytest.raises(UserError, match="position 0 must be in"):
        AcceptanceProfile("bad", (1.5,))


def test_sampled_per_position_rates_match_the_profile_without_spread():
    p = get_profile("mtbench")
    p = AcceptanceProfile(p.name, p.rates, spread=0.0)
    reqs = [TraceRequest(f"r{i}", 0.0, 8, 8) for i in range(40)]
    acc = Acceptance(p, 4, reqs, seed=3)
    counts = np.array([acc.next(r.request_id, 4) for r in reqs for _ in range(500)])
    per_pos = [(counts > i).mean() for i in range(4)]
    assert per_pos == pytest.approx(p.rates[:4], abs=0.01)


def test_request_qualities_are_stratified_normal_quantiles():
    reqs = [TraceRequest(f"r{i}", 0.0, 8, 8) for i in range(80)]
    acc = Acceptance(AcceptanceProfile("x", (0.7,), spread=0.5), 1, reqs, seed=0)
    z = np.sort(acc.qualities())
    assert z.mean() == pytest.approx(0.0, abs=1e-12) and z[-1] == pytest.approx(-z[0])
    assert z[-1] == pytest.approx(0.5 * 2.4977, rel=1e-3)  # the (79.5/80) normal quantile
    other = Acceptance(AcceptanceProfile("x", (0.7,), spread=0.5), 1, reqs, seed=1)
    assert sorted(other.qualities()) == pytest.approx(list(z)) and \
        other.qualities() != acc.qualities()


def test_replay_then_rates_past_the_end_of_the_record():
    reqs = [TraceRequest("a", 0.0, 8, 8, accepted=[2, 0, 1])]
    acc = Acceptance(get_profile("full"), 2, reqs, seed=0)
    assert [acc.next("a", 2) for _ in range(5)] == [2, 0, 1, 2, 2]


@pytest.mark.parametrize("kw, needle", [
    (dict(k=-1), "--num-speculative-tokens: must be an integer from 0 to 64, got -1"),
    (dict(mode="fast"), "--mode: must be one of sync, async, zero-bubble, got 'fast'"),
    (dict(executor="thread"), "--executor: must be one of inline, process"),
    (dict(request_rate=-1.0), "--request-rate: must be > 0 (or inf), got -1.0"),
    (dict(max_num_seqs=0), "--max-num-seqs: must be an integer from 1 to 1000000, got 0"),
    (dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization: must be in (0, 1]"),
    (dict(cpu_costs={"nap": [1]}), "--cpu-cost: unknown op 'nap'"),
])
def test_config_errors_name_the_option(kw, needle):
    with pytest.raises(UserError) as e:
        SimConfig(**kw)
    assert needle in str(e.value)


@pytest.mark.parametrize("model, method, draft, kv", [
    ("llama-3.1-8b", "eagle3", "llama-3.1-8b-eagle3", "auto"),
    ("llama-3.1-8b", "eagle3", "llama-3.1-8b-eagle3", "fp8"),
    ("llama-3.1-8b", "eagle", None, "auto"),
    ("qwen3-8b", "draft_model", "qwen3-0.6b", "auto"), ("deepseek-v3", "mtp", None, "auto"),
    ("qwen3-30b-a3b", "eagle3", None, "auto")])
def test_all_draft_passes_at_once_are_the_passes_one_by_one(model, method, draft, kv):
    """The device lane asks for a step's passes in one call: the same floats, bit for bit,
    an fp8 KV cache's reads too; a data-parallel MoE group's step (its gathered rows set)
    takes the passes one by one."""
    from stepgap.sim.plan import resolve
    k = 1 if method == "mtp" else 5
    r = resolve(SimConfig(model=model, method=method, draft=draft, k=k, kv_cache_dtype=kv,
                          tensor_parallel_size=8 if model == "deepseek-v3" else 1,
                          gpu="h200"))
    costs = r.device_costs
    for rows in (0, 96):
        for b in (Batch(6, 1, 1, 6, 5, 307, 1860.0, 6, 20, 1, 301, 301, 301),
                  Batch(300, 40, 37, 222, 185, 9000, 47000.5, 64, 30, 37, 8000, 20, 600)):
            b.moe_rows, b.draft_moe_rows = rows and 4 * b.num_tokens, rows
            assert costs.draft_forwards(b, k) == [costs.draft_forward(b, i) for i in range(k)]


@pytest.mark.parametrize("model, kv_bytes", [("llama-3.1-8b", 2), ("llama-3.1-8b", 1),
                                             ("qwen3-30b-a3b", 2)])
def test_a_gqa_targets_attention_in_one_expression_is_the_general_sum(model, kv_bytes):
    """The hot path's attention of a target without MLA or windowed layers (a MoE one too):
    the general sum, bit for bit, at the KV cache's element size (--kv-cache-dtype fp8: 1)."""
    c = RooflineCosts(load_model_config(model), None, get_hardware("l20"), 0,
                      kv_bytes=kv_bytes)
    assert c._plain is not None
    for b in (Batch(1, 1, 1, 1, 0, 230, 230.0), Batch(512, 9, 9, 9, 0, 4000, 90000.5),
              Batch(512, 9, 9, 9, 0, 40000, 90000.5)):
        general = c._attention(c.t, b.num_tokens, b.num_reqs, b.attn_pairs, b.kv_tokens,
                               c.t.num_layers, c.t.num_sliding_layers)
        assert c._target_attention(b) == general


@pytest.mark.parametrize("k", [0, 4])
def test_batches_with_one_step_key_have_the_same_times(k):
    """The device lane looks a step's times up by `step_key`: batches that differ only where
    the key does not look (requests, the longest chunk, block tables, the mix) have the same
    op times, bit for bit, computed afresh."""
    from stepgap.sim.device_lane import Device
    costs = RooflineCosts(TARGET, HEAD if k else None, get_hardware("h100"), k)
    a = Batch(2 + 2 * k, 2, 2, 2 + 2 * k, 2 * k, 700, 1400.5, 1 + k, 30, 2, 690, 300, 390)
    b = Batch(2 + 2 * k, 1, 2, 2 + 2 * k, 2 * k, 700, 1400.5, 2 + 2 * k, 9, 1, 5, 5, 5,
              [(1, 0)])
    assert costs.step_key(a) == costs.step_key(b) is not None
    assert Device(costs, k, False, None).step_ops(a) == \
        Device(RooflineCosts(TARGET, HEAD if k else None, get_hardware("h100"), k), k, False,
               None).step_ops(b)


@pytest.mark.parametrize("model, method, draft", [
    ("qwen3-30b-a3b", "eagle3", None), ("qwen3-8b", "draft_model", "qwen3-0.6b"),
    ("gpt-oss-20b", "eagle3", None)])
def test_no_step_key_where_times_read_more_of_the_batch(model, method, draft):
    """A MoE target, a draft model's own forward, windowed layers: times computed every step."""
    from stepgap.sim.plan import resolve
    r = resolve(SimConfig(model=model, method=method, draft=draft, k=3, gpu="h200"))
    assert r.device_costs.step_key(decode(4, 100)) is None


@pytest.mark.parametrize("kw", [dict(mode="async", k=4), dict(mode="sync", k=0),
                                dict(mode="zero-bubble", k=3, speed=1.1),
                                dict(mode="async", k=2, max_concurrency=8)])
def test_looked_up_step_times_give_the_computed_run(kw, monkeypatch):
    """A run whose device lane looks its steps' times up is the run that computes every one,
    result for result (a constant --speed factor too)."""
    from stepgap.sim.loop import simulate
    cfg = {"model": "llama-3.1-8b", "draft": "llama-3.1-8b-eagle3", "gpu": "h100",
           "num_prompts": 12, "max_concurrency": 1, "detailed": True, **kw}
    looked_up, _ = simulate(SimConfig(**cfg))
    monkeypatch.setattr(RooflineCosts, "step_key", lambda self, b: None)
    computed, _ = simulate(SimConfig(**cfg))
    assert looked_up == computed
