"""The options of a simulated setup, as `stepgap simulate` and `stepgap advise` take them, and
the SimConfig they make (`config_from_args`: the defaults, then the preset, then the command
line, then what a --profile was measured on where the command line does not say)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stepgap.common.errors import UserError
from stepgap.common.model_presets import DRAFT_PRESETS
from stepgap.common.limits import MAX_US
from stepgap.common.options import (DRAFTER_SPEC_KEYS, SPEC_KEYS, add_engine_args,
                                    add_model_args, add_option,
                                    add_scheduler_args, executor_from_args, mode_from_args,
                                    settings_from_args, speculative_from_args, workload_spec)
from stepgap.sim.config import SimConfig
from stepgap.sim.cpu_costs import CPU_COSTS, CPU_OPS, CpuCosts
from stepgap.sim.drafter_costs import CUDAGRAPH_MODES, drafter_graphs
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


def compilation_config_arg(text: str) -> dict:
    """`--compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}'`, as vLLM takes it."""
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None
    if not isinstance(d, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    mode = d.get("cudagraph_mode")
    if mode is not None and mode not in CUDAGRAPH_MODES:
        raise argparse.ArgumentTypeError(f"cudagraph_mode: expected one of "
                                         f"{', '.join(CUDAGRAPH_MODES)}, got {mode!r}")
    return d


def drafter_settings(args) -> dict:
    """The drafter's settings from speculative_config's keys (disable_padded_drafter_batch,
    parallel_drafting, enforce_eager) and --compilation-config's cudagraph_mode, as vLLM reads
    them; --drafter-cudagraph-mode, where given, must agree."""
    from stepgap.common.options import note
    spec = getattr(args, "speculative_config", None) or {}
    comp = getattr(args, "compilation_config", None) or {}
    out = {key: spec[key] for key in ("disable_padded_drafter_batch", "parallel_drafting")
           if key in spec}
    ignored = sorted(set(comp) - {"cudagraph_mode"})
    if ignored:
        note(args, f"ignoring compilation_config keys {', '.join(ignored)} (not modelled)")
    if "cudagraph_mode" in comp or spec.get("enforce_eager"):
        derived = drafter_graphs(comp.get("cudagraph_mode"), bool(spec.get("enforce_eager")))
        given = args.drafter_cudagraph_mode
        if given is not None and given != derived:
            raise UserError(f"--drafter-cudagraph-mode {given} and vLLM's settings "
                            f"(cudagraph_mode, enforce_eager) giving {derived} differ; give one")
        out["drafter_cudagraph_mode"] = derived
    if "cudagraph_mode" in comp:
        note(args, "compilation_config's cudagraph_mode sets the drafter's graphs; the target's "
                   "forward is priced as graph-launched kernels whatever the mode")
    return out


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
                           "lockstep (docs/explanation/past-one-gpu.md, 'Data and expert "
                           "parallelism'). Default 1")
    add_engine_args(p, D, device_help="cuda: the device runs launched ops while the CPU goes on; "
                                      "cpu: device ops run on the worker's thread. Default: from "
                                      "--gpu (cpu for --gpu cpu, else cuda)")
    g = p.add_argument_group("hardware and measured costs")
    for name in ("gpu", "profile", "device_profile", "quantization", "kv_cache_dtype", "speed",
                 "device_scale",
                 "topology", "moe_routing_skew", "all_reduce_latency_us", "collectives",
                 "disable_custom_all_reduce", "jitter"):
        add_option(g, name, D)
    g = p.add_argument_group("the drafter, as vLLM runs it (sim/drafter_costs.py)")
    add_option(g, "vllm_version", D)
    g.add_argument("--compilation-config", type=compilation_config_arg, metavar="JSON",
                   help="vLLM's compilation config: its cudagraph_mode (NONE, PIECEWISE, FULL, "
                        "FULL_DECODE_ONLY, FULL_AND_PIECEWISE, the default) gives the drafter's "
                        "graphs (PIECEWISE, or NONE where its mixed mode is NONE); other keys "
                        "are ignored, with a note")
    for name in ("drafter_cudagraph_mode", "drafter_host_scale"):
        add_option(g, name, D)
    g = p.add_argument_group("acceptance")
    for name in ("acceptance", "acceptance_dataset", "acceptance_rates", "acceptance_spread",
                 "replay"):
        add_option(g, name, D)
    add_scheduler_args(p, D, blocks_help=" (default: what device memory holds after the "
                                         "weights)")

    g = p.add_argument_group("CPU costs (microseconds; op cost = A + B*num_reqs + C*num_tokens)")
    add_option(g, "cpu_scale", D)
    g.add_argument("--cpu-cost", action="append", type=cost_arg, metavar="OP=A[,B[,C]]",
                   help="set one op's cost, repeatable; ops and defaults: " + "; ".join(
                       f"{op} {getattr(CPU, op).a:g},{getattr(CPU, op).b:g},"
                       f"{getattr(CPU, op).c:g}" for op in CPU_OPS)
                   + "; and, for a process worker on a synchronous device, result_latency "
                     "(default: wake + ipc) and worker_turnaround (default 0)")
    for name in ("launch_latency_us", "wake_us", "ipc_us", "output_latency_ms"):
        add_option(g, name, D)


def config_from_args(args, one_k: bool = True) -> SimConfig:
    """Defaults, then the preset, then what the command line gives. `one_k`: the run is of the
    k given (simulate; advise tries every k): a drafter without draft tokens is warned about."""
    from stepgap.common.options import drafter_without_k, note
    from stepgap.sim.bands import nominal_host
    from stepgap.sim.config import profile_defaults
    from stepgap.sim.presets import get_preset

    settings = dict(get_preset(args.preset).settings) if args.preset else {}
    settings.update(run_settings(args, args.model or settings.get("model") or D.model))
    args.mode = mode_from_args(args)
    args.executor = executor_from_args(args)
    args.method, args.draft, args.k = speculative_from_args(args, SPEC_KEYS + DRAFTER_SPEC_KEYS)
    warning = drafter_without_k(args.draft or settings.get("draft"),
                                args.k if args.k is not None else settings.get("k"))
    if one_k and warning:
        note(args, f"warning: {warning}")
    if args.device == "cpu" and args.gpu is None:
        settings["gpu"] = "cpu"
    settings.update(settings_from_args(args, SimConfig))
    settings.update(drafter_settings(args))
    spec = workload_spec(args)
    if spec is not None:
        settings["workload"] = spec
        if args.output_len is not None:   # a generated workload's own output option
            settings["output_len"] = args.output_len
    if args.cpu_cost:
        settings["cpu_costs"] = {**settings.get("cpu_costs", {}), **dict(args.cpu_cost)}
    settings["timeline"] = args.timeline is not None
    given = {name for name in ("gpu", "device", "executor", "acceptance", "acceptance_rates",
                               "acceptance_spread", "acceptance_dataset")
             if getattr(args, name, None) is not None}
    settings, notes = profile_defaults(settings, given | set(get_preset(args.preset).settings
                                                             if args.preset else ()))
    # the nominal host, said where the result is (simulate's `host CPU:` line, advise's
    # "CPU costs", the result's config): a note here would come before an error of the output
    settings, _ = nominal_host(settings, args.cpu_scale is not None)
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
