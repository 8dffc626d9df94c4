"""Bad input and faults, round 4 (issue 55): the files stepgap writes and reads back, the
measured tables, degenerate workloads, sizes, outputs over inputs, killed workers and signals.
One test a class of bad input: each ends in exit status 2 and one line naming the file and the
field (or the option), before any work, or is answered; never a traceback or a division by zero
(docs/reference/robustness-round4.md lists the promises)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path
from unittest import mock

import pytest

from stepgap.cli import Terminated, main
from stepgap.common.errors import UserError
from stepgap.sim.config import SimConfig
from stepgap.sim.plan import resolve
from stepgap.sim.cpu_costs import CpuCosts
from stepgap.sim.loop import simulate
from stepgap.sim.profile import CpuFit, Profile, load_profile, save_profile
from stepgap.sim.sweep_runners import run_local

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "traces/peers/llmservingsim/profiler/perf"
SEED_BENCH = ROOT / "traces/seed/vllm-pr25872-sync.json"
TINY = ["--model", "llama-3.1-8b", "--gpu", "h100", "--num-prompts", "2", "--output-len", "4"]


def run(argv: list[str]) -> int:
    """`stepgap ARGV`'s exit status (argparse's own refusals exit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def one_error(capsys, *names) -> str:
    """The one error line of a refusal (the last; any line before it is a note of the command,
    `stepgap CMD: ...`), naming every one of `names`."""
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert err and ": error: " in err[-1], err
    assert all(x.startswith("stepgap") and ": error: " not in x for x in err[:-1]), err
    assert all(n in err[-1] for n in names), (names, err[-1])
    return err[-1]


# -- a calibrate profile's bands, split and residuals ------------------------------------------


def bench_profile(tmp_path, **notes) -> Path:
    """A profile as `stepgap calibrate` writes one from bench files (its split and residuals)."""
    split = {"low": {"cpu": 0.41, "device": 1.02}, "high": {"cpu": 1.28, "device": 0.99},
             "source": "the ranges of sim/bands.py"}
    about = {"device": "cuda", "gpu": "h100",
             "topology": {"engine": "stepgap", "executor": "inline", "device": "cuda"}}
    p = Profile([], CpuFit({k: v for k, v in CpuCosts().scaled(2.4).to_dict().items()
                            if v is not None}), {}, None, [], about,
                {"bands": {"split": split},
                 "residuals": [{"run": "b.json", "k": 2, "conc": 1, "mode": "sync",
                                "mean_tpot_ms": -0.01, "mean_itl_ms": 0.02}], **notes},
                roofline_level=1.0)
    path = tmp_path / "p.json"
    save_profile(path, p)
    return path


def edited(path: Path, fn) -> Path:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["bands"].update(split={}), "bands.split.low"),
    (lambda d: d["bands"]["split"].pop("high"), "bands.split.high"),
    (lambda d: d["bands"]["split"].update(low=3), "bands.split.low"),
    (lambda d: d["bands"]["split"]["low"].update(device=0), "bands.split.low.device"),
    (lambda d: d["bands"]["split"]["high"].update(device=None), "bands.split.high.device"),
    (lambda d: d["bands"]["split"]["high"].update(cpu="1.2"), "bands.split.high.cpu"),
    (lambda d: d["bands"]["split"]["low"].update(cpu=1e9), "bands.split.low.cpu"),
    (lambda d: d["bands"]["split"]["low"].update(cpu=2.0), "bands.split"),   # above high's
    (lambda d: d.update(bands=[1]), "bands"),
    (lambda d: d.update(bands="split"), "bands"),
    (lambda d: d["residuals"][0].update(mean_itl_ms=-1), "residuals[0].mean_itl_ms"),
    (lambda d: d["residuals"][0].update(mean_itl_ms="inf"), "residuals[0].mean_itl_ms"),
    (lambda d: d["residuals"][0].update(mean_tpot_ms="nan"), "residuals[0].mean_tpot_ms"),
    (lambda d: d.update(residuals={"b.json": 0.1}), "residuals"),
    (lambda d: d["cpu"].update(launch_latency_us=1e300), "cpu"),
])
def test_a_profile_field_of_the_wrong_shape_is_refused_naming_the_file_and_field(
        tmp_path, edit, field):
    path = edited(bench_profile(tmp_path), edit)
    with pytest.raises(UserError, match=rf"p\.json: field '{re.escape(field)}'"):
        load_profile(path)


def test_advise_and_sweep_band_refuse_a_broken_split_in_one_line(tmp_path, capsys):
    good = bench_profile(tmp_path)
    argv = ["advise", "--profile", str(good), *TINY, "--max-k", "1", "--max-concurrency", "1",
            "--jobs", "1", "--quiet"]
    assert main(argv) == 0   # the profile as calibrate writes it is read
    capsys.readouterr()
    edited(good, lambda d: d["bands"].update(split={}))
    assert main(argv) == 2
    one_error(capsys, "p.json", "bands.split.low")
    assert main(["sweep", "--set", f"profile={good}", "--set", "num_prompts=2", "--grid",
                 "k=0,1", "--band", "--out", str(tmp_path / "sw"), "--jobs", "1"]) == 2
    one_error(capsys, "p.json", "bands.split.low")


def test_a_profile_is_not_written_where_its_reader_would_refuse_it(tmp_path):
    p = load_profile(bench_profile(tmp_path))
    p.notes["bands"]["split"]["high"]["cpu"] = 3e6   # a fit that ran to CPU x 0
    with pytest.raises(UserError, match=r"q\.json: not written: the fitted profile: field "
                                        r"'bands\.split\.high\.cpu'"):
        save_profile(tmp_path / "q.json", p)
    assert not (tmp_path / "q.json").exists()


# -- results that compare reads ------------------------------------------------------------------


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = tmp_path_factory.mktemp("r") / "r.json"
    assert main(["simulate", *TINY, "--detailed", "--result-json", str(path), "--quiet"]) == 0
    return path


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["config"].update(resolved=[1]), "config.resolved"),
    (lambda d: d["config"]["resolved"].update(prefix_cache=[1]), "config.resolved.prefix_cache"),
    (lambda d: d["config"]["resolved"].update(prefix_cache={"queries": 1, "hits": 5}),
     "config.resolved.prefix_cache"),
    (lambda d: d["config"]["resolved"].update(notes="x"), "config.resolved.notes"),
    (lambda d: d.update(mean_tpot_ms=-1.0), "mean_tpot_ms"),
    (lambda d: d.update(p99_itl_ms="inf"), "p99_itl_ms"),
    (lambda d: d.update(duration=0), "duration"),
    (lambda d: d.update(ttfts=d["ttfts"][:1]), "ttfts"),
    (lambda d: d.update(itls=[["x"]] * len(d["itls"])), "itls[0]"),
])
def test_compare_refuses_a_result_of_the_wrong_shape_naming_the_field(tmp_path, capsys, result,
                                                                     edit, field):
    bad = edited(Path(shutil.copy(result, tmp_path / "bad.json")), edit)
    assert main(["compare", str(result), str(bad)]) == 2
    one_error(capsys, "bad.json", f"field '{field}'")


# -- measured tables, range-checked against physics ---------------------------------------------


def test_a_moe_table_of_zero_times_is_refused_naming_its_line(tmp_path, capsys):
    from tests.test_moe import GRID, write_bundle
    b = write_bundle(tmp_path / "bf16", moe=[(ep, t, a, 0) for ep, t, a, _ in GRID], dense=False)
    assert main(["simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--device-profile",
                 str(b), "--num-prompts", "2", "--output-len", "4"]) == 2
    one_error(capsys, "moe.csv:2", "field 'time_us'")


@pytest.mark.parametrize("table, what", [("lm_head", "faster than any device"),
                                         ("qkv_proj", "over 1000 x the roofline")])
def test_a_table_priced_past_any_devices_physics_is_refused_naming_file_and_point(
        tmp_path, capsys, table, what):
    from tests.test_tables import DENSE_LAYERS, TOKENS, write_bundle
    if table == "lm_head":   # 128256 x 4096 bf16 weights in 1 ns: 1e6 TB/s
        b = write_bundle(tmp_path / "bf16", per_seq=[("lm_head", n, 0.001) for n in (1, 10)]
                         + [("sampler", n, 1 + n) for n in (1, 10)])
        file = "per_sequence.csv"
    else:   # one layer's qkv_proj at 10^9 us (a second written as us, x 1000)
        b = write_bundle(tmp_path / "bf16", dense=[
            (layer, n, 1e9 if layer == "qkv_proj" else 10 + n)
            for layer in DENSE_LAYERS for n in TOKENS])
        file = "dense.csv"
    assert main(["simulate", *TINY, "--device-profile", str(b)]) == 2
    one_error(capsys, f"tp1/{file}", table, what)


def test_an_mtp_table_at_a_second_a_kernel_is_refused(tmp_path, capsys):
    from tests.test_moe import DEEPSEEK_META, write_bundle
    b = write_bundle(tmp_path / "fp8", meta=DEEPSEEK_META, dense=False, mtp=1e9)
    with pytest.raises(UserError, match=r"tp1/mtp\.csv: mtp_embed at 1 sequences: 1e\+09 us, "
                                        r"over 1000 x the roofline of --gpu h200"):
        resolve(SimConfig(model="deepseek-v3", gpu="h200", tensor_parallel_size=8,
                          method="mtp", k=1, device_profile=str(b)))


def test_the_committed_bundles_lie_within_the_physics_bounds():
    for bundle, gpu, extra in (
            ("RTX4090/meta-llama/Llama-3.1-8B/bf16", "rtx4090", {}),
            ("RTXPRO6000/Qwen/Qwen3-32B/bf16", "rtxpro6000", {"tensor_parallel_size": 2,
                                                             "model": "qwen3-32b"}),
            ("RTXPRO6000/deepseek-ai/DeepSeek-V3.2-Exp/fp8", "h200",
             {"model": "deepseek-v3", "data_parallel_size": 8, "enable_expert_parallel": True,
              "method": "mtp", "k": 1})):
        resolve(SimConfig(**{"model": "llama-3.1-8b", "gpu": gpu,
                             "device_profile": str(PERF / bundle), **extra}))


@pytest.mark.parametrize("us, says", [(1e9, "slower than a 1 GB/s link"),
                                      (1e-6, "past any link")])
def test_collectives_no_link_could_take_are_refused_naming_the_sample(tmp_path, capsys, us,
                                                                      says):
    import yaml
    doc = yaml.safe_load((PERF / "RTXPRO6000/hardware.yaml").read_text())
    for s in doc["measured"]["interconnect"]["samples"]:
        s["us_graphed"] = us
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(doc))
    assert main(["simulate", *TINY[:2], "--gpu", str(tmp_path / "hw.yaml"), "-tp", "2",
                 *TINY[4:]]) == 2
    one_error(capsys, "hw.yaml", "measured.interconnect.samples[0]", says)


def test_a_bundle_whose_meta_names_another_model_is_refused(tmp_path, capsys):
    b = shutil.copytree(PERF / "RTXPRO6000/deepseek-ai/DeepSeek-V3.2-Exp/fp8", tmp_path / "fp8")
    meta = (b / "meta.yaml").read_text()
    (b / "meta.yaml").write_text(meta.replace("model: deepseek-ai/DeepSeek-V3.2-Exp",
                                              "model: Qwen/Qwen3-32B"))
    assert main(["simulate", "--model", "deepseek-v3", "--gpu", "h200", "-dp", "8", "-ep",
                 "--device-profile", str(b), "--num-prompts", "2", "--output-len", "4"]) == 2
    one_error(capsys, "meta.yaml", "field 'model'", "Qwen/Qwen3-32B", "hidden_size 5120 vs 7168")


# -- degenerate workloads ------------------------------------------------------------------------


def test_one_token_outputs_are_simulated_and_advise_refuses_them_in_one_line(tmp_path, capsys):
    res, _ = simulate(SimConfig(model="llama-3.1-8b", gpu="h100", num_prompts=1, output_len=1))
    assert res["completed"] == 1 and res["mean_tpot_ms"] == 0.0   # vLLM's TPOT of one token
    assert main(["advise", *TINY[:6], "--output-len", "1", "--max-k", "2",
                 "--max-concurrency", "1", "--jobs", "1"]) == 2
    one_error(capsys, "--output-len 1", "every request ends at its first token")


def test_calibrate_refuses_an_output_length_that_leaves_no_time_between_tokens(tmp_path, capsys):
    bench = shutil.copy(SEED_BENCH, tmp_path / "b.json")
    assert main(["calibrate", str(bench), "--gpu", "l20", "--model", "llama-3.1-8b", "--draft",
                 "llama-3.1-8b-eagle3", "-k", "4", "--output-len", "1", "--out",
                 str(tmp_path / "p.json")]) == 2
    one_error(capsys, "b.json", "field 'mean_itl_ms'", "--output-len 1")
    assert not (tmp_path / "p.json").exists()


# -- sizes, bounded before the work --------------------------------------------------------------


@pytest.mark.parametrize("option", ["--block-size", "--max-model-len", "--max-num-seqs",
                                    "--max-num-batched-tokens", "--num-gpu-blocks-override"])
def test_a_size_of_400_digits_is_refused_naming_its_option(capsys, option):
    assert run(["simulate", *TINY, option, "9" * 400]) == 2
    line = one_error(capsys, option, "must be at most")
    assert len(line) < 300   # the value cut short, not written out


def test_a_block_larger_than_the_gpu_is_refused_naming_block_size(capsys):
    n = str(1 << 24)
    assert main(["simulate", *TINY, "--block-size", n, "--max-model-len", n,
                 "--max-num-batched-tokens", n]) == 2
    one_error(capsys, f"--block-size {n}: one block's KV cache takes")


def test_a_question_of_3000_loads_is_refused_before_any_simulation(capsys):
    with mock.patch("stepgap.sim.loop.simulate", side_effect=AssertionError("simulated")):
        assert main(["advise", *TINY, "--max-k", "1", "--jobs", "1", "--max-concurrency",
                     ",".join(map(str, range(1, 3001)))]) == 2
    one_error(capsys, "3000 --max-concurrency", "past the 100")


def test_more_bench_files_than_calibrate_fits_are_refused_before_any_is_read(tmp_path, capsys):
    folder = tmp_path / "runs"
    folder.mkdir()
    for i in range(101):
        (folder / f"b{i}.json").write_text("")   # never read: counted first
    for argv in (["--gpu", "l20"], []):
        assert main(["calibrate", str(folder), "--model", "llama-3.1-8b", *argv, "--out",
                     str(tmp_path / "p.json")]) == 2
        one_error(capsys, "runs: 101 bench files", "past the 100")


# -- an output where it becomes an input ----------------------------------------------------------


def test_an_output_inside_a_folder_the_command_reads_is_refused_before_it_exists(tmp_path,
                                                                                capsys):
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copy(SEED_BENCH, folder / "b.json")
    out = folder / "p.json"
    assert main(["calibrate", str(folder), "--gpu", "l20", "--model", "llama-3.1-8b", "--draft",
                 "llama-3.1-8b-eagle3", "-k", "4", "--out", str(out)]) == 2
    one_error(capsys, f"--out {out}", "the next run would read the output as an input")
    assert not out.exists()


# -- contradicting inputs --------------------------------------------------------------------------


def test_one_run_given_twice_under_another_label_is_refused_naming_both(tmp_path, capsys):
    doc = json.loads(SEED_BENCH.read_text())
    (tmp_path / "c1.json").write_text(json.dumps(doc))
    (tmp_path / "c8.json").write_text(json.dumps({**doc, "max_concurrency": 8}))
    assert main(["calibrate", str(tmp_path / "c1.json"), str(tmp_path / "c8.json"), "--gpu",
                 "l20", "--model", "llama-3.1-8b", "--draft", "llama-3.1-8b-eagle3", "-k", "4",
                 "--out", str(tmp_path / "p.json")]) == 2
    one_error(capsys, "c8.json: the same run as", "c1.json", "max_concurrency 8")


def test_a_band_past_a_speed_limit_names_the_option_the_user_gave(capsys):
    assert main(["simulate", *TINY, "--band", "--speed", "1e6"]) == 2
    line = one_error(capsys, "--speed 1e+06: the band's device input at its high end")
    assert "got" not in line


def test_a_preset_name_that_is_also_a_folder_here_is_refused_naming_both(tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-3.1-8b").mkdir()
    assert main(["simulate", *TINY]) == 2
    one_error(capsys, "the preset llama-3.1-8b and the folder llama-3.1-8b", "./llama-3.1-8b")


def test_a_model_preset_as_an_eagle_head_is_named_as_one(capsys):
    assert main(["simulate", *TINY, "--draft", "llama-3.1-8b", "-k", "2"]) == 2
    one_error(capsys, "the model preset llama-3.1-8b, not an EAGLE head",
              "llama-3.1-8b-eagle3", "--spec-method draft_model")


# -- faults: a killed worker, a signal during start-up ----------------------------------------------


def die(settings: dict) -> dict:
    """A cell whose worker is killed as the OOM killer kills (SIGKILL)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return settings


def test_a_pool_worker_killed_ends_the_command_in_one_line():
    with pytest.raises(UserError, match=r"--jobs 2: a worker process died while it ran cells"):
        list(run_local([{"a": 1}, {"a": 2}, {"a": 3}], 2, die))


class _SetName:
    def __set_name__(self, owner, name):   # SIGTERM arriving while a class is built
        raise Terminated()


def test_sigterm_while_an_import_builds_a_class_is_one_line(capsys):
    def parser():
        class Grid:   # (Python wraps what __set_name__ raises in a RuntimeError)
            base = _SetName()
    with mock.patch("stepgap.cli.build_parser", parser):
        assert main(["simulate"]) == 143
    err = capsys.readouterr().err
    assert err.strip() == "stepgap: terminated (SIGTERM)" and "Traceback" not in err


def test_a_real_runtime_error_is_not_taken_for_a_signal():
    def parser():
        raise RuntimeError("a bug")
    with mock.patch("stepgap.cli.build_parser", parser), pytest.raises(RuntimeError):
        main(["simulate"])


# -- a fresh sweep after issue 55's fixes (bench/hostile_round4.py; docs/reports/
# 2026-12-07-hostile-round4-main.md) ------------------------------------------------------------

HUGE = 10 ** 400   # JSON and YAML read it as an int; every float conversion of it overflows


def test_an_integer_past_a_floats_range_is_not_a_finite_number():
    from stepgap.common.limits import is_finite
    assert not is_finite(HUGE) and not is_finite(-HUGE)
    assert is_finite(10 ** 300) and is_finite(1e308)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["bands"]["split"]["low"].update(device=HUGE), "bands.split.low.device"),
    (lambda d: d["residuals"][0].update(mean_tpot_ms=HUGE), "residuals[0].mean_tpot_ms"),
    (lambda d: d.update(acceptance={"rates": [0.8, 0.6], "spread": HUGE}), "acceptance"),
])
def test_a_profile_number_of_400_digits_is_refused_naming_its_field(tmp_path, edit, field):
    path = edited(bench_profile(tmp_path), edit)
    with pytest.raises(UserError, match=rf"p\.json: field '{re.escape(field)}'") as e:
        load_profile(path)
    assert len(str(e.value)) < 400   # the value cut short, not written out


@pytest.mark.parametrize("text, field", [
    (f"memory_gb: {HUGE}\n", "memory_gb"),
    (f"d2h_us: {HUGE}\n", "d2h_us"),
    ("flop_eff: 1.0e-300\n", "flop_eff"),  # every ITL's spread inf, exit 0 (YAML reads
                                           # 1e-300, without its point, as text)
    ("bw_eff: 1.0e-300\n", "bw_eff"),
    ("kernel_us: 900000\n", "kernel_us"),  # Llama-3.1-8B at a mean TPOT of 293 s, exit 0
])
def test_a_gpu_file_number_past_any_device_is_refused_naming_its_field(tmp_path, text, field):
    from stepgap.sim.hardware_file import load_gpu_file
    path = tmp_path / "g.yaml"
    path.write_text("base: h100\nname: mine\n" + text)
    with pytest.raises(UserError, match=rf"g\.yaml: field '{field}'"):
        load_gpu_file(path)


def test_a_bench_file_number_of_400_digits_is_refused_naming_its_field(tmp_path, capsys):
    doc = json.loads(SEED_BENCH.read_text())
    (tmp_path / "b.json").write_text(json.dumps({**doc, "mean_itl_ms": HUGE}))
    assert main(["calibrate", str(tmp_path / "b.json"), "--gpu", "l20", "--model",
                 "llama-3.1-8b", "--draft", "llama-3.1-8b-eagle3", "-k", "4", "--out",
                 str(tmp_path / "p.json")]) == 2
    one_error(capsys, "b.json", "mean_itl_ms")


def test_a_kv_cache_cap_past_a_floats_range_caps_nothing():
    from stepgap.engine.args import EngineArgs
    huge = EngineArgs(model="tiny", kv_cache_gib=1e308).create_engine_config()
    wide = EngineArgs(model="tiny", kv_cache_gib=1e6).create_engine_config()
    a = huge.args
    assert huge.num_blocks == wide.num_blocks
    assert huge.num_blocks * a.block_size >= a.max_num_seqs * a.max_model_len


def test_a_bench_file_of_more_requests_than_a_fit_simulates_is_spread_over_them(tmp_path):
    from stepgap.calibrate.bench_fit import MAX_FIT_PROMPTS, run_workload
    n = 4 * MAX_FIT_PROMPTS + 3
    doc = {**json.loads(SEED_BENCH.read_text()), "num_prompts": n, "completed": n,
           "input_lens": list(range(1, n + 1)), "output_lens": [64] * n, "ttfts": [0.05] * n,
           "itls": [[0.028] * 2] * n, "errors": [""] * n}
    reqs, note = run_workload(tmp_path / "b.json", doc, {"_workload": None, "_output_len": None,
                                                         "_seed": 0}, 4, 1)
    assert len(reqs) <= MAX_FIT_PROMPTS
    lens = [r.prompt_len for r in reqs]
    assert lens[0] == 1 and lens[-1] > n - n // MAX_FIT_PROMPTS - 5   # first to last, spread
    assert f"{n:,} requests" in note and f"{len(reqs):,} of them" in note


def test_advise_on_a_measured_engine_profile_plans_no_bench_run_and_answers(capsys):
    # the next run's projection fits a bench file's roofline level, which a profile of device op
    # fits does not use: it refused the answer, naming a projected run no user made
    profile = ROOT / "traces/measured/cpu/profile.json"
    assert main(["advise", "--device", "cpu", "--gpu", "cpu", "--profile", str(profile),
                 "--num-prompts", "3", "--output-len", "8", "--max-k", "2",
                 "--max-concurrency", "1", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "The answer" in out and "next run" not in out.lower()
