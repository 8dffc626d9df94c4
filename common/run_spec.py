"""One run's settings, defined once for both halves: `RunSpec`, made of frozen groups whose
fields say, in their metadata (`Option`), how vLLM spells them, their old names, their limits
and their help.

- `ModelSpec`: the target and its speculative decoding (method, drafter, k);
- `SchedulerSpec`: the scheduler and the KV cache (mode, limits, blocks, prefix caching);
- `TopologySpec`: where the step loop runs (executor, device, tensor, data and expert
  parallelism);
- `LoadSpec`: the workload and the load, as `vllm bench serve` sends it;
- `OutputSpec`: what the result holds besides vLLM's metrics.

A group is a base class, so its fields stay flat attributes (`cfg.max_model_len`, as files,
grids, results and the code name them): `RunSpec` is all five; `SimConfig` (sim/config.py) is
a RunSpec plus the simulator's costs; `EngineArgs` (engine/args.py) is the model, scheduler and
topology groups plus the device's settings (its load and outputs are each run's). Their own
fields carry Options too. From the metadata come the one check of a value (`check_fields`, run
by each `__post_init__`, which adds the checks that span fields), the one argparse builder and
reader (common/options.py `add_option`, `settings_from_args`), the old spellings still read
(`ALIASES`) and the option an error names (`flag`). Every error names the option and the value,
before any work.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from functools import cache

from stepgap.common.speculation import METHODS
from stepgap.common.errors import UserError, shown
from stepgap.common.formats import DEVICES, EXECUTORS, METRICS, MODES, OLD_DEVICES
from stepgap.common.limits import (MAX_K, MAX_PARAM, MAX_PROMPTS, MAX_TOKENS, MAX_TP,
                                   MIN_BURSTINESS, first_repeat, is_finite, is_int, is_number)
from stepgap.common.scheduler import (BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS,
                                      MAX_NUM_SEQS)


@dataclass(frozen=True, slots=True)
class Option:
    """How a setting is spelled, bounded and explained.

    `kind`: name (a name or a path), choice, bool, int, float, fraction (in (0, 1]), rate (a
    number > `lo`, or >= `lo` when `lo` > 0, inf allowed), or a list: rates, percentiles,
    metrics; table (a dict, checked by its class). `lo`, `hi` bound ints and floats; a float's
    `lo` is excluded where `gt`. A field whose default is None may be None."""

    flags: tuple[str, ...] = ()   # the command line's spellings (none: not an option)
    help: str = ""
    kind: str = "name"
    lo: float = 0
    hi: float | None = None
    gt: bool = False
    choices: tuple = ()
    metavar: str | None = None
    old: tuple[str, ...] = ()     # old names of the field, still read in files and grids
    label: str | None = None      # how errors name it, where not flags[0]
    what: str | None = None       # the value's noun in a range's message ("seconds")
    why: str = ""                 # said after the range ("(the GPUs of one node; ...)")
    refusal: str | None = None    # the whole complaint, where not the kind's
    action: str | None = None     # a bool's argparse action (store_true, store_false; else
                                  # --x/--no-x)
    shown: bool = True            # the help ends in the command's default (" (default X)")

    @property
    def name(self) -> str:
        return self.label or (self.flags[0] if self.flags else "")


def opt(default, *flags: str, **kw):
    """A dataclass field with its Option (a dict default is copied per instance)."""
    meta = {"option": Option(flags, **kw)}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def same(group, name: str, default=MISSING):
    """Field `name` of `group` again, in a class that holds it under another default (a half's
    own), its Option unchanged."""
    f = group.__dataclass_fields__[name]
    if default is MISSING and f.default_factory is not MISSING:
        return field(default_factory=f.default_factory, metadata=f.metadata)
    return field(default=f.default if default is MISSING else default, metadata=f.metadata)


def option_of(f) -> Option | None:
    return f.metadata.get("option")


def bad(option: str, what: str, v) -> UserError:
    return UserError(f"{option}: {what}, got {shown(v)}")


def _complaint(o: Option, v) -> str | None:
    """What is wrong with `v` (not None) as a value of Option `o`, or None."""
    k = o.kind
    if k == "name":
        return None if isinstance(v, str) else "must be a name or a path"
    if k == "bool":
        return None if isinstance(v, bool) else "must be true or false"
    if k == "choice":
        return None if v in o.choices else f"must be one of {', '.join(o.choices)}"
    if k == "int":
        if is_int(v) and v >= o.lo and (o.hi is None or v <= o.hi):
            return None
        what = o.what or "an integer"
        return (f"must be {what} from {o.lo} to {o.hi}" if o.hi is not None
                else f"must be {what} >= {o.lo}") + o.why
    if k == "float":
        if is_finite(v) and (v > o.lo if o.gt else v >= o.lo) and (o.hi is None or v <= o.hi):
            return None
        if o.hi is None:
            return f"must be a finite number {'>' if o.gt else '>='} {o.lo:g}"
        return f"must be {o.what or 'a number'} from {o.lo:g} to {o.hi:g}"
    if k == "fraction":
        return None if is_finite(v) and 0 < v <= 1 else "must be in (0, 1]"
    if k == "rate":
        if is_number(v) and not math.isnan(v) and (v >= o.lo if o.lo > 0 else v > 0):
            return None
        return f"must be >= {o.lo:g} (or inf)" if o.lo > 0 else "must be > 0 (or inf)"
    if k in ("rates", "percentiles", "metrics"):
        if isinstance(v, (str, dict)) or not hasattr(v, "__iter__"):
            return "must be a list"
        v = tuple(v)
        if k == "percentiles" and not (v and all(is_finite(p) and 0 < p < 100 for p in v)):
            return "must be percentiles in (0, 100)"
        if k == "metrics" and not set(v) <= set(METRICS):
            return f"must be some of {', '.join(METRICS)}"
        if k in ("percentiles", "metrics") and (again := first_repeat(v)) is not None:
            return f"names {again!r} twice"
    if k == "table" and not isinstance(v, dict):
        return "must be a table"
    return None


def check_fields(obj) -> None:
    """Every field of `obj` that has an Option, held to it, in field order: the first bad one
    raises, naming its option and its value. Lists are kept as tuples."""
    for f in fields(obj):
        o = option_of(f)
        if o is None:
            continue
        v = getattr(obj, f.name)
        if v is None and f.default is None:
            continue
        what = _complaint(o, v)
        if what is not None:
            raise bad(o.name, o.refusal or what, v)
        if o.kind in ("rates", "percentiles", "metrics") and not isinstance(v, tuple):
            object.__setattr__(obj, f.name, tuple(v))


# ---------------------------------------------------------------------------------------------
# The groups


@dataclass(frozen=True)
class ModelSpec:
    """The target and its speculative decoding (vLLM's --model and --speculative-config)."""

    model: str = opt("llama-3.1-8b", "--model", "--target", metavar="ID|DIR|PRESET",
                     help="the target, as `vllm serve MODEL` (also the word after the command): "
                          "a Hugging Face id stepgap knows (meta-llama/Llama-3.1-8B-Instruct, "
                          "Qwen/Qwen3-8B, ...: nothing is downloaded), a model folder, its "
                          "config.json, or a preset")
    method: str = opt("eagle3", "--spec-method", kind="choice", choices=METHODS,
                      label="--speculative-config method", old=("spec_method",),
                      help="vLLM's shortcut for speculative_config's method")
    # speculative_config's model: an EAGLE head (None: the simulator shapes one from the
    # target), the draft model of draft_model
    draft: str | None = opt(None, "--draft", metavar="ID|DIR|PRESET",
                            help="the drafter, the same as speculative_config's model (a "
                                 "head's id: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, RedHatAI's "
                                 "speculators, ...)")
    k: int = opt(0, "--num-speculative-tokens", "-k", "--k", "--num-spec-tokens", kind="int",
                 hi=MAX_K, metavar="K", old=("num_speculative_tokens",),
                 help="draft tokens per step, the same as speculative_config's "
                      "num_speculative_tokens; 0 is plain decoding")


@dataclass(frozen=True)
class SchedulerSpec:
    """vLLM's scheduler and KV cache settings; `mode` is how steps are scheduled
    (docs/explanation/design.md §1: sync, or async scheduling's two modes)."""

    mode: str = opt("sync", "--mode", kind="choice", choices=MODES,
                    help="step scheduling (docs/explanation/design.md §1)")
    max_num_seqs: int = opt(MAX_NUM_SEQS, "--max-num-seqs", kind="int", lo=1, hi=MAX_PROMPTS,
                            metavar="N", help="most requests in one step")
    max_num_batched_tokens: int = opt(MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens",
                                      kind="int", lo=1, hi=MAX_TOKENS, metavar="N",
                                      help="token budget of one step; longer prompts are "
                                           "chunked")
    max_model_len: int = opt(MAX_MODEL_LEN, "--max-model-len", kind="int", lo=1, hi=MAX_TOKENS,
                             metavar="N", help="longest prompt + output, in tokens (vLLM's "
                                               "default is the model's context; stepgap's is "
                                               "the seed's)")
    block_size: int = opt(BLOCK_SIZE, "--block-size", kind="int", lo=1, hi=MAX_TOKENS,
                          metavar="N", help="tokens per KV block")
    num_gpu_blocks_override: int | None = opt(
        None, "--num-gpu-blocks-override", "--num-kv-blocks", "--num-blocks", kind="int", lo=1,
        hi=MAX_TOKENS, metavar="N", old=("num_kv_blocks",), shown=False,
        help="KV cache size in blocks")
    gpu_memory_utilization: float = opt(
        0.9, "--gpu-memory-utilization", kind="fraction", metavar="FRAC",
        help="fraction of device memory for weights and the KV cache")
    enable_prefix_caching: bool = opt(
        True, "--enable-prefix-caching", kind="bool", shown=False,
        help="vLLM's automatic prefix caching: a request reuses the KV blocks of its longest "
             "cached prefix (full blocks hashed over its token ids; a trace without "
             "prompt_token_ids finds only a request's own blocks again, after a preemption); "
             "freed blocks stay cached until the pool hands them out again, least recently "
             "freed first (default: on, as vLLM)")
    scheduler_reserve_full_isl: bool = opt(
        True, "--scheduler-reserve-full-isl", kind="bool", shown=False,
        help="vLLM's admission rule: take a waiting request in only when the KV blocks of its "
             "whole sequence are free, not just its first chunk's (default: on, as vLLM)")


@dataclass(frozen=True)
class TopologySpec:
    """Where the parts of the step loop run: the worker inline or in its own process, the
    device, and vLLM's tensor, data and expert parallelism. `check_topology` holds them to
    each other."""

    # None: vLLM's default, inline at TP 1, process (mp) above
    executor: str | None = opt(None, "--executor", "--worker", kind="choice", choices=EXECUTORS,
                               old=("worker",),
                               help="inline: the worker in the engine process (vLLM with one "
                                    "GPU); process: its own process (vLLM's multiprocess "
                                    "executor)")
    # cuda: runs asynchronously to the CPU; cpu: the worker's own cores (None: the simulator
    # takes the --gpu entry's kind)
    device: str | None = opt(None, "--device", kind="choice", choices=DEVICES,
                             help="where the engine runs")
    tensor_parallel_size: int = opt(
        1, "--tensor-parallel-size", "-tp", kind="int", lo=1, hi=MAX_TP, metavar="N",
        old=("tp",), shown=False, why=" (the GPUs of one node; multi-node parallelism is not "
                                       "modelled)",
        help="GPUs per model replica (the engine runs 1)")
    data_parallel_size: int = opt(
        1, "--data-parallel-size", "-dp", kind="int", lo=1, metavar="N", shown=False,
        help="engine cores, each its own replica (the engine runs 1)")
    enable_expert_parallel: bool = opt(
        False, "--enable-expert-parallel", "-ep", kind="bool", shown=False,
        help="MoE layers spread over the data x tensor parallel GPUs by expert, not by width "
             "(vLLM's expert parallelism; default off)")

    def check_topology(self) -> None:
        """The old device names read as today's, and the executor vLLM's default where None
        (before check_fields)."""
        if self.device in OLD_DEVICES:
            object.__setattr__(self, "device", OLD_DEVICES[self.device])
        tp = self.tensor_parallel_size
        if self.executor is None and is_int(tp):
            object.__setattr__(self, "executor", "process" if tp > 1 else "inline")

    def check_parallel(self) -> None:
        """Data x tensor parallelism within one node, and tensor parallelism in processes."""
        tp, dp = self.tensor_parallel_size, self.data_parallel_size
        if dp > 8 or dp * tp > 8:
            raise bad("--data-parallel-size", "must be an integer from 1 to 8, with data x "
                      "tensor parallel GPUs at most 8 (one node; multi-node parallelism is not "
                      "modelled)", dp)
        if tp > 1 and self.executor == "inline":
            raise bad("--executor", "tensor parallelism runs vLLM's multiprocess executor, one "
                      "worker process per GPU (--executor process, or leave it unset)",
                      self.executor)


@dataclass(frozen=True)
class LoadSpec:
    """The workload and how it is sent, as `vllm bench serve` sends it. (The command line
    spells the workload --trace or --dataset-name and its options: common/options.py.)"""

    workload: str = opt("mtbench", label="--trace")
    num_prompts: int | None = opt(
        None, "--num-prompts", kind="int", lo=1, hi=MAX_PROMPTS,
        help="number of requests (default: the workload's own: 80 for mtbench, 1000 for vLLM's "
             "datasets as vLLM)")
    output_len: int | None = opt(
        None, "--output-len", kind="int", lo=1, hi=MAX_PARAM,
        help="override every request's output length (tokens; ignore_eos)")
    # the shared prefix's share of a prompt (common/workloads.py)
    shared_fraction: float | None = opt(
        None, "--shared-fraction", kind="float", lo=0, hi=1.0, metavar="F",
        help="prefix_repetition or generated-shared-prefix: make the shared prefix this "
             "fraction (0 to 1) of each prompt, keeping the prompt's length (its prefix and "
             "suffix lengths' sum); a sweep axis as shared_fraction")
    request_rate: float | None = opt(   # None: the trace's own arrival times
        None, "--request-rate", kind="rate", metavar="RPS",
        help="requests per second, or inf to send all at once; default: the trace's own "
             "arrival times (built-in workloads: inf)")
    burstiness: float = opt(
        1.0, "--burstiness", kind="rate", lo=MIN_BURSTINESS,
        help=f"gamma shape of inter-arrival times: 1 is Poisson, <1 burstier, >1 more uniform; "
             f"at least {MIN_BURSTINESS:g} (default 1)")
    max_concurrency: int | None = opt(
        None, "--max-concurrency", kind="int", lo=1, hi=MAX_PROMPTS,
        help="most requests in flight at once, as the benchmark client's semaphore (default: "
             f"unlimited; at most {MAX_PROMPTS:,}, the most requests a run holds)")
    seed: int = opt(0, "--seed", kind="int",
                    help="seed for workloads, arrivals and sampling (default 0, as vLLM: the "
                         "same seed draws vLLM's random lengths)")

    def check_load(self) -> None:
        """The load's settings held to each other and to the workload."""
        if self.shared_fraction is not None:
            from stepgap.common.workloads import shared_fraction_problem
            why = shared_fraction_problem(self.workload, self.shared_fraction)
            if why:
                raise bad("--shared-fraction", why, self.shared_fraction)
        if self.request_rate is not None and self.num_prompts is not None:
            from stepgap.common.workloads import last_arrival_problem
            why = last_arrival_problem(self.num_prompts, self.request_rate)
            if why:
                raise bad("--request-rate", why, self.request_rate)


@dataclass(frozen=True)
class OutputSpec:
    """What the run's result holds besides vLLM's metrics."""

    metric_percentiles: tuple[float, ...] = opt(
        (99,), "--metric-percentiles", kind="percentiles", metavar="LIST",
        help="percentiles of each metric, e.g. 50,90,99 (default 99)")
    percentile_metrics: tuple[str, ...] = opt(
        METRICS, "--percentile-metrics", kind="metrics", metavar="LIST",
        help=f"metrics that get percentiles (default {','.join(METRICS)})")
    detailed: bool = opt(
        False, "--save-detailed", "--detailed", kind="bool", action="store_true",
        help="add the per-request lists (ttfts, itls, input_lens, output_lens) and every step "
             "gap to the result")
    timeline: bool = opt(False, label="--timeline", kind="bool")   # record the spans
    # running/waiting/KV every S s, as vLLM logs them
    timeseries_interval_s: float | None = opt(
        None, "--timeseries-interval", kind="float", lo=1e-3, hi=3600, what="seconds",
        metavar="S",
        help="add to the result a timeseries of running and waiting requests, KV cache use and "
             "token throughput every S seconds, as vLLM's stat logger (and LLMServingSim's "
             "timeseries.csv) report them")


@dataclass(frozen=True)
class RunSpec(OutputSpec, LoadSpec, TopologySpec, SchedulerSpec, ModelSpec):
    """One run's settings: the five groups' fields (ModelSpec's first), checked."""

    def __post_init__(self):
        self.check_topology()
        check_fields(self)
        self.check_parallel()
        self.check_load()


@cache
def options_of(cls) -> dict[str, Option]:
    """Every setting of a class built of the groups that has an Option, by field name."""
    return {f.name: option_of(f) for f in fields(cls) if option_of(f) is not None}


# Old spellings of fields, still read (grid files, results and folders written before).
ALIASES = {old: name for name, o in options_of(RunSpec).items() for old in o.old}


def settings_of(d: dict) -> dict:
    """Settings from a dict that may use old spellings of names and devices."""
    out = {ALIASES.get(k, k): v for k, v in d.items()}
    if out.get("device") in OLD_DEVICES:
        out["device"] = OLD_DEVICES[out["device"]]
    return out


def flag(name: str, cls=RunSpec) -> str:
    """The command-line option of a setting, as errors name it."""
    o = options_of(cls).get(name)
    return o.name if o is not None and o.name else "--" + name.replace("_", "-")
