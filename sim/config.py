"""A simulation's configuration: a run's settings (common/run_spec.py `RunSpec`) plus the
simulator's own, one frozen dataclass, validated where it is built.

`SimConfig` names everything a run needs by plain values (preset names, paths, numbers), so it
serialises into the run result as it is; each field's metadata gives its option, limits and
help, for the check and for the command line (sim/setup_args.py). sim/plan.py `resolve()` turns
it into the objects the model runs on. Every error names the field (as its command-line option),
and comes before any work.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from stepgap.common.acceptance import DATASETS, PROFILES
from stepgap.sim.cpu_costs import CPU_COSTS, CpuCosts
from stepgap.sim.drafter_costs import DRAFTER_GRAPHS, LATEST, parse_version
from stepgap.sim.profile import Profile, load_profile
from stepgap.sim.hardware import CATALOG
from stepgap.common.errors import UserError
from stepgap.common.limits import (MAX_MS, MAX_SCALE, MAX_SKEW, MAX_SPREAD, MAX_US, MIN_SPEED,
                                   is_finite)
from stepgap.common.run_spec import RunSpec, flag, opt

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
    device_scale: float = opt(
        1.0, "--device-scale", kind="float", lo=MIN_SPEED, hi=MAX_SCALE, metavar="X",
        shown=False, help="multiply every device op's time, and only those (--cpu-scale the "
                          "CPU's; --speed both): a band's device end, a fitted device level "
                          "(default 1)")
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
        d = {}
        for key in CONFIG_KEYS:   # (as `asdict` gives them, containers copied, in a tenth of
            v = getattr(self, key)   # its time: advise asks for thousands)
            if key not in OPTIONAL_FIELDS or v != OPTIONAL_FIELDS[key]:
                d[key] = copy.deepcopy(v) if isinstance(v, (dict, list, tuple)) else v
        for key in ("acceptance_rates", "metric_percentiles", "percentile_metrics"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d


# A result's config, its keys in the order results have always written them (SimConfig.to_dict).
CONFIG_KEYS = (
    "mode", "k", "gpu", "model", "method", "draft", "executor", "device", "tensor_parallel_size",
    "data_parallel_size", "enable_expert_parallel", "moe_routing_skew", "all_reduce_latency_us",
    "collectives", "disable_custom_all_reduce", "topology", "profile", "device_profile",
    "jitter", "speed", "device_scale", "acceptance", "acceptance_rates",
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
                   "device_scale": 1.0,
                   "acceptance_dataset": None}


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
