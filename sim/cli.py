"""`stepgap simulate`: predict a serving run with the SimPy model of the step loop.

Every option defaults to None here, so that a preset's settings apply unless the command line
gives the option; the effective defaults are SimConfig's, shown in the help.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from common.acceptance import PROFILES
from sim.config import DEVICES, WORKERS, SimConfig
from sim.costs import CPU_COSTS, CPU_OPS, CpuCosts
from sim.hardware import CATALOG
from sim.presets import PRESETS
from common.formats import MODES
from common.modelcfg import DRAFT_PRESETS, MODEL_PRESETS
from common.workloads import add_load_args, nonneg_float, nonneg_int, positive_int

D = SimConfig()
CPU = CpuCosts()

DESCRIPTION = """\
Simulate a serving run of an LLM engine's step loop (engine core, worker, device) in sync,
async or zero-bubble scheduling, with EAGLE-3 speculative decoding of k draft tokens, and print
what `vllm bench serve` would report (TTFT, TPOT, ITL, E2EL), the acceptance and the step gaps.

A preset sets every option at once; options given on the command line override it.

presets:
""" + "\n".join(textwrap.fill(p.description, 92, initial_indent=f"  {p.name:<15}",
                              subsequent_indent=" " * 17) for p in PRESETS.values())

EPILOG = """\
examples:
  # the seed measurement (vLLM PR #25872), both modes, next to the measured values
  stepgap simulate --preset seed-l20 --mode sync
  stepgap simulate --preset seed-l20 --mode async
  # the same on an H100 at depth 2, with a timeline to open in Perfetto (ui.perfetto.dev)
  stepgap simulate --preset seed-l20 --gpu h100 -k 2 --mode zero-bubble --timeline run.jsonl
  # ShareGPT-like load at 8 req/s, 64 in flight, any Hugging Face config.json
  stepgap simulate --model path/to/config.json --draft eagle3 -k 3 --mode async \\
      --trace sharegpt --num-prompts 2000 --request-rate 8 --max-concurrency 64
  # a CPU-only engine: the worker in its own process, device ops on the worker's thread
  stepgap simulate --gpu cpu --model llama-3.2-1b -k 0 --worker process --mode async \\
      --trace my_trace.jsonl --result-json out/sim.json
  # the trained pair on this CPU, with the committed measured profile (docs/validation.md)
  stepgap simulate --gpu cpu --worker process --profile traces/measured/cpu/profile.json \\
      --model checkpoints/pystdlib/target --draft checkpoints/pystdlib/eagle3 -k 4 \\
      --trace checkpoints/pystdlib/heldout.jsonl --max-concurrency 4 --mode async

Units: times in microseconds (us) unless an option says ms; rates in requests/s.
Errors in options or trace files name the field (and the file and line) and exit with status 2.
"""


def rates_arg(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") \
            from None
    if not rates:
        raise argparse.ArgumentTypeError("expected at least one rate")
    return rates


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
    if not 1 <= len(abc) <= 3 or any(v < 0 for v in abc):
        raise argparse.ArgumentTypeError(f"{op}: expected 1 to 3 numbers >= 0, got {vals!r}")
    return op, abc


def fraction(text: str) -> float:
    v = nonneg_float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def register(sub) -> None:
    p = sub.add_parser("simulate", help="predict a serving run with the SimPy step-loop model",
                       description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("scenario")
    g.add_argument("--preset", choices=list(PRESETS), help="named scenario setting every option")
    g.add_argument("--mode", choices=MODES, help=f"scheduling mode (default {D.mode})")
    g.add_argument("-k", "--num-spec-tokens", dest="k", type=nonneg_int, metavar="K",
                   help=f"EAGLE-3 draft tokens per step; 0 is plain decoding (default {D.k})")

    g = p.add_argument_group("model and hardware")
    g.add_argument("--gpu", help=f"device from the catalog: {', '.join(CATALOG)} (default "
                                 f"{D.gpu}); `cpu` models a CPU-only engine")
    g.add_argument("--model", help=f"target: a preset ({', '.join(MODEL_PRESETS)}), a model "
                                   f"folder or a config.json (default {D.model})")
    g.add_argument("--draft", help=f"EAGLE-3 head: a preset ({', '.join(DRAFT_PRESETS)}), a "
                                   "folder or config.json, or `eagle3` for a head shaped from "
                                   f"the target (default {D.draft}; unused when k=0)")
    g.add_argument("--worker", choices=WORKERS,
                   help="inline: engine and worker share one thread (vLLM, one GPU); process: "
                        "the worker is its own process, one IPC latency per message "
                        f"(default {D.worker})")
    g.add_argument("--device", choices=DEVICES,
                   help="async: a GPU runs launched ops while the CPU goes on; sync: device ops "
                        "run on the worker's thread (a CPU). Default: async for a GPU, sync "
                        "for --gpu cpu")
    g.add_argument("--profile", metavar="PROFILE.json",
                   help="a measured profile (`stepgap profile`, or bench/gpu_measure.py's "
                        "profile.json): its device op fits replace the roofline wherever it "
                        "covers the op, and its CPU costs replace the defaults (explicit CPU "
                        "options still win). The result's config says which ops it covered")
    g.add_argument("--speed", type=nonneg_float, metavar="X",
                   help="the machine's level for this run: device ops and CPU costs take X "
                        "times as long (default 1, the profile's mean)")
    g.add_argument("--no-jitter", dest="jitter", action="store_false", default=None,
                   help="ignore the profile's measured speed noise (by default device ops "
                        "vary from step to step as measured; seeded by --seed)")

    g = p.add_argument_group("acceptance")
    g.add_argument("--acceptance", metavar="PROFILE",
                   help=f"named per-position acceptance profile: {', '.join(PROFILES)} "
                        f"(default {D.acceptance}: vLLM #26191, Llama-3.1-8B EAGLE-3 on MT-bench)")
    g.add_argument("--acceptance-rates", type=rates_arg, metavar="R1,R2,...",
                   help="per-position acceptance rates as vLLM reports them (cumulative: the "
                        "fraction of drafts whose position i was accepted); overrides the profile")
    g.add_argument("--acceptance-spread", type=nonneg_float, metavar="SIGMA",
                   help="std of each request's logit shift of the rates; 0 makes every request "
                        "alike (default: the profile's; mtbench 0.50)")
    g.add_argument("--no-replay", dest="replay", action="store_false", default=None,
                   help="ignore a trace's recorded `accepted` lists (default: replay them)")

    g = p.add_argument_group("scheduler (vLLM V1)")
    g.add_argument("--max-num-seqs", type=positive_int, metavar="N",
                   help=f"most requests in one step (default {D.max_num_seqs})")
    g.add_argument("--max-num-batched-tokens", type=positive_int, metavar="N",
                   help=f"token budget of one step; longer prompts are chunked "
                        f"(default {D.max_num_batched_tokens})")
    g.add_argument("--max-model-len", type=positive_int, metavar="N",
                   help=f"longest prompt + output, tokens (default {D.max_model_len})")
    g.add_argument("--block-size", type=positive_int, metavar="N",
                   help=f"tokens per KV block (default {D.block_size})")
    g.add_argument("--num-kv-blocks", type=positive_int, metavar="N",
                   help="KV cache size in blocks (default: what device memory holds after the "
                        "weights)")
    g.add_argument("--gpu-memory-utilization", type=fraction, metavar="FRAC",
                   help=f"fraction of device memory for weights and KV cache "
                        f"(default {D.gpu_memory_utilization})")

    g = p.add_argument_group("CPU costs (microseconds; op cost = A + B*num_reqs + C*num_tokens)")
    g.add_argument("--cpu-scale", type=nonneg_float, metavar="X",
                   help="multiply every default CPU cost and latency (default 1; the seed-l20 "
                        "preset's value is fitted on its sync row)")
    g.add_argument("--cpu-cost", action="append", type=cost_arg, metavar="OP=A[,B[,C]]",
                   help="set one op's cost, repeatable; ops and defaults: " + "; ".join(
                       f"{op} {getattr(CPU, op).a:g},{getattr(CPU, op).b:g},"
                       f"{getattr(CPU, op).c:g}" for op in CPU_OPS)
                   + "; and, for a process worker on a synchronous device, result_latency "
                     "(default: wake + ipc) and worker_turnaround (default 0)")
    g.add_argument("--launch-latency-us", type=nonneg_float, metavar="US",
                   help="from a launch's start to its first kernel running "
                        f"(default {CPU.launch_latency_us:g})")
    g.add_argument("--wake-us", type=nonneg_float, metavar="US",
                   help=f"a blocking wait returning after its event (default {CPU.wake_us:g})")
    g.add_argument("--ipc-us", type=nonneg_float, metavar="US",
                   help=f"one engine<->worker message, process topology (default {CPU.ipc_us:g})")
    g.add_argument("--output-latency-ms", type=nonneg_float, metavar="MS",
                   help="from update_from_output to the client receiving the chunk (default 0)")

    add_load_args(p)

    g = p.add_argument_group("output")
    g.add_argument("--result-json", metavar="PATH",
                   help="write the run result (vllm bench serve --save-result keys, plus "
                        "step_gaps, spec_decode and config)")
    g.add_argument("--timeline", metavar="PATH",
                   help="write the timeline as JSON lines to PATH and a Chrome-trace/Perfetto "
                        "file beside it (PATH with .chrome.json)")
    g.add_argument("--detailed", action="store_true", default=None,
                   help="add per-request lists (ttfts, itls, output_lens) and every step gap "
                        "to the result")
    g.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=run)


FIELDS = ("mode", "k", "gpu", "model", "draft", "worker", "device", "profile", "jitter",
          "speed", "acceptance",
          "acceptance_rates", "acceptance_spread", "replay", "max_num_seqs",
          "max_num_batched_tokens", "max_model_len", "block_size", "num_kv_blocks",
          "gpu_memory_utilization", "cpu_scale", "launch_latency_us", "wake_us", "ipc_us",
          "output_latency_ms", "num_prompts", "output_len", "request_rate", "max_concurrency",
          "detailed")


def config_from_args(args) -> SimConfig:
    """Defaults, then the preset, then what the command line gives."""
    from sim.presets import get_preset

    settings = dict(get_preset(args.preset).settings) if args.preset else {}
    for name in FIELDS:
        v = getattr(args, name, None)
        if v is not None:
            settings[name] = v
    if args.trace is not None:
        settings["workload"] = args.trace
    if args.cpu_cost:
        settings["cpu_costs"] = {**settings.get("cpu_costs", {}), **dict(args.cpu_cost)}
    for name in ("burstiness", "seed"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    settings["timeline"] = args.timeline is not None
    return SimConfig(**settings)


def same_scenario(cfg: SimConfig, settings: dict) -> bool:
    """The run is the preset's (only the mode, seed or output options may differ)."""
    return all(getattr(cfg, name) == value for name, value in settings.items()
               if name != "mode")


def chrome_path(path: str) -> Path:
    p = Path(path)
    return p.with_name(p.name[:-len(".jsonl")] + ".chrome.json") if p.name.endswith(".jsonl") \
        else p.with_name(p.name + ".chrome.json")


def run(args) -> int:
    from sim.loop import simulate
    from sim.presets import comparison_table, get_preset
    from common.errors import UserError
    from common.formats import format_summary, save_chrome_trace, save_result, save_timeline

    if args.seed is not None and args.seed < 0:
        raise UserError(f"--seed: must be an integer >= 0, got {args.seed}")
    cfg = config_from_args(args)
    res, spans = simulate(cfg)
    try:
        if args.result_json:
            save_result(args.result_json, res)
        if args.timeline:
            save_timeline(args.timeline, spans)
            save_chrome_trace(chrome_path(args.timeline), spans, process_name="stepgap-sim")
    except OSError as e:
        raise UserError(f"cannot write {e.filename}: {e.strerror}") from None
    if not args.quiet:
        print(format_summary(res, title=f"Simulated Serving Result ({cfg.mode}, k={cfg.k})"))
        preset = get_preset(args.preset) if args.preset else None
        if preset and cfg.mode in preset.measured and same_scenario(cfg, preset.settings):
            print(comparison_table(res, preset.measured[cfg.mode],
                                   f"{preset.name} {cfg.mode}: vs measured"))
            print(f"measured: {preset.source}")
        if args.result_json:
            print(f"result: {args.result_json}")
        if args.timeline:
            print(f"timeline: {args.timeline} and {chrome_path(args.timeline)}")
    return 0
