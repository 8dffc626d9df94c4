"""`stepgap calibrate` (calibrate/vllm_fit.py) and the simulator's vLLM topology (sim/loop.py),
on the fixtures of tests/data/vllm (real vLLM 0.32 output: one sync k=2, concurrency-4 run)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from stepgap.calibrate.vllm import vllm_timeline
from stepgap.calibrate.fit import determined, fit_determined
from stepgap.calibrate.vllm_fit import Run, calibrate_runs, load_runs
from stepgap.sim.profile import save_profile
from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from stepgap.cli import main

DATA = Path(__file__).resolve().parent / "data" / "vllm"
ROOT = DATA.parents[2]
PAIR = ROOT / "checkpoints" / "pystdlib"
HOOKS = sorted((DATA / "hooks").glob("*.jsonl"))


def test_only_the_columns_that_vary_independently_are_determined():
    n = 12
    reqs = np.full(n, 4.0)                 # one concurrency: requests never vary
    tokens = np.arange(n) * 3.0 + 12
    x = np.column_stack([np.ones(n), reqs, tokens])
    assert determined(x) == [True, False, True]
    x = np.column_stack([np.ones(n), tokens, 2 * tokens])   # a copy of another column
    assert determined(x) == [True, True, False]
    x = np.column_stack([np.ones(n), np.zeros(n), tokens])
    assert determined(x) == [True, False, True]


def test_a_fit_leaves_what_is_not_determined_at_zero_and_says_so():
    rows = [[1.0, 4.0, t] for t in range(10, 20)]
    ys = [50 + 2 * t for _, _, t in rows]
    coef, err, missing = fit_determined(rows, ys, ("fixed", "per request", "per token"), "op")
    assert coef[1] == 0.0 and coef[0] == pytest.approx(50, rel=1e-6)
    assert coef[2] == pytest.approx(2, rel=1e-6) and err < 1e-6
    assert missing == ["op: per request not determined by the data"]


@pytest.fixture(scope="module")
def fixture_run():
    doc = json.loads((DATA / "bench.json").read_text())
    spans = vllm_timeline(HOOKS)
    return Run("bench", DATA / "bench.json", doc, 2, "sync", 4, (0.0, 1e30), spans=spans)


def test_calibration_fits_what_the_run_determines_and_names_the_rest(fixture_run):
    prof = calibrate_runs([fixture_run])
    ops = {(f.op, f.i) for f in prof.fits}
    assert ops == {("target_forward", None), ("rejection_sample", None), ("draft_forward", 0),
                   ("draft_forward", 1), ("d2h", None)}
    for term in ("schedule", "update_from_output", "prepare_inputs", "launch", "rpc_mid",
                 "rpc_drafts", "process_outputs", "worker_turnaround"):
        assert term in prof.cpu.terms, term
    # every step had 4 requests: no per-request slope, and it says so
    assert any("per request not determined" in m for m in prof.undetermined)
    # without a model config the runs cannot be re-simulated: the levels are not fitted
    assert any(m.startswith("client_latency_us, level") for m in prof.undetermined)
    # the fitted forward reproduces the measured spans' mean
    fwd = [s.end_us - s.start_us for s in fixture_run.spans if s.op == "target_forward"]
    fit = next(f for f in prof.fits if f.op == "target_forward")
    assert fit.coef[0] + 12 * fit.coef[1] + 4 * fit.coef[2] == \
        pytest.approx(np.mean(fwd), rel=0.05)


def test_calibrate_from_the_command_line_then_simulate_another_k(tmp_path, capsys):
    prof = tmp_path / "profile.json"
    assert main(["calibrate", str(DATA), "--model", str(PAIR / "target"), "--draft",
                 str(PAIR / "eagle3"), "--max-num-seqs", "8", "--max-model-len", "256",
                 "--block-size", "128", "--out", str(prof)]) == 0
    out, err = capsys.readouterr()
    assert "fitted on 1 sync runs" in out and "undetermined" in err
    # the profiled run's trace (decode steps cut from a longer run) is matched by what it
    # prefilled, and no run given prefilled none
    assert "worker.pt.trace.json.gz: prefilled 0 prompt tokens, the total of no run" in err
    doc = json.loads(prof.read_text())
    assert doc["calibration"]["with_timelines"] == ["bench"]
    assert doc["level"]["device_ops_scaled_by"] == 1.0   # hook spans: no profiler to undo
    assert [r["run"] for r in doc["residuals"]] == ["bench"]
    res = tmp_path / "k4.json"
    assert main(["simulate", "--profile", str(prof), "--model", str(PAIR / "target"),
                 "--draft", str(PAIR / "eagle3"), "-k", "4", "--async-scheduling",
                 "--trace", str(DATA / "bench.json"), "--max-concurrency", "4",
                 "--save-result", "--result-filename", str(res), "--quiet"]) == 0
    sim = json.loads(res.read_text())
    bench = json.loads((DATA / "bench.json").read_text())
    assert sim["completed"] == bench["completed"]
    assert sim["total_output_tokens"] == sum(bench["output_lens"])


def test_calibrate_refuses_inputs_that_do_not_determine_a_fit(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    shutil.copy(DATA / "bench.json", tmp_path / "runs" / "bench.json")
    assert main(["calibrate", str(tmp_path / "runs"), "--model", str(PAIR / "target"), "--out",
                 str(tmp_path / "p.json")]) != 0
    assert "no timeline for any sync run" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()
    with pytest.raises(UserError, match="no `vllm bench serve --save-result` file"):
        load_runs(list(HOOKS))


# ---------------------------------------------------------------------------------------------
# The simulator's vLLM topology


def vllm_sim(mode, k=2, conc=4, profile=None, **kw):
    cfg = SimConfig(mode=mode, k=k, model=str(PAIR / "target"), draft=str(PAIR / "eagle3"),
                    gpu="cpu", device="cpu", executor="process", topology="vllm",
                    profile=profile, max_num_seqs=8, max_model_len=256, block_size=128,
                    max_concurrency=conc, timeline=True, jitter=False, **kw)
    reqs = [TraceRequest(f"r{i}", 0.0, 40 + 7 * i, 30 + 5 * i) for i in range(8)]
    return reqs, simulate(cfg, reqs)


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory, fixture_run):
    path = tmp_path_factory.mktemp("p") / "profile.json"
    save_profile(path, calibrate_runs([fixture_run]))
    return str(path)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_vllm_topology_shares_one_host_cpu_and_streams_every_token(mode, profile_path):
    reqs, (res, spans) = vllm_sim(mode, profile=profile_path)
    assert res["completed"] == len(reqs)
    assert res["total_output_tokens"] == sum(r.output_len for r in reqs)
    host = sorted((s for s in spans if s.lane in ("cpu.engine", "cpu.frontend")
                   and s.op != "wait"), key=lambda s: s.start_us)
    assert {s.lane for s in host} == {"cpu.engine", "cpu.frontend"}
    # the engine core and the API server share CPU 0: their work never overlaps
    assert all(a.end_us <= b.start_us + 1e-6 for a, b in zip(host, host[1:]))
    steps = {s.step for s in spans if s.op == "target_forward"}
    outs = {s.step for s in spans if s.op == "process_outputs"}
    assert outs <= steps and len(outs) >= 0.9 * len(steps)


def test_async_scheduling_schedules_ahead_of_the_worker(profile_path):
    """Sync: each step is scheduled after the last one's output. Async (vLLM's batch queue of
    2): the next step is scheduled while the worker still runs the one before."""
    from stepgap.calibrate.vllm_fit import ahead_share
    _, (sync, s_spans) = vllm_sim("sync", profile=profile_path)
    _, (asyn, a_spans) = vllm_sim("async", profile=profile_path)
    assert ahead_share(s_spans) == 0.0
    assert ahead_share(a_spans) > 0.9
    assert asyn["mean_itl_ms"] < sync["mean_itl_ms"]


def test_the_mode_of_a_measured_run_is_read_off_its_timeline(fixture_run):
    from stepgap.calibrate.vllm_fit import ahead_share, infer_mode
    assert ahead_share(fixture_run.spans) == 0.0
    assert infer_mode(Run(**{**fixture_run.__dict__, "mode": None})) == "sync"


def test_a_folder_given_skips_other_json_files_with_a_note(tmp_path):
    folder = tmp_path / "runs"
    shutil.copytree(DATA, folder)
    (folder / "notes.json").write_text('{"what": "my own notes"}')
    runs, notes = load_runs([folder])
    assert [r.name for r in runs] == ["bench"]
    assert any("notes.json: skipped, not a `vllm bench serve` file" in n for n in notes)
    with pytest.raises(UserError):   # named on the command line, it must be a bench file
        load_runs([folder / "notes.json"])


def test_a_folder_skips_a_stray_jsonl_with_a_note_and_keeps_its_timeline(tmp_path):
    folder = tmp_path / "runs"
    shutil.copytree(DATA, folder)
    (folder / "trace.jsonl").write_text('{"request_id": "a", "arrival_s": 0}\n')
    runs, notes = load_runs([folder])
    assert runs[0].spans and runs[0].notes == []   # it was "no timeline in its window"
    assert any("trace.jsonl: skipped, not a stepgap_hooks span file" in n for n in notes)
    with pytest.raises(UserError, match=r"trace.jsonl:1: field 'lane': unknown lane None"):
        load_runs([folder / "bench.json", folder / "trace.jsonl"])   # named, it must be one


def test_an_input_given_twice_is_named(tmp_path):
    with pytest.raises(UserError, match=r"trace.json.gz: given twice \(from .*vllm and from "
                                        r".*vllm\); give each input once"):
        load_runs([DATA, DATA])
    with pytest.raises(UserError, match=r"given twice"):
        load_runs([DATA, DATA / "bench.json"])


def test_a_broken_json_in_a_folder_is_named_not_skipped(tmp_path):
    folder = tmp_path / "runs"
    shutil.copytree(DATA, folder)
    (folder / "bench.json").write_text('{"date": "20261201-103126", ')
    with pytest.raises(UserError, match=r"runs/bench.json:1: not valid JSON .*; calibrate reads "
                                        r"each .json of a folder as a `vllm bench serve` file"):
        load_runs([folder])
    (folder / "bench.json").write_text('{"date": "20261201-103126"}')   # a key short
    with pytest.raises(UserError, match=r"no `vllm bench serve --save-result` file among the "
                                        r"inputs \(.*runs/bench.json: skipped, not a `vllm "
                                        r"bench serve` file \(it lacks one of"):
        load_runs([folder])


def test_a_bench_depth_past_64_names_the_bench_file_not_an_option(tmp_path, capsys):
    folder = tmp_path / "runs"
    shutil.copytree(DATA, folder)
    doc = json.loads((DATA / "bench.json").read_text())
    (folder / "bench.json").write_text(json.dumps({**doc, "num_speculative_tokens": "65"}))
    out = tmp_path / "p.json"
    assert main(["calibrate", str(folder), "--model", str(PAIR / "target"), "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err
    assert "bench.json: field 'num_speculative_tokens': expected an integer from 0 to 64, got " \
           "'65'" in err and "--num-speculative-tokens" not in err and not out.exists()


@pytest.mark.parametrize("option", ["--max-num-seqs", "--block-size", "--max-model-len"])
def test_calibrates_scheduler_options_refuse_0_rather_than_take_the_default(tmp_path, option,
                                                                          capsys):
    out = tmp_path / "p.json"
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(DATA), "--model", str(PAIR / "target"), option, "0", "--out",
              str(out)])
    assert e.value.code == 2 and not out.exists()
    assert f"argument {option}: must be >= 1, got 0" in capsys.readouterr().err


def test_the_async_terms_estimated_from_sync_fits_follow_the_code_structure():
    from stepgap.calibrate.vllm_fit import estimate_async
    from stepgap.sim.profile import Fit
    cpu_by_k = {0: {"prepare_inputs": [250.0, 5.0, 1.5]},
                2: {"prepare_inputs": [340.0, 30.0, 1.5], "update_from_output": [30.0, 10.0, 0.2]}}
    d2h = [Fit("d2h", None, 0, (60.0, 0.1, 2.0, 0.0), 100, 0.1, "t"),
           Fit("d2h", None, 2, (80.0, 0.2, 9.0, 0.0), 100, 0.1, "t")]
    est = estimate_async(cpu_by_k, d2h)
    # without drafts: the slice copy (nothing), the output copied once more (k = 0's d2h)
    assert est[0] == {"async_prepare": [0.0, 0.0, 0.0], "async_schedule": [0.0, 0.0, 0.0],
                      "async_output": [60.0, 2.0 + 0.1, 0.0]}
    # with drafts: two index sets, each the spec-decode metadata's cost (k=2 over k=0)
    assert est[2]["async_prepare"] == [180.0, 50.0, 0.0]
    assert est[2]["async_output"] == [80.0, 9.0 + 0.2 * 3, 0.0]
    assert est[2]["async_schedule"] == [30.0, 10.0, 0.0]
    assert estimate_async({2: cpu_by_k[2]}, d2h) == {}   # no k = 0 to take the difference from


# ---------------------------------------------------------------------------------------------
# The files as users have them


def test_a_profiled_trace_is_the_whole_timeline_of_the_run_that_prefilled_it(tmp_path):
    """`vllm bench serve --profile` writes its `date` seconds after the trace's last step (the
    profiler's files are written first): the trace is matched by the prompt tokens it prefilled
    and is the run's timeline whole, whatever the bench's clock says."""
    import gzip
    import time
    doc = json.loads(gzip.decompress((DATA / "worker.pt.trace.json.gz").read_bytes()))
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
             and e["name"].startswith("execute_context_")]
    marks[0]["name"] = "execute_context_1(40)_generation_3(9)"   # a prefill of 40 tokens
    (tmp_path / "rank0.1.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    end_s = (doc.get("baseTimeNanoseconds") or 0) / 1e9 + max(
        e["ts"] + e.get("dur", 0) for e in doc["traceEvents"] if e.get("ph") == "X") / 1e6
    bench = json.loads((DATA / "bench.json").read_text())
    bench.update(total_input_tokens=40, date=time.strftime("%Y%m%d-%H%M%S",
                                                           time.localtime(end_s + 9)))
    (tmp_path / "profiled.json").write_text(json.dumps(bench))
    runs, unused = load_runs([tmp_path / "profiled.json", tmp_path / "rank0.1.pt.trace.json.gz"])
    assert unused == [] and runs[0].notes == []
    assert runs[0].profiled and len({s.step for s in runs[0].spans}) == 8


def test_a_run_without_scrapes_takes_the_acceptance_its_bench_file_recorded(tmp_path):
    shutil.copy(DATA / "bench.json", tmp_path / "bench.json")
    runs, _ = load_runs([tmp_path / "bench.json"])
    doc = json.loads((DATA / "bench.json").read_text())
    assert runs[0].acceptance["rates"] == doc["spec_decode_per_position_acceptance_rates"]
    assert runs[0].acceptance["num_drafts"] == doc["spec_decode_num_drafts"]


def test_profiled_levels_recover_each_ks_level_and_the_cost_per_request_in_flight():
    """Measured ITL = level[k] x simulated + per_request x requests in flight: the least
    squares gives back the levels and the cost the runs were made with."""
    from stepgap.calibrate.vllm_fit import profiled_levels
    runs, sims = [], []
    for k, level in ((0, 0.5), (2, 0.9)):
        for conc, sim in ((1, 6.0 + k), (4, 6.5 + k)):
            doc = {"num_prompts": 48, "mean_itl_ms": level * sim + 0.6 * conc}
            runs.append(Run(f"k{k}c{conc}", Path("x"), doc, k, "sync", conc, (0, 0)))
            sims.append(sim)
    levels, per_request = profiled_levels(runs, sims, has_api_server=False)
    assert levels == pytest.approx({0: 0.5, 2: 0.9}) and per_request == pytest.approx(600)
    # an API-server timeline times the per-request work itself: the levels alone
    assert profiled_levels(runs, sims, has_api_server=True)[1] is None


def test_a_bench_file_with_merged_chunks_says_so_first(tmp_path, capsys):
    assert main(["ingest", "vllm-bench", str(DATA / "bench.json")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("warning: ") and "streamed chunks were merged" in first
    assert "supports TTFT, E2EL and throughput only" in first
    assert main(["calibrate", str(DATA), "--model", str(PAIR / "target"), "--draft",
                 str(PAIR / "eagle3"), "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("warning: bench: its streamed chunks were merged")
    assert not any("TPOT +" in line for line in out)   # no TPOT residual for such a run
