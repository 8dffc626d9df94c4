"""Built-in workloads and the load generator."""

import math

import pytest

from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest, save_trace
from stepgap.common.workloads import (LoadGenerator, arrival_times, load_workload, mtbench_like,
                               sharegpt_like)


def test_mtbench_like_has_eighty_prompts_ten_per_category():
    reqs = mtbench_like()
    assert len(reqs) == 80 and {r.output_len for r in reqs} == {256}
    cats = [r.category for r in reqs]
    assert all(cats.count(c) == 10 for c in set(cats)) and len(set(cats)) == 8
    assert mtbench_like() == reqs  # deterministic
    assert mtbench_like(seed=1) != reqs


def test_sharegpt_like_length_mix():
    reqs = sharegpt_like(2000)
    mean_in = sum(r.prompt_len for r in reqs) / len(reqs)
    mean_out = sum(r.output_len for r in reqs) / len(reqs)
    assert 120 < mean_in < 200 and 250 < mean_out < 400
    assert max(r.prompt_len for r in reqs) <= 1024


def test_arrival_times_match_vllm_rescaling():
    t = arrival_times(100, request_rate=4.0, seed=3)
    assert t[-1] == pytest.approx(25.0) and t == sorted(t)
    assert arrival_times(5, math.inf) == [0.0] * 5
    assert arrival_times(4, 2.0, burstiness=math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])


@pytest.mark.parametrize("rate, burst", [(-1.0, 1.0), (0.0, 1.0), (1.0, 0.0)])
def test_bad_rates_are_user_errors(rate, burst):
    with pytest.raises(UserError):
        arrival_times(3, rate, burst)


def test_load_generator_holds_max_concurrency():
    reqs = [TraceRequest(str(i), 0.0, 4, 4) for i in range(3)]
    gen = LoadGenerator(reqs, max_concurrency=1)
    assert [r.request_id for r in gen.pop_due(0.0)] == ["0"]
    assert gen.next_arrival() is None and gen.pop_due(5.0) == []
    gen.complete()
    assert gen.next_arrival() == 0.0 and [r.request_id for r in gen.pop_due(5.0)] == ["1"]


def test_load_generator_waits_for_arrivals():
    reqs = [TraceRequest("late", 2.0, 4, 4), TraceRequest("early", 1.0, 4, 4)]
    gen = LoadGenerator(reqs)
    assert gen.pop_due(0.5) == [] and gen.next_arrival() == 1.0
    assert [r.request_id for r in gen.pop_due(2.0)] == ["early", "late"]


def test_trace_file_workload_cycles_and_overrides(tmp_path):
    save_trace(tmp_path / "t.jsonl", [TraceRequest("a", 0.0, 3, 5, accepted=[1, 2])])
    reqs = load_workload(str(tmp_path / "t.jsonl"), num_prompts=3, output_len=9)
    assert [r.request_id for r in reqs] == ["a", "a#1", "a#2"]
    assert {r.output_len for r in reqs} == {9} and reqs[0].accepted is None


def test_unknown_workload_is_named():
    with pytest.raises(UserError, match="unknown workload 'nope'"):
        load_workload("nope")


def test_mtbench_like_prompt_lengths_follow_the_question_set():
    # Category means estimated from MT-bench's first turns plus the Llama-3.1 chat template.
    reqs = mtbench_like(num_prompts=8000)
    by_cat = {}
    for r in reqs:
        by_cat.setdefault(r.category, []).append(r.prompt_len)
    means = {c: sum(v) / len(v) for c, v in by_cat.items()}
    assert max(means, key=means.get) == "extraction" and min(means, key=means.get) == "humanities"
    assert 95 < sum(r.prompt_len for r in reqs) / len(reqs) < 110


def test_cycling_a_trace_never_repeats_an_id_the_trace_holds(tmp_path):
    path = tmp_path / "t.jsonl"
    save_trace(path, [TraceRequest(rid, 0.0, 4, 4) for rid in ("a", "a#2")])
    ids = [r.request_id for r in load_workload(str(path), num_prompts=5)]
    assert ids == ["a", "a#2", "a#2#", "a#2#3", "a#4"]   # the 3rd repeats a, as a#2 would
