"""`stepgap validate`: replay agreement with the engine, the run plan, and a tiny grid end to end."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from stepgap.engine.args import EngineArgs
from stepgap.engine.loop import run_trace
from stepgap.engine.sampler import SamplingConfig
from stepgap.calibrate.harness import Plan, chunk, units_of
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from stepgap.calibrate.measured import requests_of
from stepgap.common.run_result import RunResult
from stepgap.cli import main
from stepgap.common.formats import load_trace, save_trace
from tests.helpers import mixed_requests

PAIR = Path(__file__).resolve().parents[1] / "checkpoints" / "pystdlib"


TINY = EngineArgs(model="tiny", draft="tiny-eagle3", k=3, dtype="float32",
                  num_gpu_blocks_override=64, max_model_len=512, max_num_seqs=8, num_threads=1)


@pytest.fixture(scope="module")
def tiny_executor():
    return TINY.make_executor()


@pytest.mark.parametrize("mode", ["sync", "async", "zero-bubble"])
def test_the_simulator_replays_the_engines_chunks_exactly(tiny_executor, mode):
    # Synthetic acceptance makes every count 0..k occur; a small KV cache forces preemption
    # by recompute; async modes run extra steps for requests that finish early.
    reqs = mixed_requests(9, base_prompt=20, out_len=30)
    blocks = 22
    cfg = TINY.with_(sampling=SamplingConfig(synthetic=(0.8, 0.6, 0.4))).engine_config(
        mode, num_blocks=blocks)
    run = run_trace(tiny_executor, reqs, cfg, vocab_size=512, max_concurrency=4, detailed=True,
                    config={"max_concurrency": 4})
    res = run.result
    assert res["config"]["num_preemptions"] > 0
    assert {a for accs in res["accepted"] for a in accs} == {0, 1, 2, 3}
    sim, _ = simulate(SimConfig(mode=mode, k=3, model="llama-3.2-1b", gpu="h100",
                                executor="process", device="cpu", num_gpu_blocks_override=blocks,
                                max_num_seqs=8, max_num_batched_tokens=8192, max_model_len=512,
                                max_concurrency=4, detailed=True),
                      requests_of(res))
    assert sim["chunk_tokens"] == res["chunk_tokens"]
    assert sim["config"]["resolved"]["num_preemptions"] == res["config"]["num_preemptions"]
    assert sim["spec_decode"]["num_drafts"] == res["spec_decode"]["num_drafts"]


def test_chunks_of_a_trace_wrap_around():
    items = list(range(10))
    assert chunk(items, 4, 0) == [0, 1, 2, 3]
    assert chunk(items, 4, 2) == [8, 9, 0, 1]
    assert chunk(items, 20, 3) == items


def plan(**kw):
    judged = mixed_requests(48)
    calibration = [replace(r, request_id=f"c{i}") for i, r in enumerate(judged)]
    base = dict(engine=EngineArgs(model="tiny"), modes=["sync", "async", "zero-bubble"],
                ks=[0, 2, 4], concs=[1, 4], judged=judged, calibration=calibration,
                repeats=18)
    return Plan(**{**base, **kw})


def test_every_cell_runs_its_repeats_with_its_modes_back_to_back():
    units = units_of(plan())
    judged = [u for u in units if u[0] == "judged"]
    assert len(judged) == 18 * 18
    for rep in range(18):
        mine = [u for u in judged if u[4] == rep]
        for i in range(0, len(mine), 3):   # each (k, conc) group: its three modes in a row
            assert len({(u[2], u[3]) for u in mine[i:i + 3]}) == 1
            assert {u[1] for u in mine[i:i + 3]} == {"sync", "async", "zero-bubble"}
    calib = [u for u in units if u[0] == "calibration"]
    assert len(calib) == 18 * 6                      # every repeat, each group, before its modes
    assert all(units[units.index(u) + 1][2:4] == u[2:4] for u in calib)
    per_cell = {(u[1], u[2], u[3]) for u in calib}
    assert len(per_cell) == 18                        # every mode calibrates every group
    # profiling alone: every mode of every group, every repeat
    assert len(units_of(plan(judged=None, repeats=1))) == 18


def test_the_modes_of_a_group_take_every_place_and_follow_each_other_equally_often():
    from collections import Counter
    units = units_of(plan())
    places, after, places_of = Counter(), Counter(), {}
    for i, u in enumerate(units):
        if u[0] != "judged":
            continue
        prev = units[i - 1]
        place = 0 if prev[0] == "calibration" else places_of[prev] + 1
        places_of[u] = place
        places[(u[1], u[2], u[3], place)] += 1
        if prev[0] == "judged":
            after[(u[1], prev[1], u[2], u[3])] += 1
    assert set(places.values()) == {6}     # 18 repeats: each cell 6 times in each place
    assert set(after.values()) == {6}      # and 6 times after each other mode


def test_a_saving_s_interval_comes_from_the_paired_runs():
    from stepgap.calibrate.judge import paired_half_width
    def run(i, itl):   # what paired_half_width reads of a run: its slice, its mean ITL
        return RunResult.from_dict({"config": {"slice": i}, "mean_itl_ms": itl})
    base = [run(i, 10.0 + i) for i in range(4)]
    same = [run(i, 9.0 + i) for i in range(4)]
    assert paired_half_width(base, same) == 0.0        # the drift cancels in the pairs
    noisy = [run(i, 9.0 + i + d) for i, d in enumerate((0.1, -0.1, 0.1, -0.1))]
    # differences 0.9, 1.1, 0.9, 1.1: sd 0.11547, t(3) 3.182, n 4
    assert paired_half_width(base, noisy) == pytest.approx(3.182 * 0.11547 / 2, rel=1e-4)
    assert paired_half_width(base[:2], same[:2]) is None


def test_validate_help_explains_the_grid(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    out = capsys.readouterr().out
    for opt in ("--modes", "--ks", "--concurrency", "--repeats", "--slice", "--profile",
                "--from-measured", "--calibration-trace"):
        assert opt in out
    assert "18 cells" in out


def test_validate_refuses_a_calibration_trace_that_is_the_judged_one(tmp_path, capsys):
    assert main(["validate", "--calibration-trace", str(PAIR / "heldout.jsonl"),
                 "--out", str(tmp_path / "v"), "--quiet"]) == 2
    assert "calibration must use other prompts" in capsys.readouterr().err


def test_a_tiny_validation_end_to_end(tmp_path, capsys):
    # Calibration prompts: the held-out trace's last ones, renamed (the default cuts them from
    # the corpus's training files, which takes longer); judged: its first ones.
    held = load_trace(PAIR / "heldout.jsonl")
    calib = [replace(r, request_id=f"cal-{i}", output_len=16) for i, r in enumerate(held[-3:])]
    save_trace(tmp_path / "cal.jsonl", calib)
    judged = [replace(r, output_len=24) for r in held[:4]]
    save_trace(tmp_path / "judged.jsonl", judged)
    out = tmp_path / "v"
    assert main(["validate", "--modes", "sync,async", "--ks", "2", "--concurrency", "1,2",
                 "--trace", str(tmp_path / "judged.jsonl"), "--repeats", "2", "--slice", "2",
                 "--calibration-trace", str(tmp_path / "cal.jsonl"), "--calibration-slice",
                 "3", "--no-grid", "--out", str(out), "--quiet"]) == 0
    files = {p.name for p in out.iterdir()}
    assert {"report.md", "tpot.png", "timeline.png", "profile.json", "manifest.json", "runs",
            "simulated", "timelines", "models", "calibration.jsonl"} <= files
    man = json.loads((out / "manifest.json").read_text())
    assert [c["num_runs"] for c in man["cells"]] == [2, 2, 2, 2]
    # every run records what the other processes used meanwhile, and the manifest sums it up
    assert man["other_cpu"]["runs"] == 8 and 0 <= man["other_cpu"]["median_core"] < 2
    # the folder keeps the trace it judged; prompts that share no prefix keep the engine's
    # rules (the prefix cache found nothing; the simulator, on the same token ids, neither)
    from stepgap.calibrate.judge import judge_folder, rules_for
    from stepgap.calibrate.measured import load_measured
    assert load_trace(out / "judged.jsonl") == judged
    setup, verdicts, _ = judge_folder(out)
    assert rules_for(setup) == "engine" and len(setup.prompts) == 4
    assert all(m == s == {"queries": m["queries"], "hits": 0} for v in verdicts
               for m, s in v.prefix_cache)
    assert load_measured(out)[0].prefix_hits is False
    report = (out / "report.md").read_text()
    assert "| sync | 2 | 1 |" in report and "| async | 2 | 2 |" in report
    assert "saving over sync" in report
    profile = json.loads((out / "profile.json").read_text())
    assert profile["calibration"]["trace"] == str(tmp_path / "cal.jsonl")
    assert profile["topology"]["executor"] == "process"
    # re-simulating the folder gives the same table (no engine run)
    again = tmp_path / "again"
    assert main(["validate", "--from-measured", str(out), "--out", str(again), "--quiet"]) == 0
    table = lambda text: [ln for ln in text.splitlines() if ln.startswith("| ")]  # noqa: E731
    assert table((again / "report.md").read_text()) == table(report)


def test_validate_into_the_measured_folder_it_reads_is_refused(tmp_path, capsys):
    import shutil
    from stepgap.cli import main
    m = tmp_path / "m"   # its report.md and simulated/ were written over, exit 0
    shutil.copytree(Path(__file__).resolve().parents[1] / "traces/measured/cpu", m)
    before = {p: p.read_bytes() for p in m.rglob("*") if p.is_file()}
    assert main(["validate", "--from-measured", str(m), "--out", str(m)]) == 2
    assert f"--out {m}: the input --from-measured {m}, whose files" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in m.rglob("*") if p.is_file()} == before
