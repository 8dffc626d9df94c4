"""The GPUs people serve on, priced from measurements (docs/reference/gpus.md): the committed
operator tables of H100s and A100s (traces/peers/vidur/, traces/peers/llmservingsim/at-9e3f0ec/),
the roofline fitted on them (bench/fit_gpu_roofline.py), the collectives measured on their
nodes, the band of each, and `stepgap gpus`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stepgap.cli import main
from stepgap.common.model_presets import MODEL_PRESETS
from stepgap.sim.bands import DEVICE_HIGH, DEVICE_LOW, band_inputs
from stepgap.sim.config import SimConfig
from stepgap.sim.plan import resolve
from stepgap.sim.hardware import CATALOG, MeasuredLink, get_hardware
from stepgap.sim.hardware_file import load_gpu_file
from stepgap.sim.roofline import RooflineCosts
from stepgap.sim.tables import PEERS
from stepgap.sim.table_costs import TableCosts

ROOT = Path(__file__).resolve().parents[1]
VIDUR_A100_8B = PEERS / "vidur/profiler/perf/A100/meta-llama/Meta-Llama-3-8B/fp16"
H100_TP8 = PEERS / "vidur/network/h100_dgx/tp8.yaml"


@pytest.fixture(scope="module")
def fits():
    sys.path.insert(0, str(ROOT / "bench"))
    import fit_gpu_roofline
    return {gpu: fit_gpu_roofline.fit(gpu) for gpu in ("a100", "h100")}


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_the_catalog_holds_the_roofline_fitted_on_the_committed_tables(fits, gpu):
    f, hw = fits[gpu], CATALOG[gpu]
    assert (hw.bw_eff, hw.flop_eff, hw.kernel_us) == (f.bw_eff, f.flop_eff, f.kernel_us)
    assert hw.device_band == (f.device_low, f.device_high)


def test_the_fitted_roofline_prices_a_decode_layer_within_its_band(fits):
    # the band's ends hold the decode regime's own spread (5th to 95th percentile)
    for gpu, f in fits.items():
        lo, _, hi = f.layer_error["decode"]
        low, high = CATALOG[gpu].device_band
        assert low <= round(1 / (1 + hi), 3) and round(1 / (1 + lo), 3) <= high
        assert -0.1 < f.layer_error["decode"][1] < 0.1   # its median


def test_a_catalog_gpu_prices_a_model_its_committed_tables_cover_from_them():
    r = resolve(SimConfig(model="llama-3.1-8b", gpu="a100"))
    assert isinstance(r.device_costs, TableCosts)
    assert Path(r.device_costs.path) == VIDUR_A100_8B
    assert any("measured operator tables traces/peers/vidur/" in n for n in r.notes)
    src = r.device_costs.sources["target_forward"]
    assert "Vidur" in src and "final_layernorm, lm_head, attention" in src


def test_device_profile_none_prices_from_the_roofline_alone():
    r = resolve(SimConfig(model="llama-3.1-8b", gpu="a100", device_profile="none"))
    assert isinstance(r.device_costs, RooflineCosts)
    assert not any("measured operator tables" in n for n in r.notes)


def test_a_model_no_table_covers_is_priced_from_the_fitted_roofline():
    r = resolve(SimConfig(model="qwen3-8b", gpu="h100"))
    assert isinstance(r.device_costs, RooflineCosts) and r.hw.kernel_us == 4.89
    device = next(i for i in band_inputs(SimConfig(model="qwen3-8b", gpu="h100").to_dict())
                  if i.name == "device")
    assert (device.low, device.high) == CATALOG["h100"].device_band


def test_a_partial_bundle_prices_the_kernels_it_lacks_from_the_roofline():
    r = resolve(SimConfig(model="llama-3.1-8b", gpu="a100"))
    costs, roof = r.device_costs, r.device_costs.fallback
    c = r.target
    # Vidur timed no lm_head: the GEMM of the roofline, at the GPU's fitted rates
    assert costs.lm_head(7) == roof.gemm(7, c.hidden_size, c.vocab_size)
    # it timed the MLP: the table's time, not the roofline's
    assert costs._kernels["gate_up_proj"](64) == costs.tables.dense["gate_up_proj"](64)
    assert costs.tables.dense["gate_up_proj"](64) != roof.gemm(64, 4096, 2 * 14336)


def test_a_datasheet_gpu_keeps_the_datasheet_band():
    device = next(i for i in band_inputs(SimConfig(model="llama-3.1-8b", gpu="l40s").to_dict())
                  if i.name == "device")
    assert (device.low, device.high) == (DEVICE_LOW, DEVICE_HIGH)


def test_a_gpu_file_that_changes_the_roofline_drops_the_fitted_band(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: h100\nbw_eff: 0.7\n")
    assert load_gpu_file(path).device_band is None
    path.write_text("base: h100\nd2h_us: 9\n")
    assert load_gpu_file(path).device_band == CATALOG["h100"].device_band


def test_tensor_parallelism_on_an_h100_node_takes_the_committed_nccl_measurement():
    r = resolve(SimConfig(model="llama-3.3-70b", gpu="h100", tensor_parallel_size=8,
                          device_profile="none"))
    link = r.hw.interconnect
    assert isinstance(link, MeasuredLink) and Path(link.path) == H100_TP8
    big, small = 32 * 2 ** 20, 16 * 1024
    # NCCL's path (8 MiB and more): the measured all_reduce; vLLM's own kernel below it: the
    # NVLink model, which no table measured
    assert link.all_reduce_us(big, 8) == link.at("all_reduce", big)
    assert link.all_reduce_us(small, 8) == get_hardware("h100").interconnect.all_reduce_us(
        small, 8)
    assert any("h100_dgx/tp8.yaml" in n for n in r.notes)


def test_two_measurements_of_one_link_are_the_collectives_band_and_both_are_named():
    settings = SimConfig(model="qwen3-32b", gpu="rtxpro6000", tensor_parallel_size=2).to_dict()
    link = next(i for i in band_inputs(settings) if i.name == "collectives")
    assert link.low < link.high
    assert "at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml" in link.what
    assert "llmservingsim/profiler/perf/RTXPRO6000/hardware.yaml" in link.what
    assert {link.at_low["collectives"], link.at_high["collectives"]} == {
        str(PEERS / "llmservingsim/profiler/perf/RTXPRO6000/hardware.yaml"),
        str(PEERS / "llmservingsim/at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml")}


def test_collectives_given_by_file_replace_the_ones_found(tmp_path):
    other = PEERS / "llmservingsim/at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml"
    r = resolve(SimConfig(model="qwen3-32b", gpu="rtxpro6000", tensor_parallel_size=2,
                          collectives=str(other)))
    assert Path(r.hw.interconnect.path) == other
    with pytest.raises(Exception, match="measured over 2 GPUs"):
        resolve(SimConfig(model="qwen3-32b", gpu="rtxpro6000", tensor_parallel_size=4,
                          collectives=str(other)))


def test_stepgap_gpus_lists_what_prices_each_gpu_and_the_sources(capsys):
    assert main(["gpus", "a100", "h200", "--json"]) == 0
    a100, h200 = json.loads(capsys.readouterr().out)
    assert a100["roofline"]["kind"] == "fitted on measured tables"
    llama3 = next(t for t in a100["tables"] if t["model"] == "meta-llama/Meta-Llama-3-8B")
    assert llama3["prices"] == {str(tp): ["llama-3.1-8b"] for tp in (1, 2, 4, 8)}
    assert "lm_head" in llama3["not_measured"] and "7d47513" in llama3["source"]
    assert sorted(a100["collectives"]["measured"]) == ["2", "4", "8"]
    assert h200["tables"] == [] and h200["device_band"]["low"] < 1 < h200["device_band"]["high"]


def test_stepgap_gpus_refuses_an_unknown_gpu_in_one_line(capsys):
    assert main(["gpus", "h900"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'h900'" in err and "Traceback" not in err


@pytest.mark.parametrize("folder", ["vidur", "llmservingsim/at-9e3f0ec"])
def test_each_converted_folder_carries_its_licence_and_its_source_commit(folder):
    doc = json.loads((PEERS / folder / "source.json").read_text())
    assert (PEERS / folder / "LICENSE").read_text().startswith(("MIT", "    MIT")) or \
        "MIT License" in (PEERS / folder / "LICENSE").read_text()
    assert len(doc["commit"]) == 40 and doc["licence"].startswith("MIT")
    assert all(len(f["sha256"]) == 64 for f in doc["files"].values())


def test_the_qwen2_presets_are_llamas_dense_layer():
    c = MODEL_PRESETS["qwq-32b"]
    assert (c.model_type, c.num_layers, c.hidden_size, c.num_kv_heads) == ("qwen2", 64, 5120, 8)


def test_disable_custom_all_reduce_takes_nccls_measured_all_reduce_at_every_size():
    cfg = dict(model="qwq-32b", gpu="a100", tensor_parallel_size=8, device_profile="none")
    ours = resolve(SimConfig(**cfg)).hw.interconnect
    nccl = resolve(SimConfig(**cfg, disable_custom_all_reduce=True)).hw.interconnect
    small = 16 * 1024
    assert nccl.all_reduce_us(small, 8) == nccl.at("all_reduce", small)
    assert ours.all_reduce_us(small, 8) == ours.model.all_reduce_us(small, 8)
    assert SimConfig(**cfg).to_dict().get("disable_custom_all_reduce") is None   # default unwritten


def test_an_unmeasured_vllm_kernel_and_a_measured_nccl_make_the_allreduce_band():
    inputs = band_inputs(SimConfig(model="qwq-32b", gpu="a100", tensor_parallel_size=8).to_dict())
    kernel = next(i for i in inputs if i.name == "allreduce")
    assert kernel.at_high == {"disable_custom_all_reduce": True} and kernel.low < kernel.high
    assert "a100_dgx/tp8.yaml" in kernel.what
    # one GPU: no collectives, no such input
    assert not any(i.name == "allreduce" for i in band_inputs(
        SimConfig(model="qwq-32b", gpu="a100").to_dict()))


def test_a_sweep_cell_is_keyed_by_the_committed_tables_it_is_priced_from():
    from stepgap.sim.sweep_keys import cell_key, tables_of
    auto = SimConfig(model="llama-3.1-8b", gpu="a100")
    assert Path(tables_of(auto)) == VIDUR_A100_8B
    assert tables_of(SimConfig(model="llama-3.1-8b", gpu="a100", device_profile="none")) is None
    assert cell_key(auto) != cell_key(SimConfig(model="llama-3.1-8b", gpu="a100",
                                                device_profile="none"))


def test_tables_that_time_only_part_of_a_layers_gemms_price_nothing_by_default():
    # LLMServingSim's H100 modules: of vLLM's GEMMs, o_proj and down_proj alone
    assert isinstance(resolve(SimConfig(model="llama-3.1-8b", gpu="h100")).device_costs,
                      RooflineCosts)
    lss = PEERS / "llmservingsim/at-9e3f0ec/profiler/perf/H100/meta-llama/Llama-3.1-8B/bf16"
    costs = resolve(SimConfig(model="llama-3.1-8b", gpu="h100",
                              device_profile=str(lss))).device_costs
    assert isinstance(costs, TableCosts)
    assert "qkv_proj" in costs.sources["target_forward"].split("did not measure:")[1]


def test_a_roofline_run_on_a_fitted_gpu_says_so_op_by_op():
    costs = resolve(SimConfig(model="qwen3-8b", gpu="h100")).device_costs
    assert costs.sources["target_forward"].startswith("roofline fitted on measured tables (h100")
    assert getattr(resolve(SimConfig(model="qwen3-8b", gpu="l40s")).device_costs, "sources",
                   None) is None


def test_the_command_line_takes_collectives_and_vllms_custom_all_reduce_switch(tmp_path):
    other = PEERS / "llmservingsim/at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml"
    out = tmp_path / "r.json"
    assert main(["simulate", "--model", "qwen3-32b", "--gpu", "rtxpro6000", "-tp", "2",
                 "--collectives", str(other), "--disable-custom-all-reduce", "--num-prompts", "1",
                 "--output-len", "4", "--quiet", "--result-json", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["collectives"] == str(other) and config["disable_custom_all_reduce"] is True


def test_all_reduce_latency_sets_the_model_beside_a_measured_nccl():
    # vLLM's own kernel is the model's beside Vidur's NCCL: the what-if moves it, not NCCL
    link = resolve(SimConfig(model="llama-3.3-70b", gpu="h100", tensor_parallel_size=8,
                             device_profile="none", all_reduce_latency_us=20.0)).hw.interconnect
    assert link.model.latency_us == 20.0
    assert link.all_reduce_us(32 * 2 ** 20, 8) == link.at("all_reduce", 32 * 2 ** 20)
