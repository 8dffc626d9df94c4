"""Measured runs, re-simulated and judged: the fidelity check of DESIGN.md §7.

A measured folder (`traces/measured/<device>/`, written by `stepgap validate`) holds:

    manifest.json           what ran where: machine, load, commit, commands, traces, the cells
    profile.json            the calibration (sim/profile.py), fitted on *other* runs
    models/*/config.json    the target's and the head's shapes (for the roofline's fallback)
    runs/<cell>.r<n>.json.gz  each judged run's result, detailed: per-request chunks and the
                            engine's accepted count of every decode step

`resimulate` runs each judged run's trace through the simulator with that run's accepted counts
(so both see the same acceptance) and the profile, and pools the repeats of a cell as one
benchmark; `judge` takes the errors against the bounds. A folder of bench/gpu_measure.py
(results.jsonl, profile.json, env.json) is read the same way: `load_measured` tells them apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from sim.config import SimConfig
from sim.costs import run_levels
from sim.loop import simulate
from sim.profile import load_profile
from common.compare import compare, pool_results
from common.errors import UserError
from common.formats import TraceRequest

FORMAT = "stepgap-measured/1"
# The bounds: |simulated - measured| / measured.
BOUNDS = (("mean_tpot_ms", "mean TPOT", 0.05), ("mean_itl_ms", "mean ITL", 0.05),
          ("p99_tpot_ms", "P99 TPOT", 0.10))
# Student's t, two-sided 95 %, by degrees of freedom (beyond the table: 1.96)
T95 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
       18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}
SAVING_BOUND = 0.25   # of the measured saving of async / zero-bubble over sync (mean ITL)
SIM_FIELDS = ("gpu", "model", "draft", "worker", "device", "profile", "block_size")


@dataclass
class Cell:
    mode: str
    k: int
    conc: int | None
    runs: list[dict]                      # the measured results of its repeats
    info: dict = field(default_factory=dict)   # diagnostics recorded when it ran

    @property
    def name(self) -> str:
        return cell_name(self.mode, self.k, self.conc)


def cell_name(mode: str, k: int, conc: int | None) -> str:
    return f"{mode}-k{k}-c{conc if conc is not None else 'inf'}"


@dataclass
class Setup:
    """How the simulator runs a folder's cells: SimConfig fields shared by every cell."""

    folder: Path
    settings: dict
    manifest: dict
    kind: str = "stepgap"     # or "gpu_measure"


# -------------------------------------------------------------------------------------------
# Reading a folder


def load_measured(folder) -> tuple[Setup, list[Cell]]:
    folder = Path(folder)
    if (folder / "manifest.json").is_file():
        return _load_stepgap(folder)
    if (folder / "results.jsonl").is_file():
        return _load_gpu_measure(folder)
    raise UserError(f"{folder}: no manifest.json (stepgap validate) or results.jsonl "
                    "(bench/gpu_measure.py) there")


def _load_stepgap(folder: Path) -> tuple[Setup, list[Cell]]:
    path = folder / "manifest.json"
    try:
        man = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if man.get("format") != FORMAT:
        raise UserError(f"{path}: format: expected {FORMAT!r}, got {man.get('format')!r}")
    settings = dict(man["sim"])
    for key in ("model", "draft", "profile"):   # paths are relative to the folder
        if settings.get(key) and not Path(settings[key]).is_absolute():
            settings[key] = str(folder / settings[key])
    cells = [Cell(c["mode"], c["k"], c["max_concurrency"], load_runs(folder / c["runs"]),
                  c.get("info", {})) for c in man["cells"]]
    return Setup(folder, settings, man), cells


def load_runs(path: Path) -> list[dict]:
    """A cell's runs: a gzip-compressed JSON list of run results."""
    import gzip
    if not path.is_file():
        raise UserError(f"{path}: not found (a cell's runs)")
    try:
        runs = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a gzip-compressed JSON list of run results ({e})") \
            from None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise UserError(f"{path}: expected a list of run results")
    return runs


def _load_gpu_measure(folder: Path) -> tuple[Setup, list[Cell]]:
    env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").is_file() \
        else {}
    gpu = str(env.get("gpu") or "cpu")
    hw = next((h for h in ("b200", "h200", "h100", "a100", "l20") if h in gpu.lower()), None)
    cpu = env.get("device", "cpu") == "cpu" or hw is None
    sweep = env.get("sweep", {})
    settings = {"gpu": "cpu" if cpu else hw,
                "model": "llama-3.1-8b" if not cpu else _tiny_config(folder, "target"),
                "draft": "llama-3.1-8b-eagle3" if not cpu else _tiny_config(folder, "eagle3"),
                "worker": "inline", "device": "sync" if cpu else "async",
                "profile": str(folder / "profile.json"),
                "max_num_seqs": max(sweep.get("concurrency") or [256]),
                "max_model_len": sweep.get("max_model_len", 2048),
                "num_kv_blocks": sweep.get("num_blocks")}
    cells = []
    with (folder / "results.jsonl").open() as f:
        for line in f:
            res = json.loads(line)
            c = res.get("config", {})
            if "error" in res or "ttfts" not in res:
                continue
            cells.append(Cell(c["mode"], c["k"], c.get("max_concurrency"), [res]))
    return Setup(folder, settings, {"device": gpu, "source": "bench/gpu_measure.py",
                                    "env": env}, "gpu_measure"), cells


def _tiny_config(folder: Path, which: str) -> str:
    """The tiny pair's config.json (gpu_measure --device cpu builds the pair in memory, from
    engine/tiny.py's shapes), written once next to the results."""
    path = folder / "models" / which / "config.json"
    if not path.is_file():
        from engine.tiny import TINY_TARGET, tiny_draft_config   # torch: only here
        cfg = TINY_TARGET if which == "target" else tiny_draft_config(TINY_TARGET)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cfg.to_hf_dict(), indent=1) + "\n")
    return str(path)


# -------------------------------------------------------------------------------------------
# Re-simulating


def requests_of(result: dict) -> list[TraceRequest]:
    """A judged run's trace, rebuilt from its detailed result, with the engine's accepted counts
    (all requests arrive at 0, as the held-out trace)."""
    for key in ("request_ids", "input_lens", "output_lens"):
        if key not in result:
            raise UserError(f"a measured result lacks {key!r}: it must be saved with --detailed")
    accepted = result.get("accepted") or [None] * len(result["request_ids"])
    return [TraceRequest(str(rid), 0.0, plen, olen, accepted=acc)
            for rid, plen, olen, acc in zip(result["request_ids"], result["input_lens"],
                                            result["output_lens"], accepted)]


def sim_config(setup: Setup, run: dict, timeline: bool = False, **overrides) -> SimConfig:
    """The simulator's configuration of one measured run: the folder's topology and costs, the
    run's mode, k, concurrency and scheduler limits."""
    c = run.get("config", {})
    s = dict(setup.settings)
    folder = {key: s.pop(key, None) for key in ("max_num_seqs", "max_model_len",
                                                 "num_kv_blocks")}
    limits = {"max_num_seqs": c.get("max_num_seqs") or folder["max_num_seqs"] or 256,
              "max_num_batched_tokens": c.get("max_num_batched_tokens", 8192),
              "max_model_len": c.get("max_model_len") or folder["max_model_len"] or 2048,
              "num_kv_blocks": c.get("num_blocks") or folder["num_kv_blocks"]}
    settings = {**s, **limits, "mode": c.get("mode", "sync"), "k": c.get("k", 0),
                "max_concurrency": run.get("max_concurrency"), "replay": True,
                "detailed": True, "timeline": timeline, **overrides}
    return SimConfig(**settings)


def resimulate(setup: Setup, cell: Cell, timeline: bool = False, **overrides):
    """(the pooled simulated result, the first run's spans or None, each run's result).

    With a profile that measured the machine's noise, the runs of a cell get the measured
    spread of run-level speeds (stratified, mean 1: `sim.costs.run_levels`) and each its own
    jitter seed, as the measured runs met the machine at different moments."""
    results, spans = [], None
    levels = [1.0] * len(cell.runs)
    prof = setup.settings.get("profile")
    if prof and overrides.get("jitter", True):
        jitter = load_profile(prof).jitter
        if jitter:
            levels = run_levels(jitter["run_log_factors"], len(cell.runs))
    for n, run in enumerate(cell.runs):
        cfg = sim_config(setup, run, timeline and n == 0,
                         **{"speed": levels[n], "seed": n, **overrides})
        res, sp = simulate(cfg, requests_of(run))
        results.append(res)
        if n == 0 and timeline:
            spans = sp
    return pool_results(results), spans, results


# -------------------------------------------------------------------------------------------
# Judging


@dataclass
class Verdict:
    cell: Cell
    measured: dict        # pooled
    simulated: dict       # pooled
    errors: dict          # metric -> relative error
    passed: dict          # metric -> bool
    comparison: dict      # common.compare.compare(measured, simulated)

    @property
    def ok(self) -> bool:
        return all(self.passed.values())


def judge_cell(cell: Cell, simulated: dict) -> Verdict:
    measured = pool_results(cell.runs)
    errors, passed = {}, {}
    for key, _, bound in BOUNDS:
        e = (simulated[key] - measured[key]) / measured[key]
        errors[key], passed[key] = e, abs(e) <= bound
    return Verdict(cell, measured, simulated, errors, passed, compare(measured, simulated))


def paired_half_width(base_runs: list[dict], runs: list[dict]) -> float | None:
    """Half-width (ms) of the 95 % interval of a measured saving: the spread of the per-run
    differences in mean ITL between runs of the two modes on the same slice (they ran back to
    back), over the square root of their number. None with fewer than 3 pairs."""
    def by_slice(rs):
        return {r.get("config", {}).get("slice", i): r["mean_itl_ms"] for i, r in enumerate(rs)}
    a, b = by_slice(base_runs), by_slice(runs)
    d = [a[i] - b[i] for i in sorted(a.keys() & b.keys())]
    if len(d) < 3:
        return None
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    return T95.get(len(d) - 1, 1.96) * sd / math.sqrt(len(d))


def savings(verdicts: list[Verdict]) -> list[dict]:
    """What async and zero-bubble save over sync in mean ITL, measured and simulated, per k and
    concurrency, and whether the simulated saving is within SAVING_BOUND of the measured one."""
    by = {(v.cell.mode, v.cell.k, v.cell.conc): v for v in verdicts}
    rows = []
    for (mode, k, conc), v in by.items():
        base = by.get(("sync", k, conc))
        if mode == "sync" or base is None:
            continue
        m = base.measured["mean_itl_ms"] - v.measured["mean_itl_ms"]
        s = base.simulated["mean_itl_ms"] - v.simulated["mean_itl_ms"]
        err = (s - m) / abs(m) if m else math.inf
        half = paired_half_width(base.cell.runs, v.cell.runs)
        rows.append({"mode": mode, "k": k, "conc": conc, "measured_ms": m, "simulated_ms": s,
                     "measured_pct": 100 * m / base.measured["mean_itl_ms"],
                     "half_width_ms": half,
                     "within_noise": half is not None and abs(s - m) <= half,
                     "error": err, "passed": abs(err) <= SAVING_BOUND})
    return sorted(rows, key=lambda r: (r["k"], r["conc"] or 0, r["mode"]))


def judge_folder(folder, timeline_cells: tuple = ()) -> tuple[Setup, list[Verdict], dict]:
    """Re-simulate every cell of a measured folder and judge it. Also returns the simulated
    spans of the first run of the cells named in `timeline_cells`."""
    setup, cells = load_measured(folder)
    verdicts, spans = [], {}
    for cell in cells:
        sim, sp, _ = resimulate(setup, cell, timeline=cell.name in timeline_cells)
        verdicts.append(judge_cell(cell, sim))
        if sp is not None:
            spans[cell.name] = sp
    return setup, verdicts, spans


# -------------------------------------------------------------------------------------------
# The report


def _pct(e: float | None) -> str:
    return "-" if e is None or not math.isfinite(e) else f"{100 * e:+.1f} %"


def _mark(ok: bool) -> str:
    return "pass" if ok else "**MISS**"


def report_table(verdicts: list[Verdict]) -> str:
    """The errors per cell, markdown."""
    head = ("| mode | k | conc | mean TPOT ms: measured / simulated | error | mean ITL ms: "
            "measured / simulated | error | P99 TPOT ms: measured / simulated | error | "
            "median step gap µs: measured / simulated | gap KS | device vs profile | bounds |")
    lines = [head, "|" + "---|" * 13]
    for v in verdicts:
        c, m, s, e = v.cell, v.measured, v.simulated, v.errors
        gm, gs = m.get("step_gaps", {}), s.get("step_gaps", {})
        ks = v.comparison["ks"]
        dev = c.info.get("device_vs_profile")
        lines.append(
            f"| {c.mode} | {c.k} | {c.conc} "
            f"| {m['mean_tpot_ms']:.3f} / {s['mean_tpot_ms']:.3f} | {_pct(e['mean_tpot_ms'])} "
            f"| {m['mean_itl_ms']:.3f} / {s['mean_itl_ms']:.3f} | {_pct(e['mean_itl_ms'])} "
            f"| {m['p99_tpot_ms']:.3f} / {s['p99_tpot_ms']:.3f} | {_pct(e['p99_tpot_ms'])} "
            f"| {gm.get('median_us', 0):.0f} / {gs.get('median_us', 0):.0f} "
            f"| {'-' if ks is None else f'{ks:.2f}'} | {_pct(dev)} "
            f"| {_mark(v.ok) if v.ok else ', '.join(n for k, n, _ in BOUNDS if not v.passed[k]) + ' MISS'} |")
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


def summary_counts(verdicts: list[Verdict], saving_rows: list[dict]) -> str:
    n = len(verdicts)
    parts = [f"{sum(v.passed[k] for v in verdicts)}/{n} cells within ±{100 * b:g} % on {name}"
             for k, name, b in BOUNDS]
    if saving_rows:
        parts.append(f"{sum(r['passed'] for r in saving_rows)}/{len(saving_rows)} savings "
                     f"within {100 * SAVING_BOUND:g} %")
        parts.append(f"{sum(bool(r.get('within_noise')) for r in saving_rows)}/"
                     f"{len(saving_rows)} simulated savings within the measured saving's 95 % "
                     "interval")
    return "; ".join(parts)
