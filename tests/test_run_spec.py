"""One run's settings defined once (common/run_spec.py): both halves check a setting alike, with
one message naming its option and value; the command line offers every setting's option,
parsed within the same limits; old spellings still read; a result's config keeps its keys."""

import argparse
import dataclasses

import pytest

from stepgap.cli import build_parser
from stepgap.common.errors import UserError
from stepgap.common.options import parser_of
from stepgap.common.run_spec import ALIASES, RunSpec, options_of, settings_of
from stepgap.engine.args import EngineArgs
from stepgap.sim.config import CONFIG_KEYS, SimConfig


def sim(**kw):
    return SimConfig(**kw)


def engine(**kw):
    return EngineArgs(model="tiny", **kw)


@pytest.mark.parametrize("make", [sim, engine])
@pytest.mark.parametrize("setting, value, message", [
    ("max_model_len", 0, "--max-model-len: must be an integer from 1 to 16777216, got 0"),
    ("max_num_seqs", 2.5, "--max-num-seqs: must be an integer from 1 to 1000000, got 2.5"),
    ("k", 65, "--num-speculative-tokens: must be an integer from 0 to 64, got 65"),
    ("mode", "fast", "--mode: must be one of sync, async, zero-bubble, got 'fast'"),
    ("executor", "thread", "--executor: must be one of inline, process, got 'thread'"),
    ("gpu_memory_utilization", 1.5, "--gpu-memory-utilization: must be in (0, 1], got 1.5"),
    ("enable_prefix_caching", "yes", "--enable-prefix-caching: must be true or false, got 'yes'"),
    ("num_gpu_blocks_override", 0,
     "--num-gpu-blocks-override: must be an integer from 1 to 16777216, got 0"),
    ("seed", -1, "--seed: must be an integer >= 0, got -1"),
])
def test_both_halves_refuse_a_bad_setting_with_one_message(make, setting, value, message):
    with pytest.raises(UserError) as e:
        make(**{setting: value})
    assert str(e.value) == message


@pytest.mark.parametrize("make, setting, value, message", [
    (sim, "speed", 0, "--speed: must be a number from 1e-06 to 1e+06, got 0"),
    (sim, "burstiness", 0, "--burstiness: must be >= 0.01 (or inf), got 0"),
    (sim, "timeseries_interval_s", 0,
     "--timeseries-interval: must be seconds from 0.001 to 3600, got 0"),
    (sim, "tensor_parallel_size", 9, "--tensor-parallel-size: must be an integer from 1 to 8 "
     "(the GPUs of one node; multi-node parallelism is not modelled), got 9"),
    (sim, "jitter", "no", "--jitter: must be true or false, got 'no'"),
    (sim, "cpu_costs", 3, "--cpu-cost: must be a table of OP = [A, B, C], got 3"),
    (sim, "metric_percentiles", [100], "--metric-percentiles: must be percentiles in (0, 100), "
     "got [100]"),
    (sim, "metric_percentiles", [50, 50.0], "--metric-percentiles: names 50.0 twice, got "
     "[50, 50.0]"),
    (sim, "percentile_metrics", ["itl", "itl"], "--percentile-metrics: names 'itl' twice, got "
     "['itl', 'itl']"),
    (engine, "kv_cache_gib", 0, "--kv-cache-gib: must be a finite number > 0, got 0"),
    (engine, "dtype", "int8",
     "--dtype: must be one of float32, bfloat16, float16, float64, got 'int8'"),
    (engine, "tensor_parallel_size", 2, "--tensor-parallel-size 2: the engine (one device) "
     "models 1"),
])
def test_a_halfs_own_setting_is_refused_naming_its_option(make, setting, value, message):
    with pytest.raises(UserError) as e:
        make(**{setting: value})
    assert str(e.value) == message


def test_each_half_keeps_its_own_defaults_of_shared_settings():
    s, e = SimConfig(), EngineArgs(model="tiny")
    assert (s.device, s.executor, s.gpu_memory_utilization) == (None, "inline", 0.9)
    assert (e.device, e.executor, e.gpu_memory_utilization) == ("cpu", "inline", None)
    assert SimConfig(tensor_parallel_size=2).executor == "process"   # vLLM's mp above TP 1


def test_a_run_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SimConfig().k = 2
    assert dataclasses.replace(SimConfig(), k=2).k == 2


def test_old_spellings_of_settings_are_read():
    old = {"worker": "process", "num_kv_blocks": 5, "tp": 2, "spec_method": "ngram",
           "num_speculative_tokens": 3, "device": "async"}
    assert settings_of(old) == {"executor": "process", "num_gpu_blocks_override": 5,
                                "tensor_parallel_size": 2, "method": "ngram", "k": 3,
                                "device": "cuda"}
    assert set(ALIASES) == {"worker", "num_kv_blocks", "tp", "spec_method",
                            "num_speculative_tokens"}


def test_a_result_config_names_every_setting_in_its_old_order():
    assert sorted(CONFIG_KEYS) == sorted(f.name for f in dataclasses.fields(SimConfig))
    assert list(SimConfig().to_dict())[:4] == ["mode", "k", "gpu", "model"]


def _options(parser, command) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices[command]._option_string_actions)


@pytest.mark.parametrize("cls, command", [(SimConfig, "simulate"), (EngineArgs, "run"),
                                          (EngineArgs, "serve")])
def test_every_settings_option_is_on_its_command_line(cls, command):
    offered = _options(build_parser(), command)
    missing = [o.flags for o in options_of(cls).values() if o.flags
               and not set(o.flags) <= offered]
    assert missing == []


@pytest.mark.parametrize("cls", [SimConfig, EngineArgs])
def test_the_command_line_and_the_check_share_each_bound(cls):
    """Past a setting's upper bound, its option's parser and its check both refuse (the
    tensor-parallel size leaves its bound to the check, whose message says why)."""
    make = sim if cls is SimConfig else engine
    bounded = {name: o for name, o in options_of(cls).items()
               if o.flags and o.kind in ("int", "float") and o.hi is not None}
    assert "k" in bounded and (cls is EngineArgs or "speed" in bounded)
    for name, o in bounded.items():
        past = o.hi + 1 if o.kind == "int" else o.hi * 2
        if not o.why:
            with pytest.raises(argparse.ArgumentTypeError):
                parser_of(o)(str(past))
        with pytest.raises(UserError, match=o.name):
            make(**{name: past})


def test_run_spec_alone_holds_the_shared_settings():
    spec = RunSpec(max_model_len=4096, k=3, request_rate=2.0)
    assert (spec.max_model_len, spec.k, spec.request_rate) == (4096, 3, 2.0)
    with pytest.raises(UserError, match="--request-rate: must be > 0"):
        RunSpec(request_rate=0)
