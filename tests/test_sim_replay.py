"""Replaying a run's steps (sim/steps.py `Recording`): a run that differs from a recorded one only
in how long things take gives the same result, byte for byte, as simulating it in full; a run
whose steps could depend on time, or that differs in anything else, is simulated in full."""

import json

import pytest

from stepgap.common.scheduler import Scheduler
from stepgap.sim import paths
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import Recording, simulate
from stepgap.sim.sweep_runners import run_cell

BASE = dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=3, mode="async",
            workload="sharegpt", num_prompts=24, max_concurrency=4)
PAIR = "checkpoints/pystdlib"
CPU = dict(model=f"{PAIR}/target", draft=f"{PAIR}/eagle3", gpu="cpu", device="cpu",
           workload=f"{PAIR}/heldout.jsonl", profile="traces/measured/cpu/profile.json",
           k=2, max_concurrency=2, num_prompts=6)
REPLAYED = {
    "sync": dict(mode="sync"),
    "async at concurrency 1": dict(max_concurrency=1, num_prompts=6),
    "zero-bubble": dict(mode="zero-bubble"),
    "k = 0": dict(k=0, mode="sync"),
    "no concurrency cap": dict(max_concurrency=None, max_num_seqs=8),
    "prefix caching off": dict(enable_prefix_caching=False),
    "preemption": dict(num_gpu_blocks_override=80, output_len=200, max_concurrency=16,
                       num_prompts=40),
    "chunked prefill": dict(max_num_batched_tokens=64, max_num_seqs=8),
    "ngram, proposed on the CPU": dict(draft=None, method="ngram"),
    "the CPU device, a measured profile with its noise": CPU,
    "a detailed result": dict(detailed=True),
    # the run ends before or after the update of a step launched for requests its predecessor
    # finished, as the times fall (the crash of issue 49's band at cpu-high)
    "async, a step in flight when the last request ends": dict(
        model="qwen3-1.7b", gpu="h20", draft=None, method="ngram_gpu", workload="random",
        output_len=256, max_model_len=2048, num_prompts=2, max_concurrency=2),
}
TIME_ENDS = (dict(cpu_scale=0.4), dict(cpu_scale=3.1), dict(speed=0.8), dict(speed=1.3))


def text(settings: dict, recording: Recording | None = None) -> str:
    settings = {k: v for k, v in settings.items() if not (k == "draft" and v is None)}
    res, spans = simulate(SimConfig(**settings), recording=recording)
    return json.dumps([res, [tuple(s) for s in spans]], sort_keys=True, default=str)


def no_scheduling(monkeypatch):
    def refuse(self):
        raise AssertionError("a replayed run scheduled")
    monkeypatch.setattr(Scheduler, "schedule", refuse)


@pytest.mark.parametrize("case", list(REPLAYED))
def test_a_run_that_differs_only_in_time_replays_the_steps_with_the_same_result(case,
                                                                              monkeypatch):
    settings = {**BASE, **REPLAYED[case]}
    ends = [{**settings, **end} for end in TIME_ENDS]
    full = [text(s) for s in ends]
    rec = Recording()
    text(settings, rec)
    assert rec.totals is not None, "the recording was not filled"
    no_scheduling(monkeypatch)   # (a replay reads the steps back: it never schedules)
    assert [text(s, rec) for s in ends] == full


@pytest.mark.parametrize("case", [c for c in REPLAYED if REPLAYED[c].get("mode") != "sync"])
def test_zero_bubble_replays_the_steps_of_async_with_the_same_result(case, monkeypatch):
    """Zero-bubble schedules as async does and only times its steps otherwise (no wait for the
    accepted counts, a fixup op on the device): it replays async's recording, at its nominal
    settings and at each time end, and gives what it gives simulated in full."""
    settings = {**BASE, **REPLAYED[case], "mode": "async"}
    ends = [{**settings, **end, "mode": "zero-bubble"} for end in ({},) + TIME_ENDS]
    full = [text(s) for s in ends]
    rec = Recording()
    text(settings, rec)
    no_scheduling(monkeypatch)
    assert [text(s, rec) for s in ends] == full


@pytest.mark.parametrize("case", list(REPLAYED))
def test_the_plain_loop_gives_what_simpy_gives(case, monkeypatch):
    """Where a run's steps cannot depend on time, the plain loop runs it, scheduled live or
    replayed; SimPy's loop, which every other run takes, gives the same bytes, nominal and at
    each time end, and runs them all without the plain loop's help."""
    from stepgap.sim import plain_loop
    settings = {**BASE, **REPLAYED[case]}
    ends = [{**settings, **end} for end in TIME_ENDS]
    calls = []
    real = plain_loop.run
    monkeypatch.setattr(plain_loop, "run", lambda *a: calls.append(1) or real(*a))
    rec = Recording()
    plain = [text(settings, rec)] + [text(s, rec) for s in ends]
    assert len(calls) == 1 + len(ends)
    monkeypatch.setattr(plain_loop, "runs_plainly", lambda cfg, r: False)   # as with a timeline
    rec = Recording()
    assert [text(settings, rec)] + [text(s, rec) for s in ends] == plain
    assert len(calls) == 1 + len(ends)


NOT_REPLAYED = {
    "the process executor": dict(executor="process"),
    "Poisson arrivals": dict(request_rate=20.0, max_concurrency=None),
    "an output latency": dict(output_latency_ms=3.0),
    "a series of the scheduler's state": dict(timeseries_interval_s=0.5),
    "vLLM's topology (an API server)": dict(topology="vllm"),
    "data parallelism": dict(data_parallel_size=2),
    # (its steps could not depend on time, but its spans come from SimPy's loop, which neither
    # records nor replays: sim/plain_loop.py)
    "a timeline": dict(timeline=True, detailed=True),
}


@pytest.mark.parametrize("case", list(NOT_REPLAYED))
def test_a_run_whose_steps_could_depend_on_time_is_not_recorded(case):
    settings = {**BASE, **NOT_REPLAYED[case]}
    rec = Recording()
    first = text(settings, rec)
    assert rec.totals is None and rec.program is None
    assert text(settings, rec) == first


@pytest.mark.parametrize("change", [dict(k=4), dict(seed=1), dict(mode="sync"),
                                    dict(acceptance_rates=[0.5, 0.4, 0.3]),
                                    dict(max_concurrency=3)])
def test_a_run_that_differs_in_anything_else_is_simulated_in_full(change, monkeypatch):
    rec = Recording()
    text(BASE, rec)
    other = {**BASE, **change, "cpu_scale": 2.0}
    full = text(other)
    calls = []   # the record pass, by request paths (sim/paths.py) or by the scheduler
    real = paths.record
    monkeypatch.setattr(paths, "record", lambda *a: calls.append(1) or real(*a))
    assert text(other, rec) == full and calls


def test_the_same_settings_over_other_requests_are_simulated_in_full(monkeypatch):
    from stepgap.sim.loop import build_workload
    cfg = SimConfig(**BASE)
    reqs = build_workload(cfg)
    rec = Recording()
    simulate(cfg, reqs[:-1], recording=rec)
    full = simulate(cfg, reqs)[0]
    assert simulate(cfg, reqs, recording=rec)[0] == full


def test_a_recording_whose_run_failed_part_way_is_filled_afresh_by_the_next(monkeypatch):
    rec = Recording()
    real = paths._admit
    admitted = []

    def fail(*a):
        if len(admitted) > 5:
            raise RuntimeError("a run that fails")
        admitted.append(a)
        return real(*a)
    monkeypatch.setattr(paths, "_admit", fail)
    with pytest.raises(RuntimeError, match="a run that fails"):
        text(BASE, rec)
    monkeypatch.setattr(paths, "_admit", real)
    assert rec.totals is None and rec.program is None and rec.key is not None
    text(BASE, rec)
    other = {**BASE, "cpu_scale": 2.0}
    assert text(other, rec) == text(other)


def test_advise_cells_give_each_cell_what_it_gives_alone(monkeypatch):
    """advise's Cells keep one recording per steps: the nominal cell and its CPU and device
    ends run once in full, every other cell of those steps replays it."""
    from stepgap.sim.advise import Cells
    from stepgap.sim.loop import Run
    from stepgap.sim.steps import LiveSteps, ReplayedSteps
    runs = []
    real = Run.run
    monkeypatch.setattr(Run, "run", lambda self: runs.append(type(self.steps)) or real(self))
    cells = [{**BASE, "cpu_scale": c, "speed": s, "k": k}
             for k in (2, 3) for c, s in ((1.0, 1.0), (3.1, 1.0), (1.0, 0.9), (2.4, 1.1))]
    got = Cells()
    got.run(cells)
    assert runs.count(LiveSteps) == 2 and ReplayedSteps in runs   # one full run for each k
    assert [got.done[got.key(c)] for c in cells] == [run_cell(c) for c in cells]


def test_a_replay_prices_no_step_its_recording_priced(monkeypatch):
    """A step's device op times before the noise depend on the step alone (its key), and the
    runs of one recording have the same device costs: a replay reads them back (`Device.ops`),
    with the same result as a run in full (above). (Where the costs price all steps at once,
    `Device.steady_times`, a run prices none one by one: here parallel drafting, which they
    do not price so.)"""
    from stepgap.sim.device_lane import Device
    base = {**BASE, "parallel_drafting": True}
    rec = Recording()
    text(base, rec)
    assert rec.device_ops
    priced = []
    real = Device.step_ops
    monkeypatch.setattr(Device, "step_ops", lambda self, *a: priced.append(a) or real(self, *a))
    slower = {**base, "speed": 0.8}
    replayed = text(slower, rec)
    assert not priced
    assert replayed == text(slower) and priced   # in full, every step priced again


PRICED = {**REPLAYED, "fp8 weights": dict(quantization="fp8"),
          "EAGLE-1, its fc every pass": dict(method="eagle", draft=None)}


@pytest.mark.parametrize("case", ["sync", "zero-bubble", "k = 0", "chunked prefill",
                                  "ngram, proposed on the CPU", "a detailed result",
                                  "fp8 weights", "EAGLE-1, its fc every pass"])
@pytest.mark.parametrize("speed", [1.0, 0.8])
def test_the_steps_priced_at_once_are_those_priced_one_by_one(case, speed):
    """`Device.steady_times` prices a recording's steps from its columns, all at once (on one
    GPU, each formula over arrays of token counts): the same floats `Device.times` gives each
    step."""
    from stepgap.sim.loop import Run, build_workload
    settings = {k: v for k, v in {**BASE, **PRICED[case], "speed": speed}.items()
                if not (k == "draft" and v is None)}
    cfg = SimConfig(**settings)
    rec = Recording()
    simulate(cfg, recording=rec)
    device = Run(cfg, build_workload(cfg)).engine.device
    at_once = device.steady_times(rec.program.columns)
    assert at_once is not None
    each = [device.times(b, 0.0, 0.0)[3:] for b in rec.program.columns.batch_list()]
    assert at_once[0].tolist() == [v for v, _ in each]
    assert at_once[1].tolist() == [w for _, w in each]
