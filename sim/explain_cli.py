"""`stepgap explain`: where each microsecond of a step and its gap goes, op by op and lane by
lane, exposed or hidden, sync and async side by side (common/breakdown.py has the rule). It
simulates a setup in each mode, or reads timelines a run wrote (`stepgap simulate --timeline`,
`stepgap run --timeline`, `stepgap ingest vllm-profile --out`)."""

from __future__ import annotations

import sys
from dataclasses import replace

DESCRIPTION = """\
Where does each microsecond of a step, and of the gap before it, go? For a setup (simulate's
options, spelled as `vllm serve` spells them) it simulates each --modes (default sync and
async) with a timeline, or it reads the timelines given with --from-timeline (simulated,
measured by `stepgap run`, or a vLLM profile ingested by `stepgap ingest vllm-profile`), and
prints, per step and side by side:

  - the device's busy time, by op (target_forward, rejection_sample, draft_forward, d2h, fixup);
  - its idle time (the step gap, and any idle inside a step), by the CPU op on the critical
    path then: the op running on the lane nearest the device (cpu.worker, then cpu.engine,
    then cpu.frontend; a wait is not work), or (no op): latencies with no span of their own;
  - each CPU op's hidden time: the rest of it, under device work or behind a nearer lane.

Device busy by op, exposed by op and (no op) add up to the step period exactly. Each step is
taken with the gap before it: every step but the first, or --steps A:B."""

EPILOG = """\
examples:
  # the seed's setup (vLLM PR #25872, L20, Llama-3.1-8B + EAGLE-3, k=4): sync against async
  stepgap explain --preset seed-l20 --plot seed-explain.png
  # Llama-3.1-8B + EAGLE-3 on an H100 at concurrency 16, all three modes, with the Chrome
  # trace of each run, its gaps as events on a "device idle" track (ui.perfetto.dev)
  stepgap explain --model llama-3.1-8b --gpu h100 --speculative-config \\
      '{"method": "eagle3", "model": "llama-3.1-8b-eagle3", "num_speculative_tokens": 3}' \\
      --max-concurrency 16 --modes sync,async,zero-bubble --chrome h100.chrome.json
  # measured runs: the engine's timelines (stepgap run --timeline) or vLLM's (stepgap ingest
  # vllm-profile --out), each LABEL=PATH
  stepgap explain --from-timeline sync=out/sync.jsonl --from-timeline async=out/async.jsonl

--result-json writes the breakdown (format stepgap-explain/1: per run its window, steps, step
period, device busy and idle, the step gap, and per op busy_us, exposed_us and hidden_us, all
per step); --plot one figure: a stacked bar per run and each CPU op's hidden time."""


def register(sub) -> None:
    from stepgap.common.options import add_command, add_load_args
    from stepgap.sim.setup_args import add_setup_args
    from stepgap.sim.sweep_cli import _steps
    p = add_command(sub, "explain", help="where each microsecond of a step and its gap goes, "
                    "per op and lane, exposed or hidden, sync and async side by side",
                    description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False)
    add_setup_args(p)
    add_load_args(p)
    g = p.add_argument_group("what to explain")
    g.add_argument("--modes", type=modes_arg, default=("sync", "async"), metavar="M1,M2",
                   help="the modes to simulate side by side: sync, async, zero-bubble "
                        "(default sync,async)")
    g.add_argument("--from-timeline", action="append", metavar="[LABEL=]PATH",
                   help="explain this timeline (JSON lines) instead of simulating; repeatable, "
                        "each a column")
    g.add_argument("--steps", type=_steps, metavar="A:B",
                   help="steps A to B, each with the gap before it (default: every step but "
                        "the first)")
    o = p.add_argument_group("output")
    o.add_argument("--result-json", metavar="PATH", help="write the breakdowns as JSON")
    o.add_argument("--plot", metavar="FIGURE", help="the stacked bars (PNG, SVG or PDF)")
    o.add_argument("--chrome", metavar="JSON", help="every run's timeline as one Chrome-trace/"
                   "Perfetto document, a process per run, its idle stretches as events")
    o.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=run, vllm_options=True, timeline=None, detailed=None,
                   metric_percentiles=None, percentile_metrics=None, result_dir=None,
                   result_filename=None, save_result=False, timeseries_interval_s=None)


def modes_arg(text: str) -> tuple[str, ...]:
    import argparse
    from stepgap.common.formats import MODES
    modes = tuple(m.strip() for m in text.split(","))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"expected distinct modes of {', '.join(MODES)}, "
                                         f"comma-separated, got {text!r}")
    return modes


def runs_of(args) -> tuple[list[tuple[str, list]], str]:
    """(label, spans) of each run to explain, and a title saying what they are."""
    from stepgap.common.formats import load_timeline
    from stepgap.common.options import note
    if args.from_timeline:
        runs = []
        for text in args.from_timeline:
            label, sep, path = text.partition("=")
            label, path = (label, path) if sep else (text.rsplit("/", 1)[-1], text)
            runs.append((label.removesuffix(".jsonl"), load_timeline(path)))
        return runs, "timelines " + ", ".join(label for label, _ in runs)
    from stepgap.sim.loop import simulate
    from stepgap.sim.setup_args import config_from_args
    cfg = config_from_args(args)
    runs = []
    for mode in args.modes:
        res, spans = simulate(replace(cfg, mode=mode, timeline=True))
        for line in res.notes:
            note(args, line)
        runs.append((mode, spans))
    load = ", ".join(f"{k.replace('_', ' ')} {getattr(cfg, k)}" for k in
                     ("max_concurrency", "request_rate") if getattr(cfg, k) is not None)
    return runs, (f"simulated: {cfg.model} on {cfg.gpu}, k={cfg.k}, {cfg.workload}, "
                  f"{cfg.num_prompts} prompts" + (f", {load}" if load else ""))


def run(args) -> int:
    from stepgap.common.breakdown import FORMAT, RULE, breakdown, ranks
    from stepgap.common.fileio import (check_distinct, check_writable, dumps_json, write_json,
                                       write_text)
    from stepgap.common.options import note
    from stepgap.common.timeline_plots import figure_format

    outputs = [("--result-json", args.result_json), ("--plot", args.plot),
               ("--chrome", args.chrome)]
    check_distinct(outputs)
    for option, path in outputs:
        if path:
            check_writable(path, option)
    fmt = figure_format(args.plot, "--plot") if args.plot else None
    runs, title = runs_of(args)
    results = []
    for label, spans in runs:
        by_rank = ranks(spans)
        if len(by_rank) > 1:
            note(args, f"{label}: a data-parallel run: DP rank 0 explained (of {len(by_rank)})")
        results.append(breakdown(by_rank.get(0, by_rank.get(None, [])), label, args.steps))
    if not args.quiet:
        print(format_breakdowns(results, title))
        sys.stdout.flush()
    if args.result_json:
        write_json(args.result_json, {"format": FORMAT, "what": title, "rule": RULE,
                                      "runs": [b.to_dict() for b in results]})
    if args.plot:
        from stepgap.common.fileio import write_bytes
        from stepgap.common.timeline_plots import breakdown_figure, render
        write_bytes(args.plot, render(breakdown_figure(results, title), fmt))
    if args.chrome:
        from stepgap.common.formats import chrome_trace
        events = []
        for pid, (label, spans) in enumerate(runs, start=1):
            for e in chrome_trace(spans, label)["traceEvents"]:
                events.append({**e, "pid": pid + 100 * (e.get("pid", 1) - 1)})
        write_text(args.chrome, dumps_json({"traceEvents": events, "displayTimeUnit": "ms"}))
    if not args.quiet:
        for what, path in (("result", args.result_json), ("figure", args.plot),
                           ("chrome trace", args.chrome)):
            if path:
                print(f"{what}: {path}")
    return 0


def format_breakdowns(results: list, title: str) -> str:
    """The table: a row per op and lane, per run its time per step on the device or exposed
    (and its share of the step), and hidden."""
    from stepgap.sim.advise_cli import table
    keys = []
    for b in results:
        keys += [(o.lane, o.op) for o in b.rows() if (o.lane, o.op) not in keys]
    head = [[""] * 2 + sum(([b.label, "", ""] for b in results), []),
            ["lane", "op"] + ["on path", "%", "hidden"] * len(results)]
    rows = []
    for lane, op in keys:
        row = [lane, op]
        for b in results:
            o = b.ops.get((lane, op))
            if o is None:
                row += ["", "", ""]
                continue
            path = (o.busy_us + o.exposed_us) / b.steps
            row += [f"{path:.1f}", f"{100 * path * b.steps / b.window_us:.1f}",
                    f"{o.hidden_us / b.steps:.1f}" if lane not in ("device", "idle") else ""]
        rows.append(row)
    def share(what, us):
        return [what[0], what[1]] + sum(([f"{us(b) / b.steps:.1f}",
                                          f"{100 * us(b) / b.window_us:.1f}", ""]
                                         for b in results), [])
    total = [share(("total", "step: busy + idle"), lambda b: b.window_us),
             share(("", "device idle"), lambda b: b.idle_us),
             share(("", "of it, step gaps"), lambda b: b.gaps_us)]
    steps = "; ".join(f"{b.label}: steps {b.first_step}-{b.last_step} ({b.steps})"
                      for b in results)
    lines = [f"stepgap explain: {title}",
             f"Each step with the gap before it, mean us per step ({steps}).",
             "on path: a device op's busy time, or a CPU op's exposed time (the device idle, "
             "the op on the lane nearest it); hidden: the rest of a CPU op's time.", ""]
    lines += table(head, rows + total)
    saving = [(b.label, b.window_us / b.steps) for b in results]
    if len(saving) > 1:
        base_label, base = saving[0]
        lines += [""] + [f"{label} against {base_label}: "
                         f"{'saves' if v <= base else 'costs'} {abs(base - v):.1f} us a step "
                         f"({100 * abs(base - v) / base:.1f} %)" for label, v in saving[1:]]
    return "\n".join(lines)
