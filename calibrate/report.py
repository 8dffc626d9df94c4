"""The report of a judged measured folder: report.md, tpot.png, timeline.png, simulated/.

`write_report` re-simulates the folder (calibrate/judge.py), writes the simulated results, the
tables (every cell's errors, the savings, the known misses and whether they hold) and the two
figures. It writes nothing into the folder's manifest or its known_misses.toml.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stepgap.calibrate.judge import (RULES, SAVING_BOUND, SYNC_ONLY_MISSES, SYNC_ONLY_PROFILE,
                                     Verdict, bound_failures, bounds_of, judge_folder,
                                     load_known_misses, rules_for, saving_cell, savings)
from stepgap.common.fileio import read_json_object, write_text
from stepgap.common.formats import load_timeline, save_result, save_timeline
from stepgap.sim.profile import load_profile

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROW_METRICS = ("mean_tpot_ms", "mean_itl_ms", "p99_tpot_ms")   # each cell's row: measured / simulated, error
TIMELINE_STEPS = (60, 100)   # the steps of the timeline cells kept, when the manifest says none


def _pct(e: float | None) -> str:
    return "-" if e is None or not math.isfinite(e) else f"{100 * e:+.1f} %"


def _mark(ok: bool) -> str:
    return "pass" if ok else "**MISS**"


def report_table(verdicts: list[Verdict], rules: str = "engine") -> str:
    """The errors per cell, markdown. Under vLLM's rules (calibrate/judge.py RULES) the
    measured P99 TPOT's 95 % interval is a column, and a simulated P99 inside it passes."""
    interval = RULES[rules]["p99_interval"]
    head = ("| mode | k | conc | mean TPOT ms: measured / simulated | error | mean ITL ms: "
            "measured / simulated | error | P99 TPOT ms: measured / simulated | error | "
            + ("measured P99 95 % interval | " if interval else "") +
            "median step gap µs: measured / simulated | gap KS | device vs profile | bounds |")
    lines = [head, "|" + "---|" * (14 if interval else 13)]
    for v in verdicts:
        c, m, s, e = v.cell, v.measured, v.simulated, v.errors
        gm, gs = m.step_gaps, s.step_gaps
        ks = v.comparison["ks"]
        dev = c.info.get("device_vs_profile")
        iv, passed = v.p99_interval, dict(v.passed)
        cols = ""
        if interval:
            cols = "- | " if iv is None else f"{iv[0]:.3f}–{iv[1]:.3f} | "
            if iv is not None and iv[0] <= s.metrics.percentile("tpot", 99) <= iv[1]:
                passed["p99_tpot_ms"] = True
        mark = _mark(True) if all(passed.values()) else \
            ", ".join(n for k, n, _ in bounds_of(rules) if not passed[k]) + " MISS"
        lines.append(
            f"| {c.mode} | {c.k} | {c.conc} "
            + "".join(f"| {m.metrics.get(k):.3f} / {s.metrics.get(k):.3f} | {_pct(e[k])} "
                      for k in ROW_METRICS)
            + f"| {cols}{gm.median_us or 0:.0f} / {gs.median_us or 0:.0f} "
            f"| {'-' if ks is None else f'{ks:.2f}'} | {_pct(dev)} | {mark} |")
    return "\n".join(lines)


def savings_table(rows: list[dict]) -> str:
    lines = ["| saving over sync (mean ITL) | k | conc | measured ms (% of sync) | ± 95 % "
             "| simulated ms | error (of the saving) | bound 25 % | simulated within ± 95 % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        half = r.get("half_width_ms")
        lines.append(f"| {r['mode']} | {r['k']} | {r['conc']} | {r['measured_ms']:.3f} "
                     f"({r['measured_pct']:.1f} %) | "
                     f"{'-' if half is None else f'{half:.3f}'} | {r['simulated_ms']:.3f} "
                     f"| {_pct(r['error'])} | {_mark(r['passed'])} | "
                     f"{'yes' if r.get('within_noise') else 'no'} |")
    return "\n".join(lines)


def summary_counts(verdicts: list[Verdict], saving_rows: list[dict],
                   rules: str = "engine") -> str:
    n = len(verdicts)
    parts = [f"{sum(v.passed[k] for v in verdicts)}/{n} cells within ±{100 * b:g} % on {name}"
             for k, name, b in bounds_of(rules)]
    if RULES[rules]["p99_interval"]:
        inside = sum(v.p99_interval is not None
                     and v.p99_interval[0] <= v.simulated.metrics.percentile("tpot", 99)
                     <= v.p99_interval[1]
                     for v in verdicts)
        parts.append(f"{inside}/{n} simulated P99 TPOT inside the measured 95 % interval")
    if saving_rows:
        parts.append(f"{sum(r['passed'] for r in saving_rows)}/{len(saving_rows)} savings "
                     f"within {100 * SAVING_BOUND:g} %")
        parts.append(f"{sum(bool(r.get('within_noise')) for r in saving_rows)}/"
                     f"{len(saving_rows)} simulated savings within the measured saving's 95 % "
                     "interval")
    return "; ".join(parts)


def write_report(folder: Path, command: str | None = None, quiet: bool = False) -> list:
    """Re-simulate the folder's cells, judge them, and write report.md, tpot.png,
    timeline.png and simulated/. Returns the verdicts."""
    from stepgap.common import timeline_plots

    man_path = folder / "manifest.json"
    tl = read_json_object(man_path, "a measured folder's manifest").get("timeline") or {} \
        if man_path.is_file() else {}
    tl_cells = tuple(tl.get("cells", []))
    setup, verdicts, spans = judge_folder(folder, tl_cells)
    rows = savings(verdicts)
    for v in verdicts:   # without the per-request lists and every gap
        sim = replace(v.simulated, requests=None,
                      step_gaps=replace(v.simulated.step_gaps, values_us=None))
        save_result(folder / "simulated" / f"{v.cell.name}.json", sim)
    points = [{"mode": v.cell.mode, "k": v.cell.k, "conc": v.cell.conc,
               "measured": v.measured, "simulated": v.simulated} for v in verdicts]
    timeline_plots.save(sim_vs_measured_figure(points), folder / "tpot.png")
    panels = []
    lo, hi = tl.get("steps") or TIMELINE_STEPS
    for name, sp in spans.items():
        mode = name.split("-k")[0]
        tl = folder / "timelines" / f"{name}.measured.jsonl"
        sim_sp = [s for s in sp if lo <= s.step < hi]
        save_timeline(folder / "timelines" / f"{name}.simulated.jsonl", sim_sp)
        if tl.is_file():
            panels.append(timeline_plots.Panel(mode, "measured", load_timeline(tl)))
        panels.append(timeline_plots.Panel(mode, "simulated", sim_sp))
    common = set.intersection(*({s.step for s in p.spans if s.lane == "device"}
                                for p in panels)) if panels else set()
    if common:
        order = {"sync": 0, "async": 1, "zero-bubble": 2}
        panels.sort(key=lambda p: (order.get(p.row, 9), p.column))
        steps = sorted(common)
        mid = steps[len(steps) // 2]
        mid = mid if mid + 2 in common else steps[max(0, len(steps) - 3)]
        k, conc = tl_cells[0].split("-k")[1].split("-c")
        fig = timeline_plots.timeline_figure(
            panels, steps=(mid, min(mid + 2, steps[-1])),
            title=f"{setup.manifest.get('title', setup.manifest.get('device', ''))}, k={k}, "
                  f"concurrency {conc}: steps {mid}–{min(mid + 2, steps[-1])}, measured and "
                  "simulated")
        timeline_plots.save(fig, folder / "timeline.png")
    text = report_text(setup, verdicts, rows, command)
    write_text(folder / "report.md", text)
    if not quiet:
        print(report_table(verdicts, rules_for(setup)))
        print()
        print(savings_table(rows))
        print()
        print(summary_counts(verdicts, rows, rules_for(setup)))
        fails = bound_failures(verdicts, rows, load_known_misses(folder), rules_for(setup))
        print(f"\n{len(fails)} bound(s) broken beyond known_misses.toml" +
              "".join(f"\n  {f}" for f in fails))
        print(f"\nreport: {folder / 'report.md'}")
    return verdicts


def report_text(setup, verdicts, rows, command) -> str:
    man = setup.manifest
    machine = man.get("machine", {})
    load = man.get("load_avg_1m", {})
    lines = [f"# Simulated against measured: {man.get('device', 'cpu')}", ""]
    if man.get("traces"):
        lines += [
            f"- machine: {machine.get('cpu', '?')}, {machine.get('cpus', '?')} CPUs, "
            f"{machine.get('platform', '')}; Python {machine.get('python', '?')}, torch "
            f"{machine.get('torch', '?')}",
            f"- load average (1 min) during the runs: {load.get('min')}–{load.get('max')} "
            f"(mean {load.get('mean')})" + other_cpu_line(man.get("other_cpu")),
            f"- commit {man.get('commit')}, {man.get('created')}; engine and calibration runs "
            f"took {man.get('wall_s')} s",
            f"- measured: `{man.get('command')}`",
            f"- judged trace: {man['traces']['judged']} ({man['traces']['judged_prompts']} "
            f"prompts); each cell ran {man.get('repeats')} "
            f"time{'s' * (man.get('repeats') != 1)} on slices of {man.get('slice')} prompts, "
            "pooled as one benchmark",
            f"- calibration: {man['traces']['calibration']}, {man['traces']['calibration_runs']}"
            " runs interleaved with the judged ones, plus the microbenchmark grid "
            "(profile.json); one profile for every cell",
            f"- simulator: executor={setup.settings.get('executor')}, "
            f"device={setup.settings.get('device')}, the profile's device fits and CPU costs, "
            "each run's own accepted counts replayed",
        ]
    if man.get("note"):
        lines.append(f"- {man['note']}")
    if command:
        lines.append(f"- report: `{command}`")
    rules = rules_for(setup)
    bounds = ", ".join(f"{name} within ±{100 * b:g} %" for _, name, b in bounds_of(rules))
    if RULES[rules]["prefix"]:
        bounds += ", every run's prefix-cache queries and hits exactly the engine's"
    lines += ["", f"Bounds: {bounds}; the saving of async and zero-bubble over sync (mean ITL) "
              f"within {100 * SAVING_BOUND:g} % of its size. Errors are (simulated − measured) "
              "/ measured. *device vs profile*: how much longer the judged runs' device ops "
              "took than the profile predicts for the same steps (the machine's drift; a "
              "diagnostic, not used by the simulator).", "",
              f"**{summary_counts(verdicts, rows, rules)}**", "",
              report_table(verdicts, rules), "",
              savings_table(rows), "", *prefix_section(verdicts, rules),
              "![simulated against measured TPOT](tpot.png)", "",
              "![step timelines](timeline.png)", ""]
    lines += merged_chunks(verdicts)
    lines += misses_section(setup.folder, verdicts, rows, rules)
    lines += sync_only_section(setup)
    return "\n".join(lines)


def prefix_section(verdicts: list[Verdict], rules: str) -> list[str]:
    """Under the "prefix" rules: each cell's mean TTFT and its runs' prefix-cache counts,
    measured and simulated."""
    if not RULES[rules]["prefix"]:
        return []
    lines = ["| mode | k | conc | mean TTFT ms: measured / simulated | error | prefix cache "
             "(tokens): hits / queries, measured | simulated | runs equal |",
             "|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        pcs = v.prefix_cache or []
        m = (pcs[0][0] or {}) if pcs else {}
        sim = (pcs[0][1] or {}) if pcs else {}
        equal = sum(a is not None and a == b for a, b in pcs)
        lines.append(f"| {v.cell.mode} | {v.cell.k} | {v.cell.conc} | "
                     f"{v.measured.metrics.mean_ttft_ms:.3f} / "
                     f"{v.simulated.metrics.mean_ttft_ms:.3f} | "
                     f"{_pct(v.errors['mean_ttft_ms'])} | {m.get('hits')} / {m.get('queries')} "
                     f"| {sim.get('hits')} / {sim.get('queries')} | {equal}/{len(pcs)} |")
    return lines + ["", "(hits / queries: the first run's; every run must match its own.)", ""]


def sync_only_section(setup) -> list[str]:
    """The folder judged again with its sync-only profile (SYNC_ONLY_PROFILE: the async terms
    estimated from the sync runs), where it has one, against its own known misses."""
    folder = setup.folder
    if not (folder / SYNC_ONLY_PROFILE).is_file():
        return []
    _, verdicts, _ = judge_folder(folder, profile=str(folder / SYNC_ONLY_PROFILE))
    rows = savings(verdicts)
    rules = rules_for(setup)
    about = load_profile(folder / SYNC_ONLY_PROFILE).about.get("calibration", {})
    lines = [f"## Without the async calibration run ({SYNC_ONLY_PROFILE})", "",
             "The same cells simulated with the profile a user with sync runs only gets: the "
             "async terms estimated from the sync runs' own fits and vLLM's code "
             "(calibrate/vllm_fit.py `estimate_async`; "
             f"{json.dumps(about.get('async_terms', {}).get('from', {}))}).", "",
             f"**{summary_counts(verdicts, rows, rules)}**", "",
             report_table(verdicts, rules), "", savings_table(rows), ""]
    misses = load_known_misses(folder, name=SYNC_ONLY_MISSES)
    fails = bound_failures(verdicts, rows, misses, rules)
    lines += [f"**Bounds broken beyond {SYNC_ONLY_MISSES}: {len(fails)}**", ""]
    return lines + [f"- {f}" for f in fails] + ([""] if fails else [])


def other_cpu_line(other: dict | None) -> str:
    """What the processes other than the measured ones (the engine and its worker; vLLM's
    server and its client) used during the runs (common/cpu_load.py), as a clause of the load
    line."""
    if not other or other.get("median_core") is None:
        return ""
    limit = other.get("limit_core") is not None   # bench/vllm/measure.py's, idle servers and all
    line = (f"; every other process{' (the idle servers included)' * limit} used "
            f"{100 * other['median_core']:.1f} % of a core during a run (median), "
            f"{100 * other['max_core']:.1f} % at most")
    if limit:
        line += (f" (the limit {100 * other['limit_core']:g} %: {other.get('reruns', 0)} runs "
                 f"rerun, {len(other.get('left_out_over_limit') or [])} left out)")
    return line


def merged_chunks(verdicts: list[Verdict]) -> list[str]:
    """Where the bench read streamed chunks together (so its ITLs merge steps, and the token
    capture's chunk sizes stand in for them): each cell's runs' requests whose chunks matched."""
    rows = []
    for v in verdicts:
        got = [r.config.get("chunks_as_captured") for r in v.cell.runs]
        n = [len(r.requests.ttfts) if r.requests else 0 for r in v.cell.runs]
        if any(g is not None and g < m for g, m in zip(got, n)):
            rows.append(f"| {v.cell.name} | " + ", ".join(f"{g}/{m}" for g, m in zip(got, n))
                        + " |")
    if not rows:
        return []
    return ["## Streamed chunks merged by the bench", "",
            "The bench's chunks of a request match vLLM's steps (the token capture) only where "
            "its client read every chunk on its own; where it read several together, the run's "
            "ITLs merge steps. These cells' runs (requests whose chunks matched the capture, "
            "per run):", "", "| cell | requests matched, per run |", "|---|---|", *rows, ""]


def misses_section(folder: Path, verdicts: list[Verdict], rows: list[dict],
                   rules: str) -> list[str]:
    """The known misses (known_misses.toml, written by hand), each with its error now, and
    every bound broken beyond them."""
    misses = load_known_misses(folder)
    errors = {(v.cell.name, key): e for v in verdicts for key, e in v.errors.items()}
    errors.update({(saving_cell(r), "saving"): r["error"] for r in rows})
    lines = []
    if misses:
        lines += ["## Known misses (known_misses.toml, written by hand)", "",
                  "| cell | metric | error now | committed | cap | reason |",
                  "|---|---|---|---|---|---|"]
        for (cell, metric), m in sorted(misses.items()):
            lines.append(f"| {cell} | {metric} | {_pct(errors.get((cell, metric)))} "
                         f"| {_pct(m.error)} | {_pct(m.cap)} | {m.reason} |")
        lines.append("")
    fails = bound_failures(verdicts, rows, misses, rules)
    lines += [f"**Bounds broken beyond the known misses: {len(fails)}**", ""]
    lines += [f"- {f}" for f in fails] + ([""] if fails else [])
    return lines


# -------------------------------------------------------------------------------------------
# Simulated against measured

MODE_MARKERS = {"sync": "o", "async": "s", "zero-bubble": "^"}


def sim_vs_measured_figure(points: list[dict], title: str | None = None) -> Figure:
    """Simulated against measured, one point per cell: mean TPOT (with the ±5 % band) and
    P99 TPOT (±10 %). `points`: {mode, k, conc, measured, simulated} (RunResults)."""
    import numpy as np
    from matplotlib.figure import Figure

    from stepgap.common.timeline_plots import DPI
    fig = Figure(figsize=(11, 4.8), dpi=DPI, layout="constrained")
    panels = (("mean_tpot_ms", "mean TPOT (ms)", 0.05), ("p99_tpot_ms", "P99 TPOT (ms)", 0.10))
    for ax, (key, name, bound) in zip(fig.subplots(1, 2), panels):
        xs = [p["measured"].metrics[key] for p in points]
        ys = [p["simulated"].metrics[key] for p in points]
        lo, hi = min(xs + ys) * 0.9, max(xs + ys) * 1.1
        line = np.array([lo, hi])
        ax.fill_between(line, line * (1 - bound), line * (1 + bound), color="grey", alpha=0.15,
                        lw=0, label=f"±{100 * bound:g} % (the bound)")
        ax.plot(line, line, color="grey", lw=1, label="simulated = measured")
        for i, mode in enumerate(MODE_MARKERS):
            pts = [p for p in points if p["mode"] == mode]
            if not pts:
                continue
            ax.scatter([p["measured"].metrics[key] for p in pts],
                       [p["simulated"].metrics[key] for p in pts],
                       marker=MODE_MARKERS[mode], s=42, color=f"C{i}", label=mode, zorder=3,
                       edgecolors="white", linewidths=0.5)
            for p in pts:
                ax.annotate(f"k{p['k']}c{p['conc']}",
                            (p["measured"].metrics[key], p["simulated"].metrics[key]),
                            textcoords="offset points", xytext=(4, -9), fontsize=6.5,
                            color="#555555")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel(f"measured {name}")
        ax.set_ylabel(f"simulated {name}")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title or "Simulated against measured, per cell (k = speculation depth, "
                 "c = max concurrency)", fontsize=11)
    return fig
