"""The plan of a run: `resolve()` turns a SimConfig (sim/config.py) into the objects the model
runs on: model shapes, the drafter, the hardware entry, the device and CPU cost models, the
acceptance profile, the scheduler configuration and the mode the run really has (vLLM runs some
speculation methods in sync only), with a note for each thing it chose. The device's cost
source is chosen in sim/device_choice.py. Every error names the field (as its command-line
option), and comes before any work.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stepgap.common.acceptance import (AcceptanceChoice, AcceptanceProfile, dataset_acceptance,
                                       get_profile, workload_dataset)
from stepgap.sim.costs import DeviceCosts
from stepgap.sim.cpu_costs import CpuCosts, OpCost
from stepgap.sim.drafter_costs import DrafterCosts, propose_cost
from stepgap.sim.profile import Noise, Profile, load_profile
from stepgap.sim.hardware import Hardware, MeasuredLink
from stepgap.sim.hardware_file import load_gpu
from stepgap.common.errors import UserError
from stepgap.common.drafters import default_draft_model, load_drafter
from stepgap.common.model_heads import EagleHeadConfig
from stepgap.common.model_presets import load_model_config
from stepgap.common.modelcfg import ModelConfig
from stepgap.common.memory import (RESERVED_BYTES, kv_bytes_per_token, kv_cache_blocks,
                                   weight_bytes)
from stepgap.common.run_spec import bad
from stepgap.common.scheduler import SchedulerConfig
from stepgap.common.speculation import METHODS
from stepgap.sim.config import _CPU, KV_CACHE_DTYPES, TOPOLOGIES, SimConfig
from stepgap.sim.device_choice import (collectives, device_costs_of, parallel_notes, table_notes,
                                       with_committed_tables)

@dataclass(frozen=True, slots=True)
class Topology:
    """Where the step loop's parts run (docs/explanation/design.md §2), and what follows from it."""

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
    """Everything a run needs, resolved once from its SimConfig (sim/core.py `EngineCore` reads
    this, and derives nothing from the config itself)."""

    hw: Hardware
    target: ModelConfig
    draft: EagleHeadConfig | ModelConfig | None   # what drafts (None: mtp, n-gram, k = 0)
    device_costs: DeviceCosts
    cpu: CpuCosts
    profile: AcceptanceProfile
    scheduler: SchedulerConfig
    topology: Topology
    measured: Profile | None = None   # the --profile, when given
    mode: str = "sync"                # the mode the run has (a CPU proposer's: sync)
    notes: tuple[str, ...] = ()       # what was chosen for the user, one line each
    # the step loop's rules, from the mode, the method and the topology (sim/loop.py)
    wait_accepted: bool = False       # async with drafts: step N+1 waits for N's counts
    fixup: bool = False               # zero-bubble's device fixup (not where computes_ahead)
    cpu_propose: bool = False         # drafts proposed on the host (n-gram)
    rpc_share: float = 1.0            # of vLLM's sync-fitted RPC turnaround, waited
    noise: Noise | None = None        # the measured noise replayed on the device ops
    # the drafter as vLLM runs it: its passes, and its host costs where priced (a GPU, no
    # measured CPU fit, which holds them already); None: k = 0
    drafter: DrafterCosts | None = None
    drafter_host: bool = False

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
    cfg, priced = with_committed_tables(cfg, hw, target, profile)
    hw = collectives(cfg, hw, notes, target.is_moe)
    if cfg.disable_custom_all_reduce and hw.interconnect is not None:
        hw = replace(hw, interconnect=replace(hw.interconnect, p2p=False))
        notes.append("--disable-custom-all-reduce: every all-reduce is NCCL's")
    if cfg.all_reduce_latency_us is not None and hw.interconnect is not None:
        link = hw.interconnect
        if isinstance(link, MeasuredLink) and link.model is None:
            raise UserError(f"--all-reduce-latency-us: the collectives are measured "
                            f"({link.name}); it sets the interconnect model's "
                            "latency, which they replace")
        if isinstance(link, MeasuredLink):   # the model prices what was not measured
            link = replace(link, model=replace(link.model,
                                               latency_us=cfg.all_reduce_latency_us))
            notes.append(f"--all-reduce-latency-us {cfg.all_reduce_latency_us:g}: the "
                         "interconnect model's latency, for the collectives it prices beside "
                         f"the measured ones ({link.name})")
        else:
            link = replace(link, latency_us=cfg.all_reduce_latency_us)
        hw = replace(hw, interconnect=link)
    target.check_tensor_parallel(tp)
    draft, method = None, METHODS[cfg.method]
    if cfg.k > 0:
        spec = cfg.draft
        if method.needs_checkpoint and spec is None:
            spec = default_draft_model(target)
            notes.append(f"draft_model: no draft model given; using {spec}, the smallest "
                         "preset with the target's vocabulary (give speculative_config's model)")
        draft = load_drafter(cfg.method, spec, target, cfg.k)
        if draft is not None:
            draft.check_tensor_parallel(tp)
        if method.uses_mtp_layers and cfg.k > target.num_mtp_layers:
            notes.append(f"mtp: k={cfg.k} runs the model's {target.num_mtp_layers} MTP "
                         f"layer(s) {cfg.k // target.num_mtp_layers} times in turn, as vLLM "
                         "does; acceptance past the layers' own depth is extrapolated")
    mode = cfg.mode
    # a proposer from the sampled tokens on the host: vLLM runs it with sync scheduling only
    # (vllm/config/vllm.py; docs/explanation/past-one-gpu.md)
    if cfg.k > 0 and method.on_cpu and mode != "sync":
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
        raise bad("--data-parallel-size", "data parallelism is modelled for GPU engine cores "
                   "(--device cuda) behind stepgap's in-process client (--topology stepgap)",
                   cfg.data_parallel_size)
    from stepgap.common.workloads import workload_notes
    notes += workload_notes(cfg.workload, cfg.model)
    prof, note = acceptance_profile(cfg, target)
    if note and cfg.k:
        notes.append(note)
    drafter = DrafterCosts.of(cfg, draft, target) if cfg.k else None
    drafter_host = drafter is not None and topo.device_async and \
        (measured is None or measured.cpu is None)
    if drafter_host:
        notes.append(drafter.describe())
    if priced:
        notes.append(priced)
    async_ = mode != "sync"
    return Resolved(
        hw, target, draft, costs, cpu_costs(cfg, measured), prof,
        scheduler_config(cfg, target, draft, hw, mode), topo, measured, mode, tuple(notes),
        wait_accepted=mode == "async" and cfg.k > 0,
        # a process worker on a synchronous device has computed step N (and knows its counts)
        # before it prepares N+1: zero-bubble then has nothing to fix up
        fixup=mode == "zero-bubble" and not topo.computes_ahead,
        cpu_propose=cfg.k > 0 and method.on_cpu,
        # vLLM's worker turns an RPC around in a round trip in sync (it replies, and the engine
        # core sends the next only then) and in one message in async (the next is already
        # queued): the share of the sync-fitted turnaround it waits (docs/explanation/vllm.md)
        rpc_share=0.5 if engine == "vllm" and async_ else 1.0,
        noise=measured.jitter if cfg.jitter and measured is not None else None,
        drafter=drafter, drafter_host=drafter_host)


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


def cpu_costs(cfg: SimConfig, measured: Profile | None = None) -> CpuCosts:
    """The defaults, or the measured profile's CPU costs, times --cpu-scale; explicit
    latencies and op costs are taken as given."""
    latencies = {name: getattr(cfg, name) for name in ("launch_latency_us", "wake_us", "ipc_us")
                 if getattr(cfg, name) is not None}
    base = (measured.cpu_costs(k=cfg.k) if measured is not None else None) or CpuCosts()
    method = METHODS[cfg.method]
    own = propose_cost(method) if cfg.k and method.on_cpu else _CPU.propose
    if own != _CPU.propose and not (   # the method's own matching cost (the default: ngram's)
            measured is not None and measured.cpu is not None
            and "propose" in measured.cpu.terms):
        base = replace(base, propose=own)
    costs = replace(base.scaled(cfg.cpu_scale * cfg.speed), **latencies)
    if cfg.drafter_host_scale != 1.0:   # (the band's `drafter` input, a CPU proposer's part)
        p, x = costs.propose, cfg.drafter_host_scale
        costs = replace(costs, propose=OpCost(p.a * x, p.b * x, p.c * x))
    return costs.with_ops({op: OpCost(*abc) for op, abc in cfg.cpu_costs.items()})


def acceptance_profile(cfg: SimConfig, target: ModelConfig | None = None
                       ) -> tuple[AcceptanceProfile, str | None]:
    """The run's acceptance: --acceptance-rates, the named profile, or by model, method and
    dataset (`acceptance_choice`), with a note saying which."""
    if cfg.acceptance_rates is not None:
        prof = AcceptanceProfile("custom", cfg.acceptance_rates, cfg.acceptance_spread or 0.0,
                                 "--acceptance-rates")
        return prof, None
    if cfg.acceptance is not None:
        prof, note = get_profile(cfg.acceptance), None
    else:
        choice, how = acceptance_choice(cfg, target)
        prof = choice.profile
        note = (f"{choice.note}; " if choice.note else "acceptance: ") + \
            f"{prof.name} for the {choice.dataset} dataset ({how})"
    if cfg.acceptance_spread is not None:
        prof = AcceptanceProfile(prof.name, prof.rates, cfg.acceptance_spread, prof.source)
    return prof, note


def acceptance_choice(cfg: SimConfig, target: ModelConfig | None = None
                      ) -> tuple[AcceptanceChoice, str]:
    """The default acceptance of the run's model and method on its dataset (--acceptance-
    dataset, else the workload's, else mtbench), and how the dataset was chosen."""
    dataset, how = cfg.acceptance_dataset, "--acceptance-dataset"
    if dataset is None:
        dataset = workload_dataset(cfg.workload)
        how = f"the workload {cfg.workload.split(':')[0]}"
    if dataset is None:
        dataset, how = "mtbench", "a trace, whose dataset is not known: give --acceptance-dataset"
    model = target.name if target is not None else cfg.model
    return dataset_acceptance(model, cfg.method, dataset), how


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
        per_token = kv_bytes_per_token(target, draft, tp, method,
                                       KV_CACHE_DTYPES[cfg.kv_cache_dtype])
        blocks = kv_cache_blocks(hw.mem_bytes, cfg.gpu_memory_utilization, weights,
                                 RESERVED_BYTES, cfg.block_size, per_token)
        usable = hw.mem_bytes * cfg.gpu_memory_utilization / 1e9
        if blocks < 1 and cfg.block_size * per_token > hw.mem_bytes:
            raise UserError(f"--block-size {cfg.block_size}: one block's KV cache takes "
                            f"{cfg.block_size * per_token / 1e9:.3g} GB, more than --gpu "
                            f"{hw.name}'s {hw.mem_bytes / 1e9:.1f} GB (vLLM's blocks hold 16 "
                            "to 128 tokens)")
        if blocks < 1:
            per = f" per GPU at --tensor-parallel-size {tp}" if tp > 1 else ""
            raise UserError(f"--gpu {hw.name}: the weights ({weights / 1e9:.1f} GB{per}) leave "
                            f"no room for a KV cache in {usable:.1f} GB; give "
                            "--num-gpu-blocks-override, a larger --gpu-memory-utilization, more "
                            "GPUs (--tensor-parallel-size) or a --gpu with more memory")
    drafts = METHODS[cfg.method].draft_tokens(cfg.k)   # a decoding request's, each step
    return SchedulerConfig.for_run(mode or cfg.mode, drafts, blocks, cfg.block_size,
                                   cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   cfg.max_model_len, target.max_position_embeddings,
                                   scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
                                   enable_prefix_caching=cfg.enable_prefix_caching)
