"""A MoE block and an MTP module from measured tables (sim/moe_tables.py), and a MoE layer under
data and expert parallelism (sim/expert_parallel.py): the interpolation rules
docs/explanation/past-one-gpu.md states, the EP degree a run reads, what the tables do not cover,
and bad input.

The tables are written here with round numbers, so every expected time is worked out by hand
from the rule, not taken from the code."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.common.errors import UserError
from stepgap.common.model_presets import MODEL_PRESETS
from stepgap.sim.config import SimConfig
from stepgap.sim.plan import resolve
from stepgap.sim.costs import Batch
from stepgap.sim.expert_parallel import MoeCosts, MoeParallel
from stepgap.sim.hardware import Interconnect, MeasuredLink, get_hardware
from stepgap.sim.hardware_file import load_collectives
from stepgap.sim.loop import simulate
from stepgap.sim.moe_tables import load_moe_table
from stepgap.sim.roofline import expected_experts

ROOT = Path(__file__).resolve().parents[1]
QWEN = MODEL_PRESETS["qwen3-30b-a3b"]   # 48 MoE layers, 128 experts, top-8, hidden 2048

META = """\
vllm_version: 0.19.0
gpu: Test GPU
hardware: TESTGPU
architecture: qwen3_moe
model: Qwen/Qwen3-30B-A3B
tp_degrees: [1]
engine_effective:
  enforce_eager: true
  hf_overrides: {num_hidden_layers: 1, intermediate_size: 6144, num_attention_heads: 32,
                 num_key_value_heads: 4, vocab_size: 151936, num_experts: 16,
                 num_experts_per_tok: 1}
"""

# The same bundle's meta.yaml for DeepSeek-V3.2 in fp8 (its MTP layer priced by mtp.csv).
DEEPSEEK_META = META.replace("Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3.2-Exp").replace(
    "qwen3_moe", "deepseek_v32\nvariant: fp8").replace(
    "intermediate_size: 6144, num_attention_heads: 32,\n                 "
    "num_key_value_heads: 4, vocab_size: 151936",
    "intermediate_size: 18432, num_attention_heads: 128,\n                 "
    "num_key_value_heads: 128, vocab_size: 129280")


def write_moe(path, rows, header="ep,tokens,activated_experts,time_us"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


# Two token counts at EP 1: at 10 tokens 8 experts take 100 us and 16 take 200; at 20, 8 / 16 /
# 32 take 120 / 220 / 420.
GRID = [(1, 10, 8, 100), (1, 10, 16, 200), (1, 20, 8, 120), (1, 20, 16, 220), (1, 20, 32, 420)]


@pytest.fixture
def table(tmp_path):
    return load_moe_table(write_moe(tmp_path / "moe.csv", GRID))


# -- the interpolation rules --------------------------------------------------------------------

def test_at_a_measured_token_count_a_block_is_linear_in_the_activated_experts(table):
    assert table.grids[1](10, 12) == pytest.approx(150)
    assert table.grids[1](20, 24) == pytest.approx(320)


def test_outside_a_rows_activated_experts_it_holds_the_rows_first_and_last_point(table):
    assert table.grids[1](10, 4) == 100
    assert table.grids[1](10, 40) == 200


def test_between_token_counts_it_is_linear_after_each_rows_own_lookup(table):
    # 15 tokens, 24 experts: the 10-token row holds at its 16 (200), the 20-token row gives 320
    assert table.grids[1](15, 24) == pytest.approx(260)


def test_below_the_first_token_count_it_is_that_row(table):
    assert table.grids[1](3, 12) == pytest.approx(150)


def test_past_the_last_token_count_the_table_does_not_answer(table):
    assert table.grids[1](21, 8) is None


def test_a_table_without_an_ep_column_is_ep_1(tmp_path):
    t = load_moe_table(write_moe(tmp_path / "moe.csv", [r[1:] for r in GRID],
                                 header="tokens,activated_experts,time_us"))
    assert list(t.grids) == [1] and t.grids[1](10, 12) == pytest.approx(150)


def test_an_ep_degree_not_measured_reads_the_nearest_ties_to_the_lower(tmp_path):
    rows = [(ep, 10, 8, 100 * ep) for ep in (1, 2, 8)]
    t = load_moe_table(write_moe(tmp_path / "moe.csv", rows))
    assert [t.degree(ep) for ep in (1, 2, 3, 4, 5, 6, 8, 16)] == [1, 2, 2, 2, 2, 8, 8, 8]


# -- a block under expert parallelism ----------------------------------------------------------

class LinearRoofline:
    """A roofline stand-in whose MoE block costs 2 us per row."""

    skew = 0.0

    def moe_block(self, c, m, rows=0, ep=1, moe_tp=0):
        return 2.0 * (rows or m)


def test_the_experts_a_rank_touches_are_its_share_of_the_routing_model(table):
    moe = MoeCosts(QWEN, LinearRoofline(), MoeParallel(2, 1, True), None, table)
    assert moe.activated(1) == pytest.approx(8 / 2)
    assert moe.activated(10) == pytest.approx(expected_experts(128, 8, 10) / 2)


def test_past_the_grid_a_block_grows_from_its_last_time_as_the_roofline_does(table):
    moe = MoeCosts(QWEN, LinearRoofline(), MoeParallel(1, 1, False), None, table)
    # 40 rows: the 20-token row at 40's activated experts (past 32: its last point, 420),
    # times the roofline's 80 / 40
    assert moe.block(40, 40) == pytest.approx(420 * 2)
    assert moe.block(10, 10) == pytest.approx(table.grids[1](10, expected_experts(128, 8, 10)))
    assert moe.coverage() == {"row_counts": 2, "past_grid": 1, "grid_tokens": 20,
                              "most_rows": 40}


def test_dispatch_and_combine_are_an_all_gather_and_a_reduce_scatter_per_layer():
    link = get_hardware("rtxpro6000").interconnect   # PCIe 5: 20 us, 50 GB/s
    moe = MoeCosts(QWEN, LinearRoofline(), MoeParallel(2, 1, True), link)
    # 100 rows: 2 x 100 x (2048 + 128) bytes gathered, 2 x 100 x 2048 scattered, each ring
    # moving half of it over 50 bytes/us after 20 us
    assert moe.exchange(100) == pytest.approx(20 + 435200 / 2 / 50e3 + 20 + 409600 / 2 / 50e3)
    assert MoeCosts(QWEN, LinearRoofline(), MoeParallel(1, 2, True), link).exchange(100) == 0


def collectives_yaml(path, npus=2, scatter=True):
    """A hardware.yaml of round numbers: an all_gather of B bytes a GPU takes 10 us at 1,000
    bytes and 0.1 us more a kB; a reduce_scatter (B bytes out a GPU) 20 us, 0.2 us a kB."""
    rows = [("all_reduce", 1000, 5), ("all_reduce", 1001000, 50),
            ("all_gather", 1000, 10), ("all_gather", 1001000, 110)]
    if scatter:
        rows += [("reduce_scatter", 1000, 20), ("reduce_scatter", 1001000, 220)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("hardware: TESTGPU\nspec: {gpu_name: NVIDIA H100 80GB HBM3}\n"
                    f"measured:\n  interconnect:\n    npus: {npus}\n    samples:\n" + "".join(
                        f"    - {{collective: {c}, bytes: {b}, us_graphed: {t}}}\n"
                        for c, b, t in rows))
    return path


def test_dispatch_and_combine_read_the_measured_all_gather_and_reduce_scatter(tmp_path):
    link = collectives_yaml(tmp_path / "hw.yaml")
    moe = MoeCosts(QWEN, LinearRoofline(), MoeParallel(2, 1, True),
                   load_collectives(link))
    # 100 rows: each GPU gives 100 x (2048 + 128) x 2 / 2 = 217,600 bytes to the all-gather and
    # gets 100 x 2048 x 2 / 2 = 204,800 out of the reduce-scatter
    assert moe.exchange(100) == pytest.approx(10 + 216.6 * 0.1 + 20 + 203.8 * 0.2)
    no_scatter = load_collectives(
        collectives_yaml(tmp_path / "ag.yaml", scatter=False))
    # without reduce_scatter samples: the all_gather that moves the same bytes
    assert no_scatter.reduce_scatter_us(409600, 2) == pytest.approx(10 + 203.8 * 0.1)


def test_a_dp_runs_collectives_are_measured_where_the_bundles_gpu_measured_them(tmp_path):
    perf = tmp_path / "perf" / "TESTGPU"
    b = write_bundle(perf / "Qwen" / "Qwen3-30B-A3B" / "bf16", dense=False)
    collectives_yaml(perf / "hardware.yaml")
    ep2 = dict(model="qwen3-30b-a3b", gpu="h100", enable_expert_parallel=True,
               device_profile=str(b))
    r = resolve(SimConfig(**ep2, data_parallel_size=2))
    moe = r.device_costs.moe
    assert isinstance(moe.link, MeasuredLink) and moe.link.npus == 2
    assert moe.exchange(100) == pytest.approx(10 + 216.6 * 0.1 + 20 + 203.8 * 0.2)
    assert any("dispatch and combine over the DP ranks as the measured all_gather and "
               "reduce_scatter" in n for n in r.notes)
    assert "dispatch and combine from the collectives measured" in moe.source()
    # four DP ranks: the pair's measurement is not theirs, the interconnect model prices them
    r = resolve(SimConfig(**ep2, data_parallel_size=4))
    assert isinstance(r.device_costs.moe.link, Interconnect)
    assert any("measured its collectives over 2 GPUs, not 4: the --gpu's interconnect model "
               "(nvlink4) prices them" in n for n in r.notes)


def test_a_gpu_file_measured_over_other_gpus_than_the_dp_group_is_one_clear_error(tmp_path):
    gpu = collectives_yaml(tmp_path / "hw.yaml", npus=4)
    with pytest.raises(UserError, match=r"hw.yaml: field 'measured.interconnect.npus': the "
                                        r"collectives were measured over 4 GPUs; "
                                        r"--data-parallel-size 2 needs them measured over 2"):
        resolve(SimConfig(model="qwen3-30b-a3b", gpu=str(gpu), data_parallel_size=2,
                          enable_expert_parallel=True))


def test_expert_or_width_split_hold_the_same_expert_bytes_per_gpu():
    whole = QWEN.weight_bytes_per_rank(1)
    experts = 48 * 128 * 3 * 2048 * 768 * 2
    assert QWEN.weight_bytes_per_rank(1, 2) == pytest.approx(whole - experts / 2)
    dp2 = resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100", data_parallel_size=2,
                            enable_expert_parallel=True))
    dp1 = resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100"))
    assert dp2.scheduler.num_blocks > dp1.scheduler.num_blocks


# -- a bundle's MoE tables in a run -------------------------------------------------------------

def write_bundle(root, meta=META, moe=GRID, dense=True, mtp=None):
    tp = root / "tp1"
    tp.mkdir(parents=True)
    (root / "meta.yaml").write_text(meta)
    write_moe(tp / "moe.csv", moe)
    if dense:   # Qwen3-MoE's: every layer 20 us at 10 tokens (+10 us, 1 us a token)
        names = ("embedding", "layernorm", "qkv_proj", "qk_norm", "rotary_emb", "o_proj",
                 "final_layernorm")
        (tp / "dense.csv").write_text("layer,tokens,time_us\n" + "".join(
            f"{n},{t},{10 + t}\n" for n in names for t in (1, 10, 100)))
        (tp / "attention.csv").write_text(
            "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n" + "".join(
                f"{pc},0,{nd},{kd},{5 + pc / 10 + nd * kd / 1000}\n"
                for pc in (0, 100) for nd in (0, 10) for kd in ((1000, 4000) if nd else (0,))
                if pc or nd))
        (tp / "per_sequence.csv").write_text("layer,sequences,time_us\n" + "".join(
            f"{n},{s},{b + s}\n" for n, b in (("lm_head", 100), ("sampler", 1))
            for s in (1, 10, 100)))
    if mtp is not None:
        (tp / "mtp.csv").write_text("layer,sequences,time_us\n" + "".join(
            f"{n},{s},{mtp}\n" for n in ("mtp_embed", "mtp_enorm_hnorm", "mtp_eh_proj",
                                        "mtp_glue", "mtp_shared_head") for s in (1, 10, 100)))
    return root


def test_a_moe_targets_forward_adds_its_blocks_to_the_layers_attention_side(tmp_path):
    flat = [(1, t, a, 50) for t in (1, 10, 100) for a in (8, 16, 32, 64, 128)]
    b = write_bundle(tmp_path / "bf16", moe=flat)
    c = resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100", device_profile=str(b))
                ).device_costs
    # 10 decodes of 1000 history: embedding 20, 48 x (2 norms, qkv, qk_norm, rotary, o: 6 of
    # 20), final norm 20; attention 48 x 15; lm_head at 10 rows 110; 48 MoE blocks of 50
    batch = Batch(10, 10, 10, 10, 0, 10000, 0.0, num_decode=10, decode_kv=10000,
                  decode_kv_min=1000, decode_kv_max=1000)
    assert c.target_forward(batch) == pytest.approx(20 + 48 * 120 + 20 + 48 * 15 + 110
                                                    + 48 * 50)
    assert "tables" in c.sources["moe"]


def test_a_run_at_an_ep_degree_not_measured_says_which_it_read(tmp_path):
    rows = [(ep, t, a, 50) for ep in (1, 2, 8) for t in (1, 10) for a in (1, 2, 4, 8)]
    b = write_bundle(tmp_path / "bf16", moe=rows, dense=False)
    r = resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100", data_parallel_size=4,
                          enable_expert_parallel=True, device_profile=str(b)))
    assert any("no ep 4 grid (measured: ep 1, 2, 8): the nearest, ep 2" in n for n in r.notes)
    assert any("grid ends at 10 tokens" in n for n in r.notes)
    assert r.device_costs.moe.ep == 2


def test_a_bundle_of_moe_tables_alone_prices_the_rest_from_the_roofline(tmp_path):
    b = write_bundle(tmp_path / "bf16", dense=False)
    res, _ = simulate(SimConfig(model="qwen3-30b-a3b", gpu="h100", device_profile=str(b),
                                num_prompts=3, output_len=8))
    dc = res["config"]["resolved"]["device_costs"]
    assert dc["target_forward"].startswith("roofline") and "tables" in dc["moe"]
    assert dc["moe_coverage"]["row_counts"] >= 2


def test_an_mtp_pass_adds_what_mtp_csv_measured(tmp_path):
    passes = []
    for us in (10, 20):   # every MTP kernel 10 us, then 20: five of them
        b = write_bundle(tmp_path / f"b{us}", meta=DEEPSEEK_META, dense=False, mtp=us)
        c = resolve(SimConfig(model="deepseek-v3", gpu="h200", tensor_parallel_size=8,
                              method="mtp", k=1, device_profile=str(b))).device_costs
        batch = Batch(4, 4, 4, 8, 4, 4000, 4000.0, num_decode=4, decode_kv=4000)
        passes.append(c.draft_forward(batch, 0))
        assert "mtp.csv" in c.sources["draft_forward"]
    assert passes[1] - passes[0] == pytest.approx(5 * 10)


# -- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, header, message", [
    ([(1, 10, 8, 100), (1, 10, 8, 110)], None, r"moe.csv:3: ep 1, 10 tokens and 8 activated "
                                               r"experts twice"),
    ([(1, 10, 8, "x")], None, r"moe.csv:2: field 'time_us': expected a number, got 'x'"),
    ([(0, 10, 8, 100)], None, r"moe.csv:2: field 'ep': expected a count >= 1"),
    ([(1, 10, 100)], "ep,tokens,time_us", r"moe.csv:1: header lacks activated_experts"),
])
def test_a_broken_moe_table_is_one_clear_error(tmp_path, rows, header, message):
    path = write_moe(tmp_path / "moe.csv", rows, *(header,) if header else ())
    with pytest.raises(UserError, match=message):
        load_moe_table(path)


def test_moe_tables_of_another_model_are_refused_naming_the_field(tmp_path):
    b = write_bundle(tmp_path / "bf16", meta=META.replace("num_attention_heads: 32",
                                                          "num_attention_heads: 16"),
                     dense=False)
    with pytest.raises(UserError, match=r"meta.yaml: tables of Qwen/Qwen3-30B-A3B, not of "
                                        r"--model qwen3-30b-a3b: engine_effective.hf_overrides."
                                        r"num_attention_heads is 16 per rank at TP 1, --model "
                                        r"qwen3-30b-a3b has 32"):
        resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100", device_profile=str(b)))


def test_moe_tables_of_another_family_are_refused_naming_it(tmp_path):
    for dense in (True, False):   # priced by the tables, or by moe.csv alone
        b = write_bundle(tmp_path / f"bf16-{dense}", meta=META.replace("qwen3_moe", "qwen3"),
                         dense=dense)
        with pytest.raises(UserError, match=r"architecture is 'qwen3', --model is a "
                                            r"'qwen3_moe' model"):
            resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100", device_profile=str(b)))


def test_a_table_that_reads_experts_faster_than_the_gpu_can_is_flagged(tmp_path):
    # 8 Qwen3 experts (8 x 3 x 2048 x 768 bf16, 75.5 MB) in 10 us: 7.5 TB/s on an H100 (3.35)
    b = write_bundle(tmp_path / "bf16", moe=[(1, 1, 8, 10), (1, 10, 8, 100)], dense=False)
    notes = resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100", device_profile=str(b))).notes
    assert any("reads 8 experts' weights at 1 tokens at 7.5 TB/s, past --gpu h100's peak "
               "3.35 TB/s: the table likely understates the block" in n for n in notes)
    b = write_bundle(tmp_path / "ok", moe=[(1, 1, 8, 100)], dense=False)
    notes = resolve(SimConfig(model="qwen3-30b-a3b", gpu="h100", device_profile=str(b))).notes
    assert not any("understates" in n for n in notes)


# -- the judged run's command, on a stand-in run ---------------------------------------------------

def stand_in_run(folder, n=6):
    """A vLLM run's folder as LLMServingSim keeps it, its meta.json as the held-back run's
    records its engine: DP 2 with expert parallelism, TP 1, max_model_len null."""
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({
        "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "vllm_version": "0.19.0",
        "engine_kwargs": {"tensor_parallel_size": 1, "data_parallel_size": 2,
                          "enable_expert_parallel": True, "max_num_seqs": 64,
                          "max_num_batched_tokens": 256, "max_model_len": None}}))
    (folder / "requests.jsonl").write_text("".join(json.dumps({
        "request_id": f"bench-{i}", "input_toks": 300 + 50 * i, "output_toks": 20 + i,
        "arrival_time": 1e9 + 0.1 * i, "queued_ts": 10 + 0.1 * i, "scheduled_ts": 10 + 0.1 * i,
        "first_token_ts": 10.2 + 0.1 * i, "last_token_ts": 11 + 0.1 * i}) + "\n"
        for i in range(n)))
    return folder / "requests.jsonl"


def test_the_judged_command_runs_as_written_with_a_hugging_face_id(tmp_path):
    perf = tmp_path / "perf" / "TESTGPU"
    b = write_bundle(perf / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16")
    collectives_yaml(perf / "hardware.yaml")
    trace = stand_in_run(tmp_path / "bench" / "vllm")
    out = tmp_path / "sim.json"
    p = subprocess.run([sys.executable, "-m", "stepgap", "simulate", "--model",
                        "Qwen/Qwen3-30B-A3B-Instruct-2507", "--gpu", "rtxpro6000",
                        "--data-parallel-size", "2", "--enable-expert-parallel",
                        "--device-profile", str(b), "--trace", str(trace),
                        "--result-json", str(out), "--quiet"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    r = res["config"]["resolved"]
    assert res["completed"] == 6 and r["data_parallel"]["size"] == 2
    # null max_model_len: the model's own context, the 2507 release's 256K
    assert res["config"]["max_model_len"] == 262144
    assert res["config"]["enable_expert_parallel"] is True
    assert "dispatch and combine from the collectives measured" in r["device_costs"]["moe"]
    assert r["device_costs"]["target_forward"].startswith("tables")
