"""A simulation's configuration: one flat dataclass, validated where it is built.

`SimConfig` names everything a run needs by plain values (preset names, paths, numbers), so it
serialises into the run result as it is. `resolve()` turns it into the objects the model runs
on: model shapes, the hardware entry, the device and CPU cost models, the acceptance profile and
the scheduler configuration. Every error names the field (as its command-line option).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

from common.acceptance import AcceptanceProfile, get_profile
from sim.costs import CPU_COSTS, BF16, CpuCosts, DeviceCosts, OpCost, RooflineCosts
from sim.profile import Profile, ProfileCosts, load_profile
from sim.hardware import GIB, Hardware, get_hardware
from common.errors import UserError
from common.formats import METRICS, MODES
from common.options import (DEVICES, EXECUTORS, MAX_K, MAX_MS, MAX_PROMPTS, MAX_SCALE,
                            MAX_SPREAD, MAX_US)
from common.modelcfg import (Eagle3Config, ModelConfig, load_draft_config,
                              load_model_config)
from common.scheduler import SchedulerConfig

# Old spellings of fields and values, still read (grid files, folders written before).
ALIASES = {"worker": "executor", "num_kv_blocks": "num_gpu_blocks_override",
           "num_speculative_tokens": "k"}
OLD_DEVICES = {"async": "cuda", "sync": "cpu"}
# Whose step loop is simulated: stepgap's engine (one message per step, an in-process client) or
# vLLM's (execute_model and sample_tokens RPCs, take_draft_token_ids in sync, an API server
# sharing the engine core's CPU; docs/vllm.md). None: the profile's, else stepgap.
TOPOLOGIES = ("stepgap", "vllm")
RESERVED_BYTES = 2 * GIB  # CUDA context, CUDA graphs and peak activations, kept out of the KV


def flag(name: str) -> str:
    """The command-line option of a config field."""
    return {"k": "--num-speculative-tokens", "workload": "--trace"}.get(
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
    draft: str = "eagle3"
    executor: str = "inline"          # the worker in the engine process, or its own
    device: str | None = None          # cuda: runs asynchronously to the CPU; cpu: the worker's
                                       # own cores. None: from the --gpu entry's kind
    tensor_parallel_size: int = 1
    topology: str | None = None
    profile: str | None = None         # a measured profile (device ops, CPU costs) to use
    jitter: bool = True                # apply the profile's measured speed noise, if any
    speed: float = 1.0                 # the machine's level: every device op and CPU cost x it
    # acceptance
    acceptance: str = "mtbench"
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
    request_rate: float | None = None  # None: the trace's own arrival times
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    # output
    metric_percentiles: tuple[float, ...] = (99,)
    percentile_metrics: tuple[str, ...] = METRICS
    detailed: bool = False
    timeline: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise _bad("mode", f"must be one of {', '.join(MODES)}", self.mode)
        if self.executor not in EXECUTORS:
            raise _bad("executor", f"must be one of {', '.join(EXECUTORS)}", self.executor)
        if self.device in OLD_DEVICES:
            self.device = OLD_DEVICES[self.device]
        if self.device is not None and self.device not in DEVICES:
            raise _bad("device", f"must be one of {', '.join(DEVICES)}", self.device)
        for name in ("gpu", "model", "draft", "acceptance", "workload"):
            if not isinstance(getattr(self, name), str):
                raise _bad(name, "must be a name or a path", getattr(self, name))
        if self.profile is not None and not isinstance(self.profile, str):
            raise _bad("profile", "must be a path", self.profile)
        for name in ("jitter", "replay", "detailed", "timeline"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "must be true or false", getattr(self, name))
        _ints(self, ("k",), 0, MAX_K)
        _ints(self, ("seed",), 0)
        _ints(self, ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"), 1)
        _ints(self, ("num_gpu_blocks_override", "output_len", "max_concurrency"), 1,
              optional=True)
        _ints(self, ("num_prompts",), 1, MAX_PROMPTS, optional=True)
        if self.topology is not None and self.topology not in TOPOLOGIES:
            raise _bad("topology", f"must be one of {', '.join(TOPOLOGIES)}", self.topology)
        if self.tensor_parallel_size != 1:
            raise _bad("tensor_parallel_size", "the simulator models one GPU per replica (1)",
                       self.tensor_parallel_size)
        if not (_is_num(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1):
            raise _bad("gpu_memory_utilization", "must be in (0, 1]",
                       self.gpu_memory_utilization)
        _numbers(self, ("cpu_scale",), MAX_SCALE)
        if not (_is_num(self.speed) and 0 < self.speed <= MAX_SCALE):
            raise _bad("speed", f"must be a number in (0, {MAX_SCALE:g}]", self.speed)
        _numbers(self, ("launch_latency_us", "wake_us", "ipc_us"), MAX_US, optional=True)
        _numbers(self, ("acceptance_spread",), MAX_SPREAD, optional=True)
        _numbers(self, ("output_latency_ms",), MAX_MS)
        if self.request_rate is not None and not (_is_num(self.request_rate, inf=True)
                                                  and self.request_rate > 0):
            raise _bad("request_rate", "must be > 0 (or inf)", self.request_rate)
        if not (_is_num(self.burstiness, inf=True) and self.burstiness > 0):
            raise _bad("burstiness", "must be > 0", self.burstiness)
        if self.acceptance_rates is not None:
            self.acceptance_rates = _tuple(self, "acceptance_rates")
        self.metric_percentiles = _tuple(self, "metric_percentiles")
        if not self.metric_percentiles or not all(_is_num(p) and 0 < p < 100
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
                    or not all(_is_num(v) and 0 <= v <= MAX_US for v in abc):
                raise UserError(f"--cpu-cost {op}: expected A[,B[,C]], 1 to 3 numbers from 0 "
                                f"to {MAX_US:g} microseconds, got {abc!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("acceptance_rates", "metric_percentiles", "percentile_metrics"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v, inf: bool = False) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and not math.isnan(v) and (inf or math.isfinite(v)))


def _ints(cfg, names, lo: int, hi: int | None = None, optional: bool = False) -> None:
    for name in names:
        v = getattr(cfg, name)
        if v is None and optional:
            continue
        if not _is_int(v) or v < lo or (hi is not None and v > hi):
            raise _bad(name, f"must be an integer from {lo} to {hi}" if hi is not None
                       else f"must be an integer >= {lo}", v)


def _numbers(cfg, names, hi: float, optional: bool = False) -> None:
    """Finite numbers from 0 to `hi` (common/options.py's limits)."""
    for name in names:
        v = getattr(cfg, name)
        if v is None and optional:
            continue
        if not (_is_num(v) and 0 <= v <= hi):
            raise _bad(name, f"must be a number from 0 to {hi:g}", v)


def _tuple(cfg, name: str) -> tuple:
    v = getattr(cfg, name)
    if isinstance(v, (str, dict)) or not hasattr(v, "__iter__"):
        raise _bad(name, "must be a list", v)
    return tuple(v)


# -------------------------------------------------------------------------------------------
# Resolution


class Resolved(NamedTuple):
    hw: Hardware
    target: ModelConfig
    draft: Eagle3Config | None
    device_async: bool
    device_costs: DeviceCosts
    cpu: CpuCosts
    profile: AcceptanceProfile
    scheduler: SchedulerConfig
    measured: Profile | None = None   # the --profile, when given
    topology: str = "stepgap"


def resolve(cfg: SimConfig) -> Resolved:
    hw = get_hardware(cfg.gpu)
    target = load_model_config(cfg.model)
    draft = None
    if cfg.k > 0:
        draft = load_draft_config(cfg.draft, target)
        draft.check_target(target, f"--draft {cfg.draft}")
    device = cfg.device or ("cuda" if hw.kind == "gpu" else "cpu")
    device_costs: DeviceCosts = RooflineCosts(target, draft, hw, cfg.k)
    measured = load_profile(cfg.profile) if cfg.profile else None
    if measured is not None:
        device_costs = ProfileCosts(measured, cfg.k, device_costs, cfg.block_size)
    topology = cfg.topology or (measured.topology.get("engine") if measured else None) \
        or "stepgap"
    if topology not in TOPOLOGIES:
        raise UserError(f"{cfg.profile}: topology.engine {topology!r} (expected one of "
                        f"{', '.join(TOPOLOGIES)})")
    return Resolved(hw, target, draft, device == "cuda", device_costs,
                    cpu_costs(cfg, measured), acceptance_profile(cfg),
                    scheduler_config(cfg, target, draft, hw), measured, topology)


def cpu_costs(cfg: SimConfig, measured: Profile | None = None) -> CpuCosts:
    """The defaults, or the measured profile's CPU costs, times --cpu-scale; explicit
    latencies and op costs are taken as given."""
    latencies = {name: getattr(cfg, name) for name in ("launch_latency_us", "wake_us", "ipc_us")
                 if getattr(cfg, name) is not None}
    base = (measured.cpu_costs(k=cfg.k) if measured is not None else None) or CpuCosts()
    costs = replace(base.scaled(cfg.cpu_scale * cfg.speed), **latencies)
    return costs.with_ops({op: OpCost(*abc) for op, abc in cfg.cpu_costs.items()})


def acceptance_profile(cfg: SimConfig) -> AcceptanceProfile:
    if cfg.acceptance_rates is not None:
        prof = AcceptanceProfile("custom", cfg.acceptance_rates, cfg.acceptance_spread or 0.0,
                                 "--acceptance-rates")
    else:
        prof = get_profile(cfg.acceptance)
        if cfg.acceptance_spread is not None:
            prof = AcceptanceProfile(prof.name, prof.rates, cfg.acceptance_spread, prof.source)
    return prof


def kv_bytes_per_token(target: ModelConfig, draft: Eagle3Config | None) -> int:
    per = target.num_layers * 2 * target.num_kv_heads * target.head_dim * BF16
    if draft is not None:
        per += 2 * draft.num_kv_heads * draft.head_dim * BF16
    return per


def scheduler_config(cfg: SimConfig, target: ModelConfig, draft: Eagle3Config | None,
                     hw: Hardware) -> SchedulerConfig:
    blocks = cfg.num_gpu_blocks_override
    if blocks is None:
        weights = BF16 * (target.num_params + (draft.num_params if draft else 0))
        free = hw.mem_bytes * cfg.gpu_memory_utilization - weights - RESERVED_BYTES
        blocks = int(free // (cfg.block_size * kv_bytes_per_token(target, draft)))
        if blocks < 1:
            usable = hw.mem_bytes * cfg.gpu_memory_utilization / 1e9
            raise UserError(f"--gpu {hw.name}: the weights ({weights / 1e9:.1f} GB) leave no room "
                            f"for a KV cache in {usable:.1f} GB; give --num-gpu-blocks-override or a larger "
                            "--gpu-memory-utilization")
    return SchedulerConfig(num_blocks=blocks, block_size=cfg.block_size,
                           max_num_seqs=cfg.max_num_seqs,
                           max_num_batched_tokens=cfg.max_num_batched_tokens,
                           max_model_len=cfg.max_model_len, num_spec_tokens=cfg.k,
                           async_scheduling=cfg.mode != "sync",
                           max_position_embeddings=target.max_position_embeddings)
