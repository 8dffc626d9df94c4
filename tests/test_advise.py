"""stepgap advise, the bands it rests on (sim/bands.py), calibration on bench files alone
(calibrate/bench_fit.py) and a profile that runs where it was measured.

Small workloads throughout (a few MT-bench prompts, short outputs): what is checked is behaviour and
invariants, not the numbers of the default question (README and docs/reference/advise.md have those,
with their commands)."""

from __future__ import annotations

import json
import os
import math

import pytest

from stepgap.cli import main
from stepgap.common.errors import UserError
from stepgap.sim.bands import Band, band_inputs, combine, int_band
from stepgap.sim.config import SimConfig, profile_defaults
from stepgap.sim.loop import simulate
from stepgap.sim.profile import load_profile

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

# a setup small enough for tests: 6 MT-bench prompts of 48 output tokens
SMALL = dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", workload="mtbench",
             num_prompts=6, output_len=48)


# -- bands --------------------------------------------------------------------------------------


def test_a_band_adds_each_inputs_swing_on_its_side():
    b = combine(10.0, {"cpu": (8.0, 13.0), "device": (11.0, 9.0), "acceptance": (10.0, 10.0)})
    assert (b.low, b.high) == (7.0, 14.0)   # 10 - 2 - 1, 10 + 3 + 1
    assert b.dominant == ["cpu", "device"]   # acceptance moved nothing


def test_a_best_k_band_is_the_range_of_the_best_k_not_a_sum():
    b = int_band(5, [4, 6, 5, 7])
    assert (b.value, b.low, b.high) == (5, 4, 7)


def test_the_default_setup_bands_the_host_the_device_and_the_extrapolated_acceptance():
    inputs = {i.name: i for i in band_inputs(dict(SMALL, cpu_scale=2.42), max_k=8)}
    assert set(inputs) == {"cpu", "device", "acceptance", "dataset", "drafter"}
    # MT-bench's own published spread (2.61 to 2.79 at k = 3) around the default profile
    assert inputs["dataset"].low < 0 < inputs["dataset"].high
    assert inputs["drafter"].low < inputs["drafter"].nominal == 1.0 < inputs["drafter"].high
    assert (inputs["cpu"].low, inputs["cpu"].nominal, inputs["cpu"].high) == (1.0, 2.42, 3.1)
    assert inputs["device"].low < 1 < inputs["device"].high
    # mtbench measured 7 positions: the band moves runs with k >= 8 only
    assert inputs["acceptance"].min_k == 8 and not inputs["acceptance"].applies(7)
    assert "acceptance" not in {i.name for i in band_inputs(dict(SMALL), max_k=7)}


def test_an_input_end_at_the_nominal_value_is_the_nominal_run():
    cpu = next(i for i in band_inputs(dict(SMALL, cpu_scale=1.0)) if i.name == "cpu")
    base = dict(SMALL, cpu_scale=1.0)
    assert cpu.settings(base, "low") == base


def test_a_borrowed_acceptance_gets_a_band_from_k_1():
    inputs = {i.name: i for i in band_inputs(dict(model="qwen3-30b-a3b", k=3), max_k=4)}
    acc = inputs["acceptance"]
    assert acc.min_k == 1 and "borrowed" in acc.what
    low = SimConfig(**acc.settings(dict(model="qwen3-30b-a3b", k=3), "low")).acceptance_rates
    high = SimConfig(**acc.settings(dict(model="qwen3-30b-a3b", k=3), "high")).acceptance_rates
    assert all(lo < hi for lo, hi in zip(low, high))


def test_measured_tables_band_the_device_by_their_error_only():
    bundle = "traces/peers/llmservingsim/profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16"
    device = next(i for i in band_inputs(dict(gpu="rtx4090", device_profile=bundle))
                  if i.name == "device")
    assert (device.low, device.high) == (0.99, 1.01)


def test_simulate_band_puts_every_metric_inside_its_band(tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "-k", "3",
                 "--num-prompts", "4", "--output-len", "32", "--band", "--quiet",
                 "--result-json", str(out)]) == 0
    res = json.loads(out.read_text())
    names = {i["name"] for i in res["bands"]["inputs"]}
    assert names == {"cpu", "device", "dataset", "drafter"}
    for m, b in res["bands"]["metrics"].items():
        assert b["low"] <= b["value"] <= b["high"], m
        assert b["value"] == pytest.approx(res[m], rel=1e-3)
    assert res["bands"]["metrics"]["mean_tpot_ms"]["dominant"]


def test_sweep_band_adds_each_cells_band_and_what_dominates_it(tmp_path):
    assert main(["sweep", "--set", "num_prompts=3", "--set", "output_len=24",
                 "--grid", "mode=sync,async", "--grid", "k=0,2", "--band", "--jobs", "1",
                 "--out", str(tmp_path), "--quiet"]) == 0
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    for r in rows:
        assert r["mean_tpot_ms_low"] <= r["mean_tpot_ms"] <= r["mean_tpot_ms_high"]
        assert r["band_dominant"].startswith("mean_tpot_ms: ")
    header = (tmp_path / "sweep.csv").read_text().splitlines()[0].split(",")
    assert "mean_itl_ms_high" in header and "band_dominant" in header


# -- advise -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def advice():
    from stepgap.sim.advise import advise, loads_of
    base = SimConfig(**SMALL, cpu_scale=2.42).to_dict()
    return advise(base, loads_of([1, 4], None), [0, 1, 2], jobs=1)


def test_two_processes_give_the_answer_one_gives_and_end_with_it(advice, monkeypatch):
    from stepgap.sim import advise as mod
    from stepgap.sim import sweep_runners
    ended = []
    real = sweep_runners.local_pool

    def pool(jobs):   # its processes, as the last column left them
        ex = real(jobs)
        shutdown = ex.shutdown
        ex.shutdown = lambda *a, **kw: ended.append(list(ex._processes.values())) or \
            shutdown(*a, **kw)
        return ex
    monkeypatch.setattr(sweep_runners, "local_pool", pool)
    base = SimConfig(**SMALL, cpu_scale=2.42).to_dict()
    two = mod.advise(base, mod.loads_of([1, 4], None), [0, 1, 2], jobs=2)
    assert two.to_dict() == advice.to_dict()
    assert [c["mode"] for c in two.cells] == [c["mode"] for c in advice.cells]   # in one order
    assert len(ended) == 1 and len(ended[0]) == 2
    assert not any(p.is_alive() for p in ended[0])


def test_each_modes_best_k_is_the_smallest_mean_tpot_of_its_grid(advice):
    for a in advice.answers:
        for mode, m in a.modes.items():
            best = int(m.best_k.value)
            assert all(m.grid[best] <= v for v in m.grid.values()), (a.label, mode)


def test_the_grid_is_what_the_simulator_gives_for_the_same_cell(advice):
    cfg = SimConfig(**{**SMALL, "cpu_scale": 2.42, "mode": "async", "k": 2,
                       "max_concurrency": 4})
    assert advice.answers[1].modes["async"].grid[2] == simulate(cfg)[0]["mean_tpot_ms"]


def test_every_number_lies_inside_its_band(advice):
    for a in advice.answers:
        bands = [a.async_saving, a.zero_bubble_saving]
        for m in a.modes.values():
            bands += [m.best_k, m.tpot_ms, m.speedup]
        for b in bands:
            assert b.low <= b.value <= b.high


def test_the_async_saving_is_each_mode_at_its_own_best_k(advice):
    a = advice.answers[0]
    s, y = a.modes["sync"], a.modes["async"]
    assert a.async_saving.value == pytest.approx(
        1 - y.grid[int(y.best_k.value)] / s.grid[int(s.best_k.value)])


def test_a_best_k_at_the_top_of_the_range_is_warned_about(advice):
    edge = [w for a in advice.answers for w in a.warnings if "deepest tried" in w]
    top = [a for a in advice.answers for m in ("sync", "async")
           if a.modes[m].best_k.value == 2]
    assert bool(edge) == bool(top)


def test_the_result_json_holds_the_answer_and_what_it_rests_on(advice):
    doc = advice.to_dict()
    assert doc["format"] == "stepgap-advise/1"
    assert {"device", "acceptance", "cpu", "seed"} <= set(doc["rests_on"])
    assert doc["rests_on"]["acceptance"]["measured_depth"] == 7
    load = doc["loads"][0]
    assert {"sync", "async", "zero_bubble", "async_saving", "zero_bubble_saving",
            "warnings"} <= set(load)
    assert {"value", "low", "high", "dominant"} <= set(load["async_saving"])
    assert {i["name"] for i in doc["band_inputs"]} == {"cpu", "device", "dataset", "drafter"}


def test_advise_prints_what_it_rests_on_and_writes_its_figure(tmp_path, capsys):
    out, fig = tmp_path / "a.json", tmp_path / "a.png"
    assert main(["advise", "--model", "llama-3.1-8b", "--gpu", "h100", "--num-prompts", "3",
                 "--output-len", "24", "--max-concurrency", "1,2", "--max-k", "2", "--jobs", "1",
                 "--no-band", "--result-json", str(out), "--plot", str(fig)]) == 0
    text = capsys.readouterr().out
    for line in ("What the answer rests on:", "device      the roofline of the h100",
                 "CPU costs   stepgap's defaults x 2.42", "seed        0"):
        assert line in text
    assert fig.read_bytes()[:4] == b"\x89PNG"
    assert [ld["load"] for ld in json.loads(out.read_text())["loads"]] == \
        [{"max_concurrency": 1}, {"max_concurrency": 2}]


@pytest.mark.parametrize("args, says", [
    (["--max-concurrency", ","], "--max-concurrency: the load list is empty"),
    (["--max-concurrency", "0"], "--max-concurrency '0'"),
    (["--request-rate", "x"], "--request-rate 'x'"),
    (["--gpu", "nope", "--max-concurrency", "1"], "unknown device 'nope'"),
    (["--max-concurrency", "1,,2"], "--max-concurrency '1,,2': an empty value between commas"),
    (["--max-concurrency", "1", "2", "1"], "--max-concurrency: '1' is given twice"),
    (["--request-rate", "2", "2.0"], "--request-rate: '2.0' is given twice (as '2' before)"),
])
def test_bad_input_to_advise_is_one_line_and_status_2(args, says, capsys):
    assert main(["advise", "--num-prompts", "2", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


# -- calibrate on bench files -------------------------------------------------------------------


def bench_file(path, res: dict, conc: int, model_id="meta-llama/Llama-3.1-8B-Instruct",
               **metadata) -> str:
    """A `vllm bench serve --save-result` file holding a run result's numbers."""
    doc = {"date": "20260101-000000", "backend": "vllm", "model_id": model_id,
           "num_prompts": res["completed"], "completed": res["completed"], "request_rate": "inf",
           "burstiness": 1.0, "max_concurrency": conc, "duration": res["duration"],
           **{m: res[m] for m in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms",
                                  "mean_ttft_ms")}, **metadata}
    path.write_text(json.dumps(doc))
    return str(path)


CAL = ["--gpu", "h100", "--model", "llama-3.1-8b", "--draft", "llama-3.1-8b-eagle3",
       "--trace", "mtbench", "--output-len", "48"]


def truth(tmp_path, conc: int, k: int = 3, name="run.json", **kw) -> str:
    """A 'measured' run: the simulator at a known CPU factor 2.0 and device level 1.05."""
    cfg = SimConfig(**{**SMALL, "k": k, "max_concurrency": conc, "cpu_scale": 2.0 / 1.05,
                       "speed": 1.05})
    return bench_file(tmp_path / name, simulate(cfg)[0], conc, num_speculative_tokens=str(k),
                      **kw)


def test_one_cell_fits_the_cpu_and_keeps_the_split_as_the_band(tmp_path):
    run = truth(tmp_path, 1)
    prof = tmp_path / "p.json"
    assert main(["calibrate", run, *CAL, "-k", "3", "--out", str(prof)]) == 0
    p = load_profile(prof)
    assert p.roofline_level == 1.0   # one cell: the catalog's level, the CPU fitted to it
    split = p.notes["bands"]["split"]
    assert split["low"]["cpu"] < 1 < split["high"]["cpu"]
    assert any("split" in u for u in p.undetermined)
    res = p.notes["residuals"][0]
    assert abs(res["mean_itl_ms"]) < 2e-3 and abs(res["mean_tpot_ms"]) < 5e-3


def test_two_cells_tell_the_host_from_the_device(tmp_path):
    runs = [truth(tmp_path, 1, 3, "c1.json"), truth(tmp_path, 4, 0, "c4.json")]
    prof = tmp_path / "p.json"
    assert main(["calibrate", *runs, *CAL, "--out", str(prof)]) == 0
    p = load_profile(prof)
    assert p.roofline_level == pytest.approx(1.05, rel=0.02)
    assert p.about["calibration"]["cpu_scale"] == pytest.approx(2.0, rel=0.05)
    split = p.notes["bands"]["split"]
    # within the CPU range of sim/bands.py, 1.0 to 3.1 of the defaults
    cpu = p.about["calibration"]["cpu_scale"]
    assert 1.0 - 1e-3 <= cpu * split["low"]["cpu"] < cpu < cpu * split["high"]["cpu"] <= 3.1 + 1e-3


@pytest.mark.parametrize("args, extra, says", [
    (["--model", "llama-3.2-1b", "-k", "3"], {}, "'meta-llama/Llama-3.1-8B-Instruct', but --model is "
                                       "'llama-3.2-1b'"),
    (["-k", "2"], {"num_speculative_tokens": "3"}, "'num_speculative_tokens': 3, but "
                                                   "--num-speculative-tokens is 2"),
    (["-k", "3", "--max-concurrency", "4"], {}, "'max_concurrency': 1, but --max-concurrency is 4"),
    (["-k", "3", "--gpu", "nope"], {}, "unknown device 'nope'"),
])
def test_a_bench_file_that_disagrees_with_the_command_line_is_refused(tmp_path, capsys, args,
                                                                     extra, says):
    res = {"completed": 4, "duration": 1.0, "mean_tpot_ms": 3.0, "p99_tpot_ms": 4.0,
           "mean_itl_ms": 9.0, "p99_itl_ms": 9.5, "mean_ttft_ms": 20.0}
    run = bench_file(tmp_path / "b.json", res, 1, **extra)
    cal = [a for a in CAL if a not in ("--model", "llama-3.1-8b")] + \
        ([] if "--model" in args else ["--model", "llama-3.1-8b"])
    if "--gpu" in args:
        cal = [a for a in cal if a not in ("--gpu", "h100")]
    assert main(["calibrate", run, *cal, *args, "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("how", ["twice", "in its folder", "fifo"])
def test_a_bench_input_given_twice_or_no_file_is_refused_naming_it(tmp_path, capsys, how):
    """Each bench file counts once (a run given twice would weigh twice in the fit), and a
    FIFO is named for what it is, not read (a read would block)."""
    res = {"completed": 4, "duration": 1.0, "mean_tpot_ms": 3.0, "p99_tpot_ms": 4.0,
           "mean_itl_ms": 9.0, "p99_itl_ms": 9.5, "mean_ttft_ms": 20.0}
    (tmp_path / "runs").mkdir()
    run = bench_file(tmp_path / "runs" / "b.json", res, 1, num_speculative_tokens="3")
    inputs = {"twice": [run, run], "in its folder": [run, str(tmp_path / "runs")]}.get(how)
    if how == "fifo":
        os.mkfifo(tmp_path / "pipe.json")
        inputs = [str(tmp_path / "pipe.json")]
    out = tmp_path / "out" / "p.json"
    assert main(["calibrate", *inputs, *CAL, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    says = "a FIFO, not a regular file" if how == "fifo" else "given twice"
    assert len(err) == 1 and says in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("itl, says", [(1e-6, "at no host CPU at all it simulates"),
                                       (5000.0, "at 50 x the default CPU costs it simulates")])
def test_a_mean_itl_no_host_of_this_setup_reaches_is_refused_naming_the_file(
        tmp_path, capsys, itl, says):
    """A run this GPU and model cannot give (another GPU's, or a wrong number): the fit runs
    into its bounds and misses it; one line naming the file and field, no profile."""
    res = dict(simulate(SimConfig(**{**SMALL, "k": 3, "max_concurrency": 1}))[0])
    res["mean_itl_ms"], res["mean_tpot_ms"] = itl, itl / 3
    res["duration"] = 1000.0   # (a run that long, for its TPOT to fit in it)
    run = bench_file(tmp_path / "b.json", res, 1, num_speculative_tokens="3")
    out = tmp_path / "p.json"
    assert main(["calibrate", run, *CAL, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run}: field 'mean_itl_ms'" in err[0] and says in err[0], err
    assert not out.exists()


def test_a_bench_files_model_id_and_the_command_lines_model_resolve_alike():
    from stepgap.calibrate.bench_fit import model_name
    # an id and the preset it stands for are one model (common/model_presets.py MODEL_IDS)
    assert model_name("meta-llama/Llama-3.1-8B-Instruct") == model_name("llama-3.1-8b")
    assert model_name("Qwen/Qwen3-32B") == model_name("qwen3-32b")
    assert model_name("openai/gpt-oss-20b") == model_name("gpt-oss-20b")
    # an id stepgap does not know: by its name (a local folder of the same model, say)
    assert model_name("meta-llama/Meta-Llama-3.1-8B-Instruct") == model_name("llama-3.1-8b")
    assert model_name("Qwen/Qwen3-8B") != model_name("qwen3-32b")
    assert model_name("meta-llama/Llama-3.2-1B-Instruct") != model_name("llama-3.1-8b")


# -- a profile knows where it was measured ------------------------------------------------------


@pytest.fixture(scope="module")
def l20_profile(tmp_path_factory):
    """A bench-file profile of an L20 run with a measured acceptance."""
    tmp = tmp_path_factory.mktemp("l20")
    cfg = SimConfig(**{**SMALL, "gpu": "l20", "k": 2, "max_concurrency": 1, "cpu_scale": 2.0})
    res = simulate(cfg)[0]
    run = bench_file(tmp / "run.json", res, 1,
                     spec_decode_per_position_acceptance_rates=[0.8, 0.6])
    prof = tmp / "p.json"
    assert main(["calibrate", run, *[a if a != "h100" else "l20" for a in CAL], "-k", "2",
                 "--out", str(prof)]) == 0
    return str(prof)


def test_a_profile_runs_the_device_and_acceptance_it_was_measured_with(l20_profile, tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--profile", l20_profile, "--model", "llama-3.1-8b", "-k", "3",
                 "--num-prompts", "3", "--output-len", "24", "--quiet",
                 "--result-json", str(out)]) == 0
    cfg = json.loads(out.read_text())["config"]
    assert cfg["gpu"] == "l20" and cfg["resolved"]["device"] == "cuda"
    assert cfg["acceptance_rates"] == [0.8, 0.6]
    assert not any("measured on" in n for n in cfg["resolved"]["notes"])


def test_another_device_with_a_profile_is_a_choice_the_result_states(l20_profile, tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--profile", l20_profile, "--gpu", "h100", "--acceptance",
                 "mtbench", "--model", "llama-3.1-8b", "-k", "3", "--num-prompts", "3",
                 "--output-len", "24", "--quiet", "--result-json", str(out)]) == 0
    notes = json.loads(out.read_text())["config"]["resolved"]["notes"]
    assert any("measured on l20" in n and "--gpu h100" in n for n in notes)


def test_measured_tables_price_the_device_under_a_profiles_level(l20_profile):
    """--device-profile with a bench-file profile: the tables price the device ops (over the
    plain roofline, not the level of the profile's own device), the profile the CPU."""
    from stepgap.sim.plan import resolve
    bundle = (ROOT / "traces/peers/llmservingsim/profiler/perf/RTX4090/meta-llama/"
              "Llama-3.1-8B/bf16")
    cfg = SimConfig(**{**SMALL, "gpu": "rtx4090", "k": 2, "max_concurrency": 1,
                       "profile": l20_profile, "device_profile": str(bundle)})
    res = simulate(cfg)[0]
    assert res["completed"] == SMALL["num_prompts"]
    assert any("gives the CPU costs only" in n for n in resolve(cfg).notes)
    plain = simulate(SimConfig(**{**SMALL, "gpu": "rtx4090", "k": 2, "max_concurrency": 1,
                                  "device_profile": str(bundle)}))[0]
    assert res["mean_tpot_ms"] != plain["mean_tpot_ms"]   # the profile's CPU costs count


def test_profile_defaults_fill_only_what_was_not_given(l20_profile):
    settings, notes = profile_defaults({"profile": l20_profile, "acceptance": "mtbench"},
                                       {"acceptance"})
    assert settings["gpu"] == "l20" and "acceptance_rates" not in settings
    assert notes and "measured its acceptance" in notes[0]


def test_a_profile_keeps_its_level_and_acceptance_when_read_and_written(l20_profile, tmp_path):
    from stepgap.sim.profile import save_profile
    p = load_profile(l20_profile)
    save_profile(tmp_path / "again.json", p)
    assert (tmp_path / "again.json").read_text() == open(l20_profile).read()
    assert p.acceptance() == ((0.8, 0.6), 0.0)


def test_a_profile_with_a_bad_level_is_refused(l20_profile, tmp_path):
    doc = json.loads(open(l20_profile).read())
    doc["roofline_level"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(UserError, match="roofline_level"):
        load_profile(bad)


def test_the_seed_bench_files_hold_the_prs_numbers():
    from stepgap.common.vllm_bench import read_bench
    from stepgap.sim.presets import get_preset
    measured = get_preset("seed-l20").measured
    for mode in ("sync", "async"):
        doc = read_bench(f"traces/seed/vllm-pr25872-{mode}.json")
        assert {m: doc[m] for m in measured[mode]} == measured[mode]
        assert doc["max_concurrency"] == 1 and doc["num_prompts"] == 80
        assert not math.isnan(doc["duration"])


def test_combine_of_no_inputs_is_the_value():
    assert combine(3.0, {}) == Band(3.0, 3.0, 3.0, {})


def test_zero_bubble_is_simulated_wherever_it_could_beat_async(advice):
    """The ks zero-bubble skips could not have beaten async's best: the full grid agrees."""
    from stepgap.sim.advise_report import MODES
    for a in advice.answers:
        zb = a.modes["zero-bubble"].grid
        full = {k: simulate(SimConfig(**{**SMALL, "cpu_scale": 2.42, "mode": "zero-bubble",
                                         "k": k, **a.load}))[0]["mean_tpot_ms"]
                for k in zb}
        assert min(full, key=full.get) == int(a.modes["zero-bubble"].best_k.value)
        assert all(zb[k] == full[k] for k in zb if math.isfinite(zb[k]))
    assert "zero-bubble" in MODES


# -- data and expert parallelism ---------------------------------------------------------------

# a small MoE setup: Qwen3-30B-A3B on H100s with expert parallelism, 8 MT-bench prompts
MOE = dict(gpu="h100", model="qwen3-30b-a3b", workload="mtbench", num_prompts=8, output_len=32,
           cpu_scale=2.42, enable_expert_parallel=True)


@pytest.fixture(scope="module")
def moe_advice():
    """advise at data_parallel_size 1 and 2 (nominal answers: the bands' machinery is the
    dense setup's, checked above)."""
    from stepgap.sim.advise import advise, loads_of
    return {dp: advise(SimConfig(**MOE, data_parallel_size=dp).to_dict(), loads_of([8], None),
                       [0, 1, 2], band=False, jobs=1) for dp in (1, 2)}


@pytest.mark.parametrize("dp", [1, 2])
def test_advise_runs_every_cell_at_its_data_parallel_size(moe_advice, dp):
    """Every cell advise ran is the setup's DP size; its grid is what the simulator gives for
    the same cell, a DP 2 one routing the requests over both engine cores."""
    advice = moe_advice[dp]
    assert {c.get("data_parallel_size", 1) for c in advice.cells} == {dp}
    res = simulate(SimConfig(**MOE, data_parallel_size=dp, mode="async", k=2,
                             max_concurrency=8))[0]
    assert advice.answers[0].modes["async"].grid[2] == res["mean_tpot_ms"]
    ranks = res["config"]["resolved"].get("data_parallel")
    if dp == 1:
        assert ranks is None
    else:
        assert ranks["size"] == 2 and sum(ranks["requests"]) == 8 and min(ranks["requests"]) > 0
        assert ranks["lockstep"]   # a MoE target's ranks meet at every forward


def test_advise_says_the_data_and_expert_parallelism_it_rests_on(moe_advice):
    one, two = moe_advice[1].rests_on, moe_advice[2].rests_on
    assert (one["data_parallel_size"], one["expert_parallel"]) == (1, False)   # EP on one GPU
    assert (two["data_parallel_size"], two["expert_parallel"]) == (2, True)
    assert "expert-parallel over 2 GPUs" in two["device"]
    assert "expert-parallel" not in one["device"]
    # two engine cores answer otherwise than one: the grids differ at every k
    g1, g2 = (moe_advice[dp].answers[0].modes["async"].grid for dp in (1, 2))
    assert all(g1[k] != g2[k] for k in g1)


def test_advise_takes_vllms_data_and_expert_parallel_options(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert main(["advise", "--model", "qwen3-30b-a3b", "--gpu", "h100", "-dp", "2", "-ep",
                 "--trace", "mtbench", "--num-prompts", "4", "--output-len", "16",
                 "--max-concurrency", "4", "--max-k", "1", "--jobs", "1", "--no-band",
                 "--result-json", str(out)]) == 0
    assert "qwen3-30b-a3b + qwen3-30b-a3b-eagle3 (eagle3) on h100 x 2 (DP), expert parallel" \
        in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["setup"]["data_parallel_size"] == 2 and doc["setup"]["enable_expert_parallel"]


def test_a_profiles_level_prices_a_moe_target_under_data_parallelism(l20_profile):
    """A bench-file profile (CPU costs and a device level, no fits) serves a DP group as it
    serves TP: its level over the roofline, the MoE blocks' expert parallelism under it."""
    base = dict(MOE, profile=l20_profile, k=2, data_parallel_size=2)
    ep = simulate(SimConfig(**base))[0]
    no = simulate(SimConfig(**{**base, "enable_expert_parallel": False}))[0]
    src = ep["config"]["resolved"]["device_costs"]
    assert src["target_forward"].startswith("roofline x ")
    assert "expert-parallel over 2 GPUs" in src["moe"]
    assert "expert-parallel" not in no["config"]["resolved"]["device_costs"]["moe"]
    assert ep["mean_tpot_ms"] != no["mean_tpot_ms"]
    fitted = "traces/measured/cpu/profile.json"   # device op fits: one device's, refused
    assert load_profile(fitted).fits
    with pytest.raises(UserError, match="--data-parallel-size > 1"):
        simulate(SimConfig(**{**base, "profile": fitted}))


def test_a_hugging_face_id_bands_as_its_catalog_name():
    """A pasted `vllm serve` line names the model by its Hugging Face id: the bands are the
    catalog name's (the published acceptance is this model's own, not borrowed)."""
    def inputs(model, draft):
        return [(i.name, i.what, i.low, i.high) for i in band_inputs(
            dict(SMALL, model=model, draft=draft, cpu_scale=2.42), max_k=8)]
    assert inputs("meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") \
        == inputs("llama-3.1-8b", "llama-3.1-8b-eagle3")


def test_zero_bubble_is_judged_at_the_k_each_input_end_favours():
    """Where an input's end moves async's best k (here a borrowed acceptance, +-1.1 on the
    logit scale), what zero-bubble adds at that end is zero-bubble at its best against async
    at its best: it never loses more than its fixup, whatever k that end favours."""
    from stepgap.sim.advise import advise, loads_of
    base = SimConfig(**SMALL, cpu_scale=2.42, acceptance="vllm-qwen3-8b-eagle3").to_dict()
    a = advise(base, loads_of([1], None), [0, 1, 2, 3, 4], jobs=1).answers[0]
    moved = a.modes["async"].best_k
    assert moved.low < moved.value or moved.high > moved.value   # the case this is about
    from stepgap.sim.hardware import get_hardware
    from stepgap.sim.roofline import FIXUP_KERNELS
    fixup_ms = FIXUP_KERNELS * get_hardware("h100").kernel_us / 1000
    assert a.zero_bubble_saving.low > -fixup_ms, a.zero_bubble_saving


def test_jobs_past_the_cells_start_no_more_processes_than_cells(monkeypatch):
    from stepgap.sim import advise as mod
    from stepgap.sim import sweep_runners
    sizes = []
    real = sweep_runners.local_pool
    monkeypatch.setattr(sweep_runners, "local_pool", lambda jobs: sizes.append(jobs) or real(jobs))
    base = SimConfig(**SMALL, cpu_scale=2.42).to_dict()
    mod.advise(base, mod.loads_of([1], None), [0, 1], band=False, jobs=10 ** 30)
    assert sizes == [2]   # one load's two columns: sync, and async with zero-bubble


# -- the answer in words ------------------------------------------------------------------------


def answer_of(saving: tuple, zb: tuple = (-0.001, -0.001, 0.0), sync=None, async_=None,
              label: int = 1):
    """A LoadAnswer built by hand: `saving` and `zb` as (value, low, high), each mode's grid
    k -> mean TPOT (its best k and TPOT taken from it)."""
    from stepgap.sim.advise_report import LoadAnswer, ModeAnswer
    from stepgap.sim.advise import best_of
    sync = sync or {0: 3.0, 1: 2.0, 2: 1.9}
    async_ = async_ or {k: v * (1 - saving[0]) for k, v in sync.items()}
    modes = {}
    for m, grid in (("sync", sync), ("async", async_), ("zero-bubble", async_)):
        k = best_of(grid)
        modes[m] = ModeAnswer(Band(k, k, k), Band(grid[k], grid[k], grid[k]),
                              Band(grid[0] / grid[k], grid[0] / grid[k], grid[0] / grid[k]), grid)
    swing = {"cpu": (saving[1] - saving[0], saving[2] - saving[0])}
    return LoadAnswer({"max_concurrency": label}, modes, Band(*saving, swing),
                      Band(*zb, {"cpu": (zb[1] - zb[0], zb[2] - zb[0])}))


@pytest.mark.parametrize("saving, says", [
    ((0.105, 0.036, 0.138), "async: yes, saves 10.5 % (3.6-13.8 %) of TPOT"),
    ((0.031, 0.031, 0.031), "async: yes, saves 3.1 % of TPOT"),
    ((0.02, -0.01, 0.05), "async: maybe, saves 2.0 % (-1.0 to 5.0 %)"),
    ((0.001, -0.002, 0.004), "async: no gain"),
    ((-0.03, -0.05, -0.02), "async: no, costs 3.0 % (2.0-5.0 %) of TPOT"),
])
def test_the_verdict_says_yes_or_no_only_where_the_whole_band_does(saving, says):
    from stepgap.sim.advise_report import verdict
    assert verdict(answer_of(saving)).startswith(says + ";")


def test_the_verdict_gives_every_k_within_1_percent_of_the_best():
    from stepgap.sim.advise_report import verdict
    grid = {0: 3.0, 1: 2.6, 2: 2.5, 3: 2.49, 4: 2.51, 5: 2.53, 6: 2.7}
    v = verdict(answer_of((0.1, 0.05, 0.15), sync=grid))
    assert "; k: 2-4 (within 1 % of the best); zero-bubble: no gain" in v   # 2.53 > 2.49 x 1.01


def test_the_k_range_is_read_in_sync_where_async_does_not_pay():
    from stepgap.sim.advise_report import verdict
    grid = {0: 3.0, 1: 2.0, 2: 2.3}
    v = verdict(answer_of((-0.03, -0.05, -0.02), sync=grid, async_={0: 3.1, 1: 2.06, 2: 2.0}))
    assert "; k: 1 (within 1 % of the best, in sync);" in v


def test_ks_not_in_one_run_are_listed_as_runs():
    from stepgap.sim.advise_report import ks_text
    assert ks_text([2, 4, 5, 6, 8]) == "2, 4-6, 8"


def test_no_warning_says_a_saving_might_not_pay_when_its_band_excludes_zero():
    from stepgap.sim.advise_report import warnings
    sure = warnings(answer_of((0.105, 0.036, 0.138)), [0, 1, 2, 3], [])
    assert not any("pays" in w for w in sure), sure
    unsure = warnings(answer_of((0.02, -0.01, 0.05)), [0, 1, 2, 3], [])
    assert unsure == ["whether async pays rests on cpu: pin the host with one sync run "
                      "(stepgap calibrate BENCH.json --gpu ...) (async saves -1.0 to 5.0 %)"]


def test_a_warning_that_holds_at_every_load_is_printed_once_naming_them(advice):
    from stepgap.sim.advise_cli import format_advice
    text = format_advice(advice)
    block = text.split("Warnings:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(block) == len(set(block))
    edge = [line for line in block if "deepest tried" in line]
    assert edge and all(line.count("conc") >= 1 for line in edge)
    per_load = sum("deepest tried" in w for a in advice.answers for w in a.warnings)
    assert per_load > len(edge)   # the same warning at several loads, printed once


def test_advise_answers_in_words_before_anything_else(advice):
    from stepgap.sim.advise_report import verdict
    from stepgap.sim.advise_cli import format_advice
    lines = format_advice(advice).splitlines()
    assert lines[2].startswith("The answer")
    assert [line.split("  ", 2)[-1].strip() for line in lines[3:5]] == \
        [verdict(a) for a in advice.answers]
    assert lines.index("What the answer rests on:") > 5


def test_your_own_k_and_async_scheduling_are_set_against_the_best(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert main(["advise", "--model", "llama-3.1-8b", "--gpu", "h100", "--num-prompts", "3",
                 "--output-len", "24", "--max-concurrency", "1", "--max-k", "2", "--jobs", "1",
                 "--no-band", "--async-scheduling", "--speculative-config",
                 '{"method": "eagle3", "model": "llama-3.1-8b-eagle3", '
                 '"num_speculative_tokens": 3}', "--result-json", str(out)]) == 0
    text = capsys.readouterr()
    assert "k 0-3: up to your num_speculative_tokens 3" in text.err   # the range grew to it
    assert "Your setup: async, k=3 (your --async-scheduling; your num_speculative_tokens);" \
        in text.out
    doc = json.loads(out.read_text())
    mine = doc["yours"]["loads"][0]
    load = doc["loads"][0]
    assert mine["mean_tpot_ms"] == pytest.approx(load["async"]["mean_tpot_ms_by_k"]["3"],
                                                 abs=1e-4)
    best = min(load[m]["mean_tpot_ms"]["value"] for m in ("sync", "async"))
    assert mine["loss"] == pytest.approx(mine["mean_tpot_ms"] / best - 1, abs=1e-4)
    assert load["verdict"].startswith("async: ")


def test_without_a_k_or_mode_advise_says_how_to_give_them(advice):
    from stepgap.sim.advise_cli import format_advice
    assert "Your setup: no k or mode given (paste your --speculative-config and " \
           "--async-scheduling" in format_advice(advice)
