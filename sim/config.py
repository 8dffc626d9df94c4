"""A simulation's configuration: a run's settings (common/run_spec.py `RunSpec`) plus the
simulator's own, one frozen dataclass, validated where it is built.

`SimConfig` names everything a run needs by plain values (preset names, paths, numbers), so it
serialises into the run result as it is; each field's metadata gives its option, limits and
help, for the check and for the command line (sim/setup_args.py). `resolve()` turns it into
the objects the model runs on: model shapes, the drafter, the hardware entry, the device and
CPU cost models, the acceptance profile, the scheduler configuration and the mode the run
really has (vLLM runs some speculation methods in sync only), with a note for each thing it
chose. Every error names the field (as its command-line option), and comes before any work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from stepgap.common.acceptance import (DATASETS, PROFILES, AcceptanceChoice, AcceptanceProfile,
                                       dataset_acceptance, get_profile, workload_dataset)
from stepgap.sim.costs import DeviceCosts, LevelCosts
from stepgap.sim.cpu_costs import CPU_COSTS, CpuCosts, OpCost
from stepgap.sim.drafter_costs import (DRAFTER_GRAPHS, LATEST, DrafterCosts, parse_version,
                                       propose_cost)
from stepgap.sim.roofline import BF16, MTP_EXTRA_KERNELS, RooflineCosts, _ceil
from stepgap.sim.profile import Noise, Profile, load_profile
from stepgap.sim.profile_costs import ProfileCosts
from stepgap.sim.tables import (TableCosts, bundle_meta, committed_bundle, find_bundle,
                                find_variant, load_tables, read_meta, refuse_another_model,
                                repo_relative)
from stepgap.sim.expert_parallel import MoeCosts, MoeParallel
from stepgap.sim.moe_tables import check_moe_bundle, moe_only, moe_parts, mtp_path
from stepgap.sim.hardware import CATALOG, Hardware, MeasuredLink, is_gpu_file
from stepgap.sim.hardware_file import (collectives_beside, committed_link, load_collectives,
                                       load_gpu, other_measurements, with_link)
from stepgap.common.errors import UserError, where
from stepgap.common.limits import (MAX_MS, MAX_SCALE, MAX_SKEW, MAX_SPREAD, MAX_US, MIN_SPEED,
                                   is_finite)
from stepgap.common.drafters import default_draft_model, load_drafter
from stepgap.common.model_heads import EagleHeadConfig
from stepgap.common.model_presets import load_model_config
from stepgap.common.modelcfg import ModelConfig
from stepgap.common.memory import (RESERVED_BYTES, kv_bytes_per_token, kv_cache_blocks,
                                   weight_bytes)
from stepgap.common.run_spec import RunSpec, bad, flag, opt
from stepgap.common.scheduler import SchedulerConfig
from stepgap.common.speculation import METHODS

# Whose step loop is simulated: stepgap's engine (one message per step, an in-process client) or
# vLLM's (execute_model and sample_tokens RPCs, take_draft_token_ids in sync, an API server
# sharing the engine core's CPU; docs/explanation/vllm.md). None: the profile's, else stepgap.
TOPOLOGIES = ("stepgap", "vllm", "served")
# vLLM's --quantization and --kv-cache-dtype values the simulator models, and the element size
# of a KV cache of each (auto: the model's bf16).
QUANTIZATIONS = ("fp8",)
KV_CACHE_DTYPES = {"auto": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
_CPU = CpuCosts()


@dataclass(frozen=True)
class SimConfig(RunSpec):
    """A run's settings (common/run_spec.py) plus the simulator's own: the hardware, measured
    costs and where the step loop runs, the acceptance, the weights' and cache's precision,
    and the CPU costs."""

    # hardware and measured costs
    gpu: str = opt("h100", "--gpu", metavar="NAME|FILE.yaml", shown=False, help=(
        f"device from the catalog: {', '.join(CATALOG)} (default h100; cpu with --device cpu); "
        "or a YAML file for your own: stepgap's fields (base, bf16_tflops, fp8_tflops, "
        "memory_gb, memory_bw_gbps, flop_eff, bw_eff, kernel_us, d2h_us, interconnect) or "
        "LLMServingSim's hardware.yaml as it is, whose measured collectives then price tensor "
        "parallelism (docs/explanation/device-costs.md, 'The catalog')"))
    profile: str | None = opt(None, "--profile", metavar="PROFILE.json", help=(
        "a measured profile (`stepgap profile`, `stepgap calibrate`, or a measured folder's "
        "profile.json): its device op fits replace the roofline wherever it covers the op, and "
        "its CPU costs replace the defaults (explicit CPU options still win). The result's "
        "config says which ops it covered"))
    device_profile: str | None = opt(None, "--device-profile", metavar="DIR", help=(
        "measured operator tables of a GPU (LLMServingSim's perf bundle: DIR/meta.yaml and "
        "DIR/tp<N>/{dense,attention,per_sequence}.csv, e.g. "
        "profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16): they price the target forward "
        "over the step's real mix, the sampler and an EAGLE-3 head or draft model of the same "
        "shapes; the roofline prices the rest, and the result's config says which op came from "
        "where (docs/explanation/measured-tables.md, 'Measured operator tables'). Default: the "
        "tables committed for a catalog --gpu that time the model's layers, where there are "
        "any (`stepgap gpus`); `none`: the roofline alone (docs/reference/gpus.md)"))
    quantization: str | None = opt(
        None, "--quantization", "-q", kind="choice", choices=QUANTIZATIONS,
        refusal="is not modelled: stepgap models fp8 (or none: the checkpoint's own "
                "quantization_config)",
        help="vLLM's online quantization of the target: fp8 makes its linear layers 1 byte a "
             "weight (weights' memory, the bytes a step reads) and runs their GEMMs at the "
             "--gpu's fp8 peak; the embedding, lm_head and the drafter stay bf16. Default: the "
             "checkpoint's own (quantization_config)")
    kv_cache_dtype: str = opt(
        "auto", "--kv-cache-dtype", kind="choice", choices=tuple(KV_CACHE_DTYPES), shown=False,
        help="the KV cache's element: an fp8 one holds twice the tokens in the same memory and "
             "halves attention's reads (default auto: the model's bf16). With --device-profile, "
             "the bundle's variant of that dtype is used (e.g. bf16-kvfp8 beside bf16), or the "
             "run is refused")
    speed: float = opt(
        1.0, "--speed", kind="float", lo=MIN_SPEED, hi=MAX_SCALE, metavar="X", shown=False,
        help=f"the machine's level for this run: device ops and CPU costs take X times as long, "
             f"{MIN_SPEED:g} to {MAX_SCALE:g} (default 1, the profile's mean)")
    topology: str | None = opt(
        None, "--topology", kind="choice", choices=TOPOLOGIES,
        help="whose step loop: stepgap's engine, vLLM's (its RPCs, its API server sharing the "
             "engine core's CPU; docs/explanation/vllm.md), or stepgap's engine behind "
             "`stepgap serve`'s API server (docs/explanation/serve.md). Default: the profile's "
             "topology.engine, else stepgap")
    moe_routing_skew: float = opt(
        0.0, "--moe-routing-skew", kind="float", hi=MAX_SKEW, metavar="S", shown=False,
        help="MoE targets: Zipf exponent of the experts' popularity (default 0: uniform "
             "routing); skew means fewer distinct experts, so fewer expert weights read, per "
             "step (docs/explanation/past-one-gpu.md)")
    all_reduce_latency_us: float | None = opt(
        None, "--all-reduce-latency-us", kind="float", hi=MAX_US, metavar="US",
        help="tensor parallelism: one small all-reduce's time, which dominates the collectives "
             "at decode (default: the --gpu interconnect's; 6 on NVLink, 20 on PCIe; "
             "docs/explanation/past-one-gpu.md). Not with measured collectives (a "
             "hardware.yaml), which it would contradict")
    collectives: str | None = opt(
        None, "--collectives", metavar="FILE.yaml", help=(
            "a measurement of the collectives between the GPUs (LLMServingSim's hardware.yaml: "
            "measured.interconnect over as many GPUs as --tensor-parallel-size, or a MoE "
            "target's --data-parallel-size) to price them with, in place of the one found "
            "for the --gpu (its file's, the one beside --device-profile, the one committed "
            "for the GPU), or of the interconnect model; `stepgap gpus` lists them"))
    disable_custom_all_reduce: bool = opt(
        False, "--disable-custom-all-reduce", kind="bool", action="store_true", help=(
            "as vLLM's: every all-reduce is NCCL's, none vLLM's own kernel (priced by the "
            "measured NCCL all_reduce where a measurement of the link has one, else the "
            "interconnect model's ring)"))
    jitter: bool = opt(
        True, "--no-jitter", kind="bool", action="store_false", label="--jitter", shown=False,
        help="ignore the profile's measured speed noise (by default device ops vary from step "
             "to step as measured; seeded by --seed)")
    # the drafter as vLLM runs it (sim/drafter_costs.py)
    vllm_version: str | None = opt(
        None, "--vllm-version", metavar="X.Y.Z", help=(
            f"the vLLM whose drafter to price (default {LATEST}, its main branch: the padded "
            "drafter batch, PIECEWISE drafter graphs); before 0.11.0 the drafter waits for "
            "each step's tokens on the host (no padded drafter batch, #24539)"))
    disable_padded_drafter_batch: bool | None = opt(
        None, kind="bool", label="speculative_config's disable_padded_drafter_batch",
        help="the drafter waits for the step's sampled tokens on the host (default: vLLM's "
             "for --vllm-version: false from 0.11.0)")
    parallel_drafting: bool = opt(
        False, kind="bool", label="speculative_config's parallel_drafting",
        help="one drafter pass for the k drafts (P-EAGLE, PARD; vLLM #32887)")
    drafter_cudagraph_mode: str | None = opt(
        None, "--drafter-cudagraph-mode", kind="choice", choices=DRAFTER_GRAPHS, help=(
            "the drafter's CUDA graphs: FULL (vLLM's model runner V2, #37588; "
            "VLLM_USE_V2_MODEL_RUNNER=1), PIECEWISE (the V1 model runner's: attention eager "
            "between the graph's pieces) or NONE (eager). Default: what vLLM derives from "
            "--compilation-config's cudagraph_mode and speculative_config's enforce_eager, "
            "PIECEWISE unless either says otherwise"))
    drafter_host_scale: float = opt(
        1.0, "--drafter-host-scale", kind="float", lo=0.0, hi=MAX_SCALE, metavar="X",
        shown=False, help="multiply the drafter's host costs (its dispatch a pass, its first "
                          "inputs, a CPU proposer's matching; default 1)")
    # acceptance (None: the published profile of this model and method)
    acceptance: str | None = opt(
        None, "--acceptance", metavar="PROFILE",
        help=f"named per-position acceptance profile: {', '.join(PROFILES)} (default: the "
             "published one of the model and method, else mtbench: vLLM #26191, Llama-3.1-8B "
             "EAGLE-3 on MT-bench; docs/explanation/acceptance.md)")
    acceptance_dataset: str | None = opt(
        None, "--acceptance-dataset", kind="choice", choices=tuple(DATASETS), help=(
            "the dataset the acceptance is of (common/acceptance.py DATASETS: each one's "
            "published effect on acceptance, and its spread as the band): default the "
            "workload's (--dataset-name random: random; sharegpt; hf mt-bench: mtbench), "
            "mtbench for a trace; docs/explanation/acceptance-by-dataset.md)"))
    acceptance_rates: tuple[float, ...] | None = opt(
        None, "--acceptance-rates", kind="rates", metavar="R1,R2,...",
        help="per-position acceptance rates as vLLM reports them (cumulative: the fraction of "
             "drafts whose position i was accepted); overrides the profile")
    acceptance_spread: float | None = opt(   # None: the profile's
        None, "--acceptance-spread", kind="float", hi=MAX_SPREAD, metavar="SIGMA",
        help="std of each request's logit shift of the rates; 0 makes every request alike "
             "(default: the profile's; mtbench 0.50)")
    replay: bool = opt(   # use a trace's recorded `accepted` lists
        True, "--no-replay", kind="bool", action="store_false", label="--replay", shown=False,
        help="ignore a trace's recorded `accepted` lists (default: replay them)")
    # CPU (op cost = A + B*num_reqs + C*num_tokens microseconds)
    cpu_scale: float = opt(
        1.0, "--cpu-scale", kind="float", hi=MAX_SCALE, metavar="X", shown=False,
        help="multiply every default CPU cost and latency (default on the command line: the "
             "nominal host, x 2.42, without --profile; 1 with one, and in SimConfig; the "
             "seed-l20 preset's value is fitted on its sync row)")
    cpu_costs: dict = opt({}, kind="table", label="--cpu-cost",   # op -> [a, b, c]
                          refusal="must be a table of OP = [A, B, C]")
    launch_latency_us: float | None = opt(
        None, "--launch-latency-us", kind="float", hi=MAX_US, metavar="US",
        help=f"from a launch's start to its first kernel running (default "
             f"{_CPU.launch_latency_us:g})")
    wake_us: float | None = opt(
        None, "--wake-us", kind="float", hi=MAX_US, metavar="US",
        help=f"a blocking wait returning after its event (default {_CPU.wake_us:g})")
    ipc_us: float | None = opt(
        None, "--ipc-us", kind="float", hi=MAX_US, metavar="US",
        help=f"one engine<->worker message, process topology (default {_CPU.ipc_us:g})")
    output_latency_ms: float = opt(
        0.0, "--output-latency-ms", kind="float", hi=MAX_MS, metavar="MS", shown=False,
        help="from update_from_output to the client receiving the chunk (default 0)")

    def __post_init__(self):
        super().__post_init__()
        if self.vllm_version is not None:
            parse_version(self.vllm_version)
        for op, abc in self.cpu_costs.items():
            if op not in CPU_COSTS:
                raise UserError(f"--cpu-cost: unknown op {op!r} (ops: {', '.join(CPU_COSTS)})")
            if not isinstance(abc, (list, tuple)) or not 1 <= len(abc) <= 3 \
                    or not all(is_finite(v) and 0 <= v <= MAX_US for v in abc):
                raise UserError(f"--cpu-cost {op}: expected A[,B[,C]], 1 to 3 numbers from 0 "
                                f"to {MAX_US:g} microseconds, got {abc!r}")

    def to_dict(self) -> dict:
        """The config as results and a sweep's cell hashes record it, its keys in
        CONFIG_KEYS' order; the fields that came after those results (OPTIONAL_FIELDS) only
        where set, so that a run without them writes what it wrote before, byte for byte."""
        d = asdict(self)
        d = {key: d[key] for key in CONFIG_KEYS
             if key not in OPTIONAL_FIELDS or d[key] != OPTIONAL_FIELDS[key]}
        for key in ("acceptance_rates", "metric_percentiles", "percentile_metrics"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d


# A result's config, its keys in the order results have always written them (SimConfig.to_dict).
CONFIG_KEYS = (
    "mode", "k", "gpu", "model", "method", "draft", "executor", "device", "tensor_parallel_size",
    "data_parallel_size", "enable_expert_parallel", "moe_routing_skew", "all_reduce_latency_us",
    "collectives", "disable_custom_all_reduce", "topology", "profile", "device_profile",
    "jitter", "speed", "acceptance", "acceptance_rates",
    "acceptance_spread", "replay", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
    "block_size", "num_gpu_blocks_override", "gpu_memory_utilization", "quantization",
    "kv_cache_dtype", "scheduler_reserve_full_isl", "enable_prefix_caching", "cpu_scale",
    "cpu_costs", "launch_latency_us", "wake_us", "ipc_us", "output_latency_ms", "workload",
    "num_prompts", "output_len", "shared_fraction", "request_rate", "burstiness",
    "max_concurrency", "seed", "metric_percentiles", "percentile_metrics", "detailed",
    "timeline", "timeseries_interval_s", "vllm_version", "disable_padded_drafter_batch",
    "parallel_drafting", "drafter_cudagraph_mode", "drafter_host_scale", "acceptance_dataset")
# Fields written into a result only where they differ from their default (SimConfig.to_dict).
OPTIONAL_FIELDS = {"quantization": None, "kv_cache_dtype": "auto", "data_parallel_size": 1,
                   "enable_expert_parallel": False, "collectives": None,
                   "disable_custom_all_reduce": False, "vllm_version": None,
                   "disable_padded_drafter_batch": None, "parallel_drafting": False,
                   "drafter_cudagraph_mode": None, "drafter_host_scale": 1.0,
                   "acceptance_dataset": None}


# -------------------------------------------------------------------------------------------
# Resolution


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


NO_TABLES = "none"   # --device-profile none: the roofline alone, no committed tables


def committed_tables(cfg: SimConfig, hw: Hardware, target: ModelConfig,
                     profile: Profile | None = None) -> Path | None:
    """The operator tables committed under traces/peers/ that price this run by default
    (sim/tables.py committed_bundle): a catalog GPU (not a GPU file) as a CUDA device, no
    --device-profile (`none` refuses them) and no --profile (its fits or level were made over
    the roofline), a bundle of the GPU measured for the model's shapes at the run's TP."""
    if cfg.device_profile is not None or cfg.profile is not None or profile is not None \
            or is_gpu_file(cfg.gpu) or hw.kind != "gpu" or (cfg.device or "cuda") != "cuda":
        return None
    return committed_bundle(hw.name, target, cfg.tensor_parallel_size,
                            target.quantization == "fp8", KV_CACHE_DTYPES[cfg.kv_cache_dtype] == 1)


def with_committed_tables(cfg: SimConfig, hw: Hardware, target: ModelConfig,
                          profile: Profile | None) -> tuple[SimConfig, str | None]:
    """The run's config as it is priced, and the note that says what prices it (for the end of
    the run's notes): --device-profile none as none given; the committed tables of the GPU
    (committed_tables) as if given."""
    if cfg.device_profile == NO_TABLES:
        return replace(cfg, device_profile=None), None
    found = committed_tables(cfg, hw, target, profile)
    if found is None:   # (a fitted roofline says so in the result's device_costs)
        return cfg, None
    return replace(cfg, device_profile=str(found)), (
        f"--gpu {hw.name}: the measured operator tables {repo_relative(found)} price "
        f"{target.name} at TP {cfg.tensor_parallel_size} (committed with their source and "
        "licence; the result's device_costs say which kernels, and what the fitted roofline "
        f"prices; --device-profile {NO_TABLES} for the roofline alone)")


def profile_defaults(settings: dict, given, measured: Profile | None = None
                     ) -> tuple[dict, list[str]]:
    """`settings` with what their profile was measured on (`Profile.measured_on`: its gpu,
    device, executor and measured acceptance) filled in where `given` (the fields a command
    line, preset or grid set) names none of them, and a note for a measured acceptance that
    the given settings replace. A profile runs where it was measured unless told otherwise;
    told otherwise, `resolve` says so in the result. `measured`: the profile, already read."""
    if not settings.get("profile"):
        return settings, []
    measured = measured or load_profile(settings["profile"])
    where, out, notes = measured.measured_on(), dict(settings), []
    if not {"gpu", "device"} & set(given):   # a gpu or device given picks the other itself
        out.update({name: where[name] for name in ("gpu", "device") if name in where})
    if "executor" in where and "executor" not in given:
        out["executor"] = where["executor"]
    if "acceptance_rates" in where:
        chosen = [n for n in ("acceptance", "acceptance_rates", "acceptance_spread",
                              "acceptance_dataset") if n in given]
        if chosen:
            rates = ", ".join(f"{r:.3g}" for r in where["acceptance_rates"])
            notes.append(f"--profile {settings['profile']} measured its acceptance (rates "
                         f"{rates}); this run takes {flag(chosen[0], SimConfig)} instead, as asked")
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
    hardware.yaml gives them (--collectives; `--gpu FILE.yaml`; the one LLMServingSim keeps
    beside the --device-profile tables, profiler/perf/<GPU>/hardware.yaml; the one committed
    for a catalog GPU, sim/hardware_file.py COMMITTED_LINKS) over as many GPUs as each group
    has, else the --gpu's interconnect model; said in the notes when measured, with the other
    measurements of the same link this repository holds."""
    tp, link = cfg.tensor_parallel_size, hw.interconnect
    dp = cfg.data_parallel_size if moe else 1
    groups = {n: option for n, option in ((dp, "--data-parallel-size"),
                                          (tp, "--tensor-parallel-size")) if n > 1}
    if not groups:
        return hw
    found = None
    if cfg.collectives is not None:
        found = Path(cfg.collectives)
        if not found.is_file():
            raise UserError(f"--collectives {cfg.collectives}: no such file (a hardware.yaml "
                            "with measured.interconnect)")
        measured = load_collectives(found, model=_model_of(hw))
        if measured is None:
            raise UserError(f"{where(found, field='measured.interconnect')}: missing "
                            "(--collectives needs the measured collectives)")
        _check_npus(measured, groups, str(found))
        hw = with_link(hw, measured)
    elif isinstance(link, MeasuredLink):
        _check_npus(link, groups, cfg.gpu)
    else:
        if cfg.device_profile is not None:
            root = find_bundle(cfg.device_profile)
            label = read_meta(root).get("hardware")
            found = collectives_beside(root, str(label)) if label else None
        if found is None and len(groups) == 1 and not is_gpu_file(cfg.gpu):
            found = committed_link(hw.name, next(iter(groups)))
        measured = load_collectives(found, model=_model_of(hw)) if found else None
        if measured is None:
            return hw
        if any(measured.npus != n for n in groups):
            notes.append(f"{found} measured its collectives over {measured.npus} GPUs, not "
                         f"{' and '.join(map(str, groups))}: the --gpu's interconnect model "
                         f"({link.name}) prices them")
            return hw
        hw = with_link(hw, measured)
    link = hw.interconnect
    said = [f"collectives: {link.source}"]
    if tp > 1:
        if not link.p2p:
            said.append("each all-reduce is NCCL's (no peer access, so no custom all-reduce)")
        elif "all_gather" in link.sizes:
            said.append("each all-reduce takes vLLM's path (its custom one-shot kernel under "
                        "8 MiB where the GPUs have peer access, priced as the measured "
                        "all_gather of the same bytes; NCCL's measured all_reduce above)")
        else:
            said.append("each all-reduce takes vLLM's path (its custom kernel under 8 MiB "
                        "where the GPUs have peer access, from the interconnect model, which "
                        "no table measured; NCCL's measured all_reduce above)")
    if dp > 1:
        said.append("the MoE layers' dispatch and combine over the DP ranks as the measured "
                    "all_gather and " + ("reduce_scatter" if "reduce_scatter" in link.sizes
                                         else "all_gather of the same bytes (no reduce_scatter "
                                              "samples)"))
    others = other_measurements(link.path) if link.path else []
    if others:
        said.append(f"another measurement of this link: "
                    f"{', '.join(map(repo_relative, others))} (the `collectives` band input "
                    "spans them)")
    notes.append("; ".join(said))
    return hw


def _model_of(hw: Hardware):
    """The GPU's interconnect model (under measured collectives, the model they keep)."""
    link = hw.interconnect
    return link.model if isinstance(link, MeasuredLink) else link


def _check_npus(link: MeasuredLink, groups: dict, source: str) -> None:
    for n, option in groups.items():
        if link.npus != n:
            raise UserError(f"{where(source, field='measured.interconnect.npus')}: the "
                            f"collectives were measured over {link.npus} GPUs; {option} {n} "
                            f"needs them measured over {n} (or a catalog --gpu, whose "
                            "interconnect model prices them)")


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
                              or (cfg.k and not METHODS[cfg.method].profiled)):
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
                               f"fitted on {on}'s runs", measured.path, measured.draft_level)
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
    roofline = roofline_of(costs)
    if bundle is not None and roofline is not None:   # the tables against the model's shapes
        check_tables(costs, roofline, bundle, cfg.tensor_parallel_size)
    src = getattr(costs, "sources", None)
    if hw.device_band is not None and "target_forward" not in (src or {}):
        costs.sources = {**fitted_sources(hw), **(src or {})}
    return costs


def fitted_sources(hw: Hardware) -> dict[str, str]:
    """What prices each device op of a run on a GPU whose roofline was fitted on measured tables
    (`Hardware.device_band`) and that no table or profile prices (the result's device_costs)."""
    roof = (f"roofline fitted on measured tables ({hw.name}: bw_eff {hw.bw_eff:g}, flop_eff "
            f"{hw.flop_eff:g}, {hw.kernel_us:g} us a kernel; {hw.source}; `stepgap gpus`)")
    return {"target_forward": roof, "rejection_sample": roof, "draft_forward": roof,
            "d2h": f"roofline (the catalog's copy time, {hw.d2h_us:g} us)", "fixup": roof}


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
        table, mtp = moe_parts(bundle, tp, plan.moe_tp,
                               cfg.k > 0 and METHODS[cfg.method].uses_mtp_layers)
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
                     "(docs/explanation/past-one-gpu.md, 'Data and expert parallelism')"
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
                     "proportion (docs/explanation/measured-tables.md)")
    label = tables.hardware.lower()
    if hw.name.lower() not in (label, label.replace("_", "")):
        notes.append(f"--device-profile was measured on {tables.gpu} ({tables.hardware}); "
                     f"--gpu {cfg.gpu} gives the memory size and the roofline of what the "
                     "tables lack")
    return notes


# ---------------------------------------------------------------------------------------------
# Measured tables held to physics, once the model they price is known
#
# As a perf bundle is read (sim/tables.py, sim/moe_tables.py) every time is a number above 0 and
# under MAX_TIME_US; that alone lets through a table whose units are wrong (nanoseconds or
# milliseconds written as microseconds) or whose recorder broke: an mtp.csv at 10^9 us gave a
# mean TPOT of 2.8 x 10^6 ms with exit 0 (issue 55). Each point of the tables a run reads is
# held to the model's own shapes at that point (the roofline's bytes and FLOPs): no faster than
# a device of PEAK_FLOPS and PEAK_BW with no per-kernel cost could run it (past any GPU's
# physics: a unit error, or a kernel that did not run), no slower than SLOWEST x the --gpu's
# roofline of the same kernels at the same size. Each refusal is one line naming the table's
# file and the point; checked once a process for the same tables, GPU and model (a grid's cells
# each resolve the same run).

# No device is this fast: 44 x a B200's dense bf16 peak (2.25 PFLOP/s) and 22 x its fp8 one;
# 12.5 x its memory bandwidth (8 TB/s), above any GPU's L2 bandwidth too.
PEAK_FLOPS = 1e17
PEAK_BW = 1e14
# A point this many times slower than the --gpu's roofline at the datasheet peak is not a
# measurement. The committed bundles' points (on their own GPUs; DeepSeek's on --gpu h200) lie
# at 19 x the ideal device's time or more and at 23 x the roofline or less (attention.csv's
# long prefills; the rest within 3.3 x): docs/reference/robustness-round4.md has the script.
SLOWEST = 1000.0

_TABLES_CHECKED: set = set()


def ideal_hardware(hw):
    """`hw` as no device is: PEAK_FLOPS, PEAK_BW, every kernel free of fixed costs."""
    return replace(hw, flops=PEAK_FLOPS, fp8_flops=PEAK_FLOPS, mem_bw=PEAK_BW, flop_eff=1.0,
                   bw_eff=1.0, kernel_us=0.0)


class TableJudge:
    """One table's points against the fast bound (`fast`, us) and the slow one (SLOWEST x
    `ref`, us)."""

    def __init__(self, path, gpu: str):
        self.path, self.gpu = path, gpu

    def __call__(self, what: str, t: float, fast: float, ref: float) -> None:
        if t < fast:
            raise UserError(f"{self.path}: {what}: {t:g} us, faster than any device runs it "
                            f"(at {PEAK_FLOPS / 1e15:g} PFLOP/s and {PEAK_BW / 1e12:g} TB/s it "
                            f"takes {fast:.3g} us): a unit error (ns as us?) or a kernel that "
                            "did not run")
        if t > SLOWEST * ref:
            raise UserError(f"{self.path}: {what}: {t:g} us, over {SLOWEST:g} x the roofline "
                            f"of --gpu {self.gpu} ({ref:.3g} us): a unit error (ms or ns as "
                            "us?) or a broken recorder")


def check_tables(costs, roofline: RooflineCosts, bundle: Path | None, tp: int) -> None:
    """Hold the measured tables under `costs` (sim/tables.py TableCosts) and the MoE block's and
    MTP module's (roofline.moe) to physics (the comment above)."""
    tables = getattr(costs, "tables", None)
    moe = roofline.moe
    grid_table = moe.table if moe is not None else None
    mtp = moe.mtp if moe is not None else None
    if tables is None and grid_table is None and mtp is None:
        return
    c, hw = roofline.t, roofline.hw
    key = (id(tables), id(grid_table), id(mtp), c.name, tp, roofline.kv_bytes,
           hw.name, hw.flops, hw.mem_bw, hw.flop_eff, hw.bw_eff, hw.kernel_us)
    if key in _TABLES_CHECKED:
        return
    ref = RooflineCosts(c, None, hw, 0, tp, kv_bytes=roofline.kv_bytes)
    fast = RooflineCosts(c, None, ideal_hardware(hw), 0, tp, kv_bytes=roofline.kv_bytes)
    if tables is not None:
        _dense(costs, ref, fast, tp)
        _attention(tables, ref, fast, tp)
    if grid_table is not None:
        _moe(moe, ref, hw.name)
    if mtp is not None and bundle is not None:
        _mtp(mtp, ref, fast, bundle, tp)
    _TABLES_CHECKED.add(key)


def _attention_side(r: RooflineCosts, m: int) -> float:
    """One GQA layer's projections and elementwise kernels over m tokens (no MLP, no attention
    kernel), on one rank."""
    c = r.t
    heads, kv = r._heads(c)
    q, kvw, h, w = heads * c.head_dim, kv * c.head_dim, c.hidden_size, c.weight_bytes
    return (r.gemm(m, h, q + 2 * kvw, w) + r.gemm(m, q, h, w)
            + r._elementwise(m, h, q, kvw, 0, 1))


def _dense(costs, ref: RooflineCosts, fast: RooflineCosts, tp: int) -> None:
    """dense.csv: each kernel's point no slower than SLOWEST x the roofline's whole layer there;
    a layer's kernels summed no faster than its projections on the ideal device.
    per_sequence.csv: lm_head as its GEMM, the sampler as its read of the logits."""
    tables, c = costs.tables, ref.t
    judge = TableJudge(Path(tables.path) / f"tp{tp}" / "dense.csv", ref.hw.name)
    for name, f in (tables.dense or {}).items():
        for m, t in zip(f.xs, f.ys):
            judge(f"{name} at {m:g} tokens", t, 0.0, ref._dense_layer(c, int(m)))
    # (a partial bundle's roofline stand-ins for the kernels it lacks have no points)
    for m in sorted({x for f in costs._layer for x in getattr(f, "xs", ())}):
        layer = sum(f(m) for f in costs._layer)
        judge(f"one layer's kernels at {m:g} tokens", layer, _attention_side(fast, int(m)),
              ref._dense_layer(c, int(m)))
    judge.path = Path(tables.path) / f"tp{tp}" / "per_sequence.csv"
    vocab = _ceil(c.vocab_size, tp)
    for name, f in (tables.per_sequence or {}).items():
        for rows, t in zip(f.xs, f.ys):
            n = int(rows)
            if name == "lm_head":
                judge(f"lm_head at {rows:g} sequences", t, fast.gemm(n, c.hidden_size, vocab),
                      ref.gemm(n, c.hidden_size, vocab))
            else:
                judge(f"{name} at {rows:g} sequences", t,
                      fast.streaming(4 * n * c.vocab_size),
                      ref.streaming(4 * n * c.vocab_size) + ref.gemm(n, c.hidden_size, vocab))


def _attention(tables, ref: RooflineCosts, fast: RooflineCosts, tp: int) -> None:
    """attention.csv: each shot as one layer's attention over its (query, key) pairs and the
    KV it reads: a prefill chunk of pc tokens after kp, and nd decodes after kd each."""
    c = ref.t
    if tables.attention is None:   # a partial bundle (meta.yaml not_measured): the roofline's
        return
    judge = TableJudge(Path(tables.path) / f"tp{tp}" / "attention.csv", ref.hw.name)
    for (pc, nd), rows in tables.attention.slices.items():
        for kp, (kds, ts) in rows.items():
            for kd, t in zip(kds, ts):
                pairs = pc * kp + pc * (pc + 1) / 2 + nd * (kd + 1)
                kv = int((kp + pc if pc else 0) + nd * (kd + 1))
                reqs = (1 if pc else 0) + int(nd)
                tokens = int(pc + nd)
                judge(f"prefill_chunk {pc:g}, kv_prefill {kp:g}, n_decode {nd:g}, kv_decode "
                      f"{kd:g}", t, fast._attention(c, tokens, reqs, pairs, kv, 1),
                      ref._attention(c, tokens, reqs, pairs, kv, 1))


def _moe(moe, ref: RooflineCosts, gpu: str) -> None:
    """moe.csv: each point no faster than the ideal device reads its activated experts' weights
    and runs their FLOPs, no slower than SLOWEST x the roofline's block at its EP degree."""
    c = ref.t
    judge = TableJudge(moe.table.path, gpu)
    moe_tp = moe.plan.moe_tp
    inter = c.moe_intermediate_size // moe_tp
    per = 3 * c.hidden_size * inter * c.expert_weight_bytes   # one expert's weights
    for ep, grid in moe.table.grids.items():
        for tok, (xs, ys) in zip(grid.tokens, grid.rows):
            block = ref.moe_block(c, int(tok), int(tok), ep, moe_tp)
            for a, t in zip(xs, ys):
                flops = 2.0 * tok * c.num_experts_per_tok * 3 * c.hidden_size * inter / ep
                least = max(flops / PEAK_FLOPS, a * per / PEAK_BW) * 1e6
                judge(f"ep {ep}, {tok:g} tokens, {a:g} activated experts", t, least, block)


def _mtp(mtp: dict, ref: RooflineCosts, fast: RooflineCosts, bundle: Path, tp: int) -> None:
    """mtp.csv: each kernel's point no slower than SLOWEST x the roofline's MTP wrapper there
    (its eh_proj and the kernels around it); eh_proj no faster than its GEMM on the ideal
    device."""
    c = ref.t
    h = c.hidden_size
    judge = TableJudge(mtp_path(bundle, tp), ref.hw.name)
    for name, f in mtp.items():
        for rows, t in zip(f.xs, f.ys):
            n = int(rows)
            wrapper = ref.gemm(n, 2 * h, h) + ref.streaming(BF16 * 5 * n * h, MTP_EXTRA_KERNELS)
            judge(f"{name} at {rows:g} sequences", t,
                  fast.gemm(n, 2 * h, h) if name == "mtp_eh_proj" else 0.0, wrapper)


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
