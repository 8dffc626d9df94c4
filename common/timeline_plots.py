"""Step timelines as pictures: Gantt charts of spans on their lanes, with the step gaps shaded,
and the same windows as one Chrome-trace/Perfetto document. They draw any timeline of the shared
format (docs/explanation/design.md §2), simulated, measured or ingested from vLLM, so both halves,
calibrate/ and the benchmarks use them.

Every function returns a matplotlib `Figure` built without pyplot, so it works on any backend;
`save` writes any of stepgap's figures (sim/plots.py's too) as a PNG, SVG or PDF, as its name
ends. One colour per op everywhere.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from stepgap.common.errors import UserError
from stepgap.common.formats import LANES, Span, step_gaps

DPI = 130


# The formats a figure is written in, by the suffix of its name.
FIGURE_FORMATS = ("png", "svg", "pdf")


def figure_format(path, option: str | None = None) -> str:
    """The format a figure's name asks for (its suffix: .png, .svg, .pdf); any other name is an
    error naming `option` and the path, so that `--out x.svg` never holds PNG bytes."""
    fmt = Path(path).suffix.lower().removeprefix(".")
    if fmt not in FIGURE_FORMATS:
        raise UserError(f"{option + ' ' if option else ''}{path}: a figure is written as PNG, "
                        "SVG or PDF, as its name ends (.png, .svg, .pdf)"
                        + (f"; not .{fmt}" if fmt else "; the name has no suffix"))
    return fmt


def render(fig: Figure, fmt: str = "png") -> bytes:
    """The figure's bytes in `fmt` (FIGURE_FORMATS); no date in an SVG or a PDF, so that one
    figure gives the same bytes each time, as a PNG does."""
    import io

    import matplotlib
    buf = io.BytesIO()
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
    with matplotlib.rc_context({"svg.hashsalt": "stepgap"}):   # an SVG's ids, not random
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=metadata)
    return buf.getvalue()


def save(fig: Figure, path, fmt: str | None = None) -> None:
    """The figure in the format its name asks for (`figure_format`), written atomically
    (common/fileio.py)."""
    from stepgap.common.fileio import write_bytes
    write_bytes(path, render(fig, fmt or figure_format(path)))



OP_COLORS = {
    "add_request": "#aec7e8", "process_outputs": "#98df8a",
    "schedule": "#1f77b4", "update_from_output": "#17becf",
    "prepare_inputs": "#2ca02c", "launch": "#bcbd22", "wait": "#d0d0d0",
    "propose": "#7f3b08", "broadcast": "#66c2a5", "collect": "#a6d854",
    "fixup": "#e377c2", "target_forward": "#ff7f0e", "rejection_sample": "#d62728",
    "draft_forward": "#9467bd", "d2h": "#8c564b", "unmapped": "#c7c7c7",
}
GAP_COLOR = "#e41a1c"


@dataclass(slots=True)
class Panel:
    """One timeline in the grid of panels: its row (e.g. the mode) and column (e.g. measured)."""

    row: str
    column: str
    spans: list[Span]


def device_steps(spans: list[Span]) -> dict[int, tuple[float, float]]:
    """step -> (first device op start, last device op end)."""
    out: dict[int, tuple[float, float]] = {}
    for s in spans:
        if s.lane == "device":
            a, b = out.get(s.step, (math.inf, -math.inf))
            out[s.step] = (min(a, s.start_us), max(b, s.end_us))
    return out


def gaps_between(spans: list[Span]) -> list[tuple[int, float, float]]:
    """(step, start, end) of the device idle time before each step (docs/explanation/design.md §2);
    a step that starts before the previous one ends has end == start."""
    dev = device_steps(spans)
    steps = sorted(dev)
    return [(b, dev[a][1], max(dev[a][1], dev[b][0])) for a, b in zip(steps, steps[1:])]


def window(spans: list[Span], steps: tuple[int, int] | None = None,
           at_gap: int | None = None, pad_ms: float = 5.0) -> tuple[float, float]:
    """The time window (µs) of steps A..B (first op of A to the last device op of B), or
    pad_ms either side of the step gap before step `at_gap`."""
    if not spans:
        raise UserError("plot timeline: a timeline holds no spans")
    dev = device_steps(spans)
    if at_gap is not None:
        if at_gap not in dev or at_gap - 1 not in dev:
            raise UserError(f"plot timeline: --at-gap {at_gap}: steps {at_gap - 1} and {at_gap} "
                            f"need device ops (device steps: {_step_range(dev)})")
        return dev[at_gap - 1][1] - pad_ms * 1e3, dev[at_gap][0] + pad_ms * 1e3
    if steps is None:
        lo, hi = min(dev or [0]), min(dev or [0]) + 3
    else:
        lo, hi = steps
    chosen = [s for s in spans if lo <= s.step <= hi]
    if not chosen:
        raise UserError(f"plot timeline: --steps {lo}:{hi}: no spans there "
                        f"(device steps: {_step_range(dev)})")
    t0 = min(s.start_us for s in chosen)
    ends = [s.end_us for s in chosen if s.lane == "device"] or [s.end_us for s in chosen]
    return t0, max(ends)


def _step_range(dev: dict) -> str:
    return f"{min(dev)}..{max(dev)}" if dev else "none"


def _fmt_us(us: float) -> str:
    return f"{us:.0f} µs" if us < 1000 else f"{us / 1000:.2f} ms"


def timeline_figure(panels: list[Panel], steps: tuple[int, int] | None = None,
                    at_gap: int | None = None, pad_ms: float = 5.0,
                    title: str | None = None) -> Figure:
    """A Gantt chart per panel: lanes as rows, ops coloured, step gaps shaded and labelled.
    Panels with the same row stack on a shared time axis (ms from each panel's window start);
    columns (simulated, measured) stand side by side."""
    if not panels:
        raise UserError("plot timeline: give at least one timeline")
    rows = list(dict.fromkeys(p.row for p in panels))
    cols = list(dict.fromkeys(p.column for p in panels))
    fig = Figure(figsize=(2.0 + 7.2 * len(cols), 0.7 + 1.75 * len(rows)), dpi=DPI,
                 layout="constrained")
    axes = fig.subplots(len(rows), len(cols), sharex="col", squeeze=False)
    seen_ops: dict[str, None] = {}
    widths: dict[int, float] = {}
    for (i, row), (j, col) in itertools.product(enumerate(rows), enumerate(cols)):
        ax = axes[i][j]
        panel = next((p for p in panels if p.row == row and p.column == col), None)
        if panel is None:
            ax.text(0.5, 0.5, "no timeline", transform=ax.transAxes, ha="center", color="grey")
            ax.set_yticks([])
            continue
        t0, t1 = window(panel.spans, steps, at_gap, pad_ms)
        _draw_panel(ax, panel.spans, t0, t1, seen_ops, at_gap)
        gaps = step_gaps(panel.spans)
        mean = f" (mean step gap of the run: {_fmt_us(sum(gaps) / len(gaps))})" if gaps else ""
        ax.set_title(" · ".join(x for x in (col, row) if x) + mean, fontsize=10, loc="left")
        widths[j] = max(widths.get(j, 0.0), (t1 - t0) / 1e3)
    for j, width in widths.items():
        axes[0][j].set_xlim(0, width)   # the column shares it
    for ax in axes[-1]:
        ax.set_xlabel("time from the window's start (ms)")
    order = [op for op in OP_COLORS if op in seen_ops] + [op for op in seen_ops
                                                           if op not in OP_COLORS]
    handles = [Patch(color=OP_COLORS.get(op, "#7f7f7f"), label=op) for op in order]
    handles.append(Patch(color=GAP_COLOR, alpha=0.25, label="step gap (device idle)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6),
               frameon=False, fontsize=8.5)
    where = (f"the step gap before step {at_gap}, ±{pad_ms:g} ms" if at_gap is not None
             else f"steps {steps[0]}–{steps[1]}" if steps else "the first steps")
    fig.suptitle(title or f"Step timeline: {where}", fontsize=11)
    return fig


def _draw_panel(ax, spans: list[Span], t0: float, t1: float, seen_ops: dict,
                at_gap: int | None) -> None:
    # device at the bottom, the engine on top; the front end above it where a server ran
    lanes = [lane for lane in reversed(LANES)
             if lane != "cpu.frontend" or any(s.lane == lane for s in spans)]
    width_ms = (t1 - t0) / 1e3
    for s in spans:
        if s.end_us < t0 or s.start_us > t1 or s.lane not in lanes:
            continue
        y = lanes.index(s.lane)
        a, b = (max(s.start_us, t0) - t0) / 1e3, (min(s.end_us, t1) - t0) / 1e3
        color = OP_COLORS.get(s.op, "#7f7f7f")
        ax.broken_barh([(a, max(b - a, width_ms * 1e-4))], (y - 0.36, 0.72), facecolors=color,
                       edgecolors="white", linewidth=0.3, zorder=2)
        seen_ops.setdefault(s.op, None)
        if s.op == "wait":
            continue
        if s.op == "target_forward" and b - a > 0.06 * width_ms:
            ax.text((a + b) / 2, y, f"step {s.step}", ha="center", va="center", fontsize=7.5,
                    zorder=3)
        elif s.lane != "device" and b - a > 0.025 * width_ms:
            ax.text((a + b) / 2, y, str(s.step), ha="center", va="center", fontsize=6.5,
                    color="white", zorder=3)
    last_label = -math.inf
    for step, a, b in gaps_between(spans):
        if b < t0 or a > t1 or (b - a < 0.5 and step != at_gap):
            continue
        xa, xb = (max(a, t0) - t0) / 1e3, (min(b, t1) - t0) / 1e3
        ax.axvspan(xa, max(xb, xa + width_ms * 2e-3), color=GAP_COLOR, alpha=0.22, lw=0,
                   zorder=1)
        mid = (a + b) / 2
        if t0 <= mid <= t1 and (xa + xb) / 2 - last_label > 0.07 * width_ms:  # no overlaps
            last_label = (xa + xb) / 2
            ax.text(last_label, -0.62, _fmt_us(b - a), ha="center", va="top", fontsize=7.5,
                    color=GAP_COLOR, fontweight="bold")
    ax.set_ylim(-1.0, len(lanes) - 0.45)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8.5)
    ax.grid(axis="x", alpha=0.3)


def window_spans(spans: list[Span], t0: float, t1: float) -> list[Span]:
    """The spans overlapping [t0, t1], clipped to it, with times relative to t0."""
    return [s._replace(start_us=max(s.start_us, t0) - t0, end_us=min(s.end_us, t1) - t0)
            for s in spans if s.end_us >= t0 and s.start_us <= t1]


def chrome_panels(panels: list[Panel], steps=None, at_gap=None, pad_ms: float = 5.0) -> dict:
    """One Chrome-trace/Perfetto document of every panel's window, one process per panel,
    times relative to each window's start so the panels line up."""
    from stepgap.common.formats import chrome_trace

    events = []
    for pid, p in enumerate(panels, 1):
        t0, t1 = window(p.spans, steps, at_gap, pad_ms)
        doc = chrome_trace(window_spans(p.spans, t0, t1),
                           " · ".join(x for x in (p.column, p.row) if x) or "stepgap")
        events += [{**e, "pid": pid} for e in doc["traceEvents"]]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# ---------------------------------------------------------------------------------------------
# Where the time of a step goes (common/breakdown.py)


def breakdown_figure(breakdowns: list, title: str = "") -> Figure:
    """Three panels of stacked bars, one bar per run (sync and async side by side), each op in
    its colour: the mean step (the device's ops solid, its idle time hatched by the op it is
    exposed to); that idle time alone, magnified; and each CPU op's hidden time (the overlap
    that async buys)."""
    fig = Figure(figsize=(5.0 + 2.4 * len(breakdowns), 5.0), dpi=DPI, layout="constrained")
    ax_step, ax_idle, ax_hid = fig.subplots(1, 3, width_ratios=[1.2, 1, 1])
    longest = max(b.window_us / b.steps for b in breakdowns)
    scale, unit = (1e-3, "ms") if longest > 5e3 else (1.0, "µs")
    xs = range(len(breakdowns))
    seen: dict = {}

    def stack(ax, x, parts, s, hatch):
        bottom = 0.0
        for o, v in parts:
            if v <= 0:
                continue
            exposed = o.lane != "device"
            name = f"{o.op} (exposed)" if exposed and o.lane != "idle" else o.op
            ax.bar(x, v * s, bottom=bottom, width=0.6, edgecolor="white", lw=0.5,
                   color=OP_COLORS.get(o.op, "#7f7f7f") if o.op != "(no op)" else "#bdbdbd",
                   hatch=hatch if exposed else None, label=None if name in seen else name)
            seen[name] = True
            bottom += v * s
        return bottom

    for x, b in zip(xs, breakdowns):
        rows = b.rows()
        top = stack(ax_step, x, [(o, (o.busy_us + o.exposed_us) / b.steps) for o in rows],
                    scale, "///")
        ax_step.text(x, top, f"{top:.4g} {unit}", ha="center", va="bottom", fontsize=8)
        idle = stack(ax_idle, x, [(o, o.exposed_us / b.steps) for o in rows
                                  if o.lane != "device"], 1.0, "///")
        ax_idle.text(x, idle, f"{idle:.4g} µs\n({100 * b.idle_us / b.window_us:.1f} %)",
                     ha="center", va="bottom", fontsize=8)
        hidden = stack(ax_hid, x, [(o, o.hidden_us / b.steps) for o in rows
                                   if o.lane not in ("device", "idle")], 1.0, None)
        ax_hid.text(x, hidden, f"{hidden:.4g} µs", ha="center", va="bottom", fontsize=8)
    for ax, what in ((ax_step, f"mean step with its gap ({unit})"),
                     (ax_idle, "device idle per step, by exposed op (µs)"),
                     (ax_hid, "CPU time hidden per step (µs)")):
        ax.set_xticks(list(xs), [b.label for b in breakdowns])
        ax.set_ylabel(what)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    ax_step.set_title("The step: device busy,\nthen idle (hatched)", fontsize=10)
    ax_idle.set_title("Where the idle goes\n(on the critical path)", fontsize=10)
    ax_hid.set_title("CPU work hidden under the\ndevice or a nearer lane", fontsize=10)
    fig.legend(*ax_step.get_legend_handles_labels(), fontsize=7, frameon=False,
               loc="outside right center")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
