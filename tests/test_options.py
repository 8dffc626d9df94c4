"""One vocabulary: `stepgap simulate` and `stepgap run` take vLLM's option names with vLLM's
meaning (common/options.py), old spellings as aliases, and name the vLLM options they ignore."""

import json

import pytest

from stepgap.common.run_result import RunResult
from stepgap.cli import main
from tests.helpers import tiny_checkpoints

SPEC4 = json.dumps({"method": "eagle3", "num_speculative_tokens": 4})
SIM = ["simulate", "--model", "llama-3.2-1b", "--num-prompts", "4", "--output-len", "32",
       "--quiet"]


def sim_result(tmp_path, name, *extra):
    path = tmp_path / f"{name}.json"
    assert main([*SIM, *extra, "--result-json", str(path)]) == 0
    return RunResult.load(path).to_dict()


def run_result(tmp_path, name, *extra):
    path = tmp_path / f"{name}.json"
    assert main(["run", "--model", tiny_checkpoints()["target"], "--num-prompts", "3",
                 "--output-len", "12", "--quiet", *extra, "--result-json", str(path)]) == 0
    return RunResult.load(path).to_dict()


def exits_2(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_simulate_takes_the_speculative_config_as_vllm_spells_it(tmp_path):
    a = sim_result(tmp_path, "a", "--speculative-config", SPEC4)
    b = sim_result(tmp_path, "b", "--num-speculative-tokens", "4")
    c = sim_result(tmp_path, "c", "-k", "4")
    assert a["config"]["k"] == b["config"]["k"] == c["config"]["k"] == 4
    assert a["mean_tpot_ms"] == b["mean_tpot_ms"] == c["mean_tpot_ms"]
    assert a["spec_decode"]["k"] == 4


def test_run_takes_the_speculative_config_with_its_head(tmp_path):
    head = tiny_checkpoints()["eagle3-yuhuili"]
    spec = json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": 4})
    a = run_result(tmp_path, "a", "--speculative-config", spec, "--detailed")
    b = run_result(tmp_path, "b", "--draft", head, "--num-speculative-tokens", "4", "--detailed")
    assert a["config"]["k"] == b["config"]["k"] == 4
    assert a["output_token_ids"] == b["output_token_ids"]
    assert a["spec_decode"]["num_drafts"] > 0


@pytest.mark.parametrize("argv, needle", [
    (["--num-speculative-tokens", "2", "--speculative-config", SPEC4],
     "--num-speculative-tokens 2 and --speculative-config's num_speculative_tokens 4 differ"),
    (["--speculative-config", '{"method": "medusa"}'], "method 'medusa' is not modelled"),
    (["--speculative-config", "{oops"], "--speculative-config: not valid JSON"),
    (["--mode", "sync", "--async-scheduling"], "--mode sync and --async-scheduling disagree"),
    (["--tensor-parallel-size", "3"],
     "--tensor-parallel-size 3: model 'llama-3.2-1b' has 8 KV heads, which 3 neither divides"),
    (["--spec-method", "mtp", "-k", "1"], "model 'llama-3.2-1b' has no MTP layers"),
    (["--spec-tokens", "2", "--speculative-config", SPEC4],
     "--spec-tokens 2 and --speculative-config's num_speculative_tokens 4 differ"),
    (["--bogus-option", "3"], "unrecognized arguments: --bogus-option 3"),
])
def test_contradictions_and_strangers_are_one_clear_error(capsys, argv, needle):
    assert needle in exits_2([*SIM, *argv], capsys)


def test_the_engine_keeps_to_one_device_and_eagle3(capsys):
    run = ["run", "--model", tiny_checkpoints()["target"], "--num-prompts", "2", "--quiet"]
    assert "the engine (one device) models 1" in exits_2([*run, "-tp", "2"], capsys)
    err = exits_2([*run, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
                  capsys)
    assert "the engine drafts with EAGLE-3 heads only" in err


def test_vllm_shortcuts_of_the_speculative_config(tmp_path):
    a = sim_result(tmp_path, "a", "--spec-method", "ngram_gpu", "--spec-tokens", "3")
    b = sim_result(tmp_path, "b", "--speculative-config",
                   '{"method": "ngram_gpu", "num_speculative_tokens": 3}')
    assert a["config"]["method"] == b["config"]["method"] == "ngram_gpu"
    assert a["config"]["k"] == 3 and a["mean_tpot_ms"] == b["mean_tpot_ms"]


def test_a_pasted_vllm_option_is_named_and_ignored(tmp_path, capsys):
    res = sim_result(tmp_path, "a", "--enforce-eager", "--dtype", "bfloat16",
                     "--port", "8000", "--max_num_seqs", "8")
    err = capsys.readouterr().err
    for name in ("--enforce-eager", "--dtype", "--port"):
        assert f"ignoring {name} (a vLLM option that stepgap does not model)" in err
    assert err.count("ignoring") == 3
    assert res["config"]["max_num_seqs"] == 8          # vLLM's underscores are taken too


def test_vllm_spellings_of_the_mode_and_the_executor(tmp_path):
    res = sim_result(tmp_path, "a", "--async-scheduling", "--distributed-executor-backend", "mp")
    assert res["config"]["mode"] == "async" and res["config"]["executor"] == "process"
    old = sim_result(tmp_path, "b", "--mode", "async", "--worker", "process")
    assert old["mean_tpot_ms"] == res["mean_tpot_ms"]


def test_save_result_names_the_file_as_vllm_does(tmp_path):
    assert main([*SIM, "--save-result", "--result-dir", str(tmp_path / "d"),
                 "--max-concurrency", "2"]) == 0
    (path,) = (tmp_path / "d").iterdir()
    assert path.name.startswith("stepgap-sim-infqps-concurrency2-llama-3.2-1b-")
    assert RunResult.load(path).max_concurrency == 2
    assert main([*SIM, "--save-result", "--result-dir", str(tmp_path / "e"),
                 "--result-filename", "x.json"]) == 0
    assert (tmp_path / "e" / "x.json").is_file()


def test_metric_percentiles_as_vllm_takes_them(tmp_path):
    res = sim_result(tmp_path, "a", "--metric-percentiles", "50,90",
                     "--percentile-metrics", "ttft,tpot")
    assert {"p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms"} <= set(res)
    assert "p50_itl_ms" not in res and "p99_tpot_ms" not in res
    assert "mean_itl_ms" in res     # means are always there


def test_the_engine_honours_the_block_size(tmp_path):
    a = run_result(tmp_path, "a", "--block-size", "16", "--detailed")
    b = run_result(tmp_path, "b", "--block-size", "32", "--detailed")
    c = run_result(tmp_path, "c", "--block-size", "4", "--num-gpu-blocks-override", "40",
                   "--detailed")
    assert a["output_token_ids"] == b["output_token_ids"] == c["output_token_ids"]
    assert c["config"]["num_blocks"] == 40 and c["config"]["block_size"] == 4
    assert b["config"]["num_blocks"] * 32 == a["config"]["num_blocks"] * 16


def test_run_ignores_vllm_options_it_does_not_model(tmp_path, capsys):
    run_result(tmp_path, "a", "--enable-chunked-prefill", "--kv-cache-dtype", "auto")
    err = capsys.readouterr().err
    assert "ignoring --enable-chunked-prefill" in err and "ignoring --kv-cache-dtype" in err


# ---------------------------------------------------------------------------------------------
# Models by Hugging Face id, and MODEL as `vllm serve MODEL` takes it


def test_a_hugging_face_id_is_the_preset_its_config_came_from(tmp_path):
    by_id = sim_result(tmp_path, "id", "--model", "meta-llama/Llama-3.2-1B-Instruct")
    by_name = sim_result(tmp_path, "name")
    assert by_id["config"]["model"] == "meta-llama/Llama-3.2-1B-Instruct"
    assert by_id["config"]["resolved"]["target"] == "llama-3.2-1b"
    assert by_id["mean_tpot_ms"] == by_name["mean_tpot_ms"]


def test_the_issues_command_line_pastes_with_the_target_and_head_by_id(tmp_path):
    spec = json.dumps({"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                       "num_speculative_tokens": 3})
    path = tmp_path / "r.json"
    assert main(["simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                 "--speculative-config", spec, "--num-prompts", "2", "--quiet",
                 "--result-json", str(path)]) == 0
    resolved = RunResult.load(path).resolved
    assert (resolved["target"], resolved["draft"]) == ("llama-3.1-8b", "llama-3.1-8b-eagle3")


def test_model_is_the_word_after_the_command_as_vllm_serve_takes_it(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["simulate", "meta-llama/Llama-3.2-1B-Instruct", "--num-prompts", "2",
                 "--quiet", "--result-json", str(path)]) == 0
    assert RunResult.load(path).resolved["target"] == "llama-3.2-1b"
    err = exits_2(["simulate", "Qwen/Qwen3-8B", "--model", "llama-3.2-1b"], capsys)
    assert err.strip() == ("stepgap simulate: error: MODEL Qwen/Qwen3-8B and --model "
                           "llama-3.2-1b: give one")


@pytest.mark.parametrize("option, value, says", [
    ("--metric-percentiles", "50,90,50", "50 given twice in '50,90,50'"),
    ("--percentile-metrics", "ttft,itl,ttft", "ttft given twice in 'ttft,itl,ttft'"),
    # a length past what any workload takes is named by its own flag, not the workload's name
    ("--random-input-len", "1000000000", "must be at most 1e+06, got 1000000000"),
    ("--output-len", "1000000000000", "must be at most 1e+06, got 1000000000000"),
])
def test_a_list_or_length_option_is_refused_by_its_own_name(option, value, says, capsys):
    err = exits_2(["simulate", "--num-prompts", "2", option, value], capsys)
    assert f"argument {option}: {says}" in err


def test_model_may_stand_among_the_options_as_vllms_positional_does(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["simulate", "--num-prompts", "2", "--quiet", "--result-json", str(path),
                 "meta-llama/Llama-3.2-1B-Instruct"]) == 0
    assert RunResult.load(path).resolved["target"] == "llama-3.2-1b"
    err = exits_2(["simulate", "--num-prompts", "2", "Qwen/Qwen3-8B", "--model",
                   "llama-3.2-1b"], capsys)
    assert err.strip() == ("stepgap simulate: error: MODEL Qwen/Qwen3-8B and --model "
                           "llama-3.2-1b: give one")


@pytest.mark.parametrize("argv, near", [
    (["--model", "meta-llama/Llama-3.1-8B"], "near: llama-3.1-8b (meta-llama/Llama-3.1-8B-Instruct)"),
    (["--model", "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic"],
     "near: llama-3.3-70b (meta-llama/Llama-3.3-70B-Instruct); its FP8 weights: add "
     "--quantization fp8"),
    (["--model", "meta-llama/Llama-3.3-70B-Instruct", "-tp", "4", "--draft",
      "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "-k", "2"],
     "near: llama-3.3-70b-eagle3 (RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3)"),
    (["--model", "meta-llama/Llama\n-3.1-8B"], "download ORG/NAME config.json"),   # one line
])
def test_an_id_stepgap_does_not_know_is_one_line_naming_near_presets(capsys, argv, near):
    err = exits_2(["simulate", *argv, "--num-prompts", "2"], capsys)
    assert len(err.strip().splitlines()) == 1 and near in err
    assert "nothing is downloaded" in err and "config.json" in err


def test_an_argparse_error_is_one_line_not_the_usage(capsys):
    err = exits_2(["simulate", "--mode", "fast"], capsys)
    assert len(err.strip().splitlines()) == 1 and "invalid choice: 'fast'" in err
    assert "--help` lists the options" in err


def test_a_config_s_dict_is_asdict_s_in_its_keys_order():
    """SimConfig.to_dict copies what `dataclasses.asdict` would, without its recursion: the
    same values, containers copied (a change to the dict leaves the config alone)."""
    import dataclasses

    from stepgap.sim.config import CONFIG_KEYS, OPTIONAL_FIELDS, SimConfig
    cfg = SimConfig(cpu_costs={"launch": [1.0, 2.0, 3.0]}, acceptance_rates=[0.6, 0.4],
                    metric_percentiles=(50, 90), max_concurrency=4, seed=3)
    full = dataclasses.asdict(cfg)
    want = {k: full[k] for k in CONFIG_KEYS
            if k not in OPTIONAL_FIELDS or full[k] != OPTIONAL_FIELDS[k]}
    for k in ("acceptance_rates", "metric_percentiles", "percentile_metrics"):
        if want[k] is not None:
            want[k] = list(want[k])
    got = cfg.to_dict()
    assert got == want and list(got) == list(want)
    got["cpu_costs"]["launch"].append(4.0)
    assert cfg.cpu_costs == {"launch": [1.0, 2.0, 3.0]}
