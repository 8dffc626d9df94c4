"""`stepgap validate`: the engine and the simulator on the same traces, cell by cell.

For every cell of the grid (mode x k x max-concurrency) the engine runs the judged trace (the
trained pair's held-out prompts, real acceptance), and the simulator runs the same trace with
the engine's recorded accepted counts, the same scheduler limits and the engine's topology
(`worker=process`, `device=sync`), on costs calibrated from *other* runs: a microbenchmark grid
of the device ops and calibration runs on prompts from the corpus's training files
(engine/profile.py). One profile serves every cell; it is never refit per cell.

The machine's speed drifts (other tenants share its caches and memory: ±10 % over seconds on
the 2-core VM this was built on, docs/validation.md), so the runs are interleaved: each repeat
runs every (k, concurrency) group as [a calibration run, then its three modes back to back, in
each of the six orders in turn], and the groups' order rotates between repeats. The calibration then sees the same machine, on
average, as the judged runs, and each cell's repeats are pooled as one benchmark.

Output folder: report.md (errors per cell, the savings, pass/fail against the issue's bounds,
the machine and commands), tpot.png, timeline.png, profile.json, manifest.json, the judged
runs (runs/), the simulated results (simulated/), trimmed timelines (timelines/), the traces and
the models' config.json, which is what traces/measured/<device>/ commits and what
tests/test_fidelity.py re-simulates.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.profile import (add_engine_args, build_profile, calibration_trace, device_points,
                            grid_size, int_list, machine_info, measure_grid, mode_list)
from common.errors import UserError
from common.formats import save_result, save_timeline, save_trace

TIMELINE_STEPS = (60, 100)   # gpu_measure folders: steps of the timeline cells kept
TIMELINE_HALF = 20            # validate: steps kept either side of the first run's middle


def _shown(path: Path) -> str:
    """A path as the report shows it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass
class Plan:
    pair: str
    modes: list[str]
    ks: list[int]
    concs: list[int]
    judged: list | None               # None: calibrate only (`stepgap profile`)
    calibration: list | None          # None: the profile is given
    profile: dict | None = None
    repeats: int = 18                 # judged runs per cell
    slice: int = 8                    # judged prompts per run
    calibration_slice: int = 8        # calibration prompts per run
    grid: bool = True
    pin: bool = True
    timeline_group: tuple[int, int] | None = None   # (k, conc) whose timelines are kept
    judged_name: str = ""
    calibration_name: str = ""

    @classmethod
    def from_args(cls, args, judged: bool = True) -> "Plan":
        from calibrate.demo import load_heldout, pair_paths
        from common.formats import load_trace
        pair_paths(args.pair)   # names what is missing
        modes = mode_list(args.modes)
        ks = int_list(args.ks, "--ks")
        concs = int_list(args.concurrency, "--concurrency", 1)
        profile = None
        if getattr(args, "profile", None):
            path = Path(args.profile)
            if not path.is_file():
                raise UserError(f"--profile {path}: not found")
            profile = json.loads(path.read_text())
        calibration = cname = None
        if profile is None:
            n = args.calibration_prompts
            if n < 1:
                raise UserError(f"--calibration-prompts must be >= 1, got {n}")
            if args.calibration_trace:
                calibration, cname = load_trace(args.calibration_trace)[:n], \
                    args.calibration_trace
            else:
                calibration = calibration_trace(args.pair, n)
                cname = f"{n} prompts cut from the corpus's training files (seed 1)"
        trace, jname = None, ""
        if judged:
            if args.trace:
                trace, jname = load_trace(args.trace), _shown(Path(args.trace))
            else:
                trace, jname = load_heldout(args.pair), _shown(Path(args.pair) / "heldout.jsonl")
            if args.num_prompts:
                trace = trace[:args.num_prompts]
            if calibration and {r.request_id for r in trace} & \
                    {r.request_id for r in calibration}:
                raise UserError("the calibration trace shares request ids with the judged "
                                "trace; calibration must use other prompts")
        for name in ("repeats", "slice", "calibration_slice"):
            if getattr(args, name, 1) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, "
                                f"got {getattr(args, name)}")
        group = (max(ks), min(concs))
        return cls(args.pair, modes, ks, concs, trace, calibration, profile,
                   getattr(args, "repeats", 3), getattr(args, "slice", 8),
                   getattr(args, "calibration_slice", 8),
                   not getattr(args, "no_grid", False) and profile is None, args.pin, group,
                   jname, cname or "")


@dataclass
class Measured:
    profile: dict
    runs: dict = field(default_factory=lambda: defaultdict(list))      # cell -> results
    device: dict = field(default_factory=dict)    # cell -> (op, i) -> [sum us, sum features]
    timelines: dict = field(default_factory=dict)  # cell -> spans (first run, trimmed)
    timeline_steps: tuple[int, int] | None = None   # the steps kept
    loads: list = field(default_factory=list)
    wall_s: float = 0.0
    calibration_runs: int = 0
    calibration_steps: list = field(default_factory=list)   # per run: [t ms, measured, fitted]


def limits_for(plan: Plan) -> dict:
    """Scheduler limits every cell shares (engine and simulator): KV for every request at once,
    so nothing is preempted; the client's concurrency is the binding cap."""
    from calibrate.demo import limits
    reqs = (plan.judged or []) + (plan.calibration or [])
    return limits(reqs, max(plan.ks), max(plan.concs))


def chunk(items: list, size: int, i: int) -> list:
    """The i-th run's share of a trace: `size` consecutive requests, wrapping around."""
    size = min(size, len(items))
    start = i * size % len(items)
    return (items + items)[start:start + size]


def units_of(plan: Plan) -> list[tuple[str, str, int, int, int]]:
    """(kind, mode, k, conc, slice index) in run order.

    Validation: in each repeat every (k, conc) group runs one calibration run (the modes take
    turns) and then its three modes back to back, each on the repeat's slice of the judged
    trace, in an order that cycles through all orders of the modes (each mode in each place and
    after each other mode equally often over six repeats), so that what the modes save over sync
    is measured under the same conditions, and the calibration runs meet the machine when and as often as the judged runs do. Groups
    rotate between repeats, so each cell's runs spread over the whole session. Profiling
    alone: every group, every mode, each repeat."""
    groups = [(k, c) for k in plan.ks for c in plan.concs]
    # With three rotations only, async ran after sync in two repeats of three and measured 0.3-3 %
    # slower than zero-bubble (the same code on the CPU) at k > 0, c = 1 in three validations.
    orders = list(itertools.permutations(plan.modes))
    units = []
    for rep in range(plan.repeats):
        shift = rep % len(groups)
        for k, conc in groups[shift:] + groups[:shift]:
            g = groups.index((k, conc))
            if plan.calibration is not None:
                if plan.judged is None:
                    units += [("calibration", m, k, conc, rep) for m in plan.modes]
                else:
                    mode = plan.modes[(rep + g) % len(plan.modes)]
                    units.append(("calibration", mode, k, conc, rep))
            if plan.judged is not None:
                units += [("judged", m, k, conc, rep) for m in orders[rep % len(orders)]]
    return units


def run_plan(plan: Plan, progress: bool = True) -> Measured:
    """Run every unit of the plan on the engine (the process executor) and fit the profile."""
    from tqdm import tqdm

    from engine.loop import EngineConfig, run_trace
    from calibrate.demo import pair_paths
    from engine.executor import ProcessExecutor, pin_plan
    from engine.worker import WorkerSpec
    from calibrate.measured import cell_name
    from common.modelcfg import load_model_config

    t0 = time.monotonic()
    paths = pair_paths(plan.pair)
    lim = limits_for(plan)
    max_k = max(plan.ks)
    spec = WorkerSpec(paths["target"], paths["eagle3"] if max_k else None, "cpu", "float32",
                      lim["num_blocks"], lim["max_model_len"], lim["max_num_seqs"], max(max_k, 1))
    vocab = load_model_config(paths["target"]).vocab_size
    units = units_of(plan)
    sizes = {"judged": plan.slice, "calibration": plan.calibration_slice}
    traces = {"judged": plan.judged, "calibration": plan.calibration}

    def reqs_of(kind, i):
        return chunk(traces[kind], sizes[kind], i)

    total = sum(sum(r.output_len for r in reqs_of(u[0], u[4])) for u in units)
    pins = pin_plan(plan.pin)
    out = Measured(profile=plan.profile or {})
    out.loads.append(os.getloadavg()[0])
    grid_points = []
    with tqdm(total=total + (grid_size(plan.ks) if plan.grid else 0), unit=" tok",
              disable=not progress, file=sys.stderr, mininterval=1.0,
              desc="validate" if plan.judged else "profile") as bar:
        if plan.grid:
            bar.set_postfix_str("microbenchmark grid")
            grid_points = measure_grid(spec, plan.ks, min(pins[1]) if pins else None,
                                       progress=bar.update)
        calib_runs, calib_info = [], []
        with ProcessExecutor(spec, pin=plan.pin) as ex:
            warm = plan.calibration or plan.judged
            run_trace(ex, warm[:2], EngineConfig("sync", max_k, **lim), vocab_size=vocab)
            for kind, mode, k, conc, rep in units:
                name = cell_name(mode, k, conc)
                bar.set_postfix_str(f"{kind} {name} #{rep} load {os.getloadavg()[0]:.2f}")
                reqs = reqs_of(kind, rep)
                load0 = os.getloadavg()[0]
                run = run_trace(ex, reqs, EngineConfig(mode, k, **lim), vocab_size=vocab,
                                max_concurrency=conc, detailed=kind == "judged",
                                config={"executor": "process", "pinned": ex.pinned,
                                        "device": "cpu", "dtype": "float32",
                                        "trace": plan.judged_name if kind == "judged"
                                        else plan.calibration_name, "slice": rep,
                                        "max_concurrency": conc})
                out.loads.append(os.getloadavg()[0])
                if kind == "calibration":
                    calib_runs.append((mode, k, run.spans))
                    calib_info.append({"mode": mode, "k": k, "conc": conc, "slice": rep,
                                       "at_s": round(time.monotonic() - t0, 1)})
                else:
                    res = run.result
                    res.pop("output_token_ids", None)
                    res["config"]["load_avg_1m"] = [round(load0, 2), round(out.loads[-1], 2)]
                    out.runs[name].append(res)
                    _add_device(out.device.setdefault(name, {}), device_points(run.spans, k))
                    if name not in out.timelines and (k, conc) == plan.timeline_group:
                        if out.timeline_steps is None:   # mid-run, the same for every mode
                            mid = max(s.step for s in run.spans) // 2
                            out.timeline_steps = (max(0, mid - TIMELINE_HALF),
                                                  mid + TIMELINE_HALF)
                        lo, hi = out.timeline_steps
                        out.timelines[name] = [s for s in run.spans if lo <= s.step < hi]
                bar.update(sum(r.output_len for r in reqs))
    out.calibration_runs = len(calib_runs)
    if plan.profile is None:
        meta = {"device": "cpu", "machine": machine_info(),
                "model": {"target": paths["target"], "draft": paths["eagle3"],
                          "dtype": "float32"},
                "topology": {"executor": "process", "worker": "process", "device": "sync",
                             "pinned": pins is not None},
                "calibration": {"trace": plan.calibration_name,
                                "prompts": len(plan.calibration), "runs": len(calib_runs),
                                "modes": plan.modes, "ks": plan.ks, "concurrency": plan.concs,
                                "grid_points": len(grid_points)},
                "scheduler": lim}
        out.profile, series = build_profile(calib_runs, grid_points, meta)
        out.calibration_steps = [{**info, "steps": steps}
                                 for info, steps in zip(calib_info, series)]
    out.wall_s = time.monotonic() - t0
    return out


def _add_device(acc: dict, points: list[dict]) -> None:
    """Per (op, pass): the measured time and the features, summed (the fits are linear, so
    the profile's prediction for all these steps is its coefficients times the sums)."""
    for p in points:
        a = acc.setdefault(f"{p['op']}/{p['i']}", [0.0, [0.0] * len(p["x"])])
        a[0] += p["us"]
        a[1] = [s + x for s, x in zip(a[1], p["x"])]


def device_vs_profile(acc: dict, profile: dict, k: int) -> float | None:
    """How much longer (> 0) the judged runs' device ops took than the profile predicts for
    the same steps: the machine's drift between calibration and these runs, not a model error."""
    fits = {(f["op"], f["i"]): f["coef"] for f in profile.get("device_ops", []) if f["k"] == k}
    measured = predicted = 0.0
    for key, (us, x) in acc.items():
        op, i = key.split("/")
        coef = fits.get((op, None if i == "None" else int(i)))
        if coef is None:
            continue
        measured += us
        predicted += sum(c * v for c, v in zip(coef, x))
    return measured / predicted - 1 if predicted else None


# -------------------------------------------------------------------------------------------
# The folder


def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                             capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, timeout=10).stdout
        return (rev or "unknown") + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_measured(plan: Plan, m: Measured, out: Path, command: str) -> None:
    """The measured half of the folder: profile, models, traces, runs, timelines, manifest."""
    from calibrate.demo import pair_paths
    from calibrate.measured import FORMAT, cell_name
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("runs", "timelines", "simulated"):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / "profile.json").write_text(json.dumps(m.profile, indent=1) + "\n")
    paths = pair_paths(plan.pair)
    for name in ("target", "eagle3"):
        (out / "models" / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(paths[name]) / "config.json", out / "models" / name / "config.json")
    if plan.calibration is not None:
        save_trace(out / "calibration.jsonl", plan.calibration)
    if m.calibration_steps:   # what the noise model was fitted on (engine/profile.py)
        save_runs(out / "calibration_steps.json.gz", m.calibration_steps)
    cells = []
    for mode in plan.modes:
        for k in plan.ks:
            for conc in plan.concs:
                name = cell_name(mode, k, conc)
                runs = m.runs.get(name, [])
                f = f"runs/{name}.json.gz"
                save_runs(out / f, [_trim(r) for r in runs])
                info = {"device_vs_profile": device_vs_profile(m.device.get(name, {}),
                                                               m.profile, k)}
                cells.append({"mode": mode, "k": k, "max_concurrency": conc, "runs": f,
                              "num_runs": len(runs), "info": info})
                if name in m.timelines:
                    save_timeline(out / "timelines" / f"{name}.measured.jsonl",
                                  m.timelines[name])
    lim = limits_for(plan)
    manifest = {
        "format": FORMAT, "device": "cpu", "machine": machine_info(), "commit": git_commit(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": command,
        "wall_s": round(m.wall_s, 1),
        "load_avg_1m": {"min": min(m.loads), "max": max(m.loads),
                        "mean": round(sum(m.loads) / len(m.loads), 2)},
        "traces": {"judged": plan.judged_name, "judged_prompts": len(plan.judged or []),
                   "calibration": plan.calibration_name or "(the profile's)",
                   "calibration_runs": m.calibration_runs},
        "repeats": plan.repeats, "slice": plan.slice,
        "calibration_slice": plan.calibration_slice,
        "sim": {"gpu": "cpu", "model": "models/target", "draft": "models/eagle3",
                "worker": "process", "device": "sync", "profile": "profile.json",
                "max_num_seqs": lim["max_num_seqs"], "max_model_len": lim["max_model_len"],
                "num_kv_blocks": lim["num_blocks"]},
        "timeline": {"cells": sorted(m.timelines), "steps": list(m.timeline_steps or (0, 0))},
        "cells": cells,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def save_runs(path: Path, results: list[dict]) -> None:
    """A cell's runs, one gzip-compressed JSON list (no timestamp: same runs, same bytes)."""
    import gzip
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as raw, \
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
        f.write(json.dumps(results, separators=(",", ":")).encode())


def _trim(res: dict) -> dict:
    """A judged result as committed: every per-request list the simulator and the comparison
    need; times rounded to the microsecond (they are measured to about that)."""
    r = dict(res)
    r["ttfts"] = [round(x, 6) for x in r["ttfts"]]
    r["itls"] = [[round(x, 6) for x in xs] for xs in r["itls"]]
    gaps = dict(r.get("step_gaps") or {})
    if "values_us" in gaps:
        gaps["values_us"] = [round(x, 1) for x in gaps["values_us"]]
    r["step_gaps"] = gaps
    return r


def write_report(folder: Path, command: str | None = None, quiet: bool = False) -> list:
    """Re-simulate the folder's cells, judge them, and write report.md, tpot.png,
    timeline.png and simulated/. Returns the verdicts."""
    from sim import plots
    from calibrate.measured import (judge_folder, report_table, savings, savings_table,
                              summary_counts)
    from common.formats import load_timeline

    man_path = folder / "manifest.json"
    tl = json.loads(man_path.read_text()).get("timeline", {}) if man_path.is_file() else {}
    tl_cells = tuple(tl.get("cells", []))
    setup, verdicts, spans = judge_folder(folder, tl_cells)
    rows = savings(verdicts)
    for v in verdicts:
        sim = {k: x for k, x in v.simulated.items() if k not in (
            "request_ids", "input_lens", "output_lens", "ttfts", "itls", "chunk_tokens")}
        sim["step_gaps"] = {k: x for k, x in sim.get("step_gaps", {}).items()
                            if k != "values_us"}
        save_result(folder / "simulated" / f"{v.cell.name}.json", sim)
    points = [{"mode": v.cell.mode, "k": v.cell.k, "conc": v.cell.conc,
               "measured": v.measured, "simulated": v.simulated} for v in verdicts]
    plots.save(plots.sim_vs_measured_figure(points), folder / "tpot.png")
    panels = []
    lo, hi = tl.get("steps") or TIMELINE_STEPS
    for name, sp in spans.items():
        mode = name.split("-k")[0]
        tl = folder / "timelines" / f"{name}.measured.jsonl"
        sim_sp = [s for s in sp if lo <= s.step < hi]
        save_timeline(folder / "timelines" / f"{name}.simulated.jsonl", sim_sp)
        if tl.is_file():
            panels.append(plots.Panel(mode, "measured", load_timeline(tl)))
        panels.append(plots.Panel(mode, "simulated", sim_sp))
    common = set.intersection(*({s.step for s in p.spans if s.lane == "device"}
                                for p in panels)) if panels else set()
    if common:
        order = {"sync": 0, "async": 1, "zero-bubble": 2}
        panels.sort(key=lambda p: (order.get(p.row, 9), p.column))
        steps = sorted(common)
        mid = steps[len(steps) // 2]
        mid = mid if mid + 2 in common else steps[max(0, len(steps) - 3)]
        k, conc = tl_cells[0].split("-k")[1].split("-c")
        fig = plots.timeline_figure(
            panels, steps=(mid, min(mid + 2, steps[-1])),
            title=f"The trained pair on the CPU (process worker), k={k}, concurrency {conc}: "
                  f"steps {mid}–{min(mid + 2, steps[-1])}, measured and simulated")
        plots.save(fig, folder / "timeline.png")
    text = report_text(setup, verdicts, rows, command)
    (folder / "report.md").write_text(text)
    if man_path.is_file():   # the misses, for tests/test_fidelity.py: they must not grow
        man = json.loads(man_path.read_text())
        man["misses"] = misses_of(verdicts, rows)
        man_path.write_text(json.dumps(man, indent=1) + "\n")
    if not quiet:
        print(report_table(verdicts))
        print()
        print(savings_table(rows))
        print()
        print(summary_counts(verdicts, rows))
        print(f"\nreport: {folder / 'report.md'}")
    return verdicts


def misses_of(verdicts, rows) -> dict:
    """{cell: {metric: error}} of every bound missed, and {"saving <mode> k.. c..": error}."""
    from calibrate.measured import BOUNDS
    out = {}
    for v in verdicts:
        missed = {key: round(v.errors[key], 4) for key, _, _ in BOUNDS if not v.passed[key]}
        if missed:
            out[v.cell.name] = missed
    for r in rows:
        if not r["passed"]:
            out[saving_name(r)] = round(r["error"], 4)
    return out


def saving_name(r: dict) -> str:
    return f"saving {r['mode']}-k{r['k']}-c{r['conc']}"


def report_text(setup, verdicts, rows, command) -> str:
    from calibrate.measured import (BOUNDS, SAVING_BOUND, report_table, savings_table,
                              summary_counts)
    man = setup.manifest
    machine = man.get("machine", {})
    load = man.get("load_avg_1m", {})
    lines = [f"# Simulated against measured: {man.get('device', 'cpu')}", ""]
    if setup.kind == "stepgap" and man.get("source") != "bench/gpu_measure.py":
        lines += [
            f"- machine: {machine.get('cpu', '?')}, {machine.get('cpus', '?')} CPUs, "
            f"{machine.get('platform', '')}; Python {machine.get('python', '?')}, torch "
            f"{machine.get('torch', '?')}",
            f"- load average (1 min) during the runs: {load.get('min')}–{load.get('max')} "
            f"(mean {load.get('mean')})",
            f"- commit {man.get('commit')}, {man.get('created')}; engine and calibration runs "
            f"took {man.get('wall_s')} s",
            f"- measured: `{man.get('command')}`",
            f"- judged trace: {man['traces']['judged']} ({man['traces']['judged_prompts']} "
            f"prompts); each cell ran {man.get('repeats')} times on slices of "
            f"{man.get('slice')} prompts, pooled as one benchmark",
            f"- calibration: {man['traces']['calibration']}, {man['traces']['calibration_runs']}"
            " runs interleaved with the judged ones, plus the microbenchmark grid "
            "(profile.json); one profile for every cell",
            "- simulator: worker=process, device=sync, the profile's device fits and CPU costs, "
            "each run's own accepted counts replayed",
        ]
    else:
        lines += [f"- source: {man.get('source', 'bench/gpu_measure.py')}, device "
                  f"{man.get('device')}",
                  "- the profile comes from the same runs (a consistency check, not a "
                  "validation)"]
    if command:
        lines.append(f"- report: `{command}`")
    bounds = ", ".join(f"{name} within ±{100 * b:g} %" for _, name, b in BOUNDS)
    lines += ["", f"Bounds: {bounds}; the saving of async and zero-bubble over sync (mean ITL) "
              f"within {100 * SAVING_BOUND:g} % of its size. Errors are (simulated − measured) "
              "/ measured. *device vs profile*: how much longer the judged runs' device ops "
              "took than the profile predicts for the same steps (the machine's drift; a "
              "diagnostic, not used by the simulator).", "",
              f"**{summary_counts(verdicts, rows)}**", "", report_table(verdicts), "",
              savings_table(rows), "", "![simulated against measured TPOT](tpot.png)", "",
              "![step timelines](timeline.png)", ""]
    misses = [v for v in verdicts if not v.ok] + [r for r in rows if not r["passed"]]
    if misses:
        lines += ["Misses are listed in the tables; docs/validation.md explains their causes.",
                  ""]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------
# The command

EPILOG = """\
grid:
  --modes, --ks and --concurrency give the grid's axes (default: the three modes x k 0,2,4 x
  max-concurrency 1,4: 18 cells). Every cell runs --repeats times (default 18), each run on the
  next --slice prompts of the judged trace (default 8, so the 48 held-out prompts three times
  over), and its runs are pooled as one benchmark. Runs of one (k, concurrency) run their modes
  back to back, in each of their six orders in turn, and the groups rotate, so that the
  machine's drift hits every cell alike.

examples:
  stepgap validate --out out/validate                   # the default grid, about 10-12 min
  stepgap validate --ks 2 --concurrency 1 --repeats 2 --slice 4 --out /tmp/v
  stepgap validate --profile traces/measured/cpu/profile.json --out /tmp/v   # no calibration
  stepgap validate --from-measured traces/measured/cpu --out /tmp/again      # re-simulate only
  stepgap validate --from-measured out/gpu-measure --out /tmp/gpu            # gpu_measure.py

The judged trace (default: the pair's held-out prompts) and the calibration trace (default:
prompts cut from the corpus's training files) must differ. Keep the machine otherwise idle:
the report records the load average. docs/validation.md explains the method and the results.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "validate", help="run the engine and the simulator on the same traces, cell by cell",
        description="Calibrate the simulator on this machine (or take --profile), run the "
                    "engine over a grid of modes x k x max-concurrency on the judged trace, "
                    "re-simulate every run with the engine's accepted counts, and write a "
                    "report of the errors (report.md, tpot.png, timeline.png).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, "of the grid")
    g = p.add_argument_group("traces and repeats")
    g.add_argument("--trace", default=None, metavar="FILE",
                   help="judged trace (default: the pair's heldout.jsonl)")
    g.add_argument("--num-prompts", type=int, default=None, metavar="N",
                   help="the first N requests of the judged trace (default: all, 48)")
    g.add_argument("--repeats", type=int, default=18, metavar="R",
                   help="runs of every cell, interleaved and pooled (default 18)")
    g.add_argument("--slice", type=int, default=8, metavar="N",
                   help="judged prompts per run: run r takes the r-th N of the trace, "
                        "wrapping (default 8)")
    g.add_argument("--calibration-trace", default=None, metavar="FILE",
                   help="calibration trace (default: cut from the corpus's training files)")
    g.add_argument("--calibration-prompts", type=int, default=48, metavar="N",
                   help="calibration prompts in all (default 48)")
    g.add_argument("--calibration-slice", type=int, default=8, metavar="N",
                   help="calibration prompts per run (default 8); every (k, concurrency) group "
                        "runs one calibration run per repeat, before its judged runs")
    g.add_argument("--profile", default=None, metavar="PROFILE.json",
                   help="use this profile instead of calibrating (no grid, no calibration runs)")
    g.add_argument("--no-grid", action="store_true",
                   help="skip the microbenchmark grid (the calibration runs still run)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="out/validate", metavar="DIR",
                   help="report folder (default out/validate)")
    o.add_argument("--from-measured", default=None, metavar="DIR",
                   help="run no engine: re-simulate a folder of measured runs (a report folder "
                        "of this command, traces/measured/<device>/, or bench/gpu_measure.py's "
                        "output) and write the report into --out")
    o.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.set_defaults(func=cmd_validate)


def cmd_validate(args) -> int:
    out = Path(args.out)
    command = "stepgap validate " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["validate"] \
        else "stepgap validate"
    if args.from_measured:
        src = Path(args.from_measured)
        if not src.is_dir():
            raise UserError(f"--from-measured {src}: not a folder")
        if (src / "results.jsonl").is_file() and not (src / "manifest.json").is_file():
            convert_gpu_measure(src, out, command)
        elif src.resolve() != out.resolve():
            _copy_measured(src, out)
        write_report(out, command, args.quiet)
        return 0
    plan = Plan.from_args(args, judged=True)
    if not args.quiet:
        print(f"stepgap validate: {len(plan.modes) * len(plan.ks) * len(plan.concs)} cells x "
              f"{plan.repeats} runs of {min(plan.slice, len(plan.judged))} prompts; calibration: "
              f"{plan.calibration_name or args.profile}; load average "
              f"{os.getloadavg()[0]:.2f}", file=sys.stderr)
    m = run_plan(plan, progress=not args.quiet)
    write_measured(plan, m, out, command)
    write_report(out, command, args.quiet)
    return 0


def _copy_measured(src: Path, out: Path) -> None:
    """Start a report folder from a measured one (its inputs only)."""
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in ("report.md", "tpot.png", "timeline.png", "simulated"):
            continue
        dst = out / item.name
        if item.is_dir():
            shutil.copytree(item, dst, dirs_exist_ok=True)
        else:
            shutil.copy(item, dst)


def convert_gpu_measure(src: Path, out: Path, command: str) -> None:
    """bench/gpu_measure.py's folder as a measured folder of this command's format: the
    manifest (its cells, the catalog entry of its GPU, the simulator's presets of its models),
    its profile.json, each cell's run and its timelines, so that it is re-simulated, reported and
    fidelity-tested like the CPU's. Its profile comes from the same runs it judges: on a GPU
    that is a consistency check until calibration runs of their own are added."""
    import gzip

    from calibrate.measured import FORMAT, cell_name, load_measured
    from common.formats import MODES
    setup, cells = load_measured(src)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "profile.json", out / "profile.json")
    for name in ("env.json", "summary.txt"):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    sim = dict(setup.settings, profile="profile.json")
    for key in ("model", "draft"):   # a config.json written next to the results: copy it
        if Path(sim[key]).is_file():
            dst = out / "models" / Path(sim[key]).parent.name / "config.json"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(sim[key], dst)
            sim[key] = str(dst.parent.relative_to(out))
    entries, groups = [], defaultdict(list)
    for c in cells:
        f = f"runs/{c.name}.json.gz"
        save_runs(out / f, c.runs)
        entries.append({"mode": c.mode, "k": c.k, "max_concurrency": c.conc, "runs": f,
                        "num_runs": len(c.runs), "info": {}})
        groups[(c.k, c.conc)].append(c.name)
    timeline_cells = []
    tl = src / "timelines.jsonl.gz"
    if tl.is_file():   # one (k, concurrency): the largest k at the smallest concurrency
        k, conc = max(groups, key=lambda g: (g[0], -(g[1] or 0)))
        want = {f"{m}/k{k}/c{conc}": cell_name(m, k, conc) for m in MODES}
        spans = defaultdict(list)
        with gzip.open(tl, "rt") as f:
            for line in f:
                d = json.loads(line)
                name = want.get(d.pop("cell", None))
                if name and TIMELINE_STEPS[0] <= d["step"] < TIMELINE_STEPS[1]:
                    spans[name].append(d)
        for name, rows in spans.items():
            (out / "timelines").mkdir(parents=True, exist_ok=True)
            with (out / "timelines" / f"{name}.measured.jsonl").open("w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            timeline_cells.append(name)
    env = setup.manifest.get("env", {})
    manifest = {"format": FORMAT, "device": setup.manifest.get("device"),
                "machine": {k: env.get(k) for k in ("gpu", "torch", "cuda", "platform")},
                "source": "bench/gpu_measure.py", "command": command,
                "note": "the profile comes from the same runs (gpu_measure has no calibration "
                        "runs of its own): a consistency check, not a validation",
                "traces": {"judged": "mtbench-like (gpu_measure)", "judged_prompts": None,
                           "calibration": "(the same runs)", "calibration_runs": 0},
                "sim": sim, "timeline": {"cells": sorted(timeline_cells),
                                         "steps": list(TIMELINE_STEPS)},
                "cells": entries}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
