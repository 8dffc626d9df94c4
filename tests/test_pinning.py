"""Pinning a user's host (issue 51): calibrate reads the workload its bench files hold and
takes simulate's options, several runs fit together (the host apart from the device, and its
per-request costs apart from its fixed ones), advise names the run that narrows its answer
most, the user's own acceptance replaces a borrowed one, and one nominal host serves simulate,
sweep and advise.

Small workloads throughout (a few prompts, short outputs): behaviour and invariants, not the
numbers of docs/reports/2026-12-07-pinning.md (which has them, with their commands)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stepgap.cli import main
from stepgap.sim.bands import NOMINAL_CPU, band_inputs
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from stepgap.sim.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
NEW_USER = ROOT / "tests/data/new-user"
SMALL = dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", workload="mtbench",
             num_prompts=6, output_len=32)
CAL = ["--gpu", "h100", "--model", "llama-3.1-8b", "--draft", "llama-3.1-8b-eagle3",
       "--trace", "mtbench", "--output-len", "32"]


def bench_file(path: Path, res: dict, conc: int, **metadata) -> str:
    """A `vllm bench serve --save-result` file (without --save-detailed) of a run result."""
    doc = {"date": "20260101-000000", "backend": "vllm",
           "model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": res["completed"],
           "completed": res["completed"], "request_rate": "inf", "burstiness": 1.0,
           "max_concurrency": conc, "duration": res["duration"],
           "total_input_tokens": res["total_input_tokens"],
           "total_output_tokens": res["total_output_tokens"],
           **{m: res[m] for m in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms",
                                  "mean_ttft_ms")}, **metadata}
    path.write_text(json.dumps(doc))
    return str(path)


def truth(tmp_path, conc: int, k: int, host: dict, name: str, mode="sync") -> str:
    """A 'measured' run: the simulator on a known host (SimConfig settings of it)."""
    res = simulate(SimConfig(**{**SMALL, "k": k, "max_concurrency": conc, "mode": mode,
                                **host}))[0]
    return bench_file(tmp_path / name, res, conc, num_speculative_tokens=str(k), mode=mode)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# -- calibrate reads the run it is given ------------------------------------------------------


def test_a_file_without_per_request_lists_is_simulated_at_its_token_totals():
    """The issue's file: 200 prompts of 1,024 tokens, no --save-detailed, no workload given."""
    from stepgap.calibrate.bench_fit import load_bench_runs, setup_of
    from stepgap.cli import build_parser
    args = build_parser().parse_args(["calibrate", str(NEW_USER / "sync-k4-c1.json"), *CAL[:6],
                                      "-k", "4", "--out", "/tmp/unused.json"])
    runs = load_bench_runs(args.measured, args, setup_of(args))
    assert {r.prompt_len for r in runs[0].requests} == {1024}
    assert {r.output_len for r in runs[0].requests} == {128}
    assert len(runs[0].requests) == 200


def test_calibrate_takes_the_models_context_as_its_max_model_len_as_vllm():
    from stepgap.calibrate.bench_fit import setup_of
    from stepgap.cli import build_parser
    args = build_parser().parse_args(["calibrate", "x.json", *CAL, "--out", "p.json"])
    assert setup_of(args)["max_model_len"] == 131072
    args = build_parser().parse_args(["calibrate", "x.json", *CAL, "--max-model-len", "4096",
                                      "--out", "p.json"])
    assert setup_of(args)["max_model_len"] == 4096


@pytest.mark.parametrize("option, says", [
    (["--dataset-name", "random", "--random-input-len", "128"],
     "field 'total_input_tokens': 204,800 (1,024 tokens per prompt), but the workload random"),
    (["--output-len", "256"], "field 'total_output_tokens': 25,600 (128 tokens per output), "
                              "but --output-len 256 gives 256"),
    (["--request-rate", "4"], "field 'request_rate': 'inf', but --request-rate is 4.0"),
    (["--num-prompts", "100"], "field 'num_prompts': 200, but --num-prompts is 100"),
    (["--burstiness", "0.5"], "field 'burstiness': 1.0, but --burstiness is 0.5"),
])
def test_a_command_line_that_contradicts_the_file_is_refused_naming_both(tmp_path, capsys,
                                                                        option, says):
    out = tmp_path / "p.json"
    assert main(["calibrate", str(NEW_USER / "sync-k4-c1.json"), *CAL[:6], "-k", "4", *option,
                 "--out", str(out)]) == 2
    assert says in one_line_error(capsys)
    assert not out.exists()


def test_the_dataset_a_file_records_is_its_workload(tmp_path):
    from stepgap.calibrate.bench_fit import recorded_workload
    doc = {"dataset_name": "random", "random_input_len": "512", "random_output_len": "64"}
    assert recorded_workload(tmp_path / "b.json", doc) == ("random:input_len=512", 64)
    assert recorded_workload(tmp_path / "b.json", {}) == (None, None)


def test_calibrate_on_timelines_refuses_a_workload_option_it_would_not_read(tmp_path, capsys):
    assert main(["calibrate", str(ROOT / "tests/data/vllm"), "--model",
                 str(ROOT / "checkpoints/pystdlib/target"), "--dataset-name", "random",
                 "--out", str(tmp_path / "p.json")]) == 2
    assert "--dataset-name: calibrate on vLLM timelines reads" in one_line_error(capsys)


def test_a_host_factor_outside_its_documented_range_is_warned_with_the_range(tmp_path, capsys):
    run = truth(tmp_path, 1, 3, {"cpu_scale": 6.0}, "slow-host.json")
    prof = tmp_path / "p.json"
    assert main(["calibrate", run, *CAL, "--out", str(prof)]) == 0
    err = capsys.readouterr().err
    assert "warning: the host's CPU factor x 6.0" in err and "x 1 to x 3.1" in err
    assert load_profile(prof).notes["warnings"]


def test_a_run_the_device_alone_explains_calibrates_within_the_fits_bounds(tmp_path, capsys):
    # a device 5 % faster than the roofline and almost no host: one cell's CPU factor solved to
    # ~0 and its band's top, as a factor of it, to x 4.4e6, past what a profile may hold
    # (advise's next run on an H100 then ended in an error)
    run = truth(tmp_path, 1, 3, {"cpu_scale": 1e-7, "speed": 0.95}, "no-host.json")
    prof = tmp_path / "p.json"
    assert main(["calibrate", run, *CAL, "--out", str(prof)]) == 0
    split = load_profile(prof).notes["bands"]["split"]
    assert split["high"]["cpu"] <= 3.1 / 1e-3   # the band's top over the fit's floor, x 1e-3
    assert "x 1 to x 3.1" in capsys.readouterr().err   # the factor is warned about


# -- several runs ---------------------------------------------------------------------------


def test_three_cells_over_two_loads_fit_the_fixed_and_per_request_cpu_apart(tmp_path):
    from stepgap.calibrate.bench_fit import Host
    host = Host(2.0, 1.05, 4.0).settings()
    runs = [truth(tmp_path, c, k, host, f"k{k}-c{c}.json") for k, c in ((3, 1), (0, 4), (3, 4))]
    prof = tmp_path / "p.json"
    assert main(["calibrate", *runs, *CAL, "--out", str(prof)]) == 0
    cal = load_profile(prof).about["calibration"]
    assert cal["cpu_scale"] == pytest.approx(2.0, rel=0.05)
    assert cal["per_request_scale"] == pytest.approx(4.0, rel=0.1)
    assert cal["roofline_level"] == pytest.approx(1.05, rel=0.01)


def test_a_run_far_from_the_others_is_named_with_its_residual_not_refused(tmp_path, capsys):
    host = {"cpu_scale": 2.0}
    runs = [truth(tmp_path, 1, k, host, f"k{k}.json") for k in (3, 0, 1)]
    odd = json.loads(Path(runs.pop()).read_text())
    odd["mean_itl_ms"] *= 1.2
    odd["mean_tpot_ms"] *= 1.2
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    prof = tmp_path / "p.json"
    assert main(["calibrate", *runs, str(tmp_path / "odd.json"), *CAL, "--out",
                 str(prof)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'odd.json'}: the fit of all 3 runs misses its mean ITL by -1" \
        in err
    residuals = {r["run"]: r["mean_itl_ms"] for r in load_profile(prof).notes["residuals"]}
    assert residuals["odd.json"] < -0.1   # (about 1 / 1.2 - 1)
    assert abs(residuals["k3.json"]) < 0.03 and abs(residuals["k0.json"]) < 0.03


def test_a_sync_and_an_async_run_pin_the_device_the_async_one_hides_the_host(tmp_path):
    host = {"cpu_scale": 2.0 / 1.05, "speed": 1.05}
    runs = [truth(tmp_path, 1, 3, host, "sync.json"),
            truth(tmp_path, 1, 3, host, "async.json", mode="async")]
    prof = tmp_path / "p.json"
    assert main(["calibrate", *runs, *CAL, "--out", str(prof)]) == 0
    p = load_profile(prof)
    assert p.roofline_level == pytest.approx(1.05, rel=0.01)
    assert p.about["calibration"]["cpu_scale"] == pytest.approx(2.0, rel=0.1)


# -- advise names the next run --------------------------------------------------------------


@pytest.fixture(scope="module")
def one_run_profile(tmp_path_factory):
    """A profile calibrated on one sync run at concurrency 1 (its split left open)."""
    tmp = tmp_path_factory.mktemp("one-run")
    run = truth(tmp, 1, 3, {"cpu_scale": 2.0}, "sync-k3-c1.json")
    prof = tmp / "p.json"
    assert main(["calibrate", run, *CAL, "--out", str(prof)]) == 0
    return str(prof)


def test_advise_names_the_run_that_narrows_its_band_and_the_band_after_it(one_run_profile,
                                                                           tmp_path, capsys,
                                                                           monkeypatch):
    out = tmp_path / "a.json"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)   # a terminal: the bars show
    assert main(["advise", "--profile", one_run_profile, "--model", "llama-3.1-8b", "--draft",
                 "llama-3.1-8b-eagle3", "--trace", "mtbench", "--num-prompts", "4",
                 "--output-len", "24", "--max-concurrency", "1", "--max-k", "3", "-j", "1",
                 "--result-json", str(out)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "The next run to make" in text and "vllm bench serve" in text
    assert "advise: the next run" in captured.err   # its calibrations have a bar of their own
    nxt = json.loads(out.read_text())["next_run"]
    assert nxt["input"] == "split"
    # the run already made is not proposed again
    assert {"k": 3, "max_concurrency": 1, "mode": "sync"} in nxt["made"]
    assert all(c != nxt["made"][0] for c in nxt["candidates"])
    # the one named leaves the narrowest band (the cheapest within 10 % of it)
    widths = [c["width"] for c in nxt["candidates"]]
    assert nxt["width_after"] <= min(widths) * 1.1 + 1e-12
    assert nxt["width_after"] < nxt["width_now"]


def test_the_answer_and_its_next_run_are_the_same_bytes_over_two_processes(one_run_profile,
                                                                          tmp_path):
    """advise's cells and the next run's calibrations run over --jobs processes, finishing in
    any order: the result file is the one a single process writes."""
    outs = []
    for jobs in ("1", "2"):
        outs.append(tmp_path / f"j{jobs}.json")
        assert main(["advise", "--profile", one_run_profile, "--model", "llama-3.1-8b",
                     "--draft", "llama-3.1-8b-eagle3", "--trace", "mtbench", "--num-prompts",
                     "4", "--output-len", "24", "--max-concurrency", "1", "4", "--max-k", "2",
                     "-j", jobs, "--quiet", "--result-json", str(outs[-1])]) == 0
    assert json.loads(outs[0].read_text())["next_run"]["candidates"]
    assert outs[0].read_bytes() == outs[1].read_bytes()


def test_projected_runs_calibrate_back_to_the_host_they_were_made_on(tmp_path):
    from stepgap.calibrate.bench_fit import project
    truth_host = {**SMALL, "cpu_scale": 2.0 / 1.05, "speed": 1.05}
    cells = [{"k": 3, "max_concurrency": 1, "mode": "sync"},
             {"k": 3, "max_concurrency": 1, "mode": "async"}]
    p = load_profile(project(truth_host, cells, tmp_path / "p.json"))
    assert p.roofline_level == pytest.approx(1.05, rel=0.01)
    assert p.about["calibration"]["cpu_scale"] == pytest.approx(2.0, rel=0.1)


# -- the user's own acceptance --------------------------------------------------------------


def test_a_bench_files_spec_decode_counters_replace_the_borrowed_acceptance(tmp_path):
    run = NEW_USER / "sync-k4-c1-detailed.json"
    own = {i.name: i for i in band_inputs(dict(model="qwen3-8b", k=4, acceptance=str(run)),
                                          max_k=4)}
    assert "acceptance" not in own
    borrowed = {i.name: i for i in band_inputs(dict(model="qwen3-8b", k=4, acceptance="mtbench"),
                                               max_k=4)}
    assert "borrowed" in borrowed["acceptance"].what
    rates = json.loads(run.read_text())["spec_decode_per_position_acceptance_rates"]
    res = simulate(SimConfig(**{**SMALL, "k": 4, "acceptance": str(run)}))[0]
    assert res["config"]["resolved"]["acceptance_rates"] == rates


def test_an_ingested_acceptance_file_is_the_users_own_not_borrowed(tmp_path):
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"format": "stepgap-acceptance/1", "k": 2, "rates": [0.7, 0.5]}))
    inputs = {i.name: i for i in band_inputs(dict(model="qwen3-8b", k=4, acceptance=str(acc)),
                                             max_k=4)}
    assert "borrowed" not in inputs["acceptance"].what   # positions 3-4: extrapolated only
    assert inputs["acceptance"].min_k == 3


# -- one nominal host, and k = 0 with a drafter ---------------------------------------------


def test_simulate_takes_the_nominal_host_and_says_so(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "-k", "2",
                 "--num-prompts", "2", "--output-len", "16", "--result-json", str(out)]) == 0
    printed = capsys.readouterr()
    assert json.loads(out.read_text())["config"]["cpu_scale"] == NOMINAL_CPU
    assert f"host CPU: stepgap's defaults x {NOMINAL_CPU:g} (the nominal host: " in printed.out


def test_simulate_with_a_cpu_scale_or_a_profile_takes_no_nominal_host(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--cpu-scale", "1",
                 "--num-prompts", "2", "--output-len", "16", "--quiet",
                 "--result-json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["cpu_scale"] == 1.0


def test_a_sweep_cell_takes_the_nominal_host_unless_the_grid_sets_one():
    from stepgap.sim.sweep_grid import build_grid
    sets = ["num_prompts=2", "output_len=8"]
    cells = build_grid(["k=0,1"], sets=sets).cells(keyed=False)
    assert {c.settings["cpu_scale"] for c in cells} == {NOMINAL_CPU}
    cells = build_grid(["cpu_scale=1,3"], sets=sets).cells(keyed=False)
    assert [c.settings["cpu_scale"] for c in cells] == [1, 3]


def test_a_drafter_without_draft_tokens_is_warned_about(tmp_path, capsys):
    assert main(["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--speculative-config",
                 '{"method": "eagle3", "model": "llama-3.1-8b-eagle3"}', "--num-prompts", "2",
                 "--output-len", "8"]) == 0
    err = capsys.readouterr().err
    assert "warning: the drafter llama-3.1-8b-eagle3 is given but no num_speculative_tokens" \
        in err
    assert main(["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--draft",
                 "llama-3.1-8b-eagle3", "-k", "0", "--num-prompts", "2", "--output-len", "8"]) == 0
    assert "num_speculative_tokens is 0" in capsys.readouterr().err
