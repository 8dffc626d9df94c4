"""`stepgap run` and `stepgap make-tiny` from the command line."""

import json

import pytest

from tests.helpers import tiny_checkpoints
from stepgap.cli import main
from stepgap.common.formats import load_timeline, save_trace, TraceRequest
from stepgap.common.run_result import RunResult


@pytest.fixture(scope="module")
def paths():
    return tiny_checkpoints()


def test_run_help_teaches_groups_units_and_examples(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for needle in ("model and speculative decoding (as `vllm serve`):", "engine:",
                   "scheduler and KV cache (as `vllm serve`):", "sampling:",
                   "workload and load (as `vllm bench serve`):",
                   "results (as `vllm bench serve`):", "examples:", "--synthetic-acceptance",
                   "--speculative-config", "--num-speculative-tokens", "default 0", "ms"):
        assert needle in text


def test_make_tiny_writes_a_target_and_both_head_layouts(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "t"), "--train-steps", "0"]) == 0
    for name, key in (("target", "LlamaForCausalLM"), ("eagle3-yuhuili", "LlamaForCausalLMEagle3"),
                      ("eagle3-speculators", "Eagle3Speculator")):
        cfg = json.loads((tmp_path / "t" / name / "config.json").read_text())
        assert cfg["architectures"] == [key]
        assert (tmp_path / "t" / name / "model.safetensors").is_file()


def test_run_writes_result_timeline_and_output_ids_in_trace_order(tmp_path, paths, capsys):
    trace = tmp_path / "trace.jsonl"
    reqs = [TraceRequest("b", 0.0, 12, 9), TraceRequest("a", 0.0, 30, 5),
            TraceRequest("c", 0.01, 7, 11)]
    save_trace(trace, reqs)
    args = ["run", "--target", paths["target"], "--draft", paths["eagle3-speculators"],
            "--k", "3", "--trace", str(trace), "--max-concurrency", "2",
            "--result-json", str(tmp_path / "r.json"), "--detailed",
            "--timeline", str(tmp_path / "t.jsonl"), "--chrome-trace", str(tmp_path / "c.json")]
    assert main(args) == 0
    assert "Engine Benchmark Result" in capsys.readouterr().out
    res = RunResult.load(tmp_path / "r.json")
    assert res.backend == "stepgap-engine"
    assert res.metrics["completed"] == 3 and res.max_concurrency == 2
    assert res.requests.ids == ["b", "a", "c"]
    assert [len(ids) for ids in res.requests.output_token_ids] == [9, 5, 11]
    assert res.config["mode"] == "sync" and res.k == 3
    assert res.spec_decode["k"] == 3 and len(res.requests.accepted) == 3
    spans = load_timeline(tmp_path / "t.jsonl")
    assert {s.lane for s in spans} == {"cpu.engine", "cpu.worker", "device"}
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"]


@pytest.mark.parametrize("extra, needle", [
    (["--k", "2"], "--num-speculative-tokens 2 needs a draft head"),
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0"),
    (["--trace", "nope.jsonl"], "unknown workload 'nope.jsonl'"),
])
def test_bad_input_is_one_clear_line(paths, capsys, extra, needle):
    with pytest.raises(SystemExit) as e:   # argparse's errors exit 2 as the others return 2
        raise SystemExit(main(["run", "--target", paths["target"], "--num-prompts", "1",
                               *extra]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_missing_target_folder_is_named(tmp_path, capsys):
    assert main(["run", "--target", str(tmp_path / "nothing")]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_head_for_another_target_names_the_tensor(tmp_path, paths, capsys):
    import shutil
    bad = tmp_path / "head"
    shutil.copytree(paths["eagle3-yuhuili"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["target_hidden_size"] = 4096
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["run", "--target", paths["target"], "--draft", str(bad), "--k", "2",
                 "--num-prompts", "1"]) == 2
    assert "fc.weight" in capsys.readouterr().err


def test_run_with_the_process_executor_and_synthetic_acceptance(tmp_path, paths, capsys):
    args = ["run", "--target", paths["target"], "--draft", paths["eagle3-yuhuili"], "--k", "3",
            "--mode", "zero-bubble", "--executor", "process", "--num-prompts", "3",
            "--output-len", "12", "--synthetic-acceptance", "0.9,0.5,0.2",
            "--result-json", str(tmp_path / "r.json"), "--quiet"]
    assert main(args) == 0
    assert capsys.readouterr().out == ""
    res = RunResult.load(tmp_path / "r.json")
    assert res.config["executor"] == "process" and res.mode == "zero-bubble"
    assert res.metrics["completed"] == 3 and res.spec_decode["num_accepted_tokens"] > 0


def test_random_weights_build_a_config_only_folder(tmp_path, paths, capsys):
    import shutil
    for name in ("target", "eagle3-yuhuili"):
        (tmp_path / name).mkdir()
        shutil.copy(f"{paths[name]}/config.json", tmp_path / name)
    base = ["run", "--target", str(tmp_path / "target"), "--num-prompts", "1",
            "--output-len", "4", "--quiet"]
    assert main(base) == 2
    assert "no *.safetensors weights" in capsys.readouterr().err
    assert main(base + ["--draft", str(tmp_path / "eagle3-yuhuili"), "--k", "2",
                        "--random-weights"]) == 0


def test_engine_args_resolve_once_into_the_setup_every_part_of_a_run_is_made_from(
        paths, monkeypatch):
    """As vLLM's create_engine_config: the configs are read and checked once; the worker's
    spec, a run's scheduling and the executor come from the setup without reading them again."""
    import stepgap.engine.checkpoint as checkpoint
    from stepgap.engine.args import EngineArgs
    reads = []
    for name in ("target_config", "draft_config"):
        real = getattr(checkpoint, name)
        monkeypatch.setattr(checkpoint, name,
                            lambda *a, _real=real, _name=name: reads.append(_name) or _real(*a))
    ea = EngineArgs(model=paths["target"], draft=paths["eagle3-yuhuili"], k=2,
                    num_gpu_blocks_override=64, max_model_len=256)
    setup = ea.create_engine_config()
    assert reads == ["target_config", "draft_config"]
    spec, cfg = setup.worker_spec(), setup.engine_config("async", 1)
    assert reads == ["target_config", "draft_config"]
    assert (spec.num_blocks, cfg.num_blocks, cfg.mode, cfg.k) == (64, 64, "async", 1)
    assert cfg.max_position_embeddings == setup.target.max_position_embeddings
    assert setup.vocab_size == setup.target.vocab_size


def test_both_halves_size_the_kv_cache_by_one_definition():
    """common/memory.py: the simulator's GPU (bf16, the reserve) and the engine's device (its
    dtype; the host's RAM on the CPU, no reserve) go through the same arithmetic."""
    from stepgap.common.memory import (RESERVED_BYTES, kv_bytes_per_token, kv_cache_blocks,
                                       weight_bytes)
    from stepgap.engine.args import EngineArgs, device_memory
    from stepgap.sim.config import SimConfig
    from stepgap.sim.plan import resolve
    r = resolve(SimConfig(gpu="h100", model="llama-3.1-8b", k=0))
    t = r.target
    assert r.scheduler.num_blocks == kv_cache_blocks(
        r.hw.mem_bytes, 0.9, weight_bytes(t, None, 1, None), RESERVED_BYTES, 16,
        kv_bytes_per_token(t, None, 1, None))
    setup = EngineArgs(model="tiny", draft="tiny-eagle3", k=2, dtype="float32",
                       gpu_memory_utilization=1e-4).create_engine_config()
    t, d = setup.target, setup.draft
    assert t.kv_bytes_per_token(1, 4) == 2 * t.kv_bytes_per_token(1)   # float32, not bf16
    assert setup.num_blocks == kv_cache_blocks(
        device_memory("cpu"), 1e-4, 4 * (t.num_params + d.num_params), 0, 16,
        t.kv_bytes_per_token(1, 4) + d.kv_bytes_per_token(1, 4))
