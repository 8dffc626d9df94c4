"""Pictures of sweeps: heatmaps, the async saving, the best k.

Every function returns a matplotlib `Figure` built without pyplot, so it works on any backend
(the CLI saves PNGs with common/timeline_plots.py `save`; a notebook displays the figure).
Conventions: titled, axes labelled with units, colour bars labelled with the direction that is
better. The step timelines are common/timeline_plots.py's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from stepgap.sim.sweep_table import X_AXES, SweepTable
from stepgap.common.errors import UserError, where
from stepgap.common.timeline_plots import DPI

LABELS = {
    "max_concurrency": "max concurrency (requests in flight)",
    "request_rate": "request rate (req/s)",
    "shared_fraction": "shared fraction of the prompt",
    "mean_tpot_ms": "mean TPOT (ms)", "median_tpot_ms": "median TPOT (ms)",
    "p99_tpot_ms": "P99 TPOT (ms)", "mean_itl_ms": "mean ITL (ms)", "p99_itl_ms": "P99 ITL (ms)",
    "mean_ttft_ms": "mean TTFT (ms)", "p99_ttft_ms": "P99 TTFT (ms)",
    "mean_e2el_ms": "mean E2EL (ms)", "output_throughput": "output throughput (tok/s)",
    "request_throughput": "request throughput (req/s)",
    "total_token_throughput": "total token throughput (tok/s)",
    "mean_step_gap_us": "mean step gap (µs)", "acceptance_length": "acceptance length (tokens)",
    "prefix_cache_hit_rate": "prefix-cache hit rate (of prompt tokens)",
}


# The x axes in a phrase ("the best k for each ...")
X_WORDS = {"max_concurrency": "concurrency", "request_rate": "request rate",
           "shared_fraction": "shared fraction"}


def x_topic(x: str) -> str:
    """What a figure's x axis varies, for its title: the load, or the shared fraction."""
    return "the shared fraction of the prompt" if x == "shared_fraction" else "load"


def label(metric: str) -> str:
    return LABELS.get(metric, metric)


def lower_is_better(metric: str) -> bool:
    return not ("throughput" in metric or metric in ("acceptance_length",
                                                     "prefix_cache_hit_rate"))


# -------------------------------------------------------------------------------------------
# Sweeps


@dataclass(slots=True)
class View:
    """One facet of a sweep: the rows with fixed values of every axis but mode, k and x."""

    table: SweepTable
    x: str                  # the concurrency axis
    modes: list             # the mode axis' values, or the base mode
    ks: list
    xs: list
    fixed: dict             # facet axis -> value

    def value(self, metric: str, mode, k, x) -> float:
        """The metric of one cell; NaN where it has none or it is not finite (an infinite
        TPOT, a NaN a run gives when it completed nothing): such a cell is left blank, never
        drawn nor taken as the best k."""
        coords = {**self.fixed, "k": k, self.x: x}
        if "mode" in self.table.axes:
            coords["mode"] = mode
        v = self.table.value(metric, **coords)
        return float(v) if v is not None and math.isfinite(v) else math.nan

    def matrix(self, metric: str, mode) -> np.ndarray:
        """metric[k index, x index]."""
        return np.array([[self.value(metric, mode, k, x) for x in self.xs] for k in self.ks])

    @property
    def suffix(self) -> str:
        return "".join(f"__{k}-{_slug(v)}" for k, v in self.fixed.items())

    def scenario_parts(self) -> list[str]:
        t = self.table
        get = lambda key: self.fixed.get(key, t.setting(key))  # noqa: E731
        method = get("method")
        model = get("model") + (f" + {METHOD_NAMES.get(method, method)}"
                                if any(k > 0 for k in self.ks) and "method" not in self.fixed
                                else "")
        tp = get("tensor_parallel_size")
        parts = [str(get("gpu")).upper(), *([f"TP {tp}"] if tp and tp > 1 else []), model,
                 f"{get('workload')} {get('num_prompts') or ''} prompts".replace("  ", " ")]
        if get("output_len"):
            parts[-1] += f" × {get('output_len')} tokens"
        parts += [self.facet_label(k) for k in self.fixed
                  if k not in ("gpu", "model", "tensor_parallel_size")]
        if t.preset:
            parts.insert(0, f"preset {t.preset}")
        return parts

    def scenario(self) -> str:
        """One line that says what the sweep held fixed."""
        return ", ".join(self.scenario_parts())

    def facet_label(self, key: str) -> str:
        v = self.fixed[key]
        return {"tensor_parallel_size": f"TP {v}", "method": f"method {v}"}.get(key, f"{key}={v}")

    @property
    def label(self) -> str:
        """This facet's values, for a row of panels."""
        return ", ".join(self.facet_label(k) for k in self.fixed)


METHOD_NAMES = {"eagle3": "EAGLE-3", "eagle": "EAGLE", "mtp": "MTP", "draft_model": "draft model",
                "ngram": "n-gram", "ngram_gpu": "n-gram (GPU)"}


def _as_views(view) -> list[View]:
    return list(view) if isinstance(view, (list, tuple)) else [view]


def common_scenario(views: list[View]) -> str:
    """The scenario parts every view shares (the rest is on each row's label)."""
    first, rest = views[0].scenario_parts(), [set(v.scenario_parts()) for v in views[1:]]
    return ", ".join(p for p in first if all(p in r for r in rest))


def plot_axis(axes: dict, x: str | None = None, who: str = "plot sweep") -> str:
    """The x axis of a sweep's figures (`x`, or the first of X_AXES the sweep has), or an error
    when the sweep (its `axes`) cannot be drawn: checked by `sweep --plot` before it runs."""
    if "k" not in axes:
        raise UserError(f"{who}: the sweep has no k axis (sweep with --grid k=0..6)")
    if x is None:
        x = next((a for a in X_AXES if a in axes), None)
        if x is None:
            raise UserError(f"{who}: the sweep has no {', '.join(X_AXES[:-1])} or "
                            f"{X_AXES[-1]} axis to draw along (add one: --grid "
                            "max_concurrency=1..64:x2)")
    elif x not in axes:
        raise UserError(f"{who}: --x {x}: not an axis of the sweep (axes: {', '.join(axes)})")
    return x


def views(table: SweepTable, x: str | None = None) -> list[View]:
    """One view per combination of the axes other than mode, k and the concurrency axis."""
    x = plot_axis(table.axes, x)
    modes = table.axes.get("mode", [table.setting("mode")])
    others = [a for a in table.axes if a not in ("mode", "k", x)]
    out = []
    for combo in itertools.product(*(table.axes[a] for a in others)):
        out.append(View(table, x, list(modes), sorted(table.axes["k"]),
                        sorted(table.axes[x]), dict(zip(others, combo))))
    return out


@dataclass(slots=True)
class BestK:
    fixed: dict
    mode: str
    x: float
    k: int
    value: float      # the metric at the best k
    speedup: float    # over k = 0 in the same mode, > 1 better (nan without a k=0 cell)


def best_k(view: View, metric: str = "mean_tpot_ms") -> list[BestK]:
    """For each mode and concurrency, the k with the best metric (the smaller k on a tie)."""
    lower = lower_is_better(metric)
    out = []
    for mode in view.modes:
        m = view.matrix(metric, mode)
        for j, x in enumerate(view.xs):
            col = m[:, j]
            if np.all(np.isnan(col)):
                continue
            i = int(np.nanargmin(col) if lower else np.nanargmax(col))
            base = view.value(metric, mode, 0, x) if 0 in view.ks else math.nan
            speedup = (base / col[i] if lower else col[i] / base) if base and col[i] \
                else math.nan
            out.append(BestK(view.fixed, mode, x, view.ks[i], float(col[i]), float(speedup)))
    return out


def format_best_k(view: View, rows: list[BestK], metric: str = "mean_tpot_ms") -> str:
    """The best k per concurrency as a text table, one column per mode."""
    head = f"best k by {label(metric)}" + (f" ({view.scenario()})" if view.scenario() else "")
    has_base = 0 in view.ks
    cells = {(r.mode, r.x): f"k={r.k}  {r.value:7.2f}" + (f"  ({r.speedup:.2f}x)"
                                                           if has_base else "") for r in rows}
    width = max([len(c) for c in cells.values()] + [len(str(m)) for m in view.modes]) + 3
    xname = {"max_concurrency": "concurrency", "request_rate": "rate (req/s)"}.get(
        view.x, X_WORDS[view.x])
    first = max(14, len(xname) + 2)
    lines = [head, f"{xname:<{first}}" + "".join(f"{str(m):<{width}}" for m in view.modes)]
    for x in view.xs:
        lines.append(f"{_fmt_x(x):<{first}}" + "".join(f"{cells.get((m, x), '-'):<{width}}"
                                                        for m in view.modes))
    if has_base:
        lines.append("(in parentheses: speedup over k=0 in the same mode)")
    return "\n".join(lines)


def wrapped(text: str, fig: Figure, per_inch: float = 12) -> str:
    """A title line broken to the figure's width (about 12 characters an inch at 11 pt), so that
    a long workload spec is not cut off."""
    import textwrap
    return textwrap.fill(text, width=max(40, int(per_inch * fig.get_figwidth())))


def _fmt_x(x) -> str:
    return "inf" if x == math.inf else (f"{x:g}" if isinstance(x, float) else str(x))


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _slug(v) -> str:
    return str(v).replace("/", "_").replace(" ", "")


def _annotate(ax, m: np.ndarray, norm, cmap, fmt: str) -> None:
    for i, j in itertools.product(range(m.shape[0]), range(m.shape[1])):
        v = m[i, j]
        if np.isnan(v):
            continue
        r, g, b, _ = cmap(norm(v))
        dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
        ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7.5,
                color="white" if dark else "black")


def _heatmap_panels(rows: list, norm, cmap, fmt: str, cbar_label: str, title: str) -> Figure:
    """One row of panels per facet (view), one column per mode, on one colour scale. `rows`:
    (view, {mode: matrix}, {(mode, x): best k})."""
    view = rows[0][0]
    n, multi = len(view.modes), len(rows) > 1
    fig = Figure(figsize=(1.6 + 0.62 * len(view.xs) * n + 1.2,
                          1.9 + (0.42 * len(view.ks) + 0.5 * multi) * len(rows)),
                 dpi=DPI, layout="constrained")
    grid = fig.subplots(len(rows), n, sharey=True, squeeze=False)
    im = None
    for axes, (v, mats, best) in zip(grid, rows):
        for ax, mode in zip(axes, v.modes):
            m = mats[mode]
            im = ax.imshow(m, origin="lower", cmap=cmap, norm=norm, aspect="auto")
            _annotate(ax, m, norm, cmap, fmt)
            for j, x in enumerate(v.xs):
                if (mode, x) in best:
                    i = v.ks.index(best[mode, x])
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2.2,
                                           edgecolor="black"))
            ax.set_title(f"{mode} · {v.label}" if multi else f"{mode}", fontsize=11)
            ax.set_xticks(range(len(v.xs)), [_fmt_x(x) for x in v.xs])
            ax.set_yticks(range(len(v.ks)), [str(k) for k in v.ks])
            ax.set_xlabel(label(v.x))
        axes[0].set_ylabel("speculation depth k (draft tokens per step)")
    cb = fig.colorbar(im, ax=list(grid.ravel()), shrink=0.95, pad=0.02)
    cb.set_label(cbar_label)
    fig.legend(handles=[Patch(fill=False, edgecolor="black", lw=2.2,
                              label=f"best k for each {X_WORDS[view.x]}")],
               loc="outside lower center", frameon=False, fontsize=9)
    scenario = common_scenario([r[0] for r in rows]) if multi else view.scenario()
    fig.suptitle(f"{title}\n{wrapped(scenario, fig)}", fontsize=11)
    return fig


def metric_heatmap(view, metric: str = "mean_tpot_ms") -> Figure:
    """The metric over k × concurrency, one panel per mode (a row per view when given a list
    of views: e.g. TP 4 above TP 8), best k boxed."""
    rows = [(v, {mode: v.matrix(metric, mode) for mode in v.modes},
             {(r.mode, r.x): r.k for r in best_k(v, metric)}) for v in _as_views(view)]
    vals = np.concatenate([m.ravel() for _, mats, _ in rows for m in mats.values()])
    vals = vals[~np.isnan(vals)]
    if not vals.size:
        raise UserError(no_finite(metric, _as_views(view)))
    lower = lower_is_better(metric)
    cmap = colormaps["YlOrRd" if lower else "YlGn"]
    norm = Normalize(vals.min(), vals.max())
    better = "lower is better" if lower else "higher is better"
    return _heatmap_panels(rows, norm, cmap, ".1f" if vals.max() < 1000 else ".0f",
                           f"{label(metric)}, {better}",
                           f"{_cap(label(metric))} by speculation depth and "
                           f"{x_topic(rows[0][0].x)}")


def no_finite(metric: str, views: list[View]) -> str:
    """The error of a metric with no finite value to draw, naming the facets."""
    facets = "; ".join(v.label for v in views if v.label)
    source = views[0].table.path if views else None
    return (f"plot sweep: {where(source, field=f'rows[*].{metric}') if source else metric}: "
            "no finite value to draw" + (f" ({facets})" if facets else "")
            + "; every row has none, NaN or an infinity (choose another --metric)")


def has_finite(view: View, metric: str) -> bool:
    """Whether any cell of the view has a finite value of the metric."""
    return any(not math.isnan(view.value(metric, mode, k, x))
               for mode in view.modes for k in view.ks for x in view.xs)


def speedups(view: View, metric: str) -> dict:
    """mode -> the speedup over k = 0 of each cell (NaN where either has no finite value)."""
    lower = lower_is_better(metric)
    mats = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for mode in view.modes:
            m = view.matrix(metric, mode)
            base = m[view.ks.index(0)][None, :]
            ratio = base / m if lower else m / base
            mats[mode] = np.where(np.isfinite(ratio) & (ratio > 0), ratio, np.nan)
    return mats


def has_speedup(view: View, metric: str) -> bool:
    """Whether the view has k = 0 and some finite speedup over it."""
    return 0 in view.ks and any((~np.isnan(m)).any() for m in speedups(view, metric).values())


def speedup_heatmap(view, metric: str = "mean_tpot_ms") -> Figure:
    """Speedup over k = 0 in the same mode (> 1: speculation pays), one panel per mode (and
    a row per view)."""
    views = _as_views(view)
    if any(0 not in v.ks for v in views):
        raise UserError("plot sweep: a speedup over k=0 needs k=0 in the grid")
    rows = [(v, speedups(v, metric), {(r.mode, r.x): r.k for r in best_k(v, metric)})
            for v in views]
    vals = np.concatenate([m.ravel() for _, mats, _ in rows for m in mats.values()])
    vals = vals[~np.isnan(vals)]
    if not vals.size:
        raise UserError(f"plot sweep: no speedup of {metric} over k=0 is finite (the cells "
                        "of k=0, or of every other k, have no finite value)")
    # Symmetric on a ratio scale: a 2x slowdown is as red as a 2x speedup is blue.
    hi = max(vals.max(), 1 / vals.min(), 1.05)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=1 / hi, vmax=hi)
    return _heatmap_panels(rows, norm, colormaps["RdBu"], ".2f",
                           f"speedup of {label(metric).split(' (')[0]} over k=0 (×); "
                           "blue > 1 is faster",
                           f"Speedup of {label(metric).split(' (')[0]} from speculation over "
                           "k=0, same mode")


def saving_plot(view, metric: str = "mean_tpot_ms") -> Figure:
    """What async (and zero-bubble) save over sync, in % of sync's metric, against concurrency:
    one line per k, and a black line for each mode at its own best k against sync's best k.
    A list of views gives a row of panels per view, on one y axis."""
    views = _as_views(view)
    view = views[0]
    others = [m for m in view.modes if m != "sync"]
    if "sync" not in view.modes or not others:
        raise UserError("plot sweep: the saving over sync needs mode=sync and another mode")
    lower, multi = lower_is_better(metric), len(views) > 1
    fig = Figure(figsize=(1.5 + 4.6 * len(others), 0.6 + 3.8 * len(views)), dpi=DPI,
                 layout="constrained")
    grid = fig.subplots(len(views), len(others), sharey=True, squeeze=False)
    cmap = colormaps["viridis"]
    kn = Normalize(min(view.ks), max(max(view.ks), 1))
    for axes, v in zip(grid, views):
        best = {(r.mode, r.x): r.value for r in best_k(v, metric)}
        xs = np.array(v.xs, dtype=float)
        for ax, mode in zip(axes, others):
            for k in v.ks:
                s = np.array([v.value(metric, "sync", k, x) for x in v.xs])
                a = np.array([v.value(metric, mode, k, x) for x in v.xs])
                saving = 100 * ((s - a) if lower else (a - s)) / s
                ax.plot(xs, saving, marker="o", ms=3.5, lw=1.4, color=cmap(kn(k)),
                        label=f"k={k}")
            s = np.array([best.get(("sync", x), math.nan) for x in v.xs])
            a = np.array([best.get((mode, x), math.nan) for x in v.xs])
            ax.plot(xs, 100 * ((s - a) if lower else (a - s)) / s, color="black", lw=2.4,
                    ls="--", label="each at its best k")
            ax.axhline(0, color="grey", lw=0.8)
            if xs.min() > 0 and xs.max() / xs.min() >= 8 and np.isfinite(xs).all():
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs, [_fmt_x(x) for x in v.xs])
                ax.minorticks_off()
            ax.set_xlabel(label(v.x))
            ax.set_title(f"{mode} vs sync" + (f" · {v.label}" if multi else ""))
            ax.grid(alpha=0.3)
        name = label(metric).split(" (")[0]
        axes[0].set_ylabel(f"saving in {name} over sync (%)\n(> 0: {', '.join(others)} "
                           "faster)")
    grid[0][-1].legend(title="speculation depth", fontsize=8, title_fontsize=8,
                       loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    scenario = common_scenario(views) if multi else view.scenario()
    fig.suptitle(f"What async scheduling saves over sync, by {x_topic(view.x)}\n"
                 f"{wrapped(scenario, fig)}",
                 fontsize=11)
    return fig


# -------------------------------------------------------------------------------------------
# stepgap advise


def advise_figure(advice) -> Figure:
    """The best k of sync and async (their bands as bars) and what async and zero-bubble save
    (their bands shaded), against the load points of a `stepgap advise` answer."""
    from stepgap.sim.advise_report import near_best
    answers = advice.answers
    xs = np.arange(len(answers))
    fig = Figure(figsize=(11.5, 4.4), dpi=DPI, layout="constrained")
    ax_k, ax_s = fig.subplots(1, 2)
    for j, (mode, color) in enumerate((("sync", "tab:blue"), ("async", "tab:orange"))):
        b = [a.modes[mode].best_k for a in answers]
        v = np.array([x.value for x in b], dtype=float)
        lo = v - np.array([x.low for x in b], dtype=float)
        hi = np.array([x.high for x in b], dtype=float) - v
        off = (j - 0.5) * 0.12
        ax_k.errorbar(xs + off, v, yerr=[lo, hi], fmt="o-", color=color, capsize=4, lw=1.6,
                      label=f"{mode} (bar: the best k over the inputs' range)")
        near = [near_best(a.modes[mode].grid) for a in answers]
        ax_k.fill_between(xs + off, [min(n) - 0.15 for n in near], [max(n) + 0.15 for n in near],
                          color=color, alpha=0.15, lw=0,
                          label=f"{mode}: k within 1 % of its best mean TPOT")
    ax_k.set_ylim(min(advice.ks) - 0.5, max(advice.ks) + 0.5)
    ax_k.set_yticks(advice.ks)
    ax_k.set_ylabel("best k by mean TPOT (draft tokens per step)")
    ax_k.set_title("Best speculation depth")
    for mode, key, color in (("async", "async_saving", "tab:orange"),
                             ("zero-bubble", "zero_bubble_saving", "tab:green")):
        b = [getattr(a, key) for a in answers]
        v = 100 * np.array([x.value for x in b])
        ax_s.plot(xs, v, "o-", color=color, lw=1.8,
                  label=f"{mode}: saving over {'sync' if mode == 'async' else 'async'}")
        ax_s.fill_between(xs, [100 * x.low for x in b], [100 * x.high for x in b],
                          color=color, alpha=0.2, lw=0, label=f"{mode}: band")
    ax_s.axhline(0, color="grey", lw=0.8)
    ax_s.set_ylabel("saving in mean TPOT, each mode at its best k (%)")
    ax_s.set_title("What async scheduling saves")
    for ax in (ax_k, ax_s):
        ax.set_xticks(xs, [a.label for a in answers], rotation=20 if len(answers) > 6 else 0)
        ax.set_xlabel("load")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, frameon=False)
    r = advice.rests_on
    what = f"{r['model']}" + (f" + {r['draft']}" if r.get("draft") else "") + \
        f" on {r['gpu']}, {r['workload']}"
    bands = ", ".join(i.name for i in advice.inputs) or "none"
    # NOTE: wrapped at 10 characters an inch: a model id and a workload of lower-case letters
    # run wider than the 12 of `wrapped`'s default, and a suptitle wider than the figure is
    # cut at both ends
    fig.suptitle(wrapped(f"stepgap advise: {what}", fig, per_inch=10) + "\n" +
                 wrapped(f"bands: {bands} at the ends of their ranges "
                         "(docs/explanation/bands.md)", fig, per_inch=10), fontsize=11)
    return fig
