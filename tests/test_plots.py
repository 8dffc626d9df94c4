"""Figures of sweeps and timelines: what they show, read off the matplotlib objects."""

import csv
import json
import math

import numpy as np
import pytest
from matplotlib.patches import Rectangle

from stepgap.common import timeline_plots
from stepgap.sim import plots
from stepgap.sim.sweep_table import SweepTable
from stepgap.cli import main
from stepgap.common.errors import UserError
from stepgap.common.formats import Span, save_timeline

MODES = ["sync", "async"]
KS = [0, 1, 2]
CONC = [1, 4, 16]


def tpot(mode, k, c):
    """A made-up TPOT surface: k=2 is best at low load, k=1 at c=16; async saves 0.5 ms."""
    best = 2 if c < 16 else 1
    return 10.0 + abs(k - best) * 2 + c / 4 - (0.5 if mode == "async" else 0.0)


def table(extra_axes=None):
    axes = {"mode": MODES, "k": KS, "max_concurrency": CONC, **(extra_axes or {})}
    rows = []
    for combo in np.ndindex(*(len(v) for v in axes.values())):
        values = {a: axes[a][i] for a, i in zip(axes, combo)}
        rows.append({**values, "mean_tpot_ms": tpot(values["mode"], values["k"],
                                                    values["max_concurrency"])})
    return SweepTable("seed-l20", {"gpu": "l20", "model": "llama-3.1-8b", "workload": "mtbench",
                                   "num_prompts": 80, "output_len": 256}, axes, rows)


def test_best_k_minimises_the_metric_per_mode_and_concurrency():
    view = plots.views(table())[0]
    best = {(b.mode, b.x): b for b in plots.best_k(view)}
    assert {key: b.k for key, b in best.items()} == {
        (m, c): (2 if c < 16 else 1) for m in MODES for c in CONC}
    b = best["async", 1]
    assert b.value == tpot("async", 2, 1)
    assert b.speedup == pytest.approx(tpot("async", 0, 1) / tpot("async", 2, 1))


def test_best_k_maximises_a_throughput():
    t = table()
    for r in t.rows:
        r["output_throughput"] = 100.0 * r["k"]
    assert {b.k for b in plots.best_k(plots.views(t)[0], "output_throughput")} == {2}


def test_best_k_table_prints_one_column_per_mode():
    view = plots.views(table())[0]
    text = plots.format_best_k(view, plots.best_k(view))
    lines = text.splitlines()
    assert lines[0].startswith("best k by mean TPOT (ms)") and "L20" in lines[0]
    assert lines[1].split() == ["concurrency", "sync", "async"]
    assert lines[2].split()[:3] == ["1", "k=2", f"{tpot('sync', 2, 1):.2f}"]
    assert "speedup over k=0" in lines[-1]


def test_tpot_heatmap_has_a_panel_per_mode_with_labels_values_and_best_boxes():
    fig = plots.metric_heatmap(plots.views(table())[0])
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title() for ax in axes] == MODES
    ax = axes[0]
    assert ax.get_xlabel() == "max concurrency (requests in flight)"
    assert "speculation depth k" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"]
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert sorted((p.get_x() + 0.5, p.get_y() + 0.5) for p in boxes) == [(0, 2), (1, 2), (2, 1)]
    assert len(ax.texts) == len(KS) * len(CONC)
    cbar = next(a for a in fig.axes if a.get_label() == "<colorbar>")
    assert cbar.get_ylabel() == "mean TPOT (ms), lower is better"
    assert "Mean TPOT (ms) by speculation depth" in fig.get_suptitle()
    assert "L20" in fig.get_suptitle()


def test_speedup_heatmap_is_diverging_around_one_and_one_at_k0():
    fig = plots.speedup_heatmap(plots.views(table())[0])
    ax = fig.axes[0]
    im = ax.images[0]
    assert im.norm.vcenter == 1.0 and im.norm.vmin == pytest.approx(1 / im.norm.vmax)
    data = np.asarray(im.get_array())
    assert np.allclose(data[0], 1.0)              # k=0 row
    assert data[2, 0] == pytest.approx(tpot("sync", 0, 1) / tpot("sync", 2, 1))
    assert "faster" in next(a for a in fig.axes if a.get_label() == "<colorbar>").get_ylabel()


def test_saving_plot_has_a_line_per_k_and_the_best_k_line():
    fig = plots.saving_plot(plots.views(table())[0])
    ax = fig.axes[0]
    assert ax.get_title() == "async vs sync"
    assert "(%)" in ax.get_ylabel() and ax.get_xlabel().startswith("max concurrency")
    labels = [line.get_label() for line in ax.lines]
    assert labels[:4] == ["k=0", "k=1", "k=2", "each at its best k"]
    k0 = ax.lines[0].get_ydata()
    assert np.allclose(k0, [100 * 0.5 / tpot("sync", 0, c) for c in CONC])


def test_other_axes_give_one_view_each():
    vs = plots.views(table({"gpu": ["h100", "h200"]}))
    assert [v.fixed for v in vs] == [{"gpu": "h100"}, {"gpu": "h200"}]
    assert vs[1].suffix == "__gpu-h200" and "H200" in vs[1].scenario()


def test_a_sweep_without_k_or_load_axis_cannot_be_drawn():
    t = table()
    with pytest.raises(UserError, match="no k axis"):
        plots.views(SweepTable(None, {}, {"mode": MODES}, []))
    with pytest.raises(UserError, match="--x request_rate: not an axis"):
        plots.views(t, "request_rate")
    t.axes = {"k": [1, 2], "max_concurrency": CONC}
    with pytest.raises(UserError, match="needs k=0"):
        plots.speedup_heatmap(plots.views(t)[0])


# -- timelines -----------------------------------------------------------------------------

def sync_spans(steps=6, dev=1000.0, gap=500.0):
    """A sync loop: each step's CPU ops fill the gap before its device step."""
    spans, t = [], 0.0
    for n in range(steps):
        spans += [Span("cpu.engine", "schedule", n, t, t + 100),
                  Span("cpu.worker", "prepare_inputs", n, t + 100, t + 400),
                  Span("cpu.worker", "launch", n, t + 400, t + 600)]
        t += gap
        spans += [Span("device", "target_forward", n, t, t + dev * 0.8),
                  Span("device", "draft_forward", n, t + dev * 0.8, t + dev, {"i": 0}),
                  Span("cpu.worker", "wait", n, t + 100, t + dev)]
        t += dev
    return spans


def test_gaps_between_device_steps():
    gaps = timeline_plots.gaps_between(sync_spans(steps=3))
    assert [(n, b - a) for n, a, b in gaps] == [(1, 500.0), (2, 500.0)]


def test_timeline_figure_stacks_rows_and_labels_gaps():
    panels = [timeline_plots.Panel("sync", "simulated", sync_spans()),
              timeline_plots.Panel("async", "simulated", sync_spans(gap=20.0)),
              timeline_plots.Panel("sync", "measured", sync_spans(gap=700.0))]
    fig = timeline_plots.timeline_figure(panels, steps=(1, 3))
    axes = fig.axes
    assert len(axes) == 4                                  # 2 rows x 2 columns
    assert axes[0].get_title(loc="left") == "simulated · sync (mean step gap of the run: 500 µs)"
    assert axes[1].get_title(loc="left").startswith("measured · sync")
    assert "no timeline" in [t.get_text() for t in axes[3].texts]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["device", "cpu.worker",
                                                                 "cpu.engine"]
    assert axes[0].get_xlabel() == "" and "(ms)" in axes[2].get_xlabel()
    texts = [t.get_text() for t in axes[0].texts]
    assert "500 µs" in texts and "step 2" in texts
    assert "700 µs" in [t.get_text() for t in axes[1].texts]
    assert axes[0].get_xlim() == pytest.approx((0, 4.5))   # schedule of 1 .. device end of 3
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:3] == ["schedule", "prepare_inputs", "launch"]
    assert "step gap (device idle)" in legend


def test_at_gap_zooms_on_one_gap():
    t0, t1 = timeline_plots.window(sync_spans(), at_gap=2, pad_ms=0.1)
    assert (t0, t1) == (3000.0 - 100, 3500.0 + 100)
    with pytest.raises(UserError, match="--at-gap 9"):
        timeline_plots.window(sync_spans(), at_gap=9)
    with pytest.raises(UserError, match="--steps 50:60: no spans"):
        timeline_plots.window(sync_spans(), steps=(50, 60))


def test_plot_timeline_command_writes_png_and_chrome_trace(tmp_path, capsys):
    save_timeline(tmp_path / "s.jsonl", sync_spans())
    save_timeline(tmp_path / "m.jsonl", sync_spans(gap=300.0))
    png, chrome = tmp_path / "tl.png", tmp_path / "tl.json"
    assert main(["plot", "timeline", f"simulated/sync={tmp_path / 's.jsonl'}",
                 f"measured/sync={tmp_path / 'm.jsonl'}", "--steps", "1:2", "--out", str(png),
                 "--chrome", str(chrome), "--quiet"]) == 0
    assert png.stat().st_size > 10_000
    events = json.loads(chrome.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"simulated · sync", "measured · sync"}
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {1, 2}
    assert min(e["ts"] for e in spans if e["pid"] == 1) == 0      # relative to the window
    assert main(["plot", "timeline", str(tmp_path / "s.jsonl"), "--steps", "1:2",
                 "--at-gap", "2", "--out", str(png)]) == 2
    assert "not both" in capsys.readouterr().err


def test_plot_sweep_command_on_a_saved_table(tmp_path, capsys):
    t = table()
    for r in t.rows:
        r.update({m: math.nan for m in ("p99_tpot_ms",)})
    t.save(tmp_path)
    assert main(["plot", "sweep", str(tmp_path), "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "best_k.csv", "heatmap_mean_tpot_ms.png", "saving_mean_tpot_ms.png",
        "speedup_mean_tpot_ms.png"]
    assert main(["plot", "sweep", str(tmp_path), "--metric", "tpot"]) == 2
    assert "unknown metric 'tpot'" in capsys.readouterr().err
    assert main(["plot", "sweep", str(tmp_path / "nothing")]) == 2
    assert "no sweep here" in capsys.readouterr().err


@pytest.mark.parametrize("name, magic", [("tl.png", b"\x89PNG"), ("tl.svg", b"<?xml"),
                                         ("tl.pdf", b"%PDF"), ("TL.SVG", b"<?xml")])
def test_plot_timeline_writes_the_format_its_name_asks_for(name, magic, tmp_path):
    """--out x.svg is an SVG (it used to hold PNG bytes), the same bytes each time."""
    save_timeline(tmp_path / "s.jsonl", sync_spans())
    out = tmp_path / name
    assert main(["plot", "timeline", str(tmp_path / "s.jsonl"), "--out", str(out),
                 "--quiet"]) == 0
    first = out.read_bytes()
    assert first.startswith(magic)
    assert main(["plot", "timeline", str(tmp_path / "s.jsonl"), "--out", str(out),
                 "--quiet"]) == 0
    assert out.read_bytes() == first


@pytest.mark.parametrize("name", ["tl.jpg", "tl", "tl.png.txt"])
def test_plot_timeline_refuses_a_figure_name_of_another_format(name, tmp_path, capsys):
    save_timeline(tmp_path / "s.jsonl", sync_spans())
    out = tmp_path / name
    assert main(["plot", "timeline", str(tmp_path / "s.jsonl"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: a figure is written as PNG, SVG or PDF" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_plot_sweep_leaves_cells_whose_metric_is_not_finite_blank(tmp_path, capsys):
    """A cell whose metric is infinite or NaN is neither drawn nor taken as the best k; a
    facet without a finite value gets no figures; a sweep without one is one error naming the
    file and the metric, and nothing is written."""
    t = table({"tensor_parallel_size": [1, 2]})
    for r in t.rows:
        if r["k"] == 2 or r["tensor_parallel_size"] == 2:
            r["mean_tpot_ms"] = math.inf if r["mode"] == "sync" else math.nan
    t.save(tmp_path)
    assert main(["plot", "sweep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no finite value of mean_tpot_ms at TP 2: no figures of it" in out
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "heatmap_mean_tpot_ms__tensor_parallel_size-1.png" in names
    assert not any("size-2" in n for n in names)
    with open(tmp_path / "plots" / "best_k.csv") as f:
        best = list(csv.DictReader(f))
    assert best and {r["tensor_parallel_size"] for r in best} == {"1"}
    assert {r["best_k"] for r in best} <= {"0", "1"}   # never the infinite k = 2
    for r in t.rows:
        r["mean_tpot_ms"] = math.inf
    t.save(tmp_path / "all")
    assert main(["plot", "sweep", str(tmp_path / "all")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'all' / 'sweep.json'}: field 'rows[*].mean_tpot_ms': no finite " \
           "value" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "all" / "plots").exists()


def test_plot_help_explains_every_option_with_examples():
    from stepgap.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    plot = next(a for a in sub.choices["plot"]._actions if a.dest == "what")
    for name, needle in (("sweep", "stepgap plot sweep out/seed-l20"),
                         ("timeline", "[COLUMN/]ROW=PATH")):
        p = plot.choices[name]
        text = p.format_help()
        assert "examples:" in text and needle in text
        for action in p._actions:
            assert action.help, action.option_strings
