"""The command-line vocabulary of both halves: every option spelled as `vllm serve` and
`vllm bench serve` spell it, parsed in one place.

`stepgap simulate` and `stepgap run` (and `stepgap serve`) take the same options with the same
meaning, so that a user can paste a vLLM command line. A setting's option is built from its
field's metadata (common/run_spec.py): `add_option` adds it, `settings_from_args` reads back
what was given. Every option here defaults to None: each command fills in its own defaults (a
preset's, SimConfig's, EngineArgs'), and can tell an option that was given from one that was
not. Help texts say the default they are given.

- model and speculation: `--model`, `--speculative-config JSON` (its method, model and
  num_speculative_tokens; vLLM's shortcuts `--spec-method`, `--spec-model`, `--spec-tokens`),
  `--num-speculative-tokens` (`-k`), stepgap's `--draft` (speculative_config.model);
- engine: `--mode` (`--async-scheduling`), `--executor` (`--distributed-executor-backend`),
  `--device`;
- scheduler and cache: `--max-num-seqs`, `--max-num-batched-tokens`, `--max-model-len`,
  `--block-size`, `--num-gpu-blocks-override`, `--gpu-memory-utilization`,
  `--tensor-parallel-size` (the simulator 1-8, the engine 1),
  `--data-parallel-size` and `--enable-expert-parallel` (the simulator; the engine 1, off);
- load, as `vllm bench serve`: `--num-prompts`, `--request-rate`, `--burstiness`,
  `--max-concurrency`, `--seed`, the trace (`--dataset-path`);
- results: `--save-result`, `--result-dir`, `--result-filename`, `--save-detailed`,
  `--result-json`, `--metric-percentiles`, `--percentile-metrics`.

Old spellings stay as aliases (`--k`, `--num-spec-tokens`, `--target`, `--worker`,
`--num-kv-blocks`, `--num-blocks`, `--detailed`). A vLLM option that stepgap does not model is
named in one line and ignored (`ignore_vllm_options`); anything else unknown is an error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from stepgap.common.errors import UserError, shown
from stepgap.common.formats import METRICS
from stepgap.common.limits import MAX_K, first_repeat, is_int
from stepgap.common.run_spec import Option, RunSpec, options_of
from stepgap.common.speculation import METHODS

# vLLM's --distributed-executor-backend: one process (the worker inline) or a worker process.
EXECUTOR_BACKENDS = {"uni": "inline", "mp": "process"}
SPEC_KEYS = ("method", "model", "num_speculative_tokens")
# speculative_config's keys the simulator models besides (sim/drafter_costs.py), each a bool
DRAFTER_SPEC_KEYS = ("disable_padded_drafter_batch", "parallel_drafting", "enforce_eager")


# ---------------------------------------------------------------------------------------------
# Values


def add_command(sub, name: str, help: str, description: str, epilog: str | None = None,
                **kw) -> argparse.ArgumentParser:
    """A command's parser: its line in `stepgap --help`, its description, and its examples
    (the epilog), printed as written."""
    kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    return sub.add_parser(name, help=help, description=description, epilog=epilog, **kw)


def _parse(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def rate_arg(text: str) -> float:
    v = _parse(text, float)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return v


def nonneg_int(text: str) -> int:
    v = _parse(text, int)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def positive_int(text: str) -> int:
    v = _parse(text, int)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def nonneg_float(text: str) -> float:
    v = _parse(text, float)
    if not 0 <= v < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def positive_float(text: str) -> float:
    v = _parse(text, float)
    if not 0 < v < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def at_most(parse, hi: float):
    """The parser `parse`, refusing values above `hi` (common/limits.py)."""
    def bounded(text: str):
        v = parse(text)
        if v > hi:
            top = f"{hi:g}" if float(f"{hi:g}") == hi else f"{hi:,}"   # (2^24, not 1.67772e+07)
            raise argparse.ArgumentTypeError(f"must be at most {top}, got "
                                             f"{text if len(text) <= 60 else shown(text)}")
        return v
    bounded.__name__ = parse.__name__
    return bounded


def at_least(parse, lo: float):
    """The parser `parse`, refusing values below `lo` (common/limits.py)."""
    def bounded(text: str):
        v = parse(text)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo:g}, got {text}")
        return v
    bounded.__name__ = parse.__name__
    return bounded


def fraction(text: str) -> float:
    v = _parse(text, float)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def _numbers(text: str) -> tuple[float, ...]:
    """Comma-separated numbers."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") \
            from None


def rates_arg(text: str) -> tuple[float, ...]:
    """Comma-separated per-position acceptance rates."""
    rates = _numbers(text)
    if not rates:
        raise argparse.ArgumentTypeError("expected at least one rate")
    if any(not 0 <= r <= 1 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be in [0, 1], got {text!r}")
    return rates


def percentiles_arg(text: str) -> tuple[float, ...]:
    """`--metric-percentiles 50,90,99`, as vLLM takes them."""
    ps = _numbers(text)
    if not ps or any(not 0 < p < 100 for p in ps):
        raise argparse.ArgumentTypeError(f"percentiles must be in (0, 100), got {text!r}")
    _once(ps, text)
    return ps


def _once(values: tuple, text: str) -> None:
    """A list option's value names each item once (a second would print its key twice)."""
    again = first_repeat(values)
    if again is not None:
        shown = f"{again:g}" if isinstance(again, float) else again
        raise argparse.ArgumentTypeError(f"{shown} given twice in {text!r}")


def metrics_arg(text: str) -> tuple[str, ...]:
    """`--percentile-metrics ttft,tpot,itl`, as vLLM takes them."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in METRICS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(METRICS)}, got {text!r}")
    _once(names, text)
    return names


def speculative_config_arg(text: str) -> dict:
    """`--speculative-config '{"method": "eagle3", "model": DIR, "num_speculative_tokens": 4}'`"""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at column {e.colno})") \
            from None
    except RecursionError:
        raise argparse.ArgumentTypeError("not valid JSON (nested too deeply)") from None
    if not isinstance(d, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    method = d.get("method")
    if method is not None and method not in METHODS:
        raise argparse.ArgumentTypeError(
            f"method {method!r} is not modelled (stepgap models {', '.join(METHODS)}; "
            "the engine eagle3 only)")
    model = d.get("model")
    if model is not None and not isinstance(model, str):
        raise argparse.ArgumentTypeError(f"model: expected a path or preset name, got {model!r}")
    k = d.get("num_speculative_tokens")
    if k is not None and (not is_int(k) or not 0 <= k <= MAX_K):
        raise argparse.ArgumentTypeError(f"num_speculative_tokens: expected an integer from 0 "
                                         f"to {MAX_K}, got {k!r}")
    for key in DRAFTER_SPEC_KEYS:
        if key in d and not isinstance(d[key], bool):
            raise argparse.ArgumentTypeError(f"{key}: expected true or false, got {d[key]!r}")
    return d


# ---------------------------------------------------------------------------------------------
# Option groups


def parser_of(o: Option):
    """The argparse type of a setting's Option: its kind's parser within its limits (a bound
    with a reason, `o.why`, is left to the setting's check, whose message gives it); None for
    names, choices and bools."""
    if o.kind in ("name", "choice", "bool", "table"):
        return None
    listed = {"rates": rates_arg, "percentiles": percentiles_arg, "metrics": metrics_arg,
              "fraction": fraction}
    if o.kind in listed:
        return listed[o.kind]
    if o.kind == "rate":
        return at_least(rate_arg, o.lo) if o.lo > 0 else rate_arg
    if o.kind == "int":
        parse = positive_int if o.lo >= 1 else nonneg_int
        parse = at_least(parse, o.lo) if o.lo > 1 else parse
    else:
        parse = positive_float if o.lo > 0 or o.gt else nonneg_float
        parse = at_least(parse, o.lo) if o.lo > 0 else parse
    return at_most(parse, o.hi) if o.hi is not None and not o.why else parse


def add_option(g, name: str, defaults=None, help: str | None = None, tail: str | None = None,
               **kw) -> None:
    """Add setting `name`'s option to the argparse group `g`, as its Option (common/run_spec.py)
    spells, parses and explains it. `defaults`: the command's config (a RunSpec, SimConfig or
    EngineArgs), whose value ends the help (" (default X)") unless the Option says otherwise
    or `tail` ends it instead; `help` replaces the whole. It defaults to None, so that a command
    can tell an option given from one not given; `kw` overrides what argparse is told."""
    o = options_of(type(defaults) if defaults is not None else RunSpec)[name]
    if help is None:
        v = getattr(defaults, name, None) if o.shown else None
        v = f"{v:g}" if isinstance(v, float) else v
        help = o.help + (tail if tail is not None else "" if v in (None, "") else
                         f" (default {v})")
    args = {"dest": name, "help": help, "default": None}
    if o.kind == "bool":
        args["action"] = o.action or argparse.BooleanOptionalAction
    elif o.kind == "choice":
        args["choices"] = o.choices
    elif (parse := parser_of(o)) is not None:
        args["type"] = parse
    if o.metavar:
        args["metavar"] = o.metavar
    g.add_argument(*o.flags, **{**args, **kw})


def settings_from_args(args, cls) -> dict:
    """The settings of `cls` (a class of common/run_spec.py's groups) that a parsed command
    line gives: every option of its fields not left None, by field name."""
    return {name: getattr(args, name) for name, o in options_of(cls).items()
            if o.flags and getattr(args, name, None) is not None}


def add_model_args(p, defaults=None, draft_help: str | None = None, tp_help: str | None = None,
                   dp_help: str | None = None):
    g = p.add_argument_group("model and speculative decoding (as `vllm serve`)")
    add_option(g, "model", defaults)
    g.add_argument("--speculative-config", type=speculative_config_arg, metavar="JSON",
                   help='speculative decoding as vLLM takes it: {"method": METHOD, "model": '
                        'DIR|PRESET, "num_speculative_tokens": K}, METHOD one of '
                        f"{', '.join(METHODS)}; other keys are ignored, with a note")
    add_option(g, "method", defaults)
    g.add_argument("--spec-model", metavar="DIR|PRESET",
                   help="vLLM's shortcut for speculative_config's model (as --draft)")
    g.add_argument("--spec-tokens", type=at_most(nonneg_int, MAX_K), metavar="K",
                   help="vLLM's shortcut for num_speculative_tokens (as -k)")
    add_option(g, "k", defaults)
    add_option(g, "draft", defaults, tail=draft_help)
    add_option(g, "tensor_parallel_size", defaults, help=tp_help)
    add_option(g, "data_parallel_size", defaults, help=dp_help)
    add_option(g, "enable_expert_parallel", defaults)
    return g


def add_engine_args(p, defaults=None, device_help: str | None = None):
    g = p.add_argument_group("engine")
    add_option(g, "mode", defaults)
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's spelling: --async-scheduling is --mode async, "
                        "--no-async-scheduling is --mode sync")
    add_option(g, "executor", defaults)
    g.add_argument("--distributed-executor-backend", choices=tuple(EXECUTOR_BACKENDS),
                   help="vLLM's spelling: uni is --executor inline, mp is --executor process")
    add_option(g, "device", defaults, help=device_help)
    return g


def add_scheduler_args(p, defaults=None, blocks_help: str = ""):
    g = p.add_argument_group("scheduler and KV cache (as `vllm serve`)")
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
        add_option(g, name, defaults)
    add_option(g, "num_gpu_blocks_override", defaults, tail=blocks_help)
    for name in ("gpu_memory_utilization", "enable_prefix_caching",
                 "scheduler_reserve_full_isl"):
        add_option(g, name, defaults)
    return g


def add_load_args(p, default_workload: str = "mtbench", many: bool = False):
    """The workload and the load; `many`: --request-rate and --max-concurrency take lists of
    load points (stepgap advise), as VALUES or V1,V2,... (`load_list` reads them)."""
    from stepgap.common.datasets import MODELLED
    from stepgap.common.workloads import BUILTIN
    g = p.add_argument_group("workload and load (as `vllm bench serve`)")
    g.add_argument("--trace", "--workload", dest="trace", default=None, metavar="NAME|FILE",
                   help=f"built-in workload ({', '.join(BUILTIN)}) or a trace file: JSON lines "
                        f"{{request_id, arrival_s, prompt_len, output_len}}, a `vllm bench "
                        f"serve --save-result --save-detailed` file (its requests), or a vLLM "
                        f"run's requests.jsonl (default: {default_workload})")
    g.add_argument("--dataset-name", default=None, metavar="NAME",
                   help=f"a dataset of `vllm bench serve`, sampled as vLLM 0.32 samples it: "
                        f"{', '.join(MODELLED)} (docs/reference/workloads.md, 'Workloads'); "
                        "its options below. "
                        "Without it the workload is --trace's (vLLM's default, random, when "
                        "a --random-* option is given)")
    g.add_argument("--dataset-path", default=None, metavar="FILE|ID",
                   help="sharegpt: the local ShareGPT JSON; hf: the dataset's id "
                        "(philschmid/mt-bench); without --dataset-name, a trace file as "
                        "--trace takes")
    g.add_argument("--tokenizer", default=None, metavar="DIR|ID",
                   help="the tokenizer that counts a ShareGPT file's tokens (a folder with "
                        "tokenizer.json, or an id in this machine's Hugging Face cache; "
                        "default: the model's, else an estimate of 4 characters a token, "
                        "named in the run's notes)")
    add_option(g, "num_prompts")
    add_option(g, "output_len")
    for name in ("request_rate", "burstiness", "max_concurrency", "seed"):
        if many and name in LOAD_LISTS:   # words, read by load_list
            metavar, text = LOAD_LISTS[name]
            add_option(g, name, help=text, nargs="+", action="extend", type=None,
                       metavar=metavar)
        else:
            add_option(g, name)
    g.add_argument("--ignore-eos", action="store_true",
                   help="accepted for vLLM's sake: stepgap always generates each request's "
                        "output length")
    g.add_argument("--disable-shuffle", action="store_true", default=None,
                   help="sharegpt: take the file's conversations in order (vLLM shuffles them "
                        "with --seed)")
    from stepgap.common.limits import MAX_PARAM
    from stepgap.common.workloads import ZERO_OK
    for flag, key, what in WORKLOAD_FLAGS:   # a length may be 0 where the workload allows it
        kind = ratio_arg if key == "range_ratio" else \
            at_most(nonneg_int if key in ZERO_OK else positive_int, MAX_PARAM)
        g.add_argument(flag, dest=flag.lstrip("-").replace("-", "_"), type=kind,
                       default=None, metavar="R" if key == "range_ratio" else "N", help=what)
    add_option(g, "shared_fraction")
    return g


# The load options that take lists of load points (stepgap advise): their metavar and help.
LOAD_LISTS = {
    "request_rate": ("RPS", "the request rates to judge (requests per second, or inf), e.g. "
                            "2 4 8 or 2,4,8; with --max-concurrency, every pair"),
    "max_concurrency": ("N", "the concurrencies to judge, e.g. 1 2 4 8 16 32 or 1,2,4,8,16,32 "
                             "(the benchmark client's semaphore)"),
}


def load_list(option: str, words: list[str] | None, parse) -> list | None:
    """A list of load points from the words given to `option` (each VALUE or V1,V2,...),
    parsed by `parse` (rate_arg, positive_int); None when the option was not given."""
    if words is None:
        return None
    values, given = [], {}
    for word in words:
        items = [t.strip() for t in word.split(",")]
        if "" in items[:-1] and any(items):   # (a trailing comma is harmless)
            raise UserError(f"{option} {word!r}: an empty value between commas; give "
                            "numbers, as 1,2,4 or 1 2 4")
        for text in filter(None, items):
            try:
                v = parse(text)
            except argparse.ArgumentTypeError as e:
                raise UserError(f"{option} {text!r}: {e}") from None
            if v in given:
                again = "" if given[v] == text else f" (as {given[v]!r} before)"
                raise UserError(f"{option}: {text!r} is given twice{again}; each load point "
                                "is judged once")
            given[v] = text
            values.append(v)
    if not values:
        raise UserError(f"{option}: the load list is empty; give at least one value")
    return values


def ratio_arg(text: str) -> float:
    v = _parse(text, float)
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), as vLLM takes it, got {text}")
    return v


# The datasets' options, vLLM's flags (and the multi-turn sessions'): (flag, the workload's
# parameter, help). A flag belongs to the dataset whose name its prefix spells (DATASET_FLAGS).
WORKLOAD_FLAGS = (
    ("--random-input-len", "input_len", "random: input tokens of a prompt, the special tokens "
                                        "the tokenizer adds included (default 1024)"),
    ("--random-output-len", "output_len", "random: output tokens (default 128)"),
    ("--random-range-ratio", "range_ratio", "random: lengths drawn from [len x (1 - R), len x "
                                            "(1 + R)] (default 0)"),
    ("--random-prefix-len", "prefix_len", "random: tokens of a prefix every prompt shares "
                                          "before its own input (default 0)"),
    ("--sharegpt-output-len", "output_len", "sharegpt: every output this long (default: the "
                                            "file's second turn's)"),
    ("--hf-output-len", "output_len", "hf: output tokens (default 256 for philschmid/mt-bench)"),
    ("--prefix-repetition-prefix-len", "prefix_len", "prefix_repetition: tokens of each shared "
                                                     "prefix (default 256)"),
    ("--prefix-repetition-suffix-len", "suffix_len", "prefix_repetition: tokens after it, each "
                                                     "prompt its own (default 256)"),
    ("--prefix-repetition-num-prefixes", "num_prefixes", "prefix_repetition: prefixes, each "
                                                         "shared by num_prompts / this prompts "
                                                         "(default 10)"),
    ("--prefix-repetition-output-len", "output_len", "prefix_repetition: output tokens "
                                                     "(default 128)"),
    ("--gsp-num-groups", "num_groups", "generated-shared-prefix: system prompts (default 64)"),
    ("--gsp-prompts-per-group", "prompts_per_group", "generated-shared-prefix: questions per "
                                                     "system prompt (default 16)"),
    ("--gsp-system-prompt-len", "system_prompt_len", "generated-shared-prefix: tokens of a "
                                                     "system prompt (default 1664; SGLang's 2048 needs "
                                                     "--max-model-len 2432)"),
    ("--gsp-question-len", "question_len", "generated-shared-prefix: tokens of a question "
                                           "(default 128)"),
    ("--gsp-output-len", "output_len", "generated-shared-prefix: output tokens (default 256)"),
    ("--multi-turn-sessions", "sessions", "multi-turn: chat sessions (default 16)"),
    ("--multi-turn-turns", "turns", "multi-turn: turns per session (default 4)"),
    ("--multi-turn-first-len", "first_len", "multi-turn: tokens of a session's first prompt "
                                            "(default 256)"),
    ("--multi-turn-user-len", "user_len", "multi-turn: tokens of each later user message "
                                          "(default 64)"),
)
DATASET_FLAGS = {"random": "--random-", "sharegpt": "--sharegpt-", "hf": "--hf-",
                 "prefix_repetition": "--prefix-repetition-",
                 "generated-shared-prefix": "--gsp-", "multi-turn": "--multi-turn-"}


def dataset_spec(name: str, path: str | None = None, params: dict | None = None) -> str:
    """The workload spec (common/workloads.py NAME:KEY=VALUE...:path=PATH) of a vLLM dataset
    by its --dataset-name, --dataset-path and options, each checked (common/datasets.py): one
    spec for the command line, sweep grids and `stepgap advise`."""
    from stepgap.common.datasets import check_dataset_name
    check_dataset_name(name, path)
    parts = [name] + [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in (params or {}).items() if v is not None]
    if path is not None:
        parts.append(f"path={path}")
    return ":".join(parts)


def workload_spec(args) -> str | None:
    """--trace, or --dataset-name with its options as a workload spec (dataset_spec): a
    dataset's option without its --dataset-name is an error (but --random-* alone is vLLM's
    default dataset, random), as is --dataset-name beside a --trace. An output-length option
    of the dataset sets --output-len."""
    name = getattr(args, "dataset_name", None)
    path = getattr(args, "dataset_path", None)
    given = [(flag, key, getattr(args, flag.lstrip("-").replace("-", "_"), None))
             for flag, key, _ in WORKLOAD_FLAGS]
    given = [(flag, key, v) for flag, key, v in given if v is not None]
    if name is None and given and all(f.startswith("--random-") for f, _, _ in given) \
            and path is None and args.trace is None:
        name = "random"   # vLLM's default --dataset-name
        note(args, "--random-* options without --dataset-name: vLLM's default dataset, random")
    if name is None:
        if given:
            raise UserError(f"{given[0][0]}: give --dataset-name, the workload it belongs to")
        if path is not None and args.trace is not None:
            raise UserError(f"--dataset-path {path} and --trace {args.trace}: give one")
        return args.trace if path is None else path
    if args.trace is not None:
        raise UserError(f"--dataset-name {name} and --trace {args.trace}: give one")
    prefix = DATASET_FLAGS.get(name)
    params = {}
    for flag, key, v in given:
        if prefix is None or not flag.startswith(prefix):
            raise UserError(f"{flag}: an option of another workload than --dataset-name {name}")
        if key == "output_len":
            if args.output_len is not None and args.output_len != v:
                raise UserError(f"{flag} {v} and --output-len {args.output_len} differ; give one")
            args.output_len = v
        else:
            params[key] = v
    if name == "sharegpt" and path is not None:
        params["shuffle"] = 0 if getattr(args, "disable_shuffle", None) else None
    elif name == "sharegpt":
        note(args, "--dataset-name sharegpt without --dataset-path: the built-in ShareGPT-like "
                   "length mix stands in (log-normal, mean prompt 161 and output 338 tokens; "
                   "docs/reference/workloads.md); give the file for its own lengths")
    if name in ("random", "sharegpt") and getattr(args, "tokenizer", None):
        params["tokenizer"] = args.tokenizer
    return dataset_spec(name, path, params)


def add_result_args(p, timeline_help: str = ""):
    g = p.add_argument_group("results (as `vllm bench serve`)")
    g.add_argument("--result-json", metavar="PATH",
                   help="write the run result here (vllm bench serve --save-result keys, plus "
                        "step_gaps, spec_decode and config)")
    g.add_argument("--save-result", action="store_true",
                   help="write the run result to --result-dir/--result-filename, named as "
                        "vLLM names it when no filename is given")
    g.add_argument("--result-dir", metavar="DIR", help="folder of --save-result (default .)")
    g.add_argument("--result-filename", metavar="NAME", help="file name of --save-result")
    for name in ("detailed", "metric_percentiles", "percentile_metrics"):
        add_option(g, name)
    g.add_argument("--timeline", metavar="PATH",
                   help=timeline_help or "write the step timeline as JSON lines to PATH and a "
                                         "Chrome-trace/Perfetto file beside it")
    return g


# ---------------------------------------------------------------------------------------------
# Resolving what was given


def speculative_from_args(args, modelled: tuple[str, ...] = SPEC_KEYS
                          ) -> tuple[str | None, str | None, int | None]:
    """(method, draft, k) from --speculative-config and its shortcuts (--spec-method,
    --num-speculative-tokens, --draft): each given once, or given alike. None where none of
    them says. Its keys past `modelled` are named in a note and ignored."""
    spec = getattr(args, "speculative_config", None) or {}
    ignored = sorted(set(spec) - set(modelled))
    if ignored:
        note(args, f"ignoring speculative_config key{'s' * (len(ignored) > 1)} "
                   f"{', '.join(ignored)} (not modelled)")
    method, draft, k = spec.get("method"), spec.get("model"), spec.get("num_speculative_tokens")
    for flag, key, given in (("--spec-method", "method", getattr(args, "method", None)),
                             ("--spec-model", "model", getattr(args, "spec_model", None)),
                             ("--spec-tokens", "num_speculative_tokens",
                              getattr(args, "spec_tokens", None))):
        if given is not None and spec.get(key) is not None and spec[key] != given:
            raise UserError(f"{flag} {given} and --speculative-config's {key} {spec[key]} "
                            "differ; give one")
    method = method if getattr(args, "method", None) is None else args.method
    draft = draft if getattr(args, "spec_model", None) is None else args.spec_model
    k = k if getattr(args, "spec_tokens", None) is None else args.spec_tokens
    if args.draft is not None:
        if draft is not None and draft != args.draft:
            raise UserError(f"--draft {args.draft} and --speculative-config's model {draft} "
                            "differ; give one")
        draft = args.draft
    if args.k is not None:
        if k is not None and k != args.k:
            raise UserError(f"--num-speculative-tokens {args.k} and --speculative-config's "
                            f"num_speculative_tokens {k} differ; give one")
        k = args.k
    return method, draft, k


def drafter_without_k(draft: str | None, k: int | None) -> str | None:
    """One line where a drafter is given but no draft tokens (k 0, or num_speculative_tokens
    not given): vLLM refuses an EAGLE head without num_speculative_tokens, and k = 0 runs no
    speculation at all, so the drafter given would be dropped silently. None otherwise."""
    if draft is None or k:
        return None
    said = "num_speculative_tokens is 0" if k == 0 else "no num_speculative_tokens is given"
    return (f"the drafter {draft} is given but {said}: this runs without speculative decoding "
            "(give num_speculative_tokens in --speculative-config, or -k)")


def mode_from_args(args) -> str | None:
    a = getattr(args, "async_scheduling", None)
    if a is None:
        return args.mode
    implied = "async" if a else "sync"
    if args.mode is not None and (args.mode == "sync") == a:
        raise UserError(f"--mode {args.mode} and --{'' if a else 'no-'}async-scheduling "
                        "disagree; give one")
    return args.mode or implied


def executor_from_args(args) -> str | None:
    backend = getattr(args, "distributed_executor_backend", None)
    if backend is None:
        return args.executor
    ex = EXECUTOR_BACKENDS[backend]
    if args.executor is not None and args.executor != ex:
        raise UserError(f"--executor {args.executor} and --distributed-executor-backend "
                        f"{backend} disagree; give one")
    return ex


def result_path(args, backend: str, model: str) -> Path | None:
    """Where the run result goes: --result-json, or --save-result's folder and name (vLLM's
    default name: BACKEND-RATEqps[-concurrencyN]-MODEL-YYYYmmdd-HHMMSS.json)."""
    if args.result_json:
        return Path(args.result_json)
    if not (args.save_result or args.result_dir or args.result_filename):
        return None
    name = args.result_filename
    if not name:
        rate = "inf" if args.request_rate in (None, math.inf) else f"{args.request_rate:g}"
        conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = f"{backend}-{rate}qps{conc}-{Path(str(model)).name}-" \
               f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    return Path(args.result_dir or ".") / name


def check_outputs(args, result, timeline=(), chrome: str | None = None) -> None:
    """Every output path of a run, checked before the run starts, each named by its option: its
    result (--result-json, or --save-result's), its timeline and the timeline's Chrome trace
    (`timeline`: those paths, in that order), a Chrome trace of its own (`chrome`). Each is a
    file of its own (common/fileio.py check_distinct: two options naming one file would lose
    one) and can be written (check_writable)."""
    from stepgap.common.fileio import check_distinct, check_not_input, check_writable
    outputs = [("--result-json" if getattr(args, "result_json", None) else "--save-result",
                result),
               *zip(("--timeline", "--timeline's Chrome trace"), timeline or ()),
               ("--chrome-trace", chrome)]
    check_distinct(outputs)
    check_not_input(outputs, getattr(args, "input_paths", ()))   # (stepgap/cli.py gathers them)
    for option, path in outputs:
        if path is not None:
            check_writable(path, option)


def percentiles_from_args(args) -> dict:
    """Keyword arguments for run_result: the percentiles and the metrics that get them."""
    out = {}
    if getattr(args, "metric_percentiles", None):
        out["percentiles"] = args.metric_percentiles
    if getattr(args, "percentile_metrics", None):
        out["percentile_metrics"] = args.percentile_metrics
    return out


LOAD_DEFAULTS = {"burstiness": 1.0, "seed": 0}


def fill_load_defaults(args) -> None:
    """Give the load options left unset their defaults. (They default to None so that scenario
    presets can tell an explicit value from none.)"""
    for name, value in LOAD_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def workload_from_args(args, default_workload: str = "mtbench", vocab_size: int | None = None):
    from stepgap.common.workloads import apply_request_rate, load_workload
    fill_load_defaults(args)
    reqs = load_workload(workload_spec(args) or default_workload, args.num_prompts,
                         args.output_len, args.seed, vocab_size,
                         getattr(args, "shared_fraction", None), getattr(args, "model", None))
    return apply_request_rate(reqs, args.request_rate, args.burstiness, args.seed)


def note(args, text: str) -> None:
    """One line to stderr, as `stepgap COMMAND: text` (unless --quiet)."""
    if not getattr(args, "quiet", False):
        print(f"stepgap {getattr(args, 'command', '')}: {text}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# vLLM options that stepgap does not model


def vllm_option_names() -> frozenset[str]:
    """Every long option of `vllm serve` and `vllm bench serve` (common/vllm_options.json,
    dumped from vLLM's own parsers; its header names the version)."""
    from stepgap.common.fileio import read_json
    doc = read_json(Path(__file__).with_name("vllm_options.json"))
    return frozenset(doc["serve"]) | frozenset(doc["bench_serve"])


def model_tag(parser, argv: list[str]) -> list[str]:
    """`stepgap simulate MODEL ...` as `vllm serve MODEL ...`: a word right after a command that
    takes --model and vLLM's options is its --model (given also as --model, the same or an
    error)."""
    if len(argv) < 2 or argv[1].startswith("-") or argv[0] not in parser.commands:
        return argv
    command = parser.commands[argv[0]]
    flags = [f for f in ("--model", "--target") if f in command._option_string_actions]
    if not flags or not command.get_default("vllm_options"):
        return argv
    rest = argv[2:]
    for i, word in enumerate(rest):
        name, eq, value = word.partition("=")
        if name in flags:
            other = value if eq else rest[i + 1] if i + 1 < len(rest) else None
            if other != argv[1]:
                raise two_models(argv[1], name, other)
    return [argv[0], "--model", argv[1], *rest]


def two_models(tag: str, flag: str, model) -> UserError:
    """vLLM's MODEL and --model (or --target) both given, and not the same."""
    return UserError(f"MODEL {tag} and {flag} {model}: give one")


def late_model_tag(args, extra: list[str]) -> list[str]:
    """`stepgap simulate --gpu h100 ... MODEL`: vLLM's MODEL is a positional argument, so it
    may stand among the options too (`model_tag` takes it right after the command); a word the
    parser left over before any option it did not know is it. Returns the words still left."""
    if not extra or extra[0].startswith("-") or not hasattr(args, "model"):
        return extra
    if args.model is not None and args.model != extra[0]:
        raise two_models(extra[0], "--model", args.model)
    args.model = extra[0]
    return extra[1:]


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def ignore_vllm_options(parser, args, extra: list[str]) -> None:
    """Leftover command-line words: a vLLM option (with its values) gets one line saying it is
    ignored; anything else is argparse's usual error."""
    known = vllm_option_names()
    ignored, unknown, i = [], [], 0
    while i < len(extra):
        word = extra[i]
        name = word.split("=", 1)[0]
        j = i + 1
        while j < len(extra) and (not extra[j].startswith("-") or _is_number(extra[j])):
            j += 1
        if name.startswith("--") and name in known:
            ignored.append(name)
        else:
            unknown += extra[i:j]
        i = j
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    for name in ignored:   # even with --quiet: never a silent drop
        print(f"stepgap {args.command}: ignoring {name} (a vLLM option that stepgap does not "
              "model)", file=sys.stderr)
