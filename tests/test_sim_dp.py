"""Data parallelism (sim/data_parallel.py, sim/cluster.py `DataParallel`): vLLM's DP front end routing,
a MoE target's lockstep with dummy batches, dense ranks left independent, the timeline, and the
options and files that set it; the invariants hold with N engine cores."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import simpy

from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest, chrome_trace
from stepgap.common.peer_run import peer_settings
from stepgap.sim.config import SimConfig
from stepgap.sim.costs import ConstantCosts
from stepgap.sim.data_parallel import LB_PERIOD_US, Router, gathered_rows
from stepgap.sim.loop import simulate

ROOT = Path(__file__).resolve().parents[1]
MOE = dict(model="qwen3-30b-a3b", gpu="h100", num_gpu_blocks_override=4000)


def reqs(*specs):
    """TraceRequests of (arrival s, prompt, output)."""
    return [TraceRequest(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(specs)]


class TokenCosts(ConstantCosts):
    """A forward of 100 us plus 10 us a token; nothing else."""

    def target_forward(self, b):
        return 100.0 + 10.0 * b.num_tokens


def device_spans(spans, rank, op="target_forward"):
    return [(s.start_us, s.end_us) for s in spans
            if s.lane == "device" and s.op == op and s.args["dp"] == rank]


# -- routing ------------------------------------------------------------------------------------

def test_a_request_goes_to_the_lowest_four_times_waiting_plus_running_ties_to_rank_0():
    r = Router(simpy.Environment(), 3)
    r.view = [[1, 0], [0, 3], [0, 5]]      # scores 4, 3, 5
    assert r.choose() == 1 and r.view[1] == [1, 3]    # counted waiting until the next report
    assert r.choose() == 0                 # scores now 4, 7, 5


def test_the_coordinator_publishes_the_ranks_counts_at_most_every_100_ms():
    env = simpy.Environment()
    r = Router(env, 2)
    r.report(1, 2, 0)
    env.run(until=1)
    assert r.view == [[0, 0], [2, 0]]      # the first change goes out at once
    env.run(until=5e3)
    r.report(0, 0, 4)
    env.run(until=LB_PERIOD_US - 1)
    assert r.view[0] == [0, 0]             # within 100 ms of the last publication: held
    env.run(until=LB_PERIOD_US + 1)
    assert r.view == [[0, 4], [2, 0]]


def test_two_requests_at_once_go_to_two_ranks():
    res, _ = simulate(SimConfig(**MOE, data_parallel_size=2, num_prompts=2),
                      reqs((0, 10, 5), (0, 10, 5)), ConstantCosts(target=1000.0))
    assert res["config"]["resolved"]["data_parallel"]["requests"] == [1, 1]


# -- a MoE target's lockstep ----------------------------------------------------------------------

def test_the_moe_layers_see_every_ranks_tokens_padded_to_the_largest_within_graphs():
    assert gathered_rows([3, 5]) == 10
    assert gathered_rows([600, 5]) == 605


def test_an_idle_rank_runs_a_dummy_forward_beside_every_forward_of_the_busy_one():
    res, spans = simulate(SimConfig(**MOE, data_parallel_size=2, timeline=True),
                          reqs((0, 50, 6)), TokenCosts())
    dp = res["config"]["resolved"]["data_parallel"]
    assert dp["requests"] == [1, 0] and dp["steps"][1] == 0
    busy, idle = device_spans(spans, 0), device_spans(spans, 1)
    assert len(idle) >= len(busy) == 6
    # each of the busy rank's forwards has the idle rank's beside it, at the same times: the
    # group's forward lasts as long as its slowest rank's (the prefill of 50 tokens: 600 us)
    assert all(f in idle for f in busy)
    assert busy[0][1] - busy[0][0] == pytest.approx(600)
    waits = [s for s in spans if s.op == "wait" and (s.args or {}).get("on") == "dp all-reduce"]
    assert waits and all(s.lane == "cpu.worker" for s in waits)


def test_the_wave_ends_within_32_forwards_of_the_last_request():
    res, _ = simulate(SimConfig(**MOE, data_parallel_size=2), reqs((0, 50, 6)), TokenCosts())
    dp = res["config"]["resolved"]["data_parallel"]
    forwards = [s + d for s, d in zip(dp["steps"], dp["dummy_forwards"])]
    assert forwards[0] == forwards[1]      # the ranks ran every forward together
    assert forwards[0] <= 32 and dp["dummy_forwards"][1] == forwards[0]


def test_a_dense_targets_ranks_run_independently():
    one, _ = simulate(SimConfig(gpu="h100", num_prompts=1), reqs((0, 10, 5)),
                      ConstantCosts(target=1000.0))
    two, _ = simulate(SimConfig(gpu="h100", data_parallel_size=2),
                      reqs((0, 10, 5), (0, 10, 5)), ConstantCosts(target=1000.0))
    dp = two["config"]["resolved"]["data_parallel"]
    assert not dp["lockstep"] and dp["dummy_forwards"] == [0, 0]
    assert two["mean_ttft_ms"] == one["mean_ttft_ms"]


@pytest.mark.parametrize("mode", ["sync", "async", "zero-bubble"])
def test_every_request_finishes_with_exactly_its_tokens_on_every_rank(mode):
    trace = reqs(*((i * 0.002, 20 + 7 * i, 5 + i % 4) for i in range(12)))
    res, _ = simulate(SimConfig(**MOE, data_parallel_size=3, enable_expert_parallel=True,
                                mode=mode, k=2, detailed=True), trace)
    assert res["completed"] == 12
    assert res["output_lens"] == [t.output_len for t in trace]


def test_the_same_seed_gives_the_same_bytes():
    cfg = SimConfig(**MOE, data_parallel_size=2, enable_expert_parallel=True, mode="async",
                    num_prompts=20, workload="sharegpt", request_rate=50.0, detailed=True)
    a, _ = simulate(cfg)
    b, _ = simulate(cfg)
    assert a.to_json() == b.to_json()


# -- the timeline and the result -------------------------------------------------------------------

def test_every_span_names_its_rank_and_the_chrome_trace_gives_each_rank_a_process():
    _, spans = simulate(SimConfig(**MOE, data_parallel_size=2, timeline=True),
                        reqs((0, 10, 3), (0, 10, 3)), ConstantCosts(target=500.0))
    assert {s.args["dp"] for s in spans} == {0, 1}
    assert {s.lane for s in spans} <= {"cpu.engine", "cpu.worker", "device"}
    names = {e["pid"]: e["args"]["name"] for e in chrome_trace(spans, "sim")["traceEvents"]
             if e["name"] == "process_name"}
    assert names == {1: "sim DP rank 0", 2: "sim DP rank 1"}


def test_a_run_without_data_parallelism_writes_the_config_it_wrote_before():
    res, _ = simulate(SimConfig(gpu="h100", num_prompts=1), reqs((0, 10, 3)), ConstantCosts())
    assert "data_parallel_size" not in res["config"] and "dp_sync" not in \
        res["config"]["resolved"]["cpu_costs_us"]
    res, _ = simulate(SimConfig(gpu="h100", data_parallel_size=2), reqs((0, 10, 3)),
                      ConstantCosts())
    assert res["config"]["data_parallel_size"] == 2


# -- options and files -----------------------------------------------------------------------------

def test_a_peer_runs_meta_json_gives_its_data_and_expert_parallelism(tmp_path):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"vllm_version": "0.19.0", "engine_kwargs": {
        "data_parallel_size": 2, "enable_expert_parallel": True}}))
    settings, notes = peer_settings(meta, 40960)
    assert settings["data_parallel_size"] == 2 and settings["enable_expert_parallel"] is True
    assert "--data-parallel-size 2, --enable-expert-parallel" in notes[0]
    for field, value, expected in (
            ("enable_expert_parallel", "yes", "true or false"),
            ("data_parallel_size", 0, "an integer from 1 to 8"),
            ("data_parallel_size", 16, "an integer from 1 to 8")):
        meta.write_text(json.dumps({"engine_kwargs": {field: value}}))
        with pytest.raises(UserError, match=rf"field 'engine_kwargs.{field}': "
                                            rf"expected {expected}"):
            peer_settings(meta, 40960)
    meta.write_text(json.dumps({"resolved_config": {"parallel_config": [2]}}))
    with pytest.raises(UserError, match=r"field 'resolved_config.parallel_config': expected"):
        peer_settings(meta, 40960)
    meta.write_text(json.dumps({"resolved_config": {"parallel_config": {
        "data_parallel_size": 2, "enable_expert_parallel": True}}}))
    settings, _ = peer_settings(meta, 40960)   # where only vLLM's resolved config records them
    assert settings["data_parallel_size"] == 2 and settings["enable_expert_parallel"] is True


@pytest.mark.parametrize("cfg, message", [
    (dict(data_parallel_size=3, tensor_parallel_size=4), r"--data-parallel-size: must be an "
                                                         r"integer from 1 to 8, with data x "
                                                         r"tensor parallel GPUs at most 8"),
    (dict(data_parallel_size=2, device="cpu", gpu="cpu"), r"--data-parallel-size: data "
                                                          r"parallelism is modelled for GPU"),
    (dict(data_parallel_size=2, topology="vllm"), r"behind stepgap's in-process client"),
])
def test_a_data_parallel_setting_out_of_reach_is_one_clear_error(cfg, message):
    with pytest.raises(UserError, match=message):
        simulate(SimConfig(**cfg), reqs((0, 10, 3)))


def test_the_command_line_takes_vllms_spelling():
    p = subprocess.run([sys.executable, "-m", "stepgap", "simulate", "--model", "qwen3-30b-a3b",
                        "--gpu", "h100", "-dp", "2", "-ep", "--num-prompts", "4",
                        "--output-len", "4", "--num-gpu-blocks-override", "2000"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "expert-parallel over 2 GPUs" in p.stderr and "Successful requests" in p.stdout


def test_a_moe_drafters_passes_meet_like_the_forward():
    # DeepSeek-V3's MTP layer is a MoE layer: its passes gather every rank's tokens too
    _, spans = simulate(SimConfig(model="deepseek-v3", gpu="h200", tensor_parallel_size=4,
                                  data_parallel_size=2, enable_expert_parallel=True,
                                  method="mtp", k=1, num_gpu_blocks_override=2000,
                                  timeline=True),
                        reqs((0, 30, 4)), DraftCosts(target=300.0))
    busy, idle = (device_spans(spans, r, "draft_forward") for r in (0, 1))
    # the prefill's first pass over its 30 tokens (400 us) and the dummy's (110) end together
    assert busy[0][1] - busy[0][0] == pytest.approx(400)
    assert busy and all(d in idle for d in busy)


class DraftCosts(ConstantCosts):
    """A draft pass of 100 us plus 10 us a token."""

    def draft_forward(self, b, i):
        return 100.0 + 10.0 * b.num_tokens
