"""The shared formats: traces, timelines, run results and the vllm bench serve metrics."""

import math

import pytest

from stepgap.common.errors import UserError
from stepgap.common.run_result import RunResult
from stepgap.common.formats import (RequestTiming, Span, SpecStats, chrome_trace, compute_metrics,
                             format_summary, load_timeline, load_trace, save_result,
                             save_timeline, save_trace, step_gaps, TraceRequest)
from tests.helpers import run_result


def write_lines(tmp_path, lines, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_trace_round_trip(tmp_path):
    reqs = [TraceRequest("a", 0.0, 5, 7), TraceRequest("b", 1.5, 3, 2, [1, 2, 3], [1, 0], "math")]
    save_trace(tmp_path / "t.jsonl", reqs)
    assert load_trace(tmp_path / "t.jsonl") == reqs


@pytest.mark.parametrize("line, needle", [
    ('{"request_id": "a", "arrival_s": 0, "prompt_len": 5', "t.jsonl:2: not valid JSON"),
    ('{"request_id": "a", "arrival_s": 0, "prompt_len": -3, "output_len": 4}',
     "t.jsonl:2: field 'prompt_len': expected an integer >= 1, got -3"),
    ('{"request_id": "a", "arrival_s": 0, "prompt_len": 3}', "t.jsonl:2: field 'output_len': missing"),
    ('{"request_id": "a", "arrival_s": -1, "prompt_len": 3, "output_len": 1}',
     "t.jsonl:2: field 'arrival_s'"),
    ('{"request_id": "a", "arrival_s": 0, "prompt_len": 2, "output_len": 1, "prompt_token_ids": [1]}',
     "t.jsonl:2: field 'prompt_token_ids': has 1 tokens but prompt_len is 2"),
    ('{"request_id": "x", "arrival_s": 0, "prompt_len": 2, "output_len": 1}',
     "t.jsonl:2: field 'request_id': duplicate id 'x' (first on line 1)"),
    ('[1, 2]', "t.jsonl:2: expected a JSON object"),
])
def test_malformed_trace_line_names_file_line_and_field(tmp_path, line, needle):
    good = '{"request_id": "x", "arrival_s": 0, "prompt_len": 2, "output_len": 1}'
    p = write_lines(tmp_path, [good, line])
    with pytest.raises(UserError) as e:
        load_trace(p)
    assert needle in str(e.value)


def test_empty_trace_is_an_error(tmp_path):
    with pytest.raises(UserError, match="holds no requests"):
        load_trace(write_lines(tmp_path, [""]))


def test_metrics_follow_vllm_bench_serve():
    # Request a: sent at 0, chunks at 0.1 (1 token), 0.3 (2 tokens), 0.4 (2 tokens): 5 tokens.
    a = RequestTiming("a", 10, 0.0, [0.1, 0.3, 0.4], [1, 2, 2])
    # Request b: sent at 1.0, chunks at 1.2 (1), 1.5 (1).
    b = RequestTiming("b", 20, 1.0, [1.2, 1.5], [1, 1])
    m = compute_metrics([a, b], duration_s=2.0)
    assert m["completed"] == 2 and m["total_output_tokens"] == 7 and m["total_input_tokens"] == 30
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    # TPOT: a = (0.4 - 0.1) / 4 = 75 ms, b = (0.5 - 0.2) / 1 = 300 ms.
    assert m["mean_tpot_ms"] == pytest.approx(187.5)
    assert m["std_tpot_ms"] == pytest.approx(112.5)
    # ITL: 200, 100, 300 ms.
    assert m["mean_itl_ms"] == pytest.approx(200.0)
    assert m["median_itl_ms"] == pytest.approx(200.0)
    assert m["p99_itl_ms"] == pytest.approx(298.0)
    assert m["mean_e2el_ms"] == pytest.approx(450.0)
    assert m["output_throughput"] == pytest.approx(3.5)


def test_single_token_requests_have_no_tpot():
    m = compute_metrics([RequestTiming("a", 1, 0.0, [0.5], [1])], 1.0)
    assert m["mean_tpot_ms"] == 0.0 and m["mean_ttft_ms"] == pytest.approx(500.0)


def test_step_gaps_are_device_idle_between_steps():
    spans = [Span("device", "target_forward", 0, 0, 10), Span("device", "draft_forward", 0, 10, 14),
             Span("cpu.engine", "schedule", 1, 14, 20),
             Span("device", "target_forward", 1, 21, 30), Span("device", "d2h", 1, 30, 31),
             Span("device", "target_forward", 2, 29, 40)]  # overlaps step 1: no gap
    assert step_gaps(spans) == [7, 0.0]


def test_timeline_round_trip_and_chrome_export(tmp_path):
    spans = [Span("cpu.engine", "schedule", 0, 0.0, 5.0, {}),
             Span("device", "draft_forward", 0, 5.0, 9.5, {"i": 0})]
    save_timeline(tmp_path / "tl.jsonl", spans)
    assert load_timeline(tmp_path / "tl.jsonl") == spans
    trace = chrome_trace(spans)
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in x] == [("schedule", 0.0, 5.0),
                                                          ("draft_forward", 5.0, 4.5)]
    assert x[1]["args"] == {"step": 0, "i": 0}


def test_spec_stats_count_as_vllm():
    s = SpecStats(3)
    s.observe(3, 3)
    s.observe(3, 1)
    s.observe(0, 0)  # a prefill step drafts nothing: not a draft
    d = s.to_dict()
    assert d["num_drafts"] == 2 and d["num_accepted_tokens"] == 4
    assert d["acceptance_length"] == pytest.approx(3.0)
    assert d["acceptance_rate_per_pos"] == [1.0, 0.5, 0.5]


def test_result_round_trip_and_summary(tmp_path):
    t = [RequestTiming("a", 4, 0.0, [0.1, 0.2], [1, 3])]
    res = run_result(t, 0.2, backend="test", config={"mode": "sync"}, gaps_us=[1.0, 3.0],
                     spec=SpecStats(2), detailed=True)
    save_result(tmp_path / "r.json", res)
    back = RunResult.load(tmp_path / "r.json")
    assert back.metrics["mean_tpot_ms"] == pytest.approx(res["mean_tpot_ms"])
    assert back.step_gaps["values_us"] == [1.0, 3.0]
    assert back.requests.itls == [[pytest.approx(0.1)]]
    text = format_summary(back)
    assert "Mean TPOT (ms):" in text and "P99 ITL (ms):" in text and "Median step gap" in text


# A file `vllm bench serve` wrote, and one that is not a result: tests/test_run_result.py


def test_the_median_and_percentiles_are_numpys_to_the_bit():
    """formats.median and formats.percentile stand in for np.median and np.percentile in every
    result (without their masked-array import): the same float for odd and even sizes, ties,
    rounded times, every percentile a result writes and the ends, and NaN."""
    import numpy as np
    from stepgap.common.formats import median, percentile
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 4, 7, 9, 10, 99, 100, 101, 1000, 1001):
        for scale in (1e-3, 1.0, 1e4):
            v = rng.standard_normal(n) * scale
            for x in (v, np.round(v, 3), np.abs(np.round(v))):
                assert median(x) == float(np.median(x))
                for p in (0, 1, 25, 33.3, 50, 90, 95, 99, 99.9, 99.99, 100):
                    assert percentile(x, p) == float(np.percentile(x, p)), (n, p)
    nan = np.array([1.0, float("nan"), 2.0])
    assert math.isnan(median(nan)) and math.isnan(percentile(nan, 99))
    assert math.isnan(median(np.array([])))
