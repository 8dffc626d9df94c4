"""Measured operator tables as device costs (sim/tables.py) and a peer's vLLM run as a trace,
a measured side and settings (common/peer_run.py): the interpolation and extrapolation rules
docs/explanation/measured-tables.md states, the pricing of a step's mix, and bad input.

The tables here are written by the tests with round numbers, so every expected time is worked
out by hand from the rule, not taken from the code."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.common.errors import UserError
from stepgap.common.peer_run import load_peer_requests, load_peer_trace, peer_settings
from stepgap.common.run_result import peer_result
from stepgap.sim.config import SimConfig
from stepgap.sim.plan import resolve
from stepgap.sim.costs import Batch
from stepgap.sim.loop import simulate
from stepgap.sim.tables import DENSE_LAYERS, load_tables
from stepgap.sim.table_interp import Table1D

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "traces" / "peers" / "llmservingsim"
BUNDLE_4090 = PEERS / "profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16"
RUN_4090 = PEERS / "bench/examples/RTX4090/Llama-3.1-8B/vllm"
BUNDLE_PRO6000 = PEERS / "profiler/perf/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16"
RUN_PRO6000 = PEERS / "bench/examples/RTXPRO6000/Llama-3.1-8B/vllm"

META = """\
vllm_version: 0.19.0
cuda_version: '12.8'
gpu: Test GPU
hardware: TESTGPU
model: meta-llama/Llama-3.1-8B
tp_degrees: [1]
engine_effective:
  enforce_eager: true
  hf_overrides: {num_hidden_layers: 1, intermediate_size: 14336, num_attention_heads: 32,
                 num_key_value_heads: 8, vocab_size: 128256}
"""
# One layer's dense kernels: every layer 1 us per token (+ 10 us), at tokens 1, 10, 100.
TOKENS = (1, 10, 100)


def write_bundle(root: Path, meta: str = META, dense=None, attention=None, per_seq=None) -> Path:
    tp = root / "tp1"
    tp.mkdir(parents=True)
    (root / "meta.yaml").write_text(meta)
    rows = dense or [(layer, n, 10 + n) for layer in DENSE_LAYERS for n in TOKENS]
    (tp / "dense.csv").write_text("layer,tokens,time_us\n" +
                                  "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    # attention = 5 + pc/10 + kp/100 + nd * kd / 1000 us: linear on every axis
    att = attention or [(pc, kp, nd, kd, 5 + pc / 10 + kp / 100 + nd * kd / 1000)
                        for pc in (0, 100, 200) for kp in ((0, 1000) if pc else (0,))
                        for nd in (0, 10, 20) for kd in ((1000, 4000) if nd else (0,))
                        if pc or nd]
    (tp / "attention.csv").write_text(
        "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n" +
        "".join(",".join(str(x) for x in r) + "\n" for r in att))
    seq = per_seq or [("lm_head", n, 100 + n) for n in (1, 10, 100)] + \
        [("sampler", n, 1 + n) for n in (1, 10, 100)]
    (tp / "per_sequence.csv").write_text("layer,sequences,time_us\n" +
                                         "".join(f"{a},{b},{c}\n" for a, b, c in seq))
    return root


@pytest.fixture
def bundle(tmp_path):
    return write_bundle(tmp_path / "bf16")


def costs_of(path, k=0, draft=None, method="eagle3", tp=1):
    cfg = SimConfig(gpu="h100", k=k, draft=draft, method=method, device_profile=str(path))
    return resolve(cfg).device_costs


# -- interpolation and extrapolation -------------------------------------------------------

def test_a_1d_table_is_linear_between_points_flat_below_and_proportional_above():
    t = Table1D((10.0, 20.0), (100.0, 150.0))
    assert t(15) == pytest.approx(125.0)
    assert t(4) == 100.0            # below the grid: the first point's time
    assert t(40) == pytest.approx(300.0)   # above: in proportion, 150 * 40 / 20


def test_attention_is_linear_on_each_axis_and_extrapolates_from_the_top_two(bundle):
    attn = load_tables(bundle).attention
    assert attn(0, 0, 15, 2500) == pytest.approx(5 + 15 * 2500 / 1000)
    assert attn(150, 500, 0, 0) == pytest.approx(5 + 15 + 5)
    assert attn(150, 500, 15, 2500) == pytest.approx(5 + 15 + 5 + 37.5)
    # above the chunk grid (200) and the decode grid (20): linear from the top two points
    assert attn(300, 0, 0, 0) == pytest.approx(5 + 30)
    assert attn(0, 0, 40, 1000) == pytest.approx(5 + 40)


def test_a_missing_mixed_slice_is_reached_along_its_own_chunk_row(tmp_path):
    # no mixed shot with 20 decodes: a 100-token chunk beside 20 decodes comes from the
    # chunk's own row (its 0 and 10 decodes), extrapolated
    att = [(pc, kp, nd, kd, 5 + pc / 10 + nd * kd / 1000)
           for pc in (0, 100) for kp in (0,) for nd in (0, 10, 20) for kd in (
               (1000, 4000) if nd else (0,)) if (pc or nd) and not (pc and nd == 20)]
    attn = load_tables(write_bundle(tmp_path / "b", attention=att)).attention
    assert attn(100, 0, 20, 1000) == pytest.approx(5 + 10 + 20)


# -- a step's mix ---------------------------------------------------------------------------

def batch(tokens, reqs, decode, decode_kv, prefills=(), kv_min=0, kv_max=0, drafts=0,
          sampling=None):
    return Batch(tokens, reqs, sampling if sampling is not None else reqs, reqs + drafts,
                 drafts, 0, 0.0, num_decode=decode, decode_kv=decode_kv,
                 decode_kv_min=kv_min, decode_kv_max=kv_max, prefills=list(prefills))


def test_the_target_forward_sums_its_layers_attention_and_lm_head(bundle):
    c = costs_of(bundle, k=1)
    # 10 decodes of 1000 history each: dense at 10 tokens (20 us each kernel): embedding +
    # 32 x 8 kernels + final norm = 258 x 20; attention 32 x (5 + 10); lm_head at 10 rows 110
    b = batch(10, 10, 10, 10 * 1000, kv_min=1000, kv_max=1000)
    assert c.target_forward(b) == pytest.approx(258 * 20 + 32 * 15 + 110)


def test_a_second_prefill_chunk_adds_its_own_time_above_the_kernel_floor(bundle):
    c = costs_of(bundle, k=1)
    one = c.attention([(200, 0)], 0, 0)
    two = c.attention([(200, 0), (100, 0)], 0, 0)
    floor = c.attn.floor   # the cheapest shot: 5 + 10 decodes of 1000 = 15
    assert one == pytest.approx(25)
    assert two == pytest.approx(25 + (15 - floor))


def test_decodes_are_priced_at_their_mean_history(bundle):
    c = costs_of(bundle, k=1)
    assert c.attention([], 10, 10 * 2500, 1000, 4000) == pytest.approx(5 + 10 * 2500 / 1000)


def test_a_measured_skew_fit_adds_its_alpha_of_the_gap_to_the_longest_history(tmp_path):
    meta = META + "skew_fit:\n  enabled: true\n  per_tp:\n    1: {alpha_default: 0.1}\n"
    c = costs_of(write_bundle(tmp_path / "b", meta=meta), k=1)
    mean, top = 5 + 10 * 2500 / 1000, 5 + 10 * 4000 / 1000
    assert c.attention([], 10, 10 * 2500, 1000, 4000) == pytest.approx(mean + 0.1 * (top - mean))


def test_the_sampler_runs_over_every_logit_row_at_every_k(bundle):
    b = batch(10, 10, 10, 10 * 1000, kv_min=1000, kv_max=1000)
    assert costs_of(bundle, k=0).rejection_sample(b) == pytest.approx(1 + 10)
    assert costs_of(bundle, k=0).target_forward(b) == costs_of(bundle, k=1).target_forward(b)
    bk = batch(30, 10, 10, 10 * 1000, kv_min=1000, kv_max=1000, drafts=20)
    assert costs_of(bundle, k=2).rejection_sample(bk) == pytest.approx(1 + 30)


def test_an_eagle3_head_of_the_targets_width_is_priced_from_the_tables(bundle):
    c = costs_of(bundle, k=2)
    assert "tables" in c.sources["draft_forward"]
    b = batch(10, 10, 10, 10 * 1000, kv_min=1000, kv_max=1000, sampling=10)
    # pass 0 over 10 tokens: embedding 20, 3 norms, 2 qkv, rotary, o, gate_up, act, down
    # (10 kernels of 20), final norm 20, lm_head 110 x 32000/128256, the fc as 3 o_proj (60),
    # attention 5 + 10 = 15; plus the roofline's argmax bookkeeping
    bookkeeping = c.fallback.streaming(4 * 10 * 32000, 6)
    assert c.draft_forward(b, 0) == pytest.approx(
        20 + 10 * 20 + 20 + 110 * 32000 / 128256 + 60 + 15 + bookkeeping)


def test_a_drafter_of_other_shapes_falls_back_to_the_roofline_and_says_so(bundle):
    c = costs_of(bundle, k=2, method="draft_model", draft="llama-3.2-1b")
    assert c.sources["draft_forward"].startswith("roofline")
    b = batch(10, 10, 10, 10 * 1000, kv_min=1000, kv_max=1000)
    assert c.draft_forward(b, 0) == c.fallback.draft_forward(b, 0)


def test_the_result_says_which_op_came_from_where(bundle):
    res, _ = simulate(SimConfig(gpu="h100", k=2, device_profile=str(bundle), num_prompts=4,
                                output_len=8))
    dc = res["config"]["resolved"]["device_costs"]
    assert dc["profile"] == str(bundle)
    assert dc["target_forward"].startswith("tables") and dc["d2h"].startswith("roofline")


# -- the committed bundles ---------------------------------------------------------------------

def test_the_4090_tables_time_a_decode_step_as_their_kernels_add_up():
    t = load_tables(BUNDLE_4090)
    c = costs_of(BUNDLE_4090, k=1)
    dense = t.dense
    by_hand = dense["embedding"](1) + 32 * (2 * dense["layernorm"](1) + dense["qkv_proj"](1)
                                            + dense["rotary_emb"](1) + dense["o_proj"](1)
                                            + dense["gate_up_proj"](1) + dense["act_fn"](1)
                                            + dense["down_proj"](1)) \
        + dense["final_layernorm"](1) + 32 * t.attention(0, 0, 1, 1024) \
        + t.per_sequence["lm_head"](1)
    assert c.target_forward(batch(1, 1, 1, 1024, kv_min=1024, kv_max=1024)) \
        == pytest.approx(by_hand)
    # one token at 1024 of history: about 16 GB of weights at the 4090's ~1 TB/s
    assert 14e3 < by_hand < 20e3


def test_tensor_parallelism_needs_the_tables_of_that_degree(bundle):
    with pytest.raises(UserError, match=r"bf16/tp2: no such folder \(tables here at "
                                        r"tensor-parallel size 1\); --tensor-parallel-size 2"):
        load_tables(bundle, tp=2)
    qwen = PEERS / "profiler/perf/RTXPRO6000/Qwen/Qwen3-32B/bf16"   # committed: tp2/ only
    with pytest.raises(UserError, match=r"bf16/tp1: no such folder \(tables here at "
                                        r"tensor-parallel size 2; meta.yaml's tp_degrees lists "
                                        r"\[1, 2\], but the folder is missing\)"):
        load_tables(qwen, tp=1)


# -- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, message", [
    (lambda b: (b / "tp1" / "dense.csv").unlink(), r"dense.csv: table not found"),
    (lambda b: (b / "meta.yaml").unlink(), r"no meta.yaml there"),
    (lambda b: (b / "meta.yaml").write_text("model: [unclosed\n"), r"meta.yaml.*not valid YAML"),
    (lambda b: (b / "tp1" / "dense.csv").write_text("layer,tokens,time_us\nqkv_proj,1,x\n"),
     r"dense.csv:2: field 'time_us': expected a number, got 'x'"),
    (lambda b: (b / "tp1" / "dense.csv").write_text("layer,tokens,time_us\nqkv_proj,1,5\n"),
     r"dense.csv: no rows for embedding"),
    (lambda b: (b / "tp1" / "attention.csv").write_text(
        "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16,-3\n"),
     r"attention.csv:2: field 'time_us': expected microseconds"),
    (lambda b: (b / "tp1" / "per_sequence.csv").write_text("layer,sequences\nlm_head,1\n"),
     r"per_sequence.csv:1: header lacks time_us"),
])
def test_a_broken_bundle_is_one_clear_error(bundle, edit, message):
    edit(bundle)
    with pytest.raises(UserError, match=message):
        costs_of(bundle, k=1)


def test_tables_of_another_model_are_refused_naming_the_field(bundle):
    with pytest.raises(UserError, match=r"bf16/meta.yaml: tables of meta-llama/Llama-3.1-8B, "
                                        r"not of --model llama-3.2-1b: engine_effective."
                                        r"hf_overrides.intermediate_size is 14336 per rank at "
                                        r"TP 1, --model llama-3.2-1b has 8192$"):
        resolve(SimConfig(gpu="h100", model="llama-3.2-1b", device_profile=str(bundle)))


# -- a bundle of the wrong types, and skew fits out of range (docs/reference/robustness.md): one
# line naming the file, the line or the field, where they were tracebacks or silently another
# reading

# A skew fit of four bucket axes, its bins as LLMServingSim writes them (1.0e+9: a float to YAML)
SKEW_META = META + """\
skew_fit:
  enabled: true
  bucket_axes:
    n_bins: [0, 2, 1000000]
    n_labels: [n<=2, n>2]
    skew_rate_bins: [-0.01, 0.5, 1.01]
    skew_rate_labels: [low, high]
    kv_big_bins: [0, 1.0e+9]
    kv_big_labels: [any]
    kp_bins: [-1, 0, 1000000000]
    kp_labels: [kp=0, kp>0]
  per_tp:
    1: {alpha_default: 0.1, bucket_table: tp1/skew_fit.csv}
"""
SKEW_CSV = "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha\n0,n>2,low,any,kp=0,{}\n"


def skew_bundle(root: Path, meta: str = SKEW_META, alpha: str = "0.5") -> Path:
    b = write_bundle(root, meta=meta)
    (b / "tp1" / "skew_fit.csv").write_text(SKEW_CSV.format(alpha))
    return b


def test_a_bucket_of_the_skew_fit_gives_its_own_alpha(tmp_path):
    c = costs_of(skew_bundle(tmp_path / "b"), k=1)
    # 10 decodes from 1000 to 4000 of history, mean 2500: skew rate 0.5 ('low'), 10 decodes
    # ('n>2'), longest 4000 ('any'), no prefill ('kp=0'): the bucket's alpha 0.5, not 0.1
    mean, top = 5 + 10 * 2500 / 1000, 5 + 10 * 4000 / 1000
    assert c.attention([], 10, 10 * 2500, 1000, 4000) == pytest.approx(mean + 0.5 * (top - mean))


def edit_meta(old: str, new: str, meta: str = META):
    def edit(b: Path) -> None:
        assert old in meta
        (b / "meta.yaml").write_text(meta.replace(old, new))
    return edit


def edit_file(name: str, text: str):
    return lambda b: (b / "tp1" / name).write_text(text)


def alpha_default(text: str):
    """The skew fit's alpha_default written as `text` in meta.yaml."""
    return edit_meta("alpha_default: 0.1", f"alpha_default: {text}", SKEW_META)


ALPHA_RANGE = r"field 'skew_fit.per_tp.1.alpha_default': expected a number from -100 to 100, got "
EFFECTIVE = "engine_effective:\n  enforce_eager: true\n  hf_overrides:"
DENSE_HEAD = "layer,tokens,time_us\n"


@pytest.mark.parametrize("edit, message", [
    (edit_meta(EFFECTIVE, "engine_effective: [eager]\nhf_overrides:"),
     r"meta.yaml: field 'engine_effective': expected a mapping of the engine's settings, got "
     r"\['eager'\]$"),
    (edit_meta(EFFECTIVE, "engine_effective: eager\nhf_overrides:"),
     r"meta.yaml: field 'engine_effective': expected a mapping .*, got 'eager'$"),
    (edit_meta("tp_degrees: [1]", "tp_degrees: [a, 1]"),
     r"meta.yaml: field 'tp_degrees': expected a list of tensor-parallel sizes from 1 to 8, got "
     r"\['a', 1\]$"),
    (edit_meta("tp_degrees: [1]", "tp_degrees: [1000000000000]"), r"field 'tp_degrees'"),
    (edit_meta("tp_degrees: [1]", "tp_degrees: '1'"), r"field 'tp_degrees': .*, got '1'$"),
    (edit_meta("tp_degrees: [1]", "tp_degrees: {1: 1}"), r"field 'tp_degrees': .*, got \{1: 1\}$"),
    (edit_meta("num_attention_heads: 32", "num_attention_heads: '32'"),
     r"field 'engine_effective.hf_overrides.num_attention_heads': expected an integer >= 1, "
     r"got '32'$"),
    (edit_meta("model: meta-llama/Llama-3.1-8B", "model: [a, b]"), r"field 'model': expected a "
                                                                    r"name"),
    (edit_meta("gpu: Test GPU", "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
        + "gpu: *l9"),   # an alias of 10^10 strings: refused before the document is built
     r"meta.yaml:\d+: refused: its aliases expand to more than 1,000,000 values$"),
    (lambda b: (b / "meta.yaml").write_text("a: " + "[" * 20000 + "]" * 20000 + "\n"),
     r"meta.yaml:1: not valid YAML \(nested more than 100 deep\)$"),
    (lambda b: (b / "meta.yaml").write_text(META + "x: " + "9" * 5000 + "\n"),
     r"meta.yaml:\d+: not valid YAML \(an integer of 5000 digits"),
    (edit_file("dense.csv", DENSE_HEAD + "qkv_proj,1," + "1" * 200_000 + "\n"),
     r"tp1/dense.csv:2: not valid CSV \(field larger than field limit \(131072\)\)$"),
    (edit_file("attention.csv", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n"
               "0,0,1,1e300,7\n"),
     r"attention.csv:2: field 'kv_decode': expected a whole count from 0 to 16777216, got "
     r"'1e300'$"),
    (edit_meta("1.0e+9", "1.0e9", SKEW_META),
     r"field 'skew_fit.bucket_axes.kv_big_bins\[1\]': expected a number, got '1.0e9' \(YAML "
     r"reads 1.0e9 as a string: a number needs a point and a sign in its exponent"),
    (edit_meta("[0, 2, 1000000]", "[0, 2, 1]", SKEW_META),
     r"field 'skew_fit.bucket_axes.n_bins': expected bin edges that rise"),
    (edit_meta("[low, high]", "[low, 5]", SKEW_META),
     r"field 'skew_fit.bucket_axes.skew_rate_labels': expected a list of names"),
    (edit_meta("  per_tp:\n    1: {alpha_default: 0.1, bucket_table: tp1/skew_fit.csv}\n",
               "  per_tp: [{alpha_default: 0.1}]\n", SKEW_META),
     r"field 'skew_fit.per_tp': expected a mapping of tensor-parallel size to its fit"),
    (alpha_default("-1e6"), ALPHA_RANGE + r"'-1e6' \(YAML reads -1e6 as a string"),
    (alpha_default("-1.0e+6"), ALPHA_RANGE + r"-1000000.0$"),
    (alpha_default(".nan"), ALPHA_RANGE + r"nan$"),
    (edit_meta("enabled: true", "enabled: 'no'", SKEW_META), r"field 'skew_fit.enabled'"),
])
def test_a_bundle_of_the_wrong_types_is_one_line_naming_the_field(tmp_path, edit, message):
    b = skew_bundle(tmp_path / "bf16")
    edit(b)
    with pytest.raises(UserError, match=message) as e:
        costs_of(b, k=1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("alpha", ["nan", "-1e9", "inf", "-inf", "x", "100.5"])
def test_a_bucket_alpha_out_of_range_is_refused_naming_its_line(tmp_path, alpha):
    b = skew_bundle(tmp_path / "bf16", alpha=alpha)
    with pytest.raises(UserError, match=rf"tp1/skew_fit.csv:2: field 'alpha': expected a number "
                                        rf"from -100 to 100, got '{alpha}'$"):
        costs_of(b, k=1)


def test_the_committed_bundles_alphas_are_within_the_limit():
    """The limit's reason: every alpha LLMServingSim fitted (-14.0 to 4.3) is read."""
    qwen = PEERS / "profiler/perf/RTXPRO6000/Qwen/Qwen3-32B/bf16"
    skew = load_tables(qwen, tp=2).skew
    assert len(skew.alphas) == 3979 and min(skew.alphas.values()) == -14.0104
    assert max(skew.alphas.values()) == 4.256 and skew.alpha_default == 0.0649


# Qwen3-32B's per-rank shapes at TP 2, as its profiler wrote them: 64 heads of 128 over a width
# of 5120, so hidden != heads x head_dim.
QWEN_META = META.replace("model: meta-llama/Llama-3.1-8B", "architecture: qwen3\nmodel: "
                         "Qwen/Qwen3-32B").replace("tp_degrees: [1]", "tp_degrees: [1, 2]") \
    .replace("intermediate_size: 14336, num_attention_heads: 32", "intermediate_size: 12800, "
             "num_attention_heads: 32").replace("num_key_value_heads: 8, vocab_size: 128256",
                                                "num_key_value_heads: 4, vocab_size: 75968")


def qwen_bundle(root: Path, with_qk_norm=True) -> Path:
    layers = DENSE_LAYERS + (("qk_norm",) if with_qk_norm else ())
    b = write_bundle(root, QWEN_META, dense=[(layer, n, 10 + n) for layer in layers
                                             for n in TOKENS])
    (b / "tp1").rename(b / "tp2")
    return b


def test_qwen3_tables_price_its_decoupled_head_dim_and_its_qk_norm(tmp_path):
    b = qwen_bundle(tmp_path / "bf16")
    costs = resolve(SimConfig(gpu="h100", model="qwen3-32b", tensor_parallel_size=2,
                              device_profile=str(b))).device_costs
    # embedding + 64 layers of 9 kernels (2 norms, qkv, qk_norm, rotary, o, gate_up, act, down)
    # + final norm, each 10 + m us, at m = 10 tokens
    assert costs.dense(10) == pytest.approx(20 + 64 * 9 * 20 + 20)


def test_a_qwen3_bundle_without_qk_norm_rows_names_them(tmp_path):
    b = qwen_bundle(tmp_path / "bf16", with_qk_norm=False)
    with pytest.raises(UserError, match=r"tp2/dense.csv: no rows for qk_norm \(a qwen3 layer "):
        resolve(SimConfig(gpu="h100", model="qwen3-32b", tensor_parallel_size=2,
                          device_profile=str(b)))


@pytest.mark.parametrize("model, tp, fields", [
    ("llama-3.1-8b", 1, ["architecture is 'qwen3', --model is a 'llama' model",
                          "num_attention_heads is 32 per rank at TP 2 (64 in all), --model "
                          "llama-3.1-8b has 16", "vocab_size is 75968"]),
    ("qwen3-8b", 1, ["intermediate_size is 12800 per rank at TP 2 (25600 in all), --model "
                     "qwen3-8b has 6144"]),
])
def test_every_field_that_differs_is_named_once(tmp_path, model, tp, fields):
    b = qwen_bundle(tmp_path / "bf16")
    (b / "tp2").rename(b / "tp1")
    with pytest.raises(UserError) as e:
        resolve(SimConfig(gpu="h100", model=model, tensor_parallel_size=tp,
                          device_profile=str(b)))
    msg = str(e.value)
    assert msg.count("\n") == 0 and "meta.yaml: tables of Qwen/Qwen3-32B" in msg
    assert all(f in msg for f in fields), msg


def test_a_request_longer_than_the_tables_kv_grid_is_refused_before_the_run(bundle, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"request_id": "long", "arrival_s": 0, "prompt_len": 4000,
                                 "output_len": 10}) + "\n")
    with pytest.raises(UserError, match=r"request 'long'.*4010 tokens, past the KV lengths "
                                        r"the --device-profile tables measured \(up to 4000"):
        simulate(SimConfig(gpu="h100", device_profile=str(bundle), workload=str(trace),
                           max_model_len=8192))


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "stepgap", *args], capture_output=True,
                          text=True, cwd=ROOT)


def test_the_command_line_gives_one_line_and_exit_2_for_a_broken_bundle(bundle, tmp_path):
    (bundle / "tp1" / "dense.csv").write_text("layer,tokens,time_us\nqkv_proj,one,5\n")
    out = tmp_path / "r.json"
    p = run_cli("simulate", "--device-profile", str(bundle), "--num-prompts", "2",
                "--result-json", str(out))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0, p.stderr
    assert "dense.csv:2: field 'tokens'" in p.stderr and not out.exists()


# -- a peer's run -----------------------------------------------------------------------------

def write_requests(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


REQ = {"request_id": "bench-0", "input_toks": 100, "output_toks": 11, "arrival_time": 1e9,
       "queued_ts": 10.0, "scheduled_ts": 10.5, "first_token_ts": 11.0, "last_token_ts": 12.0}


def test_a_peer_run_is_measured_as_vllm_defines_its_metrics(tmp_path):
    path = write_requests(tmp_path / "requests.jsonl", [
        REQ, {**REQ, "request_id": "bench-1", "queued_ts": 12.0, "scheduled_ts": 12.0,
              "first_token_ts": 14.0, "last_token_ts": 16.0}])
    res = peer_result(path)
    assert res["mean_ttft_ms"] == pytest.approx((1.0 + 2.0) / 2 * 1e3)   # first - queued
    assert res["mean_tpot_ms"] == pytest.approx((100.0 + 200.0) / 2)     # (last - first) / 10
    assert res["mean_e2el_ms"] == pytest.approx((2.0 + 4.0) / 2 * 1e3)   # last - queued
    assert math.isnan(res["mean_itl_ms"])                               # not recorded
    trace = load_peer_trace(path)
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in trace] == \
        [(0.0, 100, 11), (2.0, 100, 11)]


@pytest.mark.parametrize("change, message", [
    ({"first_token_ts": None}, r":1: field 'first_token_ts': missing"),
    ({"queued_ts": -1.0}, r":1: field 'queued_ts': expected a timestamp in seconds from 0 to "
                            r"1e\+10 \(vLLM's monotonic clock\), got -1.0"),
    ({"last_token_ts": 10.9}, r":1: field 'last_token_ts': .* is before first_token_ts"),
    ({"output_toks": 0}, r":1: field 'output_toks': expected an integer >= 1"),
])
def test_a_broken_requests_file_is_one_clear_error(tmp_path, change, message):
    row = {k: v for k, v in {**REQ, **change}.items() if v is not None}
    with pytest.raises(UserError, match=message):
        load_peer_requests(write_requests(tmp_path / "requests.jsonl", [row]))


def test_a_broken_requests_file_on_the_command_line_writes_nothing(tmp_path):
    path = write_requests(tmp_path / "requests.jsonl", [{**REQ, "queued_ts": -2.0}])
    out = tmp_path / "r.json"
    p = run_cli("simulate", "--trace", str(path), "--result-json", str(out))
    assert p.returncode == 2 and "Traceback" not in p.stderr and not out.exists()
    assert "field 'queued_ts'" in p.stderr


def test_a_request_past_one_runs_clock_names_its_line_and_field(tmp_path):
    rows = [REQ, {**REQ, "request_id": "bench-1", "last_token_ts": 1e308}]
    with pytest.raises(UserError, match=r"requests.jsonl:2: field 'last_token_ts': expected a "
                                        r"timestamp in seconds from 0 to 1e\+10"):
        load_peer_requests(write_requests(tmp_path / "requests.jsonl", rows))
    rows[1]["last_token_ts"] = 5e6   # a number of the clock, but 58 days after the first request
    with pytest.raises(UserError, match=r"requests.jsonl:2: field 'last_token_ts': 5e\+06 s is "
                                        r"more than 1e\+06 s after the first queued_ts, 10"):
        load_peer_requests(write_requests(tmp_path / "requests.jsonl", rows))


@pytest.mark.parametrize("rid", ["bench-²", "bench-" + "9" * 5000, "bench-x", "7"])
def test_a_request_id_that_names_no_dataset_line_says_so(tmp_path, rid):
    from stepgap.common.peer_run import dataset_token_ids
    dataset = tmp_path / "ds.jsonl"
    dataset.write_text(json.dumps({"input_tok_ids": list(range(100))}) + "\n")
    with pytest.raises(UserError, match=r"ds.jsonl: no line for request .* \(the runner names "
                                        r"line i bench-i\)"):
        dataset_token_ids(dataset, [{"request_id": rid, "input_toks": 100}])
    assert dataset_token_ids(dataset, [{"request_id": "bench-0", "input_toks": 100}]) == \
        {"bench-0": list(range(100))}


def meta_with(path: str, value) -> dict:
    """The 4090 run's meta.json with one field (dotted path) set to `value`."""
    doc = json.loads((RUN_4090 / "meta.json").read_text())
    *parents, key = path.split(".")
    d = doc
    for p in parents:
        d = d.setdefault(p, {})
    d[key] = value
    return doc


@pytest.mark.parametrize("path, value, expected", [
    ("kv_cache", [1], "an object"),
    ("kv_cache", "abc", "an object"),
    ("resolved_config.cache_config", 5, "an object"),
    ("kv_cache.block_size", 0, "an integer >= 1"),   # was replaced by the resolved config's
    ("resolved_config.cache_config.block_size", 0, None),   # kv_cache's 16 is read first
    ("engine_kwargs.max_num_seqs", "8", "an integer >= 1"),
    ("engine_kwargs.tensor_parallel_size", 16, "an integer from 1 to 8"),
    ("kv_cache.num_gpu_blocks", 0, "an integer >= 1"),
    ("resolved_config.scheduler_config.async_scheduling", "false", "true or false"),
    ("kv_cache.enable_prefix_caching", 1, "true or false"),
    ("resolved_config.compilation_config.cudagraph_capture_sizes", {"a": 1},
     "a list of batch sizes"),
    ("resolved_config.compilation_config.cudagraph_capture_sizes", 5, "a list of batch sizes"),
])
def test_a_meta_json_of_the_wrong_types_names_its_own_field(tmp_path, path, value, expected):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(meta_with(path, value)))
    if expected is None:
        assert peer_settings(meta, context=131072)[0]["block_size"] == 16
        return
    with pytest.raises(UserError, match=rf"meta.json: field '{path}': expected {expected}") as e:
        peer_settings(meta, context=131072)
    assert "--" not in str(e.value)


@pytest.mark.parametrize("util", ["abc", [0.9], True, 0, 1.5, float("nan")])
def test_gpu_memory_utilization_is_a_fraction_named_as_meta_jsons(tmp_path, util):
    meta = tmp_path / "meta.json"   # (`true` was read as 1.0)
    meta.write_text(json.dumps(meta_with("kv_cache.gpu_memory_utilization", util)))
    with pytest.raises(UserError, match=r"meta.json: field 'kv_cache.gpu_memory_utilization': "
                                        r"expected a fraction of the GPU's memory, in \(0, 1\], "
                                        rf"got {re.escape(repr(util))}$"):
        peer_settings(meta, context=131072)


def test_a_cache_without_blocks_is_sized_from_the_first_utilization_recorded(tmp_path):
    doc = meta_with("kv_cache.gpu_memory_utilization", None)
    doc["kv_cache"]["num_gpu_blocks"] = doc["resolved_config"]["cache_config"]["num_gpu_blocks"] \
        = None
    doc["resolved_config"]["cache_config"]["gpu_memory_utilization"] = 0.8
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(doc))
    assert peer_settings(meta, context=131072)[0]["gpu_memory_utilization"] == 0.8


def test_a_timeseries_field_past_the_csv_limit_names_its_line(tmp_path):
    from stepgap.common.peer_run import load_timeseries
    path = tmp_path / "timeseries.csv"
    path.write_text("t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
                    "1,0,0,1,0," + "5" * 200_000 + "\n")
    with pytest.raises(UserError, match=r"timeseries.csv:2: not valid CSV \(field larger"):
        load_timeseries(path)


def test_a_broken_meta_json_on_the_command_line_is_one_line_and_writes_nothing(tmp_path):
    run = tmp_path / "vllm"
    run.mkdir()
    write_requests(run / "requests.jsonl", [REQ])
    (run / "meta.json").write_text(json.dumps(meta_with("kv_cache.gpu_memory_utilization",
                                                        "abc")))
    out = tmp_path / "r.json"
    p = run_cli("simulate", "--trace", str(run / "requests.jsonl"), "--result-json", str(out))
    assert p.returncode == 2 and "Traceback" not in p.stderr and not out.exists()
    assert p.stderr.strip().count("\n") == 0, p.stderr
    assert p.stderr.strip().endswith("meta.json: field 'kv_cache.gpu_memory_utilization': "
                                     "expected a fraction of the GPU's memory, in (0, 1], got "
                                     "'abc'")


def test_a_runs_settings_map_to_vllm_spelled_options():
    settings, notes = peer_settings(RUN_4090 / "meta.json", context=131072)
    assert settings == {"max_num_seqs": 256, "max_num_batched_tokens": 2048,
                        "max_model_len": 32768, "tensor_parallel_size": 1, "block_size": 16,
                        "num_gpu_blocks_override": 2588, "mode": "async",
                        "scheduler_reserve_full_isl": True, "enable_prefix_caching": True}
    assert "--num-gpu-blocks-override 2588" in notes[0]
    assert any("CUDA graphs" in n for n in notes)


def test_a_null_max_model_len_is_the_models_context_as_vllm_takes_it(tmp_path):
    meta = json.loads((RUN_PRO6000 / "meta.json").read_text())
    assert meta["engine_kwargs"]["max_model_len"] is None
    settings, notes = peer_settings(RUN_PRO6000 / "meta.json", context=131072)
    assert settings["max_model_len"] == 131072
    assert any("max_model_len is null" in n and "--max-model-len 131072" in n for n in notes)


def test_the_reports_command_runs_the_pro6000_run_whose_prompts_pass_2048(tmp_path):
    # (its longest request is 2,000-odd tokens past --max-model-len's own default of 2048)
    res = tmp_path / "sim.json"
    p = run_cli("simulate", "--gpu", "rtxpro6000", "--trace", str(RUN_PRO6000 / "requests.jsonl"),
                "--device-profile", str(BUNDLE_PRO6000), "--result-json", str(res))
    assert p.returncode == 0, p.stderr
    assert "--max-model-len 131072" in p.stderr and res.is_file()


def report_peer_commands() -> list[list[str]]:
    """The `stepgap simulate` commands of the peer runs' report (once the README's section), as
    printed."""
    text = (ROOT / "docs" / "reports" / "2026-12-03-peer-gpu.md").read_text()
    block = text.split("## Real GPU runs")[1].split("```")[1]
    joined = block.replace("\\\n", " ")
    folder = next(line.split("=", 1)[1] for line in joined.splitlines() if line.startswith("P="))
    return [line.replace("$P", str(ROOT / folder)).split()[2:]
            for line in joined.splitlines() if line.startswith("stepgap simulate")]


def test_the_reports_commands_run_as_printed_for_both_gpus_and_the_tp2_run(tmp_path):
    commands = report_peer_commands()
    assert len(commands) == 3
    for argv in commands:   # --model, --gpu, --device-profile, --trace and output options only
        options = {a for a in argv if a.startswith("--")}
        assert options <= {"--model", "--gpu", "--device-profile", "--trace",
                           "--metric-percentiles", "--result-json"}, options
        p = subprocess.run([sys.executable, "-m", "stepgap", "simulate", *argv, "--quiet"],
                           capture_output=True, text=True, cwd=tmp_path)
        assert p.returncode == 0, p.stderr


def test_the_committed_run_replays_the_dataset_with_its_token_ids():
    trace = load_peer_trace(RUN_4090 / "requests.jsonl")
    assert len(trace) == 300 and all(len(r.prompt_token_ids) == r.prompt_len for r in trace)
    assert trace[0].arrival_s == 0.0


def test_compare_takes_a_peer_run_as_the_measured_side(tmp_path):
    res = tmp_path / "sim.json"
    p = run_cli("simulate", "--trace", str(RUN_4090 / "requests.jsonl"), "--gpu", "rtx4090",
                "--device-profile", str(BUNDLE_4090), "--num-prompts", "300",
                "--metric-percentiles", "50,90,99", "--result-json", str(res), "--quiet")
    assert p.returncode == 0, p.stderr
    p = run_cli("compare", str(RUN_4090 / "requests.jsonl"), str(res))
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if line.startswith("Mean TPOT"))
    assert abs(float(row.split()[-1])) < 1.0   # percent
    assert next(line for line in p.stdout.splitlines()
                if line.startswith("Mean ITL")).split()[3] == "-"


def test_an_output_over_an_input_the_command_found_beside_its_trace_is_refused(tmp_path,
                                                                               capsys):
    """`--trace requests.jsonl` reads the run's meta.json beside it: a --result-json naming that
    file was written over it (exit 0, the run's settings gone)."""
    import shutil
    from stepgap.cli import main
    run = tmp_path / "run"
    shutil.copytree(RUN_4090, run)
    before = (run / "meta.json").read_bytes()
    assert main(["simulate", "--trace", str(run / "requests.jsonl"), "--gpu", "rtx4090",
                 "--num-prompts", "2", "--result-json", str(run / "meta.json"), "--quiet"]) == 2
    assert "meta.json: an input this command read" in capsys.readouterr().err
    assert (run / "meta.json").read_bytes() == before


def test_a_sweep_cells_key_follows_every_file_its_tables_may_come_from(tmp_path):
    """A stored cell is run again when a file that may price it changes: a variant beside the
    one given (find_variant takes it for fp8), and the hardware.yaml of meta.yaml's GPU (the
    key hashed the nearest one of any parent, and no sibling)."""
    from stepgap.sim.sweep_keys import cell_key
    perf = tmp_path / "perf" / "TESTGPU"
    cfg = SimConfig(gpu="h100", device_profile=str(write_bundle(perf / "m" / "bf16")))
    key = cell_key(cfg)
    assert cell_key(cfg) == key
    write_bundle(perf / "m" / "fp8")
    assert cell_key(cfg) != key
    key = cell_key(cfg)
    (perf / "hardware.yaml").write_text("hardware: TESTGPU\n")
    assert cell_key(cfg) != key


def test_a_bundle_is_parsed_once_while_its_files_are_the_same(tmp_path):
    """Every cell of a grid loads the bundle: the second load is the first's tables, still
    counted among the command's inputs; an edit of the same size (no time to tell it by) is
    read again."""
    from stepgap.common import fileio
    b = write_bundle(tmp_path / "b")
    first = load_tables(b)
    with fileio.reading_inputs():
        assert load_tables(b) is first
        assert fileio._inode(b / "tp1" / "attention.csv") in fileio.READ
    dense = b / "tp1" / "dense.csv"
    text = dense.read_text()
    edited = text.replace("embedding,1,11", "embedding,1,12")
    assert edited != text and len(edited) == len(text)
    dense.write_text(edited)
    again = load_tables(b)
    assert again is not first and again.dense["embedding"](1) == 12.0


def test_a_second_plan_of_a_catalog_gpu_reads_no_committed_bundle_again(monkeypatch):
    """advise and sweep resolve a plan per cell: the committed bundles (a glob of traces/peers/
    and each one's meta.yaml) are read by the first plan of a process, not by every one."""
    from stepgap.sim import bundle_match
    cfg = SimConfig(model="llama-3.1-8b", gpu="h100", k=3)
    resolve(cfg)   # (whatever an earlier test read, this process has read them now)
    reads = []
    monkeypatch.setattr(bundle_match, "read_meta", lambda root: reads.append(root) or {})
    monkeypatch.setattr(bundle_match, "bundle_meta", lambda root: reads.append(root))
    for k in (3, 5):
        resolve(SimConfig(model="llama-3.1-8b", gpu="h100", k=k))
    assert reads == []
