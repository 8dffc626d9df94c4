"""RunResult (common/run_result.py): every result layout read once, typed, written back byte for
byte."""

import json
import math
from pathlib import Path

import pytest

from stepgap.common.errors import UserError
from stepgap.common.fileio import read_json
from stepgap.common.formats import RequestTiming, SpecStats, save_result
from tests.helpers import run_result
from stepgap.common.run_result import RunResult
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "traces/peers/llmservingsim/bench/examples/RTX4090/Llama-3.1-8B/vllm/requests.jsonl"


def saved_and_loaded(tmp_path, doc, name="r.json"):
    """The record of `doc` saved as a file and read back, and whether saving the record wrote
    the file's bytes again."""
    save_result(tmp_path / name, doc)
    rec = RunResult.load(tmp_path / name)
    rec.save(tmp_path / f"again-{name}")
    return rec, (tmp_path / name).read_bytes() == (tmp_path / f"again-{name}").read_bytes()


def test_a_simulated_result_reads_its_plan_and_prefix_cache_and_keeps_its_bytes(tmp_path):
    cfg = SimConfig(gpu="l20", k=2, acceptance="mtbench", workload="prefix_repetition",
                    num_prompts=20, max_concurrency=4, detailed=True,
                    enable_prefix_caching=True)
    res, _ = simulate(cfg)
    rec, same = saved_and_loaded(tmp_path, res)
    assert same and rec.backend == "stepgap-sim" and rec.source == str(tmp_path / "r.json")
    pc = res["config"]["resolved"]["prefix_cache"]
    assert rec.prefix_cache == pc and pc["hits"] > 0
    assert rec.resolved.hardware == "l20" and "resolved" not in rec.config
    assert rec.num_preemptions == res["config"]["resolved"]["num_preemptions"]
    assert rec.metrics["mean_tpot_ms"] == res["mean_tpot_ms"] and rec.k == 2
    assert rec.mode == res["config"]["resolved"]["mode"]
    assert rec.requests.ttfts == res["ttfts"] and rec.requests.ids == res["request_ids"]
    assert len(rec.timings()) == 20 and rec.notes == res["config"]["resolved"]["notes"]
    assert rec.spec_decode["k"] == 2


@pytest.mark.parametrize("folder,backend", [("prefix-cpu", "stepgap-engine"),
                                            ("vllm-cpu", "vllm-openai")])
def test_a_measured_folders_run_reads_its_counters_and_keeps_its_bytes(tmp_path, folder,
                                                                       backend):
    """A committed measured folder's runs: the engine's (prefix-cache counters under config)
    and vLLM's bench files as ingested (no step gaps from the bench, per-request lists)."""
    runs = sorted((ROOT / "traces/measured" / folder / "runs").glob("*.json.gz"))
    run = read_json(runs[-1])[0]
    rec, same = saved_and_loaded(tmp_path, run, "r.json.gz")
    assert same and rec.backend == backend and rec.resolved is None
    assert rec.prefix_cache == run["config"].get("prefix_cache")
    assert rec.num_preemptions == run["config"].get("num_preemptions")
    assert rec.mode == run["config"]["mode"] and rec.k == run["config"]["k"]
    assert rec.requests.input_lens == run["input_lens"]
    assert sum(t.output_len for t in rec.timings()) == run["total_output_tokens"]
    if folder == "prefix-cpu":
        assert rec.prefix_cache["queries"] > 0


def test_a_served_result_keeps_its_bytes(tmp_path):
    """`stepgap serve --result-json` (engine/api_server.py window_result): detailed, the
    aborted count in its config."""
    t = [RequestTiming("a", 4, 0.0, [0.1, 0.2, 0.25], [1, 3, 2])]
    doc = run_result(t, 0.25, backend="stepgap-serve", config={"mode": "async", "k": 2,
                                                              "aborted": 0},
                     gaps_us=[5.0, 7.0], spec=SpecStats(2), detailed=True)
    rec, same = saved_and_loaded(tmp_path, doc)
    assert same and rec.backend == "stepgap-serve" and rec.config["aborted"] == 0
    assert rec.prefix_cache is None and rec.num_preemptions is None
    assert rec.step_gaps["values_us"] == [5.0, 7.0]
    assert rec.timings()[0].chunk_tokens == [1, 3, 2]


def test_a_file_vllm_wrote_reads_with_no_config_and_no_gaps(tmp_path):
    vllm = {"date": "20250101-000000", "backend": "vllm", "completed": 2, "duration": 1.0,
            "mean_ttft_ms": 20.0, "mean_tpot_ms": 9.91, "p99_tpot_ms": 14.94,
            "mean_itl_ms": 28.14, "p99_itl_ms": math.nan, "max_concurrency": 1,
            "input_lens": [3, 4], "output_lens": [2, 1], "ttfts": [0.02, 0.03],
            "itls": [[0.028], []], "goodput": None}
    (tmp_path / "v.json").write_text(json.dumps(vllm))
    rec = RunResult.load(tmp_path / "v.json")
    assert rec.backend == "vllm" and rec.config == {} and rec.resolved is None
    assert rec.step_gaps.count == 0 and rec.spec_decode is None
    assert rec.prefix_cache is None and rec.mode is None and rec.k == 0
    assert rec.metrics["mean_tpot_ms"] == 9.91 and math.isnan(rec.metrics["p99_itl_ms"])
    assert "date" not in rec.metrics and rec.to_dict()["date"] == vllm["date"]
    assert list(rec.to_dict()) == list(vllm)   # written back in vLLM's order
    assert [t.output_len for t in rec.timings()] == [2, 1]   # no chunk sizes: the lengths


def test_a_peers_requests_file_reads_as_a_measured_run():
    rec = RunResult.load(PEER)
    assert rec.backend == "vllm" and rec.config == {"source": str(PEER)}
    assert rec.metrics["completed"] > 0 and rec.requests is None
    with pytest.raises(UserError, match="pooling needs detailed results"):
        rec.timings()


def test_a_built_result_writes_the_keys_in_vllms_order_then_stepgaps():
    t = [RequestTiming("a", 4, 0.0, [0.1, 0.2], [1, 1])]
    spec = SpecStats(2)
    spec.observe(2, 1)
    res = RunResult.build(t, 0.2, backend="x", config={"mode": "sync"}, gaps_us=[5.0, 7.0],
                          spec=spec, detailed=True)
    keys = list(res.to_dict())
    assert keys[:5] == ["backend", "num_prompts", "request_rate", "burstiness",
                        "max_concurrency"]
    assert keys[5:13] == ["duration", "completed", "failed", "total_input_tokens",
                          "total_output_tokens", "request_throughput", "output_throughput",
                          "total_token_throughput"]
    assert keys.index("p99_ttft_ms") == keys.index("std_ttft_ms") + 1
    assert keys[keys.index("step_gaps"):] == ["step_gaps", "spec_decode", "config",
                                              "request_ids", "input_lens", "output_lens",
                                              "ttfts", "itls", "chunk_tokens"]
    assert res.metrics.mean_tpot_ms == pytest.approx(100.0)
    assert res.spec_decode.num_accepted_tokens == 1 and res.step_gaps.max_us == 7.0


def test_the_plan_is_written_last_in_config_and_read_back_typed(tmp_path):
    from stepgap.common.run_result import ResolvedPlan
    t = [RequestTiming("a", 4, 0.0, [0.1], [1])]
    plan = ResolvedPlan(hardware="l20", device="cuda", mode="async", notes=["n"], target="t",
                        num_steps=3, prefix_cache={"queries": 8, "hits": 4})
    res = RunResult.build(t, 0.1, backend="stepgap-sim", config={"mode": "async", "k": 0},
                          resolved=plan)
    doc = res.to_dict()
    assert list(doc["config"]) == ["mode", "k", "resolved"]
    assert doc["config"]["resolved"]["draft"] is None          # always written
    assert "jitter" not in doc["config"]["resolved"]           # written only when set
    res.save(tmp_path / "r.json")
    back = RunResult.load(tmp_path / "r.json")
    assert back.resolved.prefix_cache == {"queries": 8, "hits": 4} and back.notes == ["n"]
    assert back.prefix_cache == {"queries": 8, "hits": 4} and back.mode == "async"


def test_a_file_that_is_not_a_result_is_named(tmp_path):
    (tmp_path / "bad.json").write_text('{"completed": 1}')
    with pytest.raises(UserError, match=r"bad.json: field 'duration': missing"):
        RunResult.load(tmp_path / "bad.json")
    with pytest.raises(UserError, match="not found"):
        RunResult.load(tmp_path / "none.json")
