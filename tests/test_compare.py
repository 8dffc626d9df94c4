"""`stepgap compare`: the error table of one run result against another, and pooled results."""

import json

import pytest

from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from stepgap.cli import main
from stepgap.common.compare import compare, ks_distance, pool_results
from stepgap.common.formats import save_result
from stepgap.common.run_result import RunResult

# The keys `vllm bench serve --save-result` writes (no step gaps, no config).
VLLM_RESULT = {
    "date": "20250101-000000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B",
    "num_prompts": 80, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 1,
    "duration": 120.5, "completed": 80, "total_input_tokens": 8000,
    "total_output_tokens": 20480, "request_throughput": 0.66, "output_throughput": 170.0,
    "total_token_throughput": 236.4,
    "mean_ttft_ms": 30.0, "median_ttft_ms": 29.0, "std_ttft_ms": 3.0, "p99_ttft_ms": 60.0,
    "mean_tpot_ms": 9.91, "median_tpot_ms": 9.5, "std_tpot_ms": 1.0, "p99_tpot_ms": 14.94,
    "mean_itl_ms": 28.14, "median_itl_ms": 28.0, "std_itl_ms": 1.0, "p99_itl_ms": 28.52,
    "mean_e2el_ms": 2560.0, "median_e2el_ms": 2500.0, "std_e2el_ms": 100.0,
    "p99_e2el_ms": 3800.0,
}


def sim_result(**kw):
    cfg = SimConfig(gpu="l20", k=2, acceptance="mtbench", workload="mtbench", num_prompts=6,
                    output_len=32, max_concurrency=2, detailed=True, **kw)
    return simulate(cfg)[0]


def test_a_result_against_itself_has_no_error():
    res = sim_result()
    cmp = compare(res, res)
    assert all(e == 0 for _, _, _, e in cmp["rows"] + cmp["gaps"])
    assert cmp["ks"] == 0.0
    # in the order `vllm bench serve` prints them (common.formats.METRICS)
    assert [r[0] for r in cmp["rows"][:4]] == ["Mean TTFT (ms)", "Median TTFT (ms)",
                                               "P99 TTFT (ms)", "Mean TPOT (ms)"]
    assert len(cmp["rows"]) == 12   # mean, median, P99 of TTFT, TPOT, ITL, E2EL


def test_error_is_relative_to_the_measured_value():
    measured = RunResult.from_dict(dict(VLLM_RESULT))
    simulated = RunResult.from_dict(dict(VLLM_RESULT, mean_tpot_ms=9.91 * 1.1, p99_itl_ms=28.52 * 0.95))
    rows = {label: e for label, _, _, e in compare(measured, simulated)["rows"]}
    assert rows["Mean TPOT (ms)"] == pytest.approx(0.10)
    assert rows["P99 ITL (ms)"] == pytest.approx(-0.05)


def test_ks_distance_is_the_largest_gap_between_the_cdfs():
    assert ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_distance([1, 2], [3, 4]) == 1.0
    assert ks_distance([1, 2, 3, 4], [3, 4, 5, 6]) == pytest.approx(0.5)


def test_compare_reads_a_vllm_bench_serve_result_without_step_gaps(tmp_path, capsys):
    (tmp_path / "vllm.json").write_text(json.dumps(VLLM_RESULT))
    save_result(tmp_path / "sim.json", sim_result())
    assert main(["compare", str(tmp_path / "vllm.json"), str(tmp_path / "sim.json")]) == 0
    out = capsys.readouterr().out
    assert "Mean TPOT (ms)" in out and "P99 E2EL (ms)" in out
    assert "not in the measured result" in out
    assert main(["compare", str(tmp_path / "vllm.json"), str(tmp_path / "sim.json"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tpot = next(r for r in doc["metrics"] if r["metric"] == "Mean TPOT (ms)")
    assert tpot["measured"] == 9.91 and doc["step_gap_ks"] is None


def test_compare_names_a_file_that_is_not_a_result(tmp_path, capsys):
    (tmp_path / "x.json").write_text(json.dumps({"completed": 1}))
    assert main(["compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "field 'duration': missing" in capsys.readouterr().err


def test_gzip_results_round_trip(tmp_path):
    res = sim_result()
    save_result(tmp_path / "r.json.gz", res)
    assert RunResult.load(tmp_path / "r.json.gz").metrics["mean_tpot_ms"] == res["mean_tpot_ms"]
    save_result(tmp_path / "s.json.gz", res)   # no timestamp in the gzip header
    assert (tmp_path / "r.json.gz").read_bytes() == (tmp_path / "s.json.gz").read_bytes()


def test_pooled_runs_count_every_request_once():
    a, b = sim_result(seed=0), sim_result(seed=1)
    pooled = pool_results([a, b])
    assert pooled.metrics["completed"] == a["completed"] + b["completed"]
    assert pooled.metrics["duration"] == pytest.approx(a["duration"] + b["duration"])
    # equal request counts: the pooled mean TPOT is the mean of the two
    assert pooled.metrics["mean_tpot_ms"] == pytest.approx((a["mean_tpot_ms"]
                                                            + b["mean_tpot_ms"]) / 2)
    assert pooled.step_gaps["count"] == a["step_gaps"]["count"] + b["step_gaps"]["count"]
    spec = pooled.spec_decode
    assert spec["num_drafts"] == a["spec_decode"]["num_drafts"] + b["spec_decode"]["num_drafts"]
    assert pooled.config["pooled_runs"] == 2 and pooled.num_prompts == 12
    one = a
    assert pool_results([one]) is one


def test_compare_warns_when_the_results_ran_different_traces_or_configs(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_result(a, sim_result())
    save_result(b, sim_result(mode="async"))
    assert main(["compare", str(a), str(b)]) == 0
    err = capsys.readouterr().err
    assert "warning: the two results ran different configurations (mode 'sync' vs 'async')" \
        in err
    brief = {k: v for k, v in sim_result().items()   # (no per-request lists for 5 prompts)
             if k not in ("request_ids", "input_lens", "output_lens", "ttfts", "itls")}
    save_result(b, {**brief, "num_prompts": 5, "completed": 0})
    assert main(["compare", str(a), str(b)]) == 0
    err = capsys.readouterr().err
    assert "SIMULATED completed no request" in err
    assert "different traces (num_prompts 6 vs 5)" in err
    save_result(b, sim_result())
    assert main(["compare", str(a), str(b)]) == 0
    assert "warning" not in capsys.readouterr().err   # the same run twice: nothing to say
