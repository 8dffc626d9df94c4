"""The drafter's own price as vLLM runs it (sim/drafter_costs.py): where its host work costs a
step and where it hides, the version and CUDA-graph settings that change it, parallel drafting,
suffix decoding as a CPU proposer, and the band input that carries its range."""

import json

import pytest

from stepgap.cli import main
from stepgap.sim.bands import band_inputs
from stepgap.sim.config import SimConfig
from stepgap.sim.cpu_costs import OpCost
from stepgap.sim.drafter_costs import HOST_LAYER_US, HOST_PASS_US, HOST_PREP_US, HOST_RANGE
from stepgap.sim.plan import resolve
from stepgap.sim.loop import simulate

EAGLE3 = dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=3,
              max_concurrency=1, num_prompts=4, output_len=64)
SMALL = dict(gpu="h100", model="qwen3-0.6b", method="eagle3", k=3, max_concurrency=1,
             num_prompts=4, output_len=64)


def spans_of(settings: dict, step: int = 20) -> list:
    _, spans = simulate(SimConfig(**settings, timeline=True))
    return [s for s in spans if s.step == step]


def tpot(settings: dict) -> float:
    return simulate(SimConfig(**settings))[0]["mean_tpot_ms"]


def test_the_padded_drafters_host_work_hides_behind_a_long_target_forward():
    # an 8B target on an H100 runs about 6 ms a step: the launch and 3 passes' dispatch
    # (about 3 ms) end before it does
    assert tpot(EAGLE3) == tpot({**EAGLE3, "drafter_host_scale": 0.0})


def test_the_padded_drafters_host_work_costs_a_step_where_it_outlasts_the_device():
    assert tpot(SMALL) > 1.3 * tpot({**SMALL, "drafter_host_scale": 0.0})


def test_before_vllm_0_11_each_pass_waits_for_its_host_after_the_steps_tokens():
    spans = spans_of({**EAGLE3, "vllm_version": "0.9.2"})
    host = HOST_PASS_US["PIECEWISE"] + HOST_LAYER_US["PIECEWISE"]
    drafts = [s for s in spans if s.op == "draft_forward"]
    assert [s.end_us - s.start_us for s in drafts] == [host] * 3   # host-bound: 1-layer head
    sample = next(s for s in spans if s.op == "rejection_sample")
    r = resolve(SimConfig(**EAGLE3, vllm_version="0.9.2"))
    assert drafts[0].start_us - sample.end_us == pytest.approx(r.cpu.wake_us + HOST_PREP_US[False])
    assert any("no padded drafter batch" in n for n in r.notes)


def test_the_padded_batch_is_vllms_default_from_0_11_and_the_speculative_config_key_wins():
    assert resolve(SimConfig(**EAGLE3, vllm_version="0.11.0")).drafter.padded
    assert not resolve(SimConfig(**EAGLE3, vllm_version="0.10.1")).drafter.padded
    assert not resolve(SimConfig(**EAGLE3, disable_padded_drafter_batch=True)).drafter.padded


@pytest.mark.parametrize("argv, graphs", [
    ([], "PIECEWISE"),
    (["--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}'], "NONE"),
    (["--compilation-config", '{"cudagraph_mode": "FULL"}'], "PIECEWISE"),
    (["--speculative-config", '{"method": "eagle3", "enforce_eager": true}'], "NONE"),
    (["--drafter-cudagraph-mode", "FULL"], "FULL"),
])
def test_the_drafters_cuda_graphs_follow_vllms_settings(argv, graphs, tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--model", "llama-3.1-8b", "-k", "2", "--num-prompts", "2",
                 "--quiet", "--result-json", str(out), *argv]) == 0
    drafter = json.loads(out.read_text())["config"]["resolved"]["drafter"]
    assert drafter["cudagraph_mode"] == graphs


def test_a_drafter_graph_mode_against_vllms_settings_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["simulate", "--model", "llama-3.1-8b", "-k", "2",
                               "--compilation-config", '{"cudagraph_mode": "NONE"}',
                               "--drafter-cudagraph-mode", "FULL"]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--drafter-cudagraph-mode FULL" in err[0] and "NONE" in err[0]


def test_full_drafter_graphs_cost_less_host_time_than_piecewise_and_eager_most():
    small = {**SMALL, "vllm_version": "0.10.1"}   # the host is the pass's time
    full, piece, eager = (tpot({**small, "drafter_cudagraph_mode": g})
                          for g in ("FULL", "PIECEWISE", "NONE"))
    assert full < piece < eager


def test_parallel_drafting_runs_one_pass_for_the_k_drafts():
    passes = [s for s in spans_of({**EAGLE3, "parallel_drafting": True})
              if s.op == "draft_forward"]
    assert len(passes) == 1


def test_suffix_decoding_proposes_on_the_host_in_sync_at_its_own_cost():
    r = resolve(SimConfig(**{**EAGLE3, "draft": None, "method": "suffix", "mode": "async"}))
    assert r.mode == "sync" and r.cpu_propose
    assert r.cpu.propose == OpCost(30.0, 20.0, 0.0)   # about 20 us a request (arXiv:2411.04975)
    spans = spans_of({**EAGLE3, "draft": None, "method": "suffix"})
    assert [s.op for s in spans if s.op in ("propose", "draft_forward")] == ["propose"]


def test_the_band_carries_the_drafters_host_costs_over_their_range():
    inputs = {i.name: i for i in band_inputs(SimConfig(**{**EAGLE3, "k": 3}).to_dict())}
    d = inputs["drafter"]
    assert (d.low, d.high) == HOST_RANGE["PIECEWISE"]
    lo, hi = (tpot(d.settings({**EAGLE3, "model": "qwen3-0.6b", "draft": None,
                               "method": "eagle3"}, end)) for end in ("low", "high"))
    assert lo < hi


def test_a_run_without_drafts_has_no_drafter_input():
    assert "drafter" not in {i.name for i in band_inputs(SimConfig(**{**EAGLE3, "k": 0}).to_dict())}


@pytest.mark.parametrize("argv, needle", [
    (["--vllm-version", "latest"], "--vllm-version 'latest': expected a version"),
    (["--compilation-config", '{"cudagraph_mode": "SOMETIMES"}'], "cudagraph_mode: expected one"),
    (["--speculative-config", '{"method": "eagle3", "parallel_drafting": "yes"}'],
     "parallel_drafting: expected true or false"),
])
def test_a_bad_drafter_setting_is_one_line_naming_it(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["simulate", "--model", "llama-3.1-8b", "-k", "2", *argv]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
