"""`stepgap explain` (common/breakdown.py, sim/explain_cli.py): each microsecond of a step and
its gap attributed to an op, pinned on the closed forms of the step loop (constant costs, one
request; docs/explanation/step-loop.md), the parts adding up to the window on any timeline,
and the Chrome trace carrying the idle stretches."""

import json

import pytest

from stepgap.cli import main
from stepgap.common.breakdown import breakdown, idle_events
from stepgap.common.formats import Span, TraceRequest, chrome_trace, save_timeline, step_gaps
from stepgap.common.workloads import sharegpt_like
from stepgap.sim.costs import ConstantCosts
from stepgap.sim.loop import simulate
from tests.test_sim_model import L, P, S, U, cfg, one_request

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def spans_of(costs, **kw):
    return simulate(cfg(timeline=True, **kw), one_request(), costs)[1]


def per_step(b) -> dict:
    """op -> (on the path, hidden) in us per step."""
    return {o.op: (round((o.busy_us + o.exposed_us) / b.steps, 6), round(o.hidden_us / b.steps, 6))
            for o in b.rows()}


@pytest.mark.parametrize("executor", ["inline", "process"])
def test_sync_exposes_every_cpu_op_whole_and_the_step_is_their_sum_and_the_device(executor):
    b = breakdown(spans_of(ConstantCosts(target=2000.0), mode="sync", executor=executor))
    ops = per_step(b)
    assert ops["target_forward"] == (2000.0, 0.0)
    assert {op: ops[op][0] for op in ("schedule", "prepare_inputs", "launch",
                                      "update_from_output")} == \
        {"schedule": S, "prepare_inputs": P, "launch": L, "update_from_output": U}
    assert b.window_us / b.steps == pytest.approx(S + P + L + U + 2000.0)
    assert b.idle_us == pytest.approx(b.gaps_us)   # all of the idle is between steps
    assert "wait" not in ops   # a worker blocked on the device is never on the path


def test_async_without_drafts_hides_every_cpu_op_under_a_longer_device_step():
    b = breakdown(spans_of(ConstantCosts(target=2000.0), mode="async", k=0), steps=(5, 30))
    ops = per_step(b)
    assert b.idle_us == 0 and b.window_us / b.steps == pytest.approx(2000.0)
    assert {op: ops[op][1] for op in ("schedule", "prepare_inputs", "launch",
                                      "update_from_output")} == \
        {"schedule": S, "prepare_inputs": P, "launch": L, "update_from_output": U}


def test_async_with_drafts_exposes_what_prepare_and_launch_take_past_the_drafter():
    # the worker waits for step N's accepted counts (after verify), then prepares N+1 while
    # N drafts: prepare + launch - drafting is exposed, the tail of prepare and the launch
    draft, copy, k = 150.0, 50.0, 3
    drafting = k * draft + copy
    slow = {"schedule": [S], "update_from_output": [U], "prepare_inputs": [800.0],
            "launch": [L]}
    b = breakdown(spans_of(ConstantCosts(target=1400.0, rejection=100.0, draft=draft, copy=copy),
                           mode="async", k=k, cpu_costs=slow), steps=(5, 30))
    ops = per_step(b)
    assert ops["prepare_inputs"] == (pytest.approx(800.0 - drafting), pytest.approx(drafting))
    assert ops["launch"] == (pytest.approx(L), 0.0)
    assert ops["schedule"][0] == 0 and ops["update_from_output"][0] == 0   # engine: hidden
    assert b.window_us / b.steps == pytest.approx(1400.0 + 100.0 + 800.0 + L)


def test_zero_bubble_leaves_the_device_no_idle_when_it_paces():
    slow = {"schedule": [S], "update_from_output": [U], "prepare_inputs": [800.0],
            "launch": [L]}
    b = breakdown(spans_of(ConstantCosts(target=1400.0, rejection=100.0, draft=150.0,
                                         copy=50.0), mode="zero-bubble", k=3, cpu_costs=slow),
                  steps=(5, 30))
    assert b.idle_us == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("mode", ["sync", "async", "zero-bubble"])
@pytest.mark.parametrize("executor", ["inline", "process"])
def test_busy_exposed_and_no_op_add_up_to_the_window_on_a_busy_run(mode, executor):
    reqs = sharegpt_like(12, seed=3)
    spans = simulate(cfg(mode=mode, k=2, executor=executor, timeline=True, max_concurrency=4,
                         acceptance_rates=(0.7, 0.4)), reqs,
                     ConstantCosts(target=900.0, rejection=30.0, draft=200.0, copy=10.0))[1]
    b = breakdown(spans)
    assert b.busy_us + b.idle_us == pytest.approx(b.window_us, rel=1e-9)
    assert b.idle_us >= b.gaps_us - 1e-6
    assert b.gaps_us == pytest.approx(sum(step_gaps(spans)))   # every gap but none before 1st
    assert all(o.busy_us >= 0 and o.exposed_us >= 0 and o.hidden_us >= 0 for o in b.rows())


def test_an_op_on_a_lane_nearer_the_device_takes_the_idle_from_the_engine():
    # the device idles from 10 to 30; the engine schedules 10-25, the worker prepares 20-30
    spans = [Span("device", "target_forward", 0, 0, 10), Span("cpu.engine", "schedule", 1, 10, 25),
             Span("cpu.worker", "prepare_inputs", 1, 20, 30),
             Span("cpu.worker", "wait", 1, 10, 20), Span("device", "target_forward", 1, 30, 40)]
    b = breakdown(spans)
    ops = {o.op: (o.exposed_us, o.hidden_us) for o in b.rows()}
    assert ops["schedule"] == (10.0, 5.0) and ops["prepare_inputs"] == (10.0, 0.0)
    assert b.window_us == 30 and b.steps == 1


def test_no_op_is_the_idle_no_cpu_op_covers():
    spans = [Span("device", "target_forward", 0, 0, 10), Span("cpu.engine", "schedule", 1, 12, 15),
             Span("device", "target_forward", 1, 20, 30)]
    ops = {o.op: o.busy_us + o.exposed_us for o in breakdown(spans).rows()}
    assert ops == {"target_forward": 10.0, "schedule": 3.0, "(no op)": 7.0}


def test_the_chrome_trace_carries_each_idle_stretch_by_its_op_and_the_step_it_delays():
    spans = spans_of(ConstantCosts(target=2000.0), mode="sync")
    idle = [e for e in chrome_trace(spans)["traceEvents"] if e.get("cat") == "device idle"]
    assert {e["name"] for e in idle} == {"idle: update_from_output", "idle: schedule",
                                         "idle: prepare_inputs", "idle: launch"}
    assert sum(e["dur"] for e in idle) == pytest.approx(breakdown(spans).idle_us, abs=0.01)
    gap_of = dict(zip(range(2, 100), step_gaps(spans)[1:]))
    by_step = {}
    for e in idle:
        by_step[e["args"]["before_step"]] = by_step.get(e["args"]["before_step"], 0) + e["dur"]
    assert all(by_step[s] == pytest.approx(gap_of[s], abs=0.01) for s in gap_of if s in by_step)
    threads = {e["args"]["name"] for e in chrome_trace(spans)["traceEvents"]
               if e["name"] == "thread_name"}
    assert "device idle" in threads
    assert idle_events(spans[:3]) == []   # fewer than two device steps: no gap


def test_explain_simulates_sync_and_async_side_by_side(tmp_path, capsys):
    out, fig = tmp_path / "e.json", tmp_path / "e.png"
    assert main(["explain", "--preset", "seed-l20", "--num-prompts", "2", "--output-len", "24",
                 "--result-json", str(out), "--plot", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "async against sync: saves" in text and "of it, step gaps" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == "stepgap-explain/1" and [r["label"] for r in doc["runs"]] == \
        ["sync", "async"]
    sync, asyn = doc["runs"]
    for r in doc["runs"]:
        on_path = sum(o["busy_us"] + o["exposed_us"] for o in r["ops"])
        assert on_path == pytest.approx(r["step_us"], abs=0.01 * len(r["ops"]))
    assert asyn["device_idle_us"] < sync["device_idle_us"]   # async hides the CPU's turn
    assert fig.read_bytes()[:4] == b"\x89PNG"


def test_explain_reads_a_measured_timeline_given(tmp_path, capsys):
    path = ROOT / "traces/measured/vllm-cpu/timelines/sync-k2-c1.measured.jsonl"
    chrome = tmp_path / "c.json"
    assert main(["explain", "--from-timeline", f"vllm-sync={path}", "--steps", "41:60",
                 "--chrome", str(chrome), "--quiet"]) == 0
    events = json.loads(chrome.read_text())["traceEvents"]
    assert any(e.get("cat") == "device idle" for e in events)
    assert any(e.get("name") == "process_outputs" for e in events)   # vLLM's API server lane


@pytest.mark.parametrize("args, says", [
    (["--modes", "sync,fast"], "--modes: expected distinct modes"),
    (["--from-timeline", "nope.jsonl"], "nope.jsonl"),
    (["--from-timeline", "x=TL", "--steps", "900:901"], "no device op in steps 900-901"),
])
def test_bad_input_to_explain_is_one_line_and_status_2(args, says, tmp_path, capsys):
    save_timeline(tmp_path / "tl.jsonl", [Span("device", "target_forward", 0, 0, 10),
                                          Span("device", "target_forward", 1, 12, 20)])
    args = [a.replace("TL", str(tmp_path / "tl.jsonl")) for a in args]
    try:
        status = main(["explain", *args])
    except SystemExit as e:   # argparse's own errors
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_trace_with_its_requests_explains_as_the_engine_replays_it():
    reqs = [TraceRequest("r", 0.0, 16, 12)]
    spans = simulate(cfg(mode="sync", timeline=True), reqs, ConstantCosts(target=500.0))[1]
    assert breakdown(spans).steps == len({s.step for s in spans if s.lane == "device"}) - 1
