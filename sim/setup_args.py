"""The options of a simulated setup, as `stepgap simulate` and `stepgap advise` take them, and
the SimConfig they make (`config_from_args`: the defaults, then the preset, then the command
line, then what a --profile was measured on where the command line does not say)."""

from __future__ import annotations

import argparse
from pathlib import Path

from stepgap.common.acceptance import PROFILES
from stepgap.common.model_presets import DRAFT_PRESETS
from stepgap.common.limits import MAX_MS, MAX_SCALE, MAX_SKEW, MAX_SPREAD, MAX_US, MIN_SPEED
from stepgap.common.options import (add_engine_args, add_model_args, add_scheduler_args,
                                    at_least, at_most, executor_from_args, mode_from_args,
                                    nonneg_float, positive_float,
                                    rates_arg, speculative_from_args, workload_spec)
from stepgap.sim.config import KV_CACHE_DTYPES, QUANTIZATIONS, TOPOLOGIES, SimConfig
from stepgap.sim.cpu_costs import CPU_COSTS, CPU_OPS, CpuCosts
from stepgap.sim.hardware import CATALOG
from stepgap.sim.presets import PRESETS

D = SimConfig()
CPU = CpuCosts()

def cost_arg(text: str) -> tuple[str, list[float]]:
    op, sep, vals = text.partition("=")
    if not sep or op not in CPU_COSTS:
        raise argparse.ArgumentTypeError(f"expected OP=A[,B[,C]] with OP one of "
                                         f"{', '.join(CPU_COSTS)}, got {text!r}")
    try:
        abc = [float(x) for x in vals.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{op}: expected numbers A[,B[,C]], got {vals!r}") \
            from None
    if not 1 <= len(abc) <= 3 or not all(0 <= v <= MAX_US for v in abc):
        raise argparse.ArgumentTypeError(f"{op}: expected 1 to 3 numbers from 0 to {MAX_US:g} "
                                         f"(microseconds), got {vals!r}")
    return op, abc


def add_setup_args(p) -> None:
    """The options of a setup, as `stepgap simulate` and `stepgap advise` take them: a preset,
    the model and drafter, the engine, the hardware and measured costs, the acceptance, the
    scheduler and the CPU costs (the load and the outputs are each command's own)."""
    p.add_argument("--preset", choices=list(PRESETS), help="named scenario setting every option")
    add_model_args(p, D, draft_help=" (default: for eagle3 and eagle a head shaped from the "
                                    "target; for draft_model a model preset or folder, e.g. "
                                    f"qwen3-0.6b; head presets: {', '.join(DRAFT_PRESETS)})",
                   tp_help="GPUs of one node running the model (vLLM's tensor parallelism, "
                           "1 to 8; above 1 the multiprocess executor, --executor process)",
                   dp_help="engine cores behind vLLM's DP front end, each with its own "
                           "scheduler, KV cache and --tensor-parallel-size GPUs (data x "
                           "tensor parallel at most 8, one node); a MoE target's ranks run in "
                           "lockstep (docs/sim.md, 'Data and expert parallelism'). Default 1")
    add_engine_args(p, D, device_help="cuda: the device runs launched ops while the CPU goes on; "
                                      "cpu: device ops run on the worker's thread. Default: from "
                                      "--gpu (cpu for --gpu cpu, else cuda)")
    g = p.add_argument_group("hardware and measured costs")
    g.add_argument("--gpu", metavar="NAME|FILE.yaml",
                   help=f"device from the catalog: {', '.join(CATALOG)} (default {D.gpu}; cpu "
                        "with --device cpu); or a YAML file for your own: stepgap's fields "
                        "(base, bf16_tflops, fp8_tflops, memory_gb, memory_bw_gbps, flop_eff, "
                        "bw_eff, kernel_us, d2h_us, interconnect) or LLMServingSim's "
                        "hardware.yaml as it is, whose measured collectives then price tensor "
                        "parallelism (docs/sim.md, 'The catalog')")
    g.add_argument("--profile", metavar="PROFILE.json",
                   help="a measured profile (`stepgap profile`, `stepgap calibrate`, or a "
                        "measured folder's profile.json): its device op fits replace the "
                        "roofline wherever it covers the op, and its CPU costs replace the "
                        "defaults (explicit CPU options still win). The result's config says "
                        "which ops it covered")
    g.add_argument("--device-profile", metavar="DIR",
                   help="measured operator tables of a GPU (LLMServingSim's perf bundle: "
                        "DIR/meta.yaml and DIR/tp<N>/{dense,attention,per_sequence}.csv, e.g. "
                        "profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16): they price the "
                        "target forward over the step's real mix, the sampler and an EAGLE-3 "
                        "head or draft model of the same shapes; the roofline prices the rest, "
                        "and the result's config says which op came from where (docs/sim.md, "
                        "'Measured operator tables')")
    g.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                   help="vLLM's online quantization of the target: fp8 makes its linear layers "
                        "1 byte a weight (weights' memory, the bytes a step reads) and runs "
                        "their GEMMs at the --gpu's fp8 peak; the embedding, lm_head and the "
                        "drafter stay bf16. Default: the checkpoint's own (quantization_config)")
    g.add_argument("--kv-cache-dtype", choices=tuple(KV_CACHE_DTYPES),
                   help="the KV cache's element: an fp8 one holds twice the tokens in the same "
                        "memory and halves attention's reads (default auto: the model's bf16). "
                        "With --device-profile, the bundle's variant of that dtype is used "
                        "(e.g. bf16-kvfp8 beside bf16), or the run is refused")
    g.add_argument("--speed", type=at_least(at_most(positive_float, MAX_SCALE), MIN_SPEED),
                   metavar="X",
                   help="the machine's level for this run: device ops and CPU costs take X "
                        f"times as long, {MIN_SPEED:g} to {MAX_SCALE:g} (default 1, the "
                        "profile's mean)")
    g.add_argument("--topology", choices=TOPOLOGIES,
                   help="whose step loop: stepgap's engine, vLLM's (its RPCs, its API "
                        "server sharing the engine core's CPU; docs/vllm.md), or stepgap's "
                        "engine behind `stepgap serve`'s API server (docs/serve.md). Default: "
                        "the profile's topology.engine, else stepgap")
    g.add_argument("--moe-routing-skew", type=at_most(nonneg_float, MAX_SKEW), metavar="S",
                   help="MoE targets: Zipf exponent of the experts' popularity (default 0: "
                        "uniform routing); skew means fewer distinct experts, so fewer expert "
                        "weights read, per step (docs/sim.md)")
    g.add_argument("--all-reduce-latency-us", type=at_most(nonneg_float, MAX_US), metavar="US",
                   help="tensor parallelism: one small all-reduce's time, which dominates the "
                        "collectives at decode (default: the --gpu interconnect's; 6 on "
                        "NVLink, 20 on PCIe; docs/sim.md). Not with measured collectives (a "
                        "hardware.yaml), which it would contradict")
    g.add_argument("--no-jitter", dest="jitter", action="store_false", default=None,
                   help="ignore the profile's measured speed noise (by default device ops "
                        "vary from step to step as measured; seeded by --seed)")

    g = p.add_argument_group("acceptance")
    g.add_argument("--acceptance", metavar="PROFILE",
                   help=f"named per-position acceptance profile: {', '.join(PROFILES)} "
                        "(default: the published one of the model and method, else mtbench: "
                        "vLLM #26191, Llama-3.1-8B EAGLE-3 on MT-bench; docs/sim.md)")
    g.add_argument("--acceptance-rates", type=rates_arg, metavar="R1,R2,...",
                   help="per-position acceptance rates as vLLM reports them (cumulative: the "
                        "fraction of drafts whose position i was accepted); overrides the profile")
    g.add_argument("--acceptance-spread", type=at_most(nonneg_float, MAX_SPREAD),
                   metavar="SIGMA",
                   help="std of each request's logit shift of the rates; 0 makes every request "
                        "alike (default: the profile's; mtbench 0.50)")
    g.add_argument("--no-replay", dest="replay", action="store_false", default=None,
                   help="ignore a trace's recorded `accepted` lists (default: replay them)")

    add_scheduler_args(p, D, blocks_help=" (default: what device memory holds after the "
                                         "weights)")

    g = p.add_argument_group("CPU costs (microseconds; op cost = A + B*num_reqs + C*num_tokens)")
    g.add_argument("--cpu-scale", type=at_most(nonneg_float, MAX_SCALE), metavar="X",
                   help="multiply every default CPU cost and latency (default 1; the seed-l20 "
                        "preset's value is fitted on its sync row)")
    g.add_argument("--cpu-cost", action="append", type=cost_arg, metavar="OP=A[,B[,C]]",
                   help="set one op's cost, repeatable; ops and defaults: " + "; ".join(
                       f"{op} {getattr(CPU, op).a:g},{getattr(CPU, op).b:g},"
                       f"{getattr(CPU, op).c:g}" for op in CPU_OPS)
                   + "; and, for a process worker on a synchronous device, result_latency "
                     "(default: wake + ipc) and worker_turnaround (default 0)")
    g.add_argument("--launch-latency-us", type=at_most(nonneg_float, MAX_US), metavar="US",
                   help="from a launch's start to its first kernel running "
                        f"(default {CPU.launch_latency_us:g})")
    g.add_argument("--wake-us", type=at_most(nonneg_float, MAX_US), metavar="US",
                   help=f"a blocking wait returning after its event (default {CPU.wake_us:g})")
    g.add_argument("--ipc-us", type=at_most(nonneg_float, MAX_US), metavar="US",
                   help=f"one engine<->worker message, process topology (default {CPU.ipc_us:g})")
    g.add_argument("--output-latency-ms", type=at_most(nonneg_float, MAX_MS), metavar="MS",
                   help="from update_from_output to the client receiving the chunk (default 0)")


FIELDS = ("mode", "gpu", "model", "method", "moe_routing_skew", "all_reduce_latency_us",
          "executor", "device", "profile", "device_profile", "topology", "jitter", "speed",
          "enable_prefix_caching", "scheduler_reserve_full_isl", "timeseries_interval_s",
          "acceptance", "acceptance_rates", "acceptance_spread", "replay", "max_num_seqs",
          "max_num_batched_tokens", "max_model_len", "block_size", "num_gpu_blocks_override",
          "gpu_memory_utilization", "quantization", "kv_cache_dtype", "tensor_parallel_size",
          "data_parallel_size", "enable_expert_parallel", "cpu_scale", "launch_latency_us",
          "wake_us", "ipc_us", "output_latency_ms", "num_prompts", "output_len",
          "shared_fraction", "request_rate", "max_concurrency", "detailed",
          "metric_percentiles", "percentile_metrics")


def config_from_args(args) -> SimConfig:
    """Defaults, then the preset, then what the command line gives."""
    from stepgap.common.options import note
    from stepgap.sim.config import profile_defaults
    from stepgap.sim.presets import get_preset

    settings = dict(get_preset(args.preset).settings) if args.preset else {}
    settings.update(run_settings(args, args.model or settings.get("model") or D.model))
    args.mode = mode_from_args(args)
    args.executor = executor_from_args(args)
    method, draft, k = speculative_from_args(args)
    args.method = method
    if draft is not None:
        settings["draft"] = draft
    if k is not None:
        settings["k"] = k
    if args.device == "cpu" and args.gpu is None:
        settings["gpu"] = "cpu"
    for name in FIELDS:
        v = getattr(args, name, None)
        if v is not None:
            settings[name] = v
    spec = workload_spec(args)
    if spec is not None:
        settings["workload"] = spec
        if args.output_len is not None:   # a generated workload's own output option
            settings["output_len"] = args.output_len
    if args.cpu_cost:
        settings["cpu_costs"] = {**settings.get("cpu_costs", {}), **dict(args.cpu_cost)}
    for name in ("burstiness", "seed"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    settings["timeline"] = args.timeline is not None
    given = {name for name in ("gpu", "device", "executor", "acceptance", "acceptance_rates",
                               "acceptance_spread") if getattr(args, name, None) is not None}
    settings, notes = profile_defaults(settings, given | set(get_preset(args.preset).settings
                                                             if args.preset else ()))
    for line in notes:
        note(args, line)
    return SimConfig(**settings)


def run_settings(args, model: str) -> dict:
    """A peer's vLLM run given as --trace (its requests.jsonl): the settings its meta.json
    records, as the options they map to, read as the judge reads them (common/peer_run.py
    `peer_settings`: what it leaves null takes vLLM's default for `model`); the command line
    still wins."""
    from stepgap.common.model_presets import load_model_config
    from stepgap.common.options import note
    from stepgap.common.peer_run import find_dataset, is_peer_requests, peer_settings
    if args.trace is None or not is_peer_requests(args.trace):
        return {}
    meta = Path(args.trace).with_name("meta.json")
    if not meta.is_file():
        note(args, f"--trace {args.trace}: no meta.json beside it; the run's settings are not "
                   "known, so stepgap's defaults are used")
        return {}
    settings, notes = peer_settings(meta, load_model_config(model).max_position_embeddings)
    dataset = find_dataset(args.trace)
    notes.append(f"prompt token ids from {dataset} (the dataset the run replayed): prefix "
                 "caching finds the prompts' shared blocks" if dataset else
                 "the dataset the run replayed (meta.json's dataset_path) is not found under "
                 "the run's folder: no prompt token ids, so prefix caching finds only a "
                 "preempted request's own blocks")
    for line in notes:
        note(args, line)
    return settings
