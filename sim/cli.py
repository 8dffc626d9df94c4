"""`stepgap simulate`: predict a serving run with the SimPy model of the step loop.

Every option defaults to None here, so that a preset's settings apply unless the command line
gives the option; the effective defaults are SimConfig's, shown in the help.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from stepgap.common.options import add_command, add_load_args, add_option, add_result_args
from stepgap.sim.config import SimConfig
from stepgap.sim.presets import PRESETS
from stepgap.sim.setup_args import add_setup_args, config_from_args

DESCRIPTION = """\
Simulate a serving run of an LLM engine's step loop (engine core, worker, device) in sync,
async or zero-bubble scheduling, with speculative decoding of k draft tokens (EAGLE-3, EAGLE,
MTP, a draft model, n-gram on the CPU or the GPU), on one GPU, a tensor-parallel group of up
to 8, or data-parallel engine cores with expert parallelism (MoE blocks and MTP modules from
measured tables where given), and print what `vllm bench serve` would report (TTFT, TPOT,
ITL, E2EL), the acceptance and the step gaps. Targets: the presets by name or Hugging Face id
(MODEL, as `vllm serve MODEL`, or --model), or any Hugging Face config.json of the families
llama, qwen3, qwen3_moe, gpt_oss and deepseek_v3.

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
  stepgap simulate --preset seed-l20 --gpu h100 --num-speculative-tokens 2 --mode zero-bubble \\
      --timeline run.jsonl
  # a pasted vLLM command line: models by Hugging Face id (nothing is downloaded), vLLM's
  # random dataset; the options stepgap does not model are named and ignored
  stepgap simulate meta-llama/Llama-3.1-8B-Instruct --gpu h100 --async-scheduling \\
      --speculative-config '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
      "num_speculative_tokens": 3}' --no-enable-prefix-caching --dataset-name random \\
      --random-input-len 1024 --random-output-len 128 --num-prompts 2000 --request-rate 8 \\
      --max-concurrency 64 --save-result --result-dir out
  # a local ShareGPT file, its lengths from the model's tokenizer (else estimated, and said)
  stepgap simulate --model DIR --dataset-name sharegpt --dataset-path ShareGPT_V3.json
  # Llama-3.3-70B + EAGLE-3 on 4 H100s (vLLM's multiprocess executor, NVLink all-reduces),
  # fp8 weights and KV cache
  stepgap simulate --model meta-llama/Llama-3.3-70B-Instruct -tp 4 --gpu h100 \\
      --async-scheduling --speculative-config '{"method": "eagle3", "num_speculative_tokens": 3,
      "model": "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3"}' --quantization fp8 \\
      --kv-cache-dtype fp8 --max-concurrency 16
  # a MoE target with a small draft model, and with skewed expert routing
  stepgap simulate --model qwen3-30b-a3b --mode async --speculative-config \\
      '{"method": "draft_model", "model": "qwen3-0.6b", "num_speculative_tokens": 3}' \\
      --moe-routing-skew 0.5 --max-concurrency 32
  # Qwen3-30B-A3B on two RTX PRO 6000s as two data-parallel engine cores with expert
  # parallelism, its MoE blocks from measured tables (LLMServingSim's bundle with moe.csv)
  stepgap simulate --model Qwen/Qwen3-30B-A3B-Instruct-2507 --gpu rtxpro6000 \\
      --data-parallel-size 2 --enable-expert-parallel --device-profile BUNDLE \\
      --trace RUN/vllm/requests.jsonl
  # DeepSeek-V3 drafting with its own MTP layer on 8 H200s; n-gram proposals (vLLM: sync)
  stepgap simulate --model deepseek-v3 -tp 8 --gpu h200 --spec-method mtp -k 1 --mode async
  stepgap simulate --spec-method ngram -k 3 --mode async     # says it runs in sync, and why
  # a real vLLM run on two RTX PRO 6000s, replayed from its own files, priced from the GPU's
  # measured kernels and collectives (RUNS=traces/peers/llmservingsim;
  # docs/explanation/measured-tables.md)
  stepgap simulate --model Qwen/Qwen3-32B \\
      --gpu RUNS/at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml \\
      --device-profile RUNS/profiler/perf/RTXPRO6000/Qwen/Qwen3-32B/bf16 \\
      --trace RUNS/bench/examples/RTXPRO6000/Qwen3-32B/vllm/requests.jsonl
  # a CPU-only engine: the worker in its own process, device ops on the worker's thread
  stepgap simulate --device cpu --model llama-3.2-1b --executor process --mode async \\
      --trace my_trace.jsonl --result-json out/sim.json
  # the trained pair on this CPU, with the committed measured profile
  # (docs/explanation/validation.md)
  stepgap simulate --device cpu --executor process --profile traces/measured/cpu/profile.json \\
      --model checkpoints/pystdlib/target --speculative-config \\
      '{"method": "eagle3", "model": "checkpoints/pystdlib/eagle3", "num_speculative_tokens": 4}' \\
      --trace checkpoints/pystdlib/heldout.jsonl --max-concurrency 4 --mode async

Units: times in microseconds (us) unless an option says ms; rates in requests/s.
Errors in options or trace files name the field (and the file and line) and exit with status 2.
"""


def register(sub) -> None:
    """The simulator's commands: `simulate`, `advise` (sim/advise_cli.py), `explain`
    (sim/explain_cli.py), and `sweep` and `plot` (sim/sweep_cli.py)."""
    from stepgap.sim import advise_cli, explain_cli, sweep_cli
    register_simulate(sub)
    register_gpus(sub)
    advise_cli.register(sub)
    explain_cli.register(sub)
    sweep_cli.register(sub)


def register_gpus(sub) -> None:
    p = add_command(sub, "gpus", help="every GPU of the catalog, what prices it, the sources",
                    description=(
                        "Every GPU of the catalog: its roofline (datasheet peaks, and the "
                        "efficiencies and per-kernel cost fitted on measured tables or taken "
                        "from a like GPU) and the range of its `device` band input; the "
                        "measured operator tables committed for it, the models (presets) and "
                        "tensor-parallel sizes they price by default and the kernels they "
                        "leave to the roofline; its collectives, measured over how many GPUs "
                        "and by whom, else the interconnect model (docs/reference/gpus.md)."),
                    epilog="examples:\n  stepgap gpus\n  stepgap gpus h100 --json")
    p.add_argument("gpu", nargs="*", help="catalog entries (default: every GPU)")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.set_defaults(func=run_gpus)


def gpu_listing(name: str) -> dict:
    """What prices catalog GPU `name`, and the sources: its roofline, the committed tables and
    the presets each prices at each TP, and its collectives by group size."""
    from stepgap.common.model_presets import MODEL_PRESETS
    from stepgap.sim.bands import DEVICE_HIGH, DEVICE_LOW, DEVICE_SOURCE
    from stepgap.sim.hardware import get_hardware
    from stepgap.sim.hardware_file import committed_link, link_key, other_measurements
    from stepgap.sim.bundle_match import LAYER_GEMMS, committed_bundles, shape_mismatch
    from stepgap.sim.tables import bundle_meta, read_meta, repo_relative
    hw = get_hardware(name)
    fitted = hw.device_band is not None
    lo, hi, why = (*hw.device_band, hw.device_band_source) if fitted else \
        (DEVICE_LOW, DEVICE_HIGH, DEVICE_SOURCE)
    tables, taken = [], set()   # (preset, tp) a bundle before this one prices
    for root in committed_bundles(hw.name):
        bm, meta = bundle_meta(root), read_meta(root)
        lack = set(meta.get("not_measured") or ())
        fits = [m for m, c in MODEL_PRESETS.items()
                if shape_mismatch(bm, c, c.hidden_size) is None and not lack & set(LAYER_GEMMS)
                and "fp8" not in str(meta.get("variant") or root.name)]
        prices = {tp: [m for m in fits if (m, tp) not in taken] for tp in bm.tp_folders}
        taken |= {(m, tp) for tp, ms in prices.items() for m in ms}
        tables.append({"bundle": repo_relative(root), "model": bm.model,
                       "tp": list(bm.tp_folders),
                       "prices": {tp: ms for tp, ms in prices.items() if ms},
                       "not_measured": list(meta.get("not_measured") or []),
                       "source": str(meta.get("source") or
                                     f"LLMServingSim's perf bundle (vLLM "
                                     f"{meta.get('vllm_version', '?')})")})
    links = {}
    model = hw.interconnect
    for n in (2, 4, 8):
        found = committed_link(hw.name, n)
        if found is not None:
            key = link_key(found)
            others = [p for p in other_measurements(found) if link_key(p) == key]
            links[n] = [repo_relative(p) for p in (found, *others)]
    return {"gpu": hw.name, "device_names": list(hw.device_names),
            "peaks": {"bf16_tflops": hw.flops / 1e12, "fp8_tflops": hw.fp8_flops / 1e12,
                      "memory_bw_gbps": hw.mem_bw / 1e9, "memory_gb": hw.mem_bytes / 1e9},
            "roofline": {"kind": "fitted on measured tables" if fitted else "datasheet",
                         "bw_eff": hw.bw_eff, "flop_eff": hw.flop_eff,
                         "kernel_us": hw.kernel_us, "source": hw.source},
            "device_band": {"low": lo, "high": hi, "source": why},
            "tables": tables,
            "collectives": {"model": None if model is None else
                            {"name": model.name, "source": model.source},
                            "measured": links}}


def run_gpus(args) -> int:
    import json
    from stepgap.common.errors import UserError
    from stepgap.sim.hardware import CATALOG
    from stepgap.sim.bundle_match import LAYER_GEMMS
    names = args.gpu or [n for n, h in CATALOG.items() if h.kind == "gpu"]
    for n in names:
        if n.lower() not in CATALOG:
            raise UserError(f"stepgap gpus: unknown GPU {n!r} (known: {', '.join(CATALOG)})")
    listing = [gpu_listing(n.lower()) for n in names]
    if args.json:
        print(json.dumps(listing, indent=1))
        return 0
    for g in listing:
        r, b, pk = g["roofline"], g["device_band"], g["peaks"]
        print(f"{g['gpu']}: {pk['bf16_tflops']:g} TFLOP/s bf16, {pk['memory_bw_gbps']:g} GB/s, "
              f"{pk['memory_gb']:g} GB")
        print(f"  roofline ({r['kind']}): bw_eff {r['bw_eff']:g}, flop_eff {r['flop_eff']:g}, "
              f"{r['kernel_us']:g} us a kernel; {r['source']}")
        print(f"  device band: x{b['low']:.3g} .. x{b['high']:.3g} ({b['source']})")
        for t in g["tables"]:
            priced = "; ".join(f"TP {tp}: {', '.join(ms)}" for tp, ms in t["prices"].items()) \
                or ("no preset by default: they do not time every GEMM of a layer (fit data of "
                    "the roofline; --device-profile to price from them)"
                    if set(t["not_measured"]) & set(LAYER_GEMMS) else "no preset of these shapes")
            lack = f"; the fitted roofline for {', '.join(t['not_measured'])}" \
                if t["not_measured"] else ""
            print(f"  tables {t['bundle']} ({t['model']}, TP {', '.join(map(str, t['tp']))}): "
                  f"price {priced}{lack}; {t['source']}")
        if not g["tables"]:
            print("  tables: none committed (every model from the roofline)")
        c = g["collectives"]
        for n, files in c["measured"].items():
            print(f"  collectives over {n}: measured, {' and '.join(files)}"
                  + (" (they disagree: the band spans them)" if len(files) > 1 else ""))
        if c["model"] is not None:
            print(f"  collectives otherwise: the interconnect model {c['model']['name']} "
                  f"({c['model']['source']})")
    return 0


def register_simulate(sub) -> None:
    p = add_command(sub, "simulate", help="predict a serving run with the SimPy step-loop model",
                    description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False)
    add_setup_args(p)
    add_load_args(p)
    add_result_args(p, timeline_help="write the timeline as JSON lines to PATH and a "
                                     "Chrome-trace/Perfetto file beside it (PATH with "
                                     ".chrome.json)")
    add_option(p, "timeseries_interval_s")
    p.add_argument("--band", action="store_true",
                   help="also run each uncertain input (the host's CPU, the device where the "
                        "roofline prices it, a borrowed or extrapolated acceptance) at the ends "
                        "of its range, and print the band of each metric and the inputs that "
                        "dominate it (the result gets `bands`; docs/explanation/bands.md, 'Bands')")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=run, vllm_options=True)


def same_scenario(cfg: SimConfig, settings: dict) -> bool:
    """The run is the preset's (only the mode, seed or output options may differ)."""
    return all(getattr(cfg, name) == value for name, value in settings.items()
               if name != "mode")


def chrome_path(path: str) -> Path:
    p = Path(path)
    return p.with_name(p.name[:-len(".jsonl")] + ".chrome.json") if p.name.endswith(".jsonl") \
        else p.with_name(p.name + ".chrome.json")


def run(args) -> int:
    from stepgap.sim.loop import simulate
    from stepgap.sim.presets import comparison_table, get_preset
    from stepgap.common.formats import format_summary, save_chrome_trace, save_timeline
    from stepgap.common.options import check_outputs, note, result_path
    from stepgap.sim.bands import host_line

    cfg = config_from_args(args)
    out = result_path(args, "stepgap-sim", cfg.model)
    check_outputs(args, out, args.timeline and (args.timeline, chrome_path(args.timeline)))
    if args.band:
        from stepgap.sim.band_runs import bands_doc, format_bands, run_bands
        res, inputs, bands, spans = run_bands(cfg.to_dict())
        res.extra["bands"] = bands_doc(inputs, bands)
    else:
        res, spans = simulate(cfg)
    for line in res.notes:
        note(args, line)
    if not args.quiet:
        print(format_summary(res, title=f"Simulated Serving Result ({cfg.mode}, k={cfg.k})"))
        print(host_line(res.config))
        if args.band:
            print(format_bands(inputs, bands))
        preset = get_preset(args.preset) if args.preset else None
        if preset and cfg.mode in preset.measured and same_scenario(cfg, preset.settings):
            print(comparison_table(res.metrics, preset.measured[cfg.mode],
                                   f"{preset.name} {cfg.mode}: vs measured"))
            print(f"measured: {preset.source}")
        sys.stdout.flush()   # a stdout that cannot take it fails here, before any file is written
    if out:
        res.save(out)
    if args.timeline:
        save_timeline(args.timeline, spans)
        save_chrome_trace(chrome_path(args.timeline), spans, process_name="stepgap-sim")
    if not args.quiet:
        if out:
            print(f"result: {out}")
        if args.timeline:
            print(f"timeline: {args.timeline} and {chrome_path(args.timeline)}")
    return 0
