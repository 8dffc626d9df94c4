"""A simulation's configuration: one flat dataclass, validated where it is built.

`SimConfig` names everything a run needs by plain values (preset names, paths, numbers), so it
serialises into the run result as it is. `resolve()` turns it into the objects the model runs
on: model shapes, the drafter, the hardware entry, the device and CPU cost models, the
acceptance profile, the scheduler configuration and the mode the run really has (vLLM runs
some speculation methods in sync only), with a note for each thing it chose. Every error names
the field (as its command-line option), and comes before any work.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from stepgap.common.acceptance import AcceptanceProfile, default_profile, get_profile
from stepgap.sim.costs import DeviceCosts, LevelCosts
from stepgap.sim.cpu_costs import CPU_COSTS, CpuCosts, OpCost
from stepgap.sim.roofline import RooflineCosts
from stepgap.sim.profile import Noise, Profile, load_profile
from stepgap.sim.profile_costs import ProfileCosts
from stepgap.sim.tables import (TableCosts, bundle_meta, find_bundle, find_variant,
                                load_tables, read_meta, refuse_another_model)
from stepgap.sim.expert_parallel import MoeCosts, MoeParallel
from stepgap.sim.moe_tables import check_moe_bundle, moe_only, moe_parts
from stepgap.sim.hardware import Hardware, MeasuredLink
from stepgap.sim.hardware_file import (collectives_beside, load_collectives, load_gpu,
                                       with_link)
from stepgap.common.errors import UserError, where
from stepgap.common.formats import DEVICES, EXECUTORS, METRICS, MODES, OLD_DEVICES
from stepgap.common.limits import (MAX_K, MAX_MS, MAX_PROMPTS, MAX_SCALE, MAX_SKEW, MAX_SPREAD,
                                   MAX_TP, MAX_US, MIN_BURSTINESS, MIN_SPEED, is_finite, is_int,
                                   is_number)
from stepgap.common.drafters import SPEC_METHODS, default_draft_model, load_drafter
from stepgap.common.model_heads import EagleHeadConfig
from stepgap.common.model_presets import load_model_config
from stepgap.common.modelcfg import ModelConfig
from stepgap.common.memory import (RESERVED_BYTES, kv_bytes_per_token, kv_cache_blocks,
                                   weight_bytes)
from stepgap.common.scheduler import SchedulerConfig

# Old spellings of fields and values, still read (grid files, folders written before).
ALIASES = {"worker": "executor", "num_kv_blocks": "num_gpu_blocks_override",
           "num_speculative_tokens": "k", "spec_method": "method", "tp": "tensor_parallel_size"}
# Whose step loop is simulated: stepgap's engine (one message per step, an in-process client) or
# vLLM's (execute_model and sample_tokens RPCs, take_draft_token_ids in sync, an API server
# sharing the engine core's CPU; docs/vllm.md). None: the profile's, else stepgap.
TOPOLOGIES = ("stepgap", "vllm", "served")
# Methods whose drafter proposes from the sampled tokens on the host: vLLM runs them with sync
# scheduling only (vllm/config/vllm.py; docs/sim.md).
CPU_PROPOSERS = ("ngram",)


def flag(name: str) -> str:
    """The command-line option of a config field."""
    return {"k": "--num-speculative-tokens", "workload": "--trace",
            "method": "--speculative-config method",
            "timeseries_interval_s": "--timeseries-interval"}.get(
        name, "--" + name.replace("_", "-"))


def settings_of(d: dict) -> dict:
    """SimConfig settings from a dict that may use old spellings."""
    out = {ALIASES.get(k, k): v for k, v in d.items()}
    if out.get("device") in OLD_DEVICES:
        out["device"] = OLD_DEVICES[out["device"]]
    return out


def _bad(name: str, what: str, v) -> UserError:
    return UserError(f"{flag(name)}: {what}, got {v!r}")


@dataclass(slots=True)
class SimConfig:
    # scenario
    mode: str = "sync"
    k: int = 0
    gpu: str = "h100"
    model: str = "llama-3.1-8b"
    method: str = "eagle3"            # speculative_config's method
    draft: str | None = None          # speculative_config's model: an EAGLE head (None: shaped
                                      # from the target), the draft model of draft_model
    executor: str | None = None       # the worker in the engine process, or its own; None:
                                      # vLLM's default, inline at TP 1, process (mp) above
    device: str | None = None          # cuda: runs asynchronously to the CPU; cpu: the worker's
                                       # own cores. None: from the --gpu entry's kind
    tensor_parallel_size: int = 1      # GPUs of one node running one model replica
    data_parallel_size: int = 1        # engine cores, each its own replica (sim/data_parallel.py)
    enable_expert_parallel: bool = False   # MoE experts split over the dp x tp GPUs by count
    moe_routing_skew: float = 0.0      # Zipf exponent of the experts' popularity (0: uniform)
    all_reduce_latency_us: float | None = None   # None: the --gpu's interconnect's
    topology: str | None = None
    profile: str | None = None         # a measured profile (device ops, CPU costs) to use
    device_profile: str | None = None  # measured operator tables of a GPU (sim/tables.py)
    jitter: bool = True                # apply the profile's measured speed noise, if any
    speed: float = 1.0                 # the machine's level: every device op and CPU cost x it
    # acceptance
    acceptance: str | None = None      # None: the published profile of this model and method
    acceptance_rates: tuple[float, ...] | None = None
    acceptance_spread: float | None = None   # None: the profile's
    replay: bool = True                # use a trace's recorded `accepted` lists
    # scheduler
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    block_size: int = 16
    num_gpu_blocks_override: int | None = None   # None: from device memory
    gpu_memory_utilization: float = 0.9
    quantization: str | None = None              # vLLM's --quantization: fp8 (the target's
                                                 # linear layers); None: the checkpoint's own
    kv_cache_dtype: str = "auto"                 # vLLM's --kv-cache-dtype: auto (the model's
                                                 # dtype) or an fp8 one
    scheduler_reserve_full_isl: bool = True      # vLLM's: admit only what fits whole
    enable_prefix_caching: bool = True           # vLLM's automatic prefix caching
    # CPU
    cpu_scale: float = 1.0
    cpu_costs: dict = field(default_factory=dict)   # op -> [a, b, c] microseconds
    launch_latency_us: float | None = None
    wake_us: float | None = None
    ipc_us: float | None = None
    output_latency_ms: float = 0.0
    # workload and load, as `vllm bench serve`
    workload: str = "mtbench"
    num_prompts: int | None = None
    output_len: int | None = None
    shared_fraction: float | None = None   # the shared prefix's share of a prompt (workloads.py)
    request_rate: float | None = None  # None: the trace's own arrival times
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    # output
    metric_percentiles: tuple[float, ...] = (99,)
    percentile_metrics: tuple[str, ...] = METRICS
    detailed: bool = False
    timeline: bool = False
    timeseries_interval_s: float | None = None   # running/waiting/KV every S s, as vLLM logs

    def __post_init__(self):
        if self.mode not in MODES:
            raise _bad("mode", f"must be one of {', '.join(MODES)}", self.mode)
        tp = self.tensor_parallel_size
        if not is_int(tp) or not 1 <= tp <= MAX_TP:
            raise _bad("tensor_parallel_size", f"must be an integer from 1 to {MAX_TP} (the "
                       "GPUs of one node; multi-node parallelism is not modelled)", tp)
        if self.executor is None:
            self.executor = "process" if tp > 1 else "inline"
        if self.executor not in EXECUTORS:
            raise _bad("executor", f"must be one of {', '.join(EXECUTORS)}", self.executor)
        dp = self.data_parallel_size
        if not is_int(dp) or not 1 <= dp <= 8 or dp * tp > 8:
            raise _bad("data_parallel_size", "must be an integer from 1 to 8, with data x tensor "
                       "parallel GPUs at most 8 (one node; multi-node parallelism is not "
                       "modelled)", dp)
        if tp > 1 and self.executor == "inline":
            raise _bad("executor", "tensor parallelism runs vLLM's multiprocess executor, one "
                       "worker process per GPU (--executor process, or leave it unset)",
                       self.executor)
        if self.method not in SPEC_METHODS:
            raise _bad("method", f"must be one of {', '.join(SPEC_METHODS)}", self.method)
        if self.device in OLD_DEVICES:
            self.device = OLD_DEVICES[self.device]
        if self.device is not None and self.device not in DEVICES:
            raise _bad("device", f"must be one of {', '.join(DEVICES)}", self.device)
        for name in ("gpu", "model", "workload"):
            if not isinstance(getattr(self, name), str):
                raise _bad(name, "must be a name or a path", getattr(self, name))
        for name in ("draft", "acceptance", "profile", "device_profile"):   # None: resolve()
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise _bad(name, "must be a name or a path", getattr(self, name))
        for name in ("jitter", "replay", "detailed", "timeline", "scheduler_reserve_full_isl",
                     "enable_prefix_caching", "enable_expert_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "must be true or false", getattr(self, name))
        _ints(self, ("k",), 0, MAX_K)
        _ints(self, ("seed",), 0)
        _ints(self, ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"), 1)
        _ints(self, ("num_gpu_blocks_override", "output_len", "max_concurrency"), 1,
              optional=True)
        _ints(self, ("num_prompts",), 1, MAX_PROMPTS, optional=True)
        if self.shared_fraction is not None:
            from stepgap.common.workloads import shared_fraction_problem
            why = shared_fraction_problem(self.workload, self.shared_fraction)
            if why:
                raise _bad("shared_fraction", why, self.shared_fraction)
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise _bad("quantization", "is not modelled: stepgap models fp8 (or none: the "
                       "checkpoint's own quantization_config)", self.quantization)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise _bad("kv_cache_dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)}",
                       self.kv_cache_dtype)
        if self.topology is not None and self.topology not in TOPOLOGIES:
            raise _bad("topology", f"must be one of {', '.join(TOPOLOGIES)}", self.topology)
        if not (is_finite(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1):
            raise _bad("gpu_memory_utilization", "must be in (0, 1]",
                       self.gpu_memory_utilization)
        _numbers(self, ("cpu_scale",), MAX_SCALE)
        _numbers(self, ("moe_routing_skew",), MAX_SKEW)
        if not (is_finite(self.speed) and MIN_SPEED <= self.speed <= MAX_SCALE):
            raise _bad("speed", f"must be a number from {MIN_SPEED:g} to {MAX_SCALE:g}",
                       self.speed)
        _numbers(self, ("launch_latency_us", "wake_us", "ipc_us", "all_reduce_latency_us"),
                 MAX_US, optional=True)
        _numbers(self, ("acceptance_spread",), MAX_SPREAD, optional=True)
        _numbers(self, ("output_latency_ms",), MAX_MS)
        if self.timeseries_interval_s is not None and not (
                is_finite(self.timeseries_interval_s) and 1e-3 <= self.timeseries_interval_s
                <= 3600):
            raise _bad("timeseries_interval_s", "must be seconds from 0.001 to 3600",
                       self.timeseries_interval_s)
        if self.request_rate is not None and not (_is_rate(self.request_rate)
                                                  and self.request_rate > 0):
            raise _bad("request_rate", "must be > 0 (or inf)", self.request_rate)
        if not (_is_rate(self.burstiness) and self.burstiness >= MIN_BURSTINESS):
            raise _bad("burstiness", f"must be >= {MIN_BURSTINESS:g} (or inf)", self.burstiness)
        if self.request_rate is not None and self.num_prompts is not None:
            from stepgap.common.workloads import last_arrival_problem
            why = last_arrival_problem(self.num_prompts, self.request_rate)
            if why:
                raise _bad("request_rate", why, self.request_rate)
        if self.acceptance_rates is not None:
            self.acceptance_rates = _tuple(self, "acceptance_rates")
        self.metric_percentiles = _tuple(self, "metric_percentiles")
        if not self.metric_percentiles or not all(is_finite(p) and 0 < p < 100
                                                  for p in self.metric_percentiles):
            raise _bad("metric_percentiles", "must be percentiles in (0, 100)",
                       self.metric_percentiles)
        self.percentile_metrics = _tuple(self, "percentile_metrics")
        if not set(self.percentile_metrics) <= set(METRICS):
            raise _bad("percentile_metrics", f"must be some of {', '.join(METRICS)}",
                       self.percentile_metrics)
        if not isinstance(self.cpu_costs, dict):
            raise _bad("cpu_costs", "must be a table of OP = [A, B, C]", self.cpu_costs)
        for op, abc in self.cpu_costs.items():
            if op not in CPU_COSTS:
                raise UserError(f"--cpu-cost: unknown op {op!r} (ops: {', '.join(CPU_COSTS)})")
            if not isinstance(abc, (list, tuple)) or not 1 <= len(abc) <= 3 \
                    or not all(is_finite(v) and 0 <= v <= MAX_US for v in abc):
                raise UserError(f"--cpu-cost {op}: expected A[,B[,C]], 1 to 3 numbers from 0 "
                                f"to {MAX_US:g} microseconds, got {abc!r}")

    def to_dict(self) -> dict:
        """The config as results and a sweep's cell hashes record it; the fields that came
        after those results (OPTIONAL_FIELDS) only where set, so that a run without them writes
        what it wrote before, byte for byte."""
        d = asdict(self)
        for key, default in OPTIONAL_FIELDS.items():
            if d[key] == default:
                del d[key]
        for key in ("acceptance_rates", "metric_percentiles", "percentile_metrics"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d


# Fields written into a result only where they differ from their default (SimConfig.to_dict).
OPTIONAL_FIELDS = {"quantization": None, "kv_cache_dtype": "auto", "data_parallel_size": 1,
                   "enable_expert_parallel": False}
# vLLM's --quantization and --kv-cache-dtype values the simulator models, and the element size
# of a KV cache of each (auto: the model's bf16).
QUANTIZATIONS = ("fp8",)
KV_CACHE_DTYPES = {"auto": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def _is_rate(v) -> bool:
    """A number, inf allowed (a request rate, a burstiness), NaN not."""
    return is_number(v) and not math.isnan(v)


def _ints(cfg, names, lo: int, hi: int | None = None, optional: bool = False) -> None:
    for name in names:
        v = getattr(cfg, name)
        if v is None and optional:
            continue
        if not is_int(v) or v < lo or (hi is not None and v > hi):
            raise _bad(name, f"must be an integer from {lo} to {hi}" if hi is not None
                       else f"must be an integer >= {lo}", v)


def _numbers(cfg, names, hi: float, optional: bool = False) -> None:
    """Finite numbers from 0 to `hi` (common/options.py's limits)."""
    for name in names:
        v = getattr(cfg, name)
        if v is None and optional:
            continue
        if not (is_finite(v) and 0 <= v <= hi):
            raise _bad(name, f"must be a number from 0 to {hi:g}", v)


def _tuple(cfg, name: str) -> tuple:
    v = getattr(cfg, name)
    if isinstance(v, (str, dict)) or not hasattr(v, "__iter__"):
        raise _bad(name, "must be a list", v)
    return tuple(v)


# -------------------------------------------------------------------------------------------
# Resolution


@dataclass(frozen=True, slots=True)
class Topology:
    """Where the step loop's parts run (docs/design.md §2), and what follows from it."""

    engine: str = "stepgap"       # whose step loop (TOPOLOGIES)
    inline: bool = True           # the worker on the engine core's thread (else its process)
    device_async: bool = True     # the device runs asynchronously to the worker (cuda)
    tp: int = 1                   # ranks of the multiprocess executor
    api_server: bool = False      # an API server in front, on the engine core's CPU
    computes_ahead: bool = False  # a process worker on a synchronous device: it computed step N
                                  # (and knows its counts) before it prepares N+1

    @classmethod
    def of(cls, engine: str, executor: str, device: str, tp: int) -> Topology:
        inline, device_async = executor == "inline", device == "cuda"
        return cls(engine, inline, device_async, tp, engine in ("vllm", "served"),
                   not inline and not device_async)


@dataclass(frozen=True, slots=True)
class Resolved:
    """Everything a run needs, resolved once from its SimConfig (sim/loop.py `Sim` reads this,
    and derives nothing from the config itself)."""

    hw: Hardware
    target: ModelConfig
    draft: EagleHeadConfig | ModelConfig | None   # what drafts (None: mtp, n-gram, k = 0)
    device_costs: DeviceCosts
    cpu: CpuCosts
    profile: AcceptanceProfile
    scheduler: SchedulerConfig
    topology: Topology
    measured: Profile | None = None   # the --profile, when given
    mode: str = "sync"                # the mode the run has (see CPU_PROPOSERS)
    notes: tuple[str, ...] = ()       # what was chosen for the user, one line each
    # the step loop's rules, from the mode, the method and the topology (sim/loop.py)
    wait_accepted: bool = False       # async with drafts: step N+1 waits for N's counts
    fixup: bool = False               # zero-bubble's device fixup (not where computes_ahead)
    cpu_propose: bool = False         # drafts proposed on the host (n-gram)
    rpc_share: float = 1.0            # of vLLM's sync-fitted RPC turnaround, waited
    noise: Noise | None = None        # the measured noise replayed on the device ops

    @property
    def device_async(self) -> bool:
        return self.topology.device_async


def resolve(cfg: SimConfig, profile: Profile | None = None,
            device_costs: DeviceCosts | None = None) -> Resolved:
    """Every object the run needs, and every check that can fail, before any work. `profile`:
    a measured profile to use instead of reading `cfg.profile`'s file; `device_costs`: a
    source of device costs to use instead of the config's (ConstantCosts in tests)."""
    hw = load_gpu(cfg.gpu)
    target, notes = quantized(load_model_config(cfg.model), cfg, hw)
    tp = cfg.tensor_parallel_size
    hw = collectives(cfg, hw, notes, target.is_moe)
    if cfg.all_reduce_latency_us is not None and hw.interconnect is not None:
        if isinstance(hw.interconnect, MeasuredLink):
            raise UserError(f"--all-reduce-latency-us: the collectives are measured "
                            f"({hw.interconnect.name}); it sets the interconnect model's "
                            "latency, which they replace")
        hw = replace(hw, interconnect=replace(hw.interconnect,
                                              latency_us=cfg.all_reduce_latency_us))
    target.check_tensor_parallel(tp)
    draft = None
    if cfg.k > 0:
        spec = cfg.draft
        if cfg.method == "draft_model" and spec is None:
            spec = default_draft_model(target)
            notes.append(f"draft_model: no draft model given; using {spec}, the smallest "
                         "preset with the target's vocabulary (give speculative_config's model)")
        draft = load_drafter(cfg.method, spec, target, cfg.k)
        if draft is not None:
            draft.check_tensor_parallel(tp)
        if cfg.method == "mtp" and cfg.k > target.num_mtp_layers:
            notes.append(f"mtp: k={cfg.k} runs the model's {target.num_mtp_layers} MTP "
                         f"layer(s) {cfg.k // target.num_mtp_layers} times in turn, as vLLM "
                         "does; acceptance past the layers' own depth is extrapolated")
    mode = cfg.mode
    if cfg.k > 0 and cfg.method in CPU_PROPOSERS and mode != "sync":
        mode = "sync"
        notes.append(f"method {cfg.method} proposes on the CPU from the sampled tokens on the "
                     f"host, so vLLM runs it with sync scheduling (async takes EAGLE, MTP, "
                     f"draft models and ngram_gpu): --mode {cfg.mode} is simulated as sync")
    measured = profile or (load_profile(cfg.profile) if cfg.profile else None)
    device = cfg.device or ("cuda" if hw.kind == "gpu" else "cpu")
    if measured is not None:
        notes += elsewhere_notes(cfg, measured, hw.name, device)
    costs = device_costs_of(cfg, target, draft, hw, measured)   # (its checks, whatever is used)
    notes += table_notes(cfg, costs, hw, measured)
    notes += parallel_notes(cfg, target, costs)
    if device_costs is not None:
        costs = device_costs
    engine = cfg.topology or (measured.engine if measured else None) or "stepgap"
    if engine not in TOPOLOGIES:
        raise UserError(f"{measured.path or 'the profile'}: topology.engine {engine!r} "
                        f"(expected one of {', '.join(TOPOLOGIES)})")
    topo = Topology.of(engine, cfg.executor, device, tp)
    if cfg.data_parallel_size > 1 and (engine != "stepgap" or not topo.device_async):
        raise _bad("data_parallel_size", "data parallelism is modelled for GPU engine cores "
                   "(--device cuda) behind stepgap's in-process client (--topology stepgap)",
                   cfg.data_parallel_size)
    from stepgap.common.workloads import workload_notes
    notes += workload_notes(cfg.workload, cfg.model)
    prof, note = acceptance_profile(cfg, target)
    if note and cfg.k:
        notes.append(note)
    async_ = mode != "sync"
    return Resolved(
        hw, target, draft, costs, cpu_costs(cfg, measured), prof,
        scheduler_config(cfg, target, draft, hw, mode), topo, measured, mode, tuple(notes),
        wait_accepted=mode == "async" and cfg.k > 0,
        # a process worker on a synchronous device has computed step N (and knows its counts)
        # before it prepares N+1: zero-bubble then has nothing to fix up
        fixup=mode == "zero-bubble" and not topo.computes_ahead,
        cpu_propose=cfg.k > 0 and cfg.method in CPU_PROPOSERS,
        # vLLM's worker turns an RPC around in a round trip in sync (it replies, and the engine
        # core sends the next only then) and in one message in async (the next is already
        # queued): the share of the sync-fitted turnaround it waits (docs/vllm.md)
        rpc_share=0.5 if engine == "vllm" and async_ else 1.0,
        noise=measured.jitter if cfg.jitter and measured is not None else None)


def profile_defaults(settings: dict, given) -> tuple[dict, list[str]]:
    """`settings` with what their profile was measured on (`Profile.measured_on`: its gpu,
    device, executor and measured acceptance) filled in where `given` (the fields a command
    line, preset or grid set) names none of them, and a note for a measured acceptance that
    the given settings replace. A profile runs where it was measured unless told otherwise;
    told otherwise, `resolve` says so in the result."""
    if not settings.get("profile"):
        return settings, []
    measured = load_profile(settings["profile"])
    where, out, notes = measured.measured_on(), dict(settings), []
    if not {"gpu", "device"} & set(given):   # a gpu or device given picks the other itself
        out.update({name: where[name] for name in ("gpu", "device") if name in where})
    if "executor" in where and "executor" not in given:
        out["executor"] = where["executor"]
    if "acceptance_rates" in where:
        chosen = [n for n in ("acceptance", "acceptance_rates", "acceptance_spread") if n in given]
        if chosen:
            rates = ", ".join(f"{r:.3g}" for r in where["acceptance_rates"])
            notes.append(f"--profile {settings['profile']} measured its acceptance (rates "
                         f"{rates}); this run takes {flag(chosen[0])} instead, as asked")
        else:
            out["acceptance_rates"] = where["acceptance_rates"]
            out["acceptance_spread"] = where["acceptance_spread"]
            out.pop("acceptance", None)
    return out, notes


def elsewhere_notes(cfg: SimConfig, measured: Profile, gpu: str, device: str) -> list[str]:
    """A profile run on another device than the one it was measured on: an explicit choice
    (the command line takes the profile's device unless told otherwise), said in the result."""
    where = measured.measured_on()
    name = cfg.profile or measured.path or "the profile"
    was = where.get("gpu") if where.get("gpu") not in (None, gpu) else None
    if was is None and where.get("device") in (None, device):
        return []
    what = ["its CPU costs"] + (["its device fits"] if measured.fits else []) + \
        (["its device level"] if measured.roofline_level is not None else [])
    return [f"--profile {name} was measured on {was or where['device']} (device "
            f"{where.get('device', '?')}); this run simulates --gpu {gpu} --device {device}: "
            f"{' and '.join(what)} on another device, as asked"]


def collectives(cfg: SimConfig, hw: Hardware, notes: list[str], moe: bool) -> Hardware:
    """The collectives of a run over several GPUs, tensor parallelism's (all-reduces, the
    logits' all-gather over the tp GPUs) and a MoE target's under data parallelism (`moe`: its
    dispatch and combine over the dp ranks, sim/expert_parallel.py): measured where a
    hardware.yaml gives them (`--gpu FILE.yaml`, or the one LLMServingSim keeps beside the
    --device-profile tables, profiler/perf/<GPU>/hardware.yaml) over as many GPUs as each group
    has, else the --gpu's interconnect model; said in the notes when measured."""
    tp, link = cfg.tensor_parallel_size, hw.interconnect
    dp = cfg.data_parallel_size if moe else 1
    groups = {n: opt for n, opt in ((dp, "--data-parallel-size"),
                                    (tp, "--tensor-parallel-size")) if n > 1}
    if not groups:
        return hw
    if isinstance(link, MeasuredLink):
        for n, opt in groups.items():
            if link.npus != n:
                raise UserError(f"{where(cfg.gpu, field='measured.interconnect.npus')}: the "
                                f"collectives were measured over {link.npus} GPUs; {opt} {n} "
                                f"needs them measured over {n} (or a catalog --gpu, whose "
                                "interconnect model prices them)")
    elif cfg.device_profile is not None:
        root = find_bundle(cfg.device_profile)
        label = read_meta(root).get("hardware")
        found = collectives_beside(root, str(label)) if label else None
        measured = load_collectives(found) if found else None
        if measured is None:
            return hw
        if any(measured.npus != n for n in groups):
            notes.append(f"{found} measured its collectives over {measured.npus} GPUs, not "
                         f"{' and '.join(map(str, groups))}: the --gpu's interconnect model "
                         f"({link.name}) prices them")
            return hw
        hw = with_link(hw, measured)
    else:
        return hw
    link = hw.interconnect
    said = [f"collectives: {link.source}"]
    if tp > 1:
        said.append("each all-reduce takes vLLM's path (its custom one-shot kernel under 8 MiB "
                    "where the GPUs have peer access, priced as the measured all_gather of the "
                    "same bytes; NCCL's measured all_reduce above)" if link.p2p else
                    "each all-reduce is NCCL's (no peer access, so no custom all-reduce)")
    if dp > 1:
        said.append("the MoE layers' dispatch and combine over the DP ranks as the measured "
                    "all_gather and " + ("reduce_scatter" if "reduce_scatter" in link.sizes
                                         else "all_gather of the same bytes (no reduce_scatter "
                                              "samples)"))
    notes.append("; ".join(said))
    return hw


def quantized(target: ModelConfig, cfg: SimConfig, hw: Hardware) -> tuple[ModelConfig, list]:
    """The target with --quantization fp8 applied (vLLM's online fp8: every linear layer of the
    decoder 1 byte a weight; the embedding, lm_head and the drafter keep theirs), and the lines
    that say what fp8 weights and an fp8 KV cache change on this GPU."""
    notes = []
    if cfg.quantization == "fp8" and target.quantization != "fp8":
        if target.quantization is not None:
            raise UserError(f"--quantization fp8: model {target.name!r} is a "
                            f"{target.quantization} checkpoint (vLLM serves a checkpoint in its "
                            "own quantization); drop --quantization")
        experts = 1.0 if target.expert_weight_bytes == 2.0 else target.expert_weight_bytes
        target = replace(target, weight_bytes=1.0, expert_weight_bytes=experts,
                         quantization="fp8")
        peak = (f"the fp8 GEMM peak of {hw.name} ({hw.fp8_flops / 1e12:g} TFLOP/s dense)"
                if hw.fp8_flops else f"the bf16 rate ({hw.name} has no fp8 tensor cores: "
                "vLLM dequantizes)")
        notes.append(f"--quantization fp8: the target's linear layers 1 byte a weight, at {peak}; "
                     "its embedding, lm_head and the drafter stay bf16")
    if KV_CACHE_DTYPES[cfg.kv_cache_dtype] == 1:
        notes.append(f"--kv-cache-dtype {cfg.kv_cache_dtype}: 1 byte a KV element, for the "
                     "cache's capacity and the attention's reads")
    return target, notes


def device_costs_of(cfg: SimConfig, target: ModelConfig, draft, hw: Hardware,
                    measured: Profile | None) -> DeviceCosts:
    """The run's source of device costs, behind the DeviceCosts seam (sim/costs.py): the
    roofline of the model on the hardware entry, and over it a measured profile's fits where
    one is given (the roofline answers for the ops it has no fit of). Another source (measured
    operator tables) stands here the same way."""
    costs: DeviceCosts = RooflineCosts(
        target, draft, hw, cfg.k, tp=cfg.tensor_parallel_size, method=cfg.method,
        routing_skew=cfg.moe_routing_skew, max_model_len=cfg.max_model_len,
        kv_bytes=KV_CACHE_DTYPES[cfg.kv_cache_dtype])
    bundle = None   # the --device-profile variant folder the run reads
    if measured is not None:
        if measured.fits and (cfg.tensor_parallel_size > 1 or cfg.data_parallel_size > 1
                              or (cfg.k and cfg.method != "eagle3")):
            raise UserError(f"--profile {cfg.profile or measured.path}: a measured profile "
                            "times one device running EAGLE-3 drafts; --tensor-parallel-size "
                            "or --data-parallel-size > 1 and other methods use the roofline "
                            "(drop --profile)")
        if measured.fits and (cfg.quantization or
                              cfg.kv_cache_dtype not in ("auto", target.torch_dtype)):
            raise UserError(f"--profile {cfg.profile or measured.path}: a measured profile "
                            "times the weights and KV cache it was measured with; "
                            "--quantization and --kv-cache-dtype use the roofline (drop "
                            "--profile)")
        if measured.roofline_level is not None:   # the device it was measured on, its level
            on = measured.measured_on().get("gpu", "the device measured")
            costs = LevelCosts(costs, measured.roofline_level, "the level `stepgap calibrate` "
                               f"fitted on {on}'s runs", measured.path)
        costs = ProfileCosts(measured, cfg.k, costs, cfg.block_size)
    if cfg.device_profile is not None:   # a GPU's measured operator tables (sim/tables.py)
        device = cfg.device or ("cuda" if hw.kind == "gpu" else "cpu")
        if device != "cuda":
            raise UserError(f"--device-profile {cfg.device_profile}: GPU operator tables price "
                            "a GPU's kernels (--device cuda, a --gpu of the catalog); drop "
                            "--device cpu")
        roofline = costs if measured is None else costs.fallback
        fp8_kv = KV_CACHE_DTYPES[cfg.kv_cache_dtype] == 1
        why = " with ".join(x for x in (
            "fp8 weights" if target.quantization == "fp8" else f"{target.torch_dtype} weights",
            f"--kv-cache-dtype {cfg.kv_cache_dtype}" if fp8_kv else None) if x)
        bundle = find_variant(cfg.device_profile, target.quantization == "fp8", fp8_kv,
                              target.torch_dtype, why)
        refuse_another_model(bundle_meta(bundle), target)   # (before reading its tables)
        only = moe_only(bundle, cfg.tensor_parallel_size, target)
        if only is None:
            # the tables price the device; a profile's level was of another device's roofline
            costs = TableCosts(load_tables(bundle, cfg.tensor_parallel_size), target,
                               draft, cfg.k, roofline_of(roofline), cfg.method,
                               cfg.tensor_parallel_size)
        else:   # a MoE target's MoE and MTP tables alone: the roofline prices the rest
            about = check_moe_bundle(bundle, target)
            costs = roofline   # (a profile's level over it, where it has one)
            costs.path = str(bundle)
            sources = getattr(costs, "sources", None) or {}
            under = sources.get("target_forward", "roofline")
            costs.sources = {**sources,
                             "target_forward": f"{under} (the bundle, {about}: {only})"}
    attach_moe(cfg, target, hw, costs, bundle)
    return costs


def attach_moe(cfg: SimConfig, target: ModelConfig, hw: Hardware, costs,
               bundle: Path | None) -> None:
    """A MoE target's blocks from the bundle's moe.csv (`bundle`: the --device-profile variant
    folder the run reads), or under data or expert parallelism (sim/expert_parallel.py),
    priced by one MoeCosts that the tables and their roofline share; its dispatch and combine
    over `hw.interconnect`, measured where `collectives` found them. A run with neither keeps
    the roofline's own MoE layers, as before."""
    dp, tp = cfg.data_parallel_size, cfg.tensor_parallel_size
    plan = MoeParallel(dp, tp, cfg.enable_expert_parallel and dp * tp > 1)   # vLLM's use_ep
    roofline = roofline_of(costs)
    if not target.is_moe or roofline is None:
        return
    table = mtp = None
    if bundle is not None:
        table, mtp = moe_parts(bundle, tp, plan.moe_tp, cfg.k > 0 and cfg.method == "mtp")
    if not isinstance(costs, TableCosts) and table is None and mtp is None and plan.dp == 1 \
            and not plan.expert_parallel:
        return
    if plan.dp > 1 and hw.interconnect is None:
        raise UserError(f"--data-parallel-size {plan.dp}: --gpu {hw.name} has no interconnect "
                        "in the catalog to gather the MoE layers' tokens over")
    moe = MoeCosts(target, roofline, plan, hw.interconnect, table, mtp)
    roofline.moe = moe
    if isinstance(costs, TableCosts):
        costs.moe = moe
    sources = getattr(costs, "sources", None)
    if sources is None:
        costs.sources = sources = {}
    sources["moe"] = moe.source()
    if mtp is not None:
        sources["draft_forward"] = (f"MTP module's own kernels from tables ({bundle}/mtp.csv), "
                                    "its decoder layer as the target's, the rest the roofline")


def roofline_of(costs) -> RooflineCosts | None:
    """The roofline under a run's device costs: itself, the fallback of a profile's fits or of
    measured tables, the roofline a profile's level scales (None: another source)."""
    while not isinstance(costs, RooflineCosts):
        costs = getattr(costs, "fallback", None) or getattr(costs, "costs", None)
        if costs is None:
            return None
    return costs


def parallel_notes(cfg: SimConfig, target: ModelConfig, costs) -> list[str]:
    """What a run under data or expert parallelism, or with MoE tables, should be told."""
    notes = []
    dp = cfg.data_parallel_size
    if cfg.enable_expert_parallel and not target.is_moe:
        notes.append(f"--enable-expert-parallel: {target.name} has no experts; it changes "
                     "nothing")
    elif cfg.enable_expert_parallel and dp * cfg.tensor_parallel_size == 1:
        notes.append("--enable-expert-parallel on one GPU: no other GPU to hold experts; it "
                     "changes nothing (vLLM: expert parallelism needs data x tensor parallel "
                     "> 1)")
    if dp > 1:
        notes.append(f"data parallel {dp}: {dp} engine cores, each its own scheduler, KV cache "
                     "and GPU(s), requests routed as vLLM's DP front end routes them "
                     "(docs/sim.md, 'Data and expert parallelism')"
                     + ("; a MoE target: every rank runs each forward in lockstep, a dummy "
                        "batch where it has none" if target.is_moe else
                        "; a dense target: the ranks run independently, as vLLM runs them"))
    roofline = roofline_of(costs)
    moe = roofline.moe if roofline is not None else None
    if moe is None:
        return notes
    plan = moe.plan
    notes.append(moe.source())
    if moe.grid is not None:
        measured = ", ".join(map(str, moe.table.grids))
        if moe.ep != plan.ep:
            notes.append(f"moe.csv has no ep {plan.ep} grid (measured: ep {measured}): the "
                         f"nearest, ep {moe.ep}, prices the MoE blocks")
        bw, tok, active = moe.fastest_read()
        if bw > moe.roof.hw.mem_bw:   # the datasheet peak
            notes.append(f"moe.csv's ep {moe.ep} grid reads {active:g} experts' weights at "
                         f"{tok:g} tokens at {bw / 1e12:.1f} TB/s, past --gpu "
                         f"{moe.roof.hw.name}'s peak {moe.roof.hw.mem_bw / 1e12:.2f} TB/s: "
                         "the table "
                         "likely understates the block (LLMServingSim's output-bundle docs: "
                         "a stack of dense and MoE layers measured before its normalization "
                         "fix understates it; remeasure with slice --group moe --force)")
        rows = cfg.max_num_batched_tokens * (dp if dp > 1 else 1)
        if rows > moe.grid.max_tokens:
            notes.append(f"moe.csv's ep {moe.ep} grid ends at {moe.grid.max_tokens:g} tokens; "
                         f"a MoE block over more (up to {rows}: --max-num-batched-tokens"
                         + (f" x DP {dp}" if dp > 1 else "") + ") grows from its last time as "
                         "the roofline grows (the result counts them)")
    elif cfg.device_profile is not None:
        notes.append(f"--device-profile has no moe.csv for MoE layers split {plan.moe_tp} ways "
                     f"by width (tp{plan.moe_tp}/): the roofline prices the MoE blocks")
    return notes


def table_notes(cfg: SimConfig, costs: DeviceCosts, hw: Hardware,
                measured: Profile | None) -> list[str]:
    """What a run priced from measured tables should be told: a step longer than their grid,
    tables of another GPU than the --gpu entry, a --profile that then gives the CPU only."""
    if not isinstance(costs, TableCosts):
        return []
    tables, notes = costs.tables, []
    if measured is not None:
        notes.append(f"--device-profile prices the device ops; --profile {cfg.profile} "
                     "gives the CPU costs only")
    if cfg.max_num_batched_tokens > tables.max_tokens:
        notes.append(f"--max-num-batched-tokens {cfg.max_num_batched_tokens} is past the "
                     f"tables' {tables.max_tokens:g} tokens: longer steps extrapolated in "
                     "proportion (docs/sim.md)")
    label = tables.hardware.lower()
    if hw.name.lower() not in (label, label.replace("_", "")):
        notes.append(f"--device-profile was measured on {tables.gpu} ({tables.hardware}); "
                     f"--gpu {cfg.gpu} gives the memory size and the roofline of what the "
                     "tables lack")
    return notes


def cpu_costs(cfg: SimConfig, measured: Profile | None = None) -> CpuCosts:
    """The defaults, or the measured profile's CPU costs, times --cpu-scale; explicit
    latencies and op costs are taken as given."""
    latencies = {name: getattr(cfg, name) for name in ("launch_latency_us", "wake_us", "ipc_us")
                 if getattr(cfg, name) is not None}
    base = (measured.cpu_costs(k=cfg.k) if measured is not None else None) or CpuCosts()
    costs = replace(base.scaled(cfg.cpu_scale * cfg.speed), **latencies)
    return costs.with_ops({op: OpCost(*abc) for op, abc in cfg.cpu_costs.items()})


def acceptance_profile(cfg: SimConfig, target: ModelConfig | None = None
                       ) -> tuple[AcceptanceProfile, str | None]:
    """The run's acceptance: --acceptance-rates, the named profile, or the published one of
    this model and method (with a note when there is none and another stands in)."""
    note = None
    if cfg.acceptance_rates is not None:
        prof = AcceptanceProfile("custom", cfg.acceptance_rates, cfg.acceptance_spread or 0.0,
                                 "--acceptance-rates")
        return prof, None
    name = cfg.acceptance
    if name is None:
        name, note = default_profile(target.name if target else cfg.model, cfg.method)
    prof = get_profile(name)
    if cfg.acceptance_spread is not None:
        prof = AcceptanceProfile(prof.name, prof.rates, cfg.acceptance_spread, prof.source)
    return prof, note


def scheduler_config(cfg: SimConfig, target: ModelConfig, draft, hw: Hardware,
                     mode: str | None = None) -> SchedulerConfig:
    """The scheduler's limits, with the KV cache sized per GPU (common/memory.py): memory ×
    utilization − that GPU's weights − RESERVED_BYTES, over the KV bytes a token takes on one
    GPU."""
    blocks = cfg.num_gpu_blocks_override
    tp, method = cfg.tensor_parallel_size, cfg.method if cfg.k else None
    if blocks is None:
        weights = weight_bytes(target, draft, tp, method,
                               tp * cfg.data_parallel_size if target.is_moe else None)
        blocks = kv_cache_blocks(hw.mem_bytes, cfg.gpu_memory_utilization, weights,
                                 RESERVED_BYTES, cfg.block_size,
                                 kv_bytes_per_token(target, draft, tp, method,
                                                    KV_CACHE_DTYPES[cfg.kv_cache_dtype]))
        if blocks < 1:
            usable = hw.mem_bytes * cfg.gpu_memory_utilization / 1e9
            per = f" per GPU at --tensor-parallel-size {tp}" if tp > 1 else ""
            raise UserError(f"--gpu {hw.name}: the weights ({weights / 1e9:.1f} GB{per}) leave "
                            f"no room for a KV cache in {usable:.1f} GB; give "
                            "--num-gpu-blocks-override, a larger --gpu-memory-utilization, more "
                            "GPUs (--tensor-parallel-size) or a --gpu with more memory")
    return SchedulerConfig.for_run(mode or cfg.mode, cfg.k, blocks, cfg.block_size,
                                   cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   cfg.max_model_len, target.max_position_embeddings,
                                   scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
                                   enable_prefix_caching=cfg.enable_prefix_caching)
