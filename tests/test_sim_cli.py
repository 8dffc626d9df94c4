"""`stepgap simulate`: help, presets, outputs and clean errors."""

import json

import pytest

from stepgap.cli import build_parser, main
from stepgap.common.formats import load_timeline
from stepgap.common.run_result import RunResult


def simulate_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["simulate"]


def test_help_documents_every_option_with_examples():
    p = simulate_parser()
    text = p.format_help()
    for action in p._actions:
        for opt in action.option_strings:
            assert opt in text
        if action.option_strings and action.dest != "help":
            assert action.help, action.option_strings
    assert "examples:" in text and "stepgap simulate --preset seed-l20 --mode async" in text
    for group in ("model and speculative decoding (as `vllm serve`)", "engine",
                  "hardware and measured costs", "acceptance",
                  "scheduler and KV cache (as `vllm serve`)", "CPU costs",
                  "workload and load (as `vllm bench serve`)", "results (as `vllm bench serve`)"):
        assert group in text


@pytest.mark.parametrize("mode, tpot, itl", [("sync", 9.91, 28.14), ("async", 9.57, 27.17)])
def test_seed_preset_prints_its_columns_next_to_the_measurement(capsys, mode, tpot, itl):
    assert main(["simulate", "--preset", "seed-l20", "--mode", mode]) == 0
    out = capsys.readouterr().out
    assert "Mean TPOT (ms)" in out and "P99 ITL (ms)" in out
    row = next(line for line in out.splitlines() if line.startswith("Mean ITL (ms)  "))
    sim, meas, err = row.split()[3:6]
    assert float(meas) == itl and abs(float(err.rstrip("%"))) < 5.0
    assert f"{tpot:.2f}" in out


def test_overriding_the_scenario_drops_the_comparison(capsys):
    main(["simulate", "--preset", "seed-l20", "--num-prompts", "4", "--quiet"])
    assert capsys.readouterr().out == ""
    main(["simulate", "--preset", "seed-l20", "--gpu", "h100", "--num-prompts", "4"])
    assert "vs measured" not in capsys.readouterr().out


def test_result_json_and_timeline_files(tmp_path, capsys):
    res_path, tl = tmp_path / "r.json", tmp_path / "run.jsonl"
    assert main(["simulate", "--gpu", "h200", "-k", "2", "--mode", "async", "--trace",
                 "sharegpt", "--num-prompts", "5", "--detailed", "--result-json",
                 str(res_path), "--timeline", str(tl), "--quiet"]) == 0
    res = RunResult.load(res_path)
    assert res.metrics["completed"] == 5 and res.config["mode"] == "async" and res.requests
    assert load_timeline(tl)
    chrome = json.loads((tmp_path / "run.chrome.json").read_text())
    assert any(e.get("name") == "draft_forward" for e in chrome["traceEvents"])


def bad_trace(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"request_id": "a", "arrival_s": 0, "prompt_len": 4, "output_len": 3}\n'
                 '{"request_id": "b", "arrival_s": 0, "prompt_len": "x", "output_len": 3}\n')
    return str(p)


@pytest.mark.parametrize("argv, needle", [
    (["--gpu", "x900"], "gpu: unknown device 'x900'"),
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--draft", "nope", "-k", "2"], "unknown draft 'nope'"),
    (["-k", "-1"], "argument --num-speculative-tokens/-k/--k/--num-spec-tokens: must be >= 0"),
    (["--request-rate", "-2"], "argument --request-rate: must be > 0"),
    (["--acceptance-rates", "0.5,0.9", "-k", "2"], "cumulative"),
    (["--acceptance", "vibes"], "acceptance: unknown profile 'vibes'"),
    (["--cpu-cost", "nap=3"], "argument --cpu-cost: expected OP=A[,B[,C]]"),
    (["--seed", "-3"], "argument --seed: must be >= 0"),
    (["--num-kv-blocks", "2", "--num-prompts", "2"], "but the cache holds 2"),
    (["--max-model-len", "64", "--trace", "sharegpt"], "exceeds --max-model-len 64"),
])
def test_bad_input_is_one_clear_message(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["simulate", *argv]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_model_from_a_config_json_with_a_derived_head(tmp_path, capsys):
    cfg = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
           "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["simulate", "--model", str(tmp_path), "--draft", "eagle3", "-k", "2",
                 "--gpu", "a100", "--num-prompts", "3", "--result-json",
                 str(tmp_path / "r.json"), "--quiet"]) == 0
    res = RunResult.load(tmp_path / "r.json")
    assert res.metrics["completed"] == 3 and res.resolved["draft"].endswith("-eagle3")


def test_unwritable_output_is_a_clean_error(tmp_path, capsys):
    assert main(["simulate", "--num-prompts", "2", "--result-json", str(tmp_path)]) == 2
    assert f"--result-json {tmp_path}: is a folder" in capsys.readouterr().err


def test_an_output_file_ending_in_a_slash_is_refused_not_written_as_a_file(tmp_path, capsys):
    out = f"{tmp_path}/new/"
    with pytest.raises(SystemExit) as e:   # argparse's error
        main(["simulate", "--num-prompts", "2", "--result-json", out])
    assert e.value.code == 2
    assert "argument --result-json: a path ending in '/' names a folder" in \
        capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_malformed_trace_line_names_file_line_and_field(tmp_path, capsys):
    path = bad_trace(tmp_path)
    assert main(["simulate", "--trace", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: field 'prompt_len'" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# FP8 weights and KV cache (--quantization, --kv-cache-dtype)

LLAMA8B_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)   # parameters


def fp8_run(tmp_path, capsys, name, *extra):
    path = tmp_path / f"{name}.json"
    # (the roofline alone, --device-profile none: the H100's tables of this model are bf16)
    assert main(["simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100",
                 "--device-profile", "none",
                 "--num-prompts", "4", "--max-concurrency", "1", "--output-len", "64", *extra,
                 "--result-json", str(path)]) == 0
    return RunResult.load(path).to_dict(), capsys.readouterr().err


def test_an_fp8_kv_cache_holds_twice_the_blocks(tmp_path, capsys):
    bf16, _ = fp8_run(tmp_path, capsys, "bf16")
    fp8, err = fp8_run(tmp_path, capsys, "kv", "--kv-cache-dtype", "fp8")
    a, b = (r["config"]["resolved"]["num_kv_blocks"] for r in (bf16, fp8))
    assert abs(b - 2 * a) <= 1
    assert fp8["config"]["kv_cache_dtype"] == "fp8" and "kv_cache_dtype" not in bf16["config"]
    assert "--kv-cache-dtype fp8: 1 byte a KV element" in err


def test_fp8_weights_free_a_byte_a_linear_weight_and_run_at_the_fp8_peak(tmp_path, capsys):
    bf16, _ = fp8_run(tmp_path, capsys, "bf16")
    fp8, err = fp8_run(tmp_path, capsys, "fp8", "--quantization", "fp8")
    a, b = (r["config"]["resolved"]["num_kv_blocks"] for r in (bf16, fp8))
    per_block = 16 * 32 * 2 * 8 * 128 * 2   # tokens x layers x K,V x KV heads x dim x bf16
    assert abs((b - a) - LLAMA8B_LINEAR / per_block) <= 1
    assert "the fp8 GEMM peak of h100 (1979 TFLOP/s dense)" in err
    # decode streams the weights: half of their bytes read, so the step takes about half, less
    # what does not halve (each of its ~330 kernels' fixed cost, 4.89 us on the fitted H100,
    # and the host's step)
    assert 0.45 < fp8["mean_tpot_ms"] / bf16["mean_tpot_ms"] < 0.72


def test_a_gpu_without_fp8_tensor_cores_says_it_multiplies_at_the_bf16_rate(tmp_path, capsys):
    _, err = fp8_run(tmp_path, capsys, "a100", "--quantization", "fp8", "--gpu", "a100")
    assert "the bf16 rate (a100 has no fp8 tensor cores" in err


@pytest.mark.parametrize("argv, needle", [
    (["--model", "openai/gpt-oss-20b", "--quantization", "fp8"],
     "is a mxfp4 checkpoint (vLLM serves a checkpoint in its own quantization)"),
    (["--model", "checkpoints/pystdlib/target", "--draft", "checkpoints/pystdlib/eagle3",
      "--gpu", "cpu", "--profile", "traces/measured/cpu/profile.json", "--kv-cache-dtype",
      "fp8"], "a measured profile times the weights and KV cache it was measured with"),
    (["--quantization", "awq"], "invalid choice: 'awq'"),
])
def test_what_fp8_cannot_be_applied_to_is_one_line(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:   # (argparse's errors exit; the others return)
        raise SystemExit(main(["simulate", *argv, "--num-prompts", "2", "--quiet"]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_measured_tables_take_the_variant_of_the_kv_caches_dtype(tmp_path, capsys):
    import shutil
    bundle = ("traces/peers/llmservingsim/profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16")
    argv = ["simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090",
            "--kv-cache-dtype", "fp8", "--num-prompts", "2", "--quiet"]
    assert main([*argv, "--device-profile", bundle]) == 2
    err = capsys.readouterr().err
    assert "measured as variant bf16" in err and "needs the bundle's bf16-kvfp8 variant" in err
    shutil.copytree(bundle, tmp_path / "bf16")
    kv = tmp_path / "bf16-kvfp8"
    shutil.copytree(bundle, kv)
    meta = (kv / "meta.yaml").read_text().replace("variant: bf16", "variant: bf16-kvfp8")
    (kv / "meta.yaml").write_text(meta)
    path = tmp_path / "r.json"
    assert main([*argv, "--device-profile", str(tmp_path / "bf16"), "--result-json",
                 str(path)]) == 0
    assert RunResult.load(path).resolved["device_costs"]["profile"] == str(kv)
