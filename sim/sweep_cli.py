"""`stepgap sweep` (the simulator over a grid) and `stepgap plot sweep|timeline`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from stepgap.common.limits import MAX_MS
from stepgap.common.options import add_command, at_most, positive_float, positive_int
from stepgap.sim.sweep_table import X_AXES

SWEEP_DESCRIPTION = """\
Run the simulator over a grid of what-ifs (mode, k, concurrency or request rate, GPU, model,
acceptance, scheduler limits: any `stepgap simulate` setting) and write a tidy table with the
run-result metrics of every cell: OUT/sweep.csv and OUT/sweep.json, one row per cell in grid
order (the axes, then the metrics of `vllm bench serve`, the step gaps and the acceptance).

Each cell is a preset's settings (--preset), then fixed settings (--set, the grid file's base),
then the cell's axis values. The whole grid is checked before anything runs. Cells run in
parallel on local cores (--jobs) or on a Dask or Ray cluster (--cluster). Finished cells
are kept in OUT/cells.jsonl, so a rerun (after an interruption, or with a larger grid) runs
only the cells not done yet. Every cell uses the same seed, so the table is the same however
and wherever it runs.

grid syntax (--grid KEY=VALUES; keys are `stepgap simulate` settings with _ or -):
  mode=sync,async,zero-bubble        a list
  k=0..6                             an inclusive range (step 1)
  max_concurrency=1..64:x2           1,2,4,...,64: a geometric range
  request_rate=0.5..4:0.5            an arithmetic range; values and ranges mix: 1,2,8..12
  gpu=l20,h100,h200   acceptance=mtbench,full   max_num_seqs=64,128,256
  tensor_parallel_size=4,8   model=llama-3.3-70b,qwen3-30b-a3b   method=eagle3,draft_model
  acceptance_rates=0.8/0.6/0.4,0.9/0.8/0.7      list-valued settings: '/' between numbers

a grid file (--grid-file F.toml or F.json):
  preset = "seed-l20"
  [base]                  # fixed settings of every cell
  num_prompts = 40
  [grid]                  # axes, in order; a list or a string in the syntax above
  mode = ["sync", "async"]
  k = "0..6"
  max_concurrency = [1, 4, 16, 64]
"""

SWEEP_EPILOG = """\
examples:
  # the seed setup (L20, Llama-3.1-8B + EAGLE-3, MT-bench 80 x 256): k 0..6 x concurrency
  # 1..64 x three modes (147 cells), its table, heatmaps and the best k, in a few seconds
  stepgap sweep --preset seed-l20 --grid mode=sync,async,zero-bubble --grid k=0..6 \\
      --grid max_concurrency=1..64:x2 --out out/seed-l20 --plot
  # three GPUs, async only, from a file plus one more axis
  stepgap sweep --grid-file grid.toml --grid gpu=l20,h100,h200 --out out/gpus
  # on a running Dask cluster (stepgap installed on its workers), or on Ray: a running
  # cluster (ray://head:10001) or a local instance started for the sweep (ray)
  stepgap sweep --preset seed-l20 --grid k=0..8 --grid max_concurrency=1..256:x2 \\
      --cluster tcp://scheduler:8786 --out out/big
  stepgap sweep --preset seed-l20 --grid k=0..8 --cluster ray --out out/big
  # check a grid without running it
  stepgap sweep --preset seed-l20 --grid k=0..6 --grid gpu=h100,h200 --dry-run

Outputs: OUT/sweep.csv, OUT/sweep.json (table), OUT/cells.jsonl (resume store), and with
--plot OUT/plots/*.png and OUT/plots/best_k.csv. Times in the table are ms (µs for step gaps).
"""

PLOT_SWEEP_EPILOG = """\
examples:
  stepgap plot sweep out/seed-l20                       # mean TPOT heatmaps, speedup, saving
  stepgap plot sweep out/seed-l20 --metric p99_tpot_ms --out out/seed-l20/p99

Figures (one set per combination of the axes other than mode, k and the concurrency axis,
e.g. tensor_parallel_size, model, method or gpu: the "facets"):
  heatmap_METRIC.png   the metric over k x concurrency, one panel per mode, best k boxed
  speedup_METRIC.png   speedup over k=0 in the same mode (diverging, centred at 1)
  saving_METRIC.png    async and zero-bubble saving over sync (%) against concurrency
  *__panels.png        with more than one facet: the same figures with a row of panels per
                       facet on one scale (e.g. TP 4 above TP 8)
  best_k.csv           the best k for each mode and concurrency (also printed)
"""

TIMELINE_EPILOG = """\
examples:
  stepgap simulate --preset seed-l20 --mode sync --num-prompts 2 --timeline sync.jsonl --quiet
  stepgap simulate --preset seed-l20 --mode async --num-prompts 2 --timeline async.jsonl --quiet
  stepgap plot timeline sync=sync.jsonl async=async.jsonl --steps 100:103 --out tl.png
  # zoom on one step gap, simulated beside measured, and a Perfetto file of the same windows
  stepgap plot timeline simulated/sync=sync.jsonl measured/sync=engine.jsonl \\
      --at-gap 101 --pad-ms 5 --out gap.png --chrome gap.chrome.json

Each TIMELINE is [COLUMN/]ROW=PATH: rows (e.g. modes) stack on a shared time axis, columns
(e.g. simulated, measured) stand side by side; a bare PATH is a row named after the file.
Time runs from each panel's window start, in ms; gap labels are in µs or ms.
"""


def register(sub) -> None:
    p = add_command(sub, "sweep", help="run the simulator over a grid of what-ifs (table, plots)",
                    description=SWEEP_DESCRIPTION, epilog=SWEEP_EPILOG)
    g = p.add_argument_group("grid")
    g.add_argument("--preset", help="base scenario: a `stepgap simulate` preset (seed-l20, "
                                    "sharegpt-h100); default: SimConfig's defaults")
    g.add_argument("--grid", action="append", default=[], metavar="KEY=VALUES",
                   help="one axis, repeatable; axes vary in the order given, the last fastest")
    g.add_argument("--grid-file", metavar="FILE",
                   help="axes (and preset, base) from a .toml or .json file; --grid axes come "
                        "after its axes and replace one of the same name")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a fixed setting of every cell, repeatable (e.g. num_prompts=40)")
    g = p.add_argument_group("execution")
    g.add_argument("--out", default="out/sweep", metavar="DIR",
                   help="output folder (default out/sweep); cells already in DIR/cells.jsonl "
                        "are not run again")
    g.add_argument("--jobs", "-j", type=positive_int, default=os.cpu_count() or 1, metavar="N",
                   help=f"local worker processes (default: all {os.cpu_count()} cores)")
    g.add_argument("--cluster", metavar="ADDRESS",
                   help="run the cells on a cluster instead of local processes: the Dask "
                        "distributed scheduler at ADDRESS (e.g. tcp://host:8786), a Ray "
                        "cluster (ray://host:10001) or a local Ray instance (ray); "
                        "pip install 'stepgap[cluster]' or 'stepgap[ray]'")
    g.add_argument("--fresh", action="store_true",
                   help="forget the cells done before and run every cell")
    g.add_argument("--dry-run", action="store_true",
                   help="check the grid, say how many cells it has and how many are done, "
                        "run nothing")
    g.add_argument("--band", action="store_true",
                   help="also run every cell with each uncertain input at the ends of its range "
                        "(sim/bands.py): the table gets the band of mean TPOT and mean ITL "
                        "(*_low, *_high) and the inputs that dominate each (band_dominant); "
                        "about 5 times the simulations")
    g = p.add_argument_group("output")
    g.add_argument("--plot", action="store_true",
                   help="then draw the sweep's figures into DIR/plots (as `stepgap plot sweep`)")
    g.add_argument("--metric", default="mean_tpot_ms",
                   help="metric of the figures and the best k (default mean_tpot_ms)")
    g.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p.set_defaults(func=run_sweep_cmd)

    p = sub.add_parser("plot", help="draw a sweep (heatmaps, best k) or a step timeline",
                       description="Figures of a sweep or of step timelines (PNG).")
    psub = p.add_subparsers(dest="what", metavar="WHAT")
    p.set_defaults(func=lambda args: p.print_help() or 2)

    q = add_command(psub, "sweep", help="heatmaps, speedup over k=0, async saving, best k",
                    description="Figures of a sweep written by `stepgap sweep`: the metric "
                    "and its speedup over k=0\nacross k x concurrency (one panel per mode), "
                    "the saving of async over sync, and\nthe best k per concurrency.",
                    epilog=PLOT_SWEEP_EPILOG)
    q.add_argument("sweep", metavar="DIR", help="the sweep's output folder (or its sweep.json)")
    q.add_argument("--metric", default="mean_tpot_ms",
                   help="a column of the table (default mean_tpot_ms; e.g. p99_tpot_ms, "
                        "mean_itl_ms, output_throughput); the best k minimises times and "
                        "maximises throughputs")
    q.add_argument("--x", choices=X_AXES,
                   help="the x axis: the load, or the shared fraction of the prompt (default: "
                        "the first of these the sweep has)")
    q.add_argument("--out", metavar="DIR", help="where the figures go (default DIR/plots)")
    q.add_argument("--quiet", action="store_true", help="print nothing but errors")
    q.set_defaults(func=plot_sweep_cmd)

    q = add_command(psub, "timeline", help="Gantt chart of the lanes over a window of steps",
                    description="A Gantt chart of the lanes (cpu.engine, cpu.worker, device) "
                    "of one or more timelines\n(JSON lines, docs/explanation/design.md §2, "
                    "simulated or measured), step gaps shaded and labelled with their\nlength.",
                    epilog=TIMELINE_EPILOG)
    q.add_argument("timelines", nargs="+", metavar="TIMELINE", help="[COLUMN/]ROW=PATH")
    w = q.add_argument_group("window")
    w.add_argument("--steps", type=_steps, metavar="A:B",
                   help="steps A to B inclusive (default: the first four device steps)")
    w.add_argument("--at-gap", type=int, metavar="STEP",
                   help="instead: the step gap before STEP, with --pad-ms either side")
    w.add_argument("--pad-ms", type=at_most(positive_float, MAX_MS), default=5.0, metavar="MS",
                   help="time shown either side of the --at-gap gap (default 5 ms)")
    o = q.add_argument_group("output")
    o.add_argument("--out", default="timeline.png", metavar="FIGURE",
                   help="the figure, a PNG, SVG or PDF as its name ends (default timeline.png)")
    o.add_argument("--chrome", metavar="JSON",
                   help="also write the windows as Chrome-trace/Perfetto JSON, one process "
                        "per timeline, times from each window's start")
    o.add_argument("--title", help="figure title (default: says the window)")
    o.add_argument("--quiet", action="store_true", help="print nothing but errors")
    q.set_defaults(func=plot_timeline_cmd)


def _steps(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    try:
        lo, hi = (int(a), int(b)) if sep else (int(a), int(a))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B (step numbers), got {text!r}") from None
    if lo > hi or lo < 0:
        raise argparse.ArgumentTypeError(f"expected 0 <= A <= B, got {text!r}")
    return lo, hi


# -------------------------------------------------------------------------------------------


def run_sweep_cmd(args) -> int:
    from stepgap.common.errors import UserError
    from stepgap.common.fileio import check_not_input, check_writable
    from stepgap.sim.sweep import cell_notes, run_sweep
    from stepgap.sim.sweep_grid import build_grid, format_cell
    from stepgap.sim.sweep_store import CellStore

    if args.cluster == "":
        raise UserError("--cluster '': no address; give a Dask scheduler's (tcp://host:8786), "
                        "ray://host:port or ray, or leave --cluster out to run on local "
                        "processes")
    grid = build_grid(args.grid, args.grid_file, args.preset, args.set)
    if args.plot:   # a sweep that cannot be drawn is found before it runs, not after
        from stepgap.sim.plots import plot_axis
        plot_axis(grid.axes, None, "--plot")
        check_metric(args.metric)
    if not args.dry_run:
        check_writable(args.out, "--out", folder=True)
        if args.plot:
            check_writable(Path(args.out) / "plots", "--plot", folder=True)
        for name in ("sweep.json", "sweep.csv", "cells.jsonl"):   # what the sweep writes there
            check_not_input([("--out", Path(args.out) / name)], getattr(args, "input_paths", ()))
    if args.dry_run:
        cells = grid.cells()
        for line in cell_notes(cells):
            print(f"note: {line}")
        done = CellStore(Path(args.out) / "cells.jsonl").done
        print(f"{len(cells)} cells, all valid; {sum(c.key in done for c in cells)} already "
              f"done in {args.out}")
        for name, values in grid.axes.items():
            print(f"  {name}: {', '.join(map(str, values))}")
        if cells:
            print(f"  first cell: {format_cell(cells[0].values)}")
        return 0
    run = run_sweep(grid, args.out, jobs=args.jobs, cluster=args.cluster, fresh=args.fresh,
                    progress=not args.quiet, band=args.band)
    if not args.quiet:
        for line in run.notes:
            print(f"note: {line}")
        where = f"on {args.cluster}" if args.cluster else \
            f"on {min(args.jobs, max(run.ran, 1))} process(es)"
        print(f"{run.ran + run.skipped} cells: {run.ran} run {where}, {run.skipped} done "
              f"before; {run.seconds:.1f} s")
        print(f"table: {Path(args.out) / 'sweep.csv'} and {Path(args.out) / 'sweep.json'}")
    if args.plot:
        return draw_sweep(run.table, Path(args.out) / "plots", args.metric, None, args.quiet)
    return 0


def plot_sweep_cmd(args) -> int:
    from stepgap.common.fileio import check_writable
    from stepgap.sim.sweep_table import load_sweep

    table = load_sweep(args.sweep)
    src = Path(args.sweep)
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent) / "plots"
    check_writable(out, "--out", folder=True)
    return draw_sweep(table, out, args.metric, args.x, args.quiet)


def check_metric(metric: str) -> None:
    from stepgap.common.errors import UserError
    from stepgap.sim.sweep_table import COLUMNS, TEXT_COLUMNS
    if metric not in COLUMNS or metric in TEXT_COLUMNS:
        numeric = [c for c in COLUMNS if c not in TEXT_COLUMNS]
        raise UserError(f"--metric: unknown metric {metric!r} (columns: {', '.join(numeric)})")


def draw_sweep(table, out: Path, metric: str, x: str | None, quiet: bool) -> int:
    """The sweep's figures and best_k.csv in `out`. Every figure is drawn before any file is
    written, so that a sweep that cannot be drawn leaves nothing half written; a cell whose
    metric is not finite is left blank (sim/plots.py View.value), a facet with no finite value
    gets no figures of its own, and a sweep with none at all is an error."""
    import csv
    import io
    import math

    from stepgap.common.timeline_plots import render
    from stepgap.sim import plots
    from stepgap.common.errors import UserError
    from stepgap.common.fileio import write_bytes, write_text

    check_metric(metric)
    files, best_rows = [], []
    views = plots.views(table, x)
    drawn = [v for v in views if plots.has_finite(v, metric)]
    if not drawn:
        raise UserError(plots.no_finite(metric, views))
    skipped = [v for v in views if v not in drawn]

    def figures(vs) -> list:
        chosen = [("heatmap", plots.metric_heatmap)]
        if all(plots.has_speedup(v, metric) for v in vs):
            chosen.append(("speedup", plots.speedup_heatmap))
        if "sync" in vs[0].modes and len(vs[0].modes) > 1:
            chosen.append(("saving", plots.saving_plot))
        return chosen

    if len(drawn) > 1:   # the facets (TP, model, method, GPU, ...) as rows of one figure each
        for name, draw in figures(drawn):
            files.append((out / f"{name}_{metric}__panels.png", render(draw(drawn, metric))))
    for view in drawn:
        for name, draw in figures([view]):
            files.append((out / f"{name}_{metric}{view.suffix}.png", render(draw(view, metric))))
        best = plots.best_k(view, metric)
        best_rows += [{**b.fixed, "mode": b.mode, view.x: b.x, "best_k": b.k, metric: b.value,
                       "speedup_over_k0": None if math.isnan(b.speedup) else b.speedup}
                      for b in best]
        if not quiet:
            print(plots.format_best_k(view, best, metric))
            print()
    keys = list(dict.fromkeys(k for r in best_rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, keys, lineterminator="\n")
    w.writeheader()
    w.writerows(best_rows)
    for path, data in files:
        write_bytes(path, data)
    write_text(out / "best_k.csv", buf.getvalue())
    if not quiet:
        for v in skipped:
            print(f"no finite value of {metric} at {v.label}: no figures of it")
        print("figures:\n" + "\n".join(f"  {p}" for p, _ in files)
              + f"\n  {out / 'best_k.csv'}")
    return 0


def parse_timeline_spec(text: str) -> tuple[str, str, str]:
    """[COLUMN/]ROW=PATH -> (column, row, path); a bare PATH is a row named after its file."""
    label, sep, path = text.partition("=")
    if not sep:
        return "", Path(text).name.removesuffix(".jsonl"), text
    column, _, row = label.rpartition("/")
    return column, row, path


def plot_timeline_cmd(args) -> int:
    from stepgap.common import timeline_plots
    from stepgap.common.errors import UserError
    from stepgap.common.fileio import check_distinct, check_writable, dumps_json, write_text
    from stepgap.common.formats import load_timeline

    if args.steps and args.at_gap is not None:
        raise UserError("give --steps or --at-gap, not both")
    check_distinct([("--out", args.out), ("--chrome", args.chrome)])
    check_writable(args.out, "--out")
    fmt = timeline_plots.figure_format(args.out, "--out")   # .png, .svg or .pdf, before the work
    if args.chrome:
        check_writable(args.chrome, "--chrome")
    panels = []
    for spec in args.timelines:
        column, row, path = parse_timeline_spec(spec)
        spans = load_timeline(path)
        if not spans:
            raise UserError(f"{path}: the timeline holds no spans")
        try:   # the window must exist in every timeline: say which one lacks it
            timeline_plots.window(spans, args.steps, args.at_gap, args.pad_ms)
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
        panels.append(timeline_plots.Panel(row, column, spans))
    fig = timeline_plots.timeline_figure(panels, args.steps, args.at_gap, args.pad_ms, args.title)
    timeline_plots.save(fig, Path(args.out), fmt)
    if args.chrome:
        doc = timeline_plots.chrome_panels(panels, args.steps, args.at_gap, args.pad_ms)
        write_text(args.chrome, dumps_json(doc))
    if not args.quiet:
        print(f"figure: {args.out}" + (f"\nchrome trace: {args.chrome}" if args.chrome else ""))
    return 0

