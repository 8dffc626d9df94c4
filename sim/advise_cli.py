"""`stepgap advise`: the options of a `vllm serve` line, a GPU and the loads to judge in; the
best k in sync and async, what async and zero-bubble save and the speedup over k = 0 out, per
load, each with its band and after what it rests on (sim/advise.py)."""

from __future__ import annotations

import math
import os
import sys

DESCRIPTION = """\
Answer the question stepgap exists for: on this GPU, model and load, does vLLM's
--async-scheduling pay, and which num_speculative_tokens? For every load point (each
--max-concurrency, each --request-rate, or every pair of them) the simulator runs k = 0 up to
--max-k in sync, async and zero-bubble scheduling and prints:

  - the best k in sync and in async (by mean TPOT), and the mean TPOT there;
  - the speedup of each mode's best k over k = 0;
  - what async at its best k saves against sync at its best k;
  - whether zero-bubble (vLLM #29957) adds anything over async.

Every number has its band: the simulator reruns the cells the answer reads with each uncertain
input at the ends of its documented range (the host's CPU costs; the device where the roofline
prices it; the acceptance where it is borrowed or extrapolated) and names the inputs that
dominate each band (docs/explanation/bands.md, "Bands"). Before the table it prints what the answer rests
on: the device costs (measured tables, a profile, or the roofline with its efficiencies), the
acceptance (profile, source, measured depth, extrapolated positions), the CPU costs (the
defaults x a factor, or your calibration) and the seed. It warns when a best k sits at the edge
of the range or past the measured acceptance, and when a band is wider than the effect it bounds.

The setup takes `stepgap simulate`'s options, spelled as `vllm serve` spells them, so a vLLM
command line pastes. Without --profile the CPU costs are stepgap's defaults x 2.42 (the nominal
host, as simulate and sweep take it), as said in the output; `stepgap calibrate` on runs of
yours pins them. After the answer it names the next `vllm bench serve` run to make: the one
whose calibration narrows the widest band of what async saves most, with the band to expect
after it (--no-next-run leaves it out)."""

EPILOG = """\
examples:
  # Llama-3.1-8B + EAGLE-3 on one H100, concurrency 1 to 32 (the defaults: k 0-8, six loads)
  stepgap advise --model llama-3.1-8b --gpu h100 --speculative-config \\
      '{"method": "eagle3", "model": "llama-3.1-8b-eagle3", "num_speculative_tokens": 3}' \\
      --max-concurrency 1 2 4 8 16 32 --plot advise.png --result-json advise.json
  # request rates instead of concurrencies (every pair when both are given)
  stepgap advise --model llama-3.1-8b --gpu h200 --trace sharegpt --num-prompts 500 \\
      --request-rate 2,4,8,16 --max-concurrency 64
  # priced from a GPU's measured operator tables instead of the roofline
  stepgap advise --gpu rtx4090 --model llama-3.1-8b --device-profile \\
      traces/peers/llmservingsim/profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16 \\
      --max-concurrency 1,8,64
  # a MoE model on two GPUs as two data-parallel engine cores with expert parallelism
  stepgap advise --model qwen3-30b-a3b --gpu h100 -dp 2 -ep --max-concurrency 4,16,64
  # pinned by your own GPU run: calibrate on one sync bench file, then advise with it
  stepgap calibrate sync-k4-c1.json --gpu l20 --model llama-3.1-8b \\
      --draft llama-3.1-8b-eagle3 -k 4 --max-concurrency 1 --out my-l20.json
  stepgap advise --profile my-l20.json --model llama-3.1-8b --draft llama-3.1-8b-eagle3 \\
      --max-concurrency 1 4 16

--result-json writes every number, band, input and warning (docs/reference/advise.md, "stepgap advise",
has the schema); --plot one figure: the best k and the async saving, with their bands,
against the load. Bad input (an empty load list, an unknown GPU, a model that is not one)
ends in one line, exit status 2, before any simulation.
"""


def register(sub) -> None:
    from stepgap.common.options import add_command, add_load_args, at_most, positive_int
    from stepgap.common.limits import MAX_K
    from stepgap.sim.advise import DEFAULT_MAX_K
    from stepgap.sim.setup_args import add_setup_args
    p = add_command(sub, "advise", help="async on? which k? per load, with bands and what the "
                    "answer rests on", description=DESCRIPTION, epilog=EPILOG,
                    allow_abbrev=False)
    add_setup_args(p)
    add_load_args(p, many=True)
    g = p.add_argument_group("the question")
    g.add_argument("--max-k", type=at_most(positive_int, MAX_K), default=DEFAULT_MAX_K,
                   metavar="K", help=f"try k = 0..K (default {DEFAULT_MAX_K}; MTP: the depths "
                                     "its layers allow)")
    g.add_argument("--no-band", dest="band", action="store_false",
                   help="the nominal answer only, without bands (faster)")
    g.add_argument("--jobs", "-j", type=positive_int, default=os.cpu_count() or 1, metavar="N",
                   help="local worker processes, each running a load's sync cells, or its "
                   "async and zero-bubble ones, at a time: no more than two per load are used "
                   f"(default: all {os.cpu_count()} cores)")
    o = p.add_argument_group("output")
    o.add_argument("--result-json", metavar="PATH", help="write the whole answer as JSON")
    o.add_argument("--plot", metavar="FIGURE", help="draw the best k and the async saving, "
                   "with their bands, against the load (PNG, SVG or PDF)")
    o.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=run, vllm_options=True, timeline=None, detailed=None,
                   metric_percentiles=None, percentile_metrics=None, result_dir=None,
                   result_filename=None, save_result=False, timeseries_interval_s=None)


def question(args) -> tuple[dict, list[dict], list[int], list[str]]:
    """(the setup's settings, the load points, the ks, notes on the defaults it chose)."""
    from stepgap.common.limits import MAX_PROMPTS
    from stepgap.common.options import at_most, load_list, positive_int, rate_arg
    from stepgap.sim.advise import DEFAULT_CONCURRENCY, depths, loads_of
    from stepgap.sim.setup_args import config_from_args
    from stepgap.sim.plan import resolve
    from stepgap.sim.config import SimConfig
    from stepgap.sim.presets import get_preset

    conc = load_list("--max-concurrency", args.max_concurrency,
                     at_most(positive_int, MAX_PROMPTS))
    rates = load_list("--request-rate", args.request_rate, rate_arg)
    args.max_concurrency = args.request_rate = None
    notes = []
    preset = get_preset(args.preset).settings if args.preset else {}
    if conc is None and rates is None:
        conc = [preset["max_concurrency"]] if preset.get("max_concurrency") else \
            list(DEFAULT_CONCURRENCY)
        notes.append(f"no --max-concurrency or --request-rate: judging concurrency "
                     f"{', '.join(map(str, conc))}")
    base = config_from_args(args, one_k=False).to_dict()
    for key in ("timeline", "detailed"):
        base.pop(key, None)
    ks = depths(base, args.max_k)
    resolve(SimConfig(**{**base, "k": max(ks)}))   # an unknown GPU or model: one line, now
    return base, loads_of(conc, rates), ks, notes


def your_choice(args) -> dict | None:
    """The mode and k the user's own command line (or --preset) gives, and where each came from;
    None where it gives neither. Read after `question` (config_from_args sets args.k, args.mode
    from --speculative-config, -k, --async-scheduling and --mode)."""
    from stepgap.sim.presets import get_preset
    preset = get_preset(args.preset).settings if args.preset else {}
    k, mode = args.k, args.mode
    k_from = "your num_speculative_tokens" if k is not None else None
    mode_from = "your --async-scheduling" if getattr(args, "async_scheduling", None) else \
        "your --no-async-scheduling" if getattr(args, "async_scheduling", None) is False else \
        "your --mode" if mode is not None else None
    if k is None and "k" in preset:
        k, k_from = preset["k"], f"--preset {args.preset}"
    if mode is None and "mode" in preset:
        mode, mode_from = preset["mode"], f"--preset {args.preset}"
    if k is None and mode is None:
        return None
    if mode is None:
        mode, mode_from = "sync", "the default: no --async-scheduling given"
    return {"mode": mode, "k": k, "mode_from": mode_from, "k_from": k_from}


def run(args, next_run=None) -> int:
    """The answer; `next_run`: a function of the answer that names the next run to make
    (calibrate/bench_fit.py `plan_next_run`, which the layer above passes in: sim/ does not
    import it)."""
    from stepgap.common.fileio import check_distinct, check_writable, write_json
    from stepgap.common.options import note
    from stepgap.sim.advise import advise

    check_distinct([("--result-json", args.result_json), ("--plot", args.plot)])
    for option, path in (("--result-json", args.result_json), ("--plot", args.plot)):
        if path:
            check_writable(path, option)
    fmt = None
    if args.plot:
        from stepgap.common.timeline_plots import figure_format
        fmt = figure_format(args.plot, "--plot")
    base, loads, ks, notes = question(args)
    mine = your_choice(args)
    if mine is not None and mine.get("k") is not None and mine["k"] > max(ks):
        from stepgap.sim.advise import depths
        ks = depths(base, mine["k"])
        notes.append(f"k {ks[0]}-{ks[-1]}: up to your num_speculative_tokens {mine['k']}")
    for line in notes:
        note(args, line)
    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(unit="sim", desc="advise", dynamic_ncols=True, leave=False)
    try:
        advice = advise(base, loads, ks, band=args.band, jobs=args.jobs,
                        progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    for line in advice.notes:   # the cells' own (fp8, a dataset's estimate, a profile's device)
        note(args, line)
    advice.notes = notes + advice.notes
    advice.yours = mine
    if next_run is not None and args.band and getattr(args, "next_run", True):
        bar = None
        if not args.quiet and sys.stderr.isatty():   # (a calibration a candidate run's end)
            from tqdm import tqdm
            bar = tqdm(unit="fit", desc="advise: the next run", dynamic_ncols=True, leave=False)
        try:
            advice.next_run = next_run(advice, progress=bar.update if bar is not None else None,
                                       jobs=args.jobs)
        finally:
            if bar is not None:
                bar.close()
    figure = None
    if args.plot:
        from stepgap.common.timeline_plots import render
        from stepgap.sim.plots import advise_figure
        figure = render(advise_figure(advice), fmt)
    if not args.quiet:
        print(format_advice(advice))
        if advice.next_run is not None:
            print(format_next_run(advice.next_run))
        sys.stdout.flush()
    if args.result_json:
        write_json(args.result_json, advice.to_dict())
    if figure is not None:
        from stepgap.common.fileio import write_bytes
        write_bytes(args.plot, figure)
    if not args.quiet:
        for option, path in (("result", args.result_json), ("figure", args.plot)):
            if path:
                print(f"{option}: {path}")
        note(args, f"{advice.sims} simulations in {advice.seconds:.1f} s")
    return 0


# ---------------------------------------------------------------------------------------------
# The answer, as printed


def _b(b, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    """value [low, high] (the value alone where the band rounds to it)"""
    v, lo, hi = (x * scale for x in (b.value, b.low, b.high))
    if f"{lo:{fmt}}" == f"{hi:{fmt}}":
        return f"{v:{fmt}}{unit}"
    return f"{v:{fmt}}{unit} [{lo:{fmt}}, {hi:{fmt}}]"


def _k(b) -> str:
    k, lo, hi = int(b.value), int(b.low), int(b.high)
    return f"{k}" if lo == hi else f"{k} [{lo}-{hi}]"


def table(head: list[list[str]], rows: list[list[str]]) -> list[str]:
    """Columns as wide as their widest cell, two spaces apart; `head`: its lines of titles."""
    widths = [max(len(r[i]) for r in head + rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in head + rows]


def format_advice(advice) -> str:
    from dataclasses import fields

    from stepgap.common.run_spec import ModelSpec
    r = advice.rests_on
    acc = r["acceptance"]
    default = next(f.default for f in fields(ModelSpec) if f.name == "method")   # (eagle3)
    draft = f" + {r['draft']} ({r['method']})" if r.get("draft") else \
        (f" ({r['method']})" if r.get("method") not in (default, None) else "")
    tp = f" x {r['tensor_parallel_size']} (TP)" if r["tensor_parallel_size"] > 1 else ""
    dp = r.get("data_parallel_size", 1)
    tp += (f" x {dp} (DP)" if dp > 1 else "") + \
        (", expert parallel" if r.get("expert_parallel") else "")
    lines = [f"stepgap advise: {r['model']}{draft} on {r['gpu']}{tp}; {r['workload']}; "
             f"k {advice.ks[0]}-{advice.ks[-1]}, sync, async and zero-bubble, best k by "
             "mean TPOT", ""] + verdict_lines(advice) + [
             "", "What the answer rests on:",
             f"  device      {r['device']}",
             f"  acceptance  {acc['profile']}: {acc['source']}; measured to position "
             f"{acc['measured_depth']}" + (
                 f"; positions {_span(acc['extrapolated_positions'])} extrapolated (the last "
                 "conditional rate repeats)" if acc["extrapolated_positions"] else "")
             + (f"; BORROWED: {acc['borrowed']}" if acc.get("borrowed") else "")
             + (f"; {acc['chosen']}" if acc.get("chosen") else ""),
             f"  CPU costs   {r['cpu']}",
             f"  seed        {r['seed']} (the workload's prompts and the acceptance draws)"]
    if advice.inputs:
        lines += ["", "Bands: each input at the ends of its range (docs/explanation/bands.md, 'Bands'):"]
        for i in advice.inputs:
            lines.append(f"  {i.name:<11} {i.low:.3g} .. {i.high:.3g} {i.unit} (nominal "
                         f"{i.nominal:.3g}){' from k=' + str(i.min_k) if i.min_k > 1 else ''}"
                         f": {i.source}")
    else:
        lines += ["", "Bands: not computed (--no-band)"]
    lines += [""] + table(
        [["", "best k", "", "mean TPOT ms, at the best k", "", "speedup over k=0", ""],
         ["load", "sync", "async", "sync", "async", "sync", "async"]],
        [[a.label, _k(a.modes["sync"].best_k), _k(a.modes["async"].best_k),
          _b(a.modes["sync"].tpot_ms, ".2f"), _b(a.modes["async"].tpot_ms, ".2f"),
          _b(a.modes["sync"].speedup, ".2f", unit="x"),
          _b(a.modes["async"].speedup, ".2f", unit="x")] for a in advice.answers])
    rows = []
    for a in advice.answers:
        zb = a.zero_bubble_saving
        rows.append([a.label, _b(a.async_saving, ".1f", 100, " %"),
                     ", ".join(a.async_saving.dominant) or "-", _b(zb, ".1f", 100, " %"),
                     "no" if zb.high < 0.005 else "yes" if zb.low > 0.005 else "maybe"])
    lines += [""] + table(
        [["", "async saves (each mode", "", "zero-bubble adds over", "zero-bubble"],
         ["load", "at its best k), % of sync", "dominated by", "async, % of its TPOT",
          "pays?"]], rows)
    lines += near_best_lines(advice) + yours_lines(advice) + warning_lines(advice)
    lines += ["", f"({advice.sims} simulations; a band sums, on each side, what each input "
                  "moves the number at the ends of its range)"]
    return "\n".join(lines)


def verdict_lines(advice) -> list[str]:
    """The answer in words, one line a load (sim/advise_report.py `verdict`)."""
    from stepgap.sim.advise_report import verdict
    width = max(len(a.label) for a in advice.answers)
    head = "The answer" + (" (nominal: no bands)" if not advice.inputs else
                           ", each number's band over the inputs below") + ":"
    return [head] + [f"  {a.label:<{width}}  {verdict(a)}" for a in advice.answers]


def near_best_lines(advice) -> list[str]:
    """Every k within 1 % of each mode's best mean TPOT, per load."""
    from stepgap.sim.advise_report import near_best, ks_text
    rows = [[a.label] + [f"{ks_text(near_best(a.modes[m].grid))} (best {_k(a.modes[m].best_k)})"
                         for m in ("sync", "async")] for a in advice.answers]
    return [""] + table([["load", "sync: k within 1 % of its best", "async: the same"]], rows)


def yours_lines(advice) -> list[str]:
    """The user's own mode and k against the best of sync and async, per load."""
    from stepgap.sim.advise_report import yours
    y = advice.yours
    if y is None:
        return ["", "Your setup: no k or mode given (paste your --speculative-config and "
                "--async-scheduling to see what they lose against the best)"]
    src = "; ".join(x for x in (y.get("mode_from"), y.get("k_from")) if x)
    if y.get("k") is None:
        return ["", f"Your setup: {y['mode']} ({src}); no num_speculative_tokens given"]
    lines = ["", f"Your setup: {y['mode']}, k={y['k']} ({src});",
             "  against the best of sync and async at each load (nominal mean TPOT):"]
    width = max(len(a.label) for a in advice.answers)
    for a in advice.answers:
        x = yours(a, y["mode"], y["k"])
        if x is None:
            text = "not simulated (zero-bubble cannot beat async there)"
        elif x.loss <= 0.01:
            text = (f"{x.tpot_ms:.2f} ms, within 1 % of the best ({x.best_mode} k={x.best_k}: "
                    f"{x.best_ms:.2f} ms)" if x.loss > 0 else f"{x.tpot_ms:.2f} ms, the best")
        else:
            text = (f"{x.tpot_ms:.2f} ms: {100 * x.loss:.1f} % above the best, {x.best_mode} "
                    f"k={x.best_k} ({x.best_ms:.2f} ms)")
            there = a.modes[x.best_mode].grid.get(x.k, math.inf)
            if x.best_mode != x.mode and math.isfinite(there):
                text += f"; {x.best_mode} at your k={x.k}: {there:.2f} ms"
        lines.append(f"  {a.label:<{width}}  {text}")
    return lines


def warning_lines(advice) -> list[str]:
    """Each warning once, with the loads it holds at (and each load's detail)."""
    from stepgap.sim.advise_report import warning_parts
    seen: dict = {}
    for a in advice.answers:
        for message, detail in warning_parts(a, advice.ks, advice.inputs):
            seen.setdefault(message, []).append(f"{a.label}: {detail}" if detail else a.label)
    if not seen:
        return []
    return ["", "Warnings:"] + [f"  {message} ({'; '.join(where)})"
                                for message, where in seen.items()]


def _span(ks: list[int]) -> str:
    return str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}"


def format_next_run(nxt) -> str:
    """The next run to make (calibrate/bench_fit.py NextRun), as printed after the answer."""
    from stepgap.sim.advise_report import load_label

    def pct(b):
        return f"{100 * b[0]:.1f} to {100 * b[1]:.1f} %"
    c = nxt.best
    made = (f" with the profile's runs ({', '.join(_cell(m) for m in nxt.made)})"
            if nxt.made else "")
    now = nxt.now[1] - nxt.now[0]
    lines = ["", "The next run to make (what narrows the widest band of what async saves):",
             f"  at {load_label(nxt.load)} that band is dominated by {nxt.input}: "
             f"{pct(nxt.now)} now, {100 * now:.1f} points wide (judged on {PROMPTS_NOTE})",
             f"  run {_cell(c.cell())} ({c.cost_s:.1f} s of GPU time at this workload):",
             f"    {c.command(nxt.base)}",
             f"  expected after calibrating on it{made}: a band {100 * nxt.width_after():.1f} "
             f"points wide ({100 * nxt.width_after() / now:.0f} % of now), calibrated on "
             f"the runs simulated at the ends and the middle of {nxt.input}'s range: "
             + "; ".join(f"{end} {pct(b)}" for end, b in c.ends.items()),
             "  then: stepgap calibrate YOUR-RUNS.json --gpu ... --out P.json, and advise again "
             "with --profile P.json: it names the run after it"]
    others = [f"{_cell(o.cell())} {100 * o.width:.1f}" for o in nxt.candidates if o is not c]
    if others:
        lines.append(f"  (the others judged, the points wide each leaves: {'; '.join(others)})")
    return "\n".join(lines)


PROMPTS_NOTE = "the question's first prompts, short outputs, each mode at its best k"


def _cell(c: dict) -> str:
    conc = f" at concurrency {c['max_concurrency']}" if c.get("max_concurrency") else ""
    return f"{c['mode']} k={c['k']}{conc}"
