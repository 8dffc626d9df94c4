"""Judging a measured folder: re-simulate every cell and hold it to its bounds
(docs/explanation/design.md §7).

`resimulate` runs each judged run's trace through the simulator with that run's accepted counts
(so both see the same acceptance) and the folder's profile, and pools the repeats of a cell as
one benchmark; `judge_cell` takes the errors against BOUNDS; `savings` sets what async and
zero-bubble save over sync, measured against simulated.

The bounds are fixed here and never loosened by a command. A cell may miss one only where the
folder's `known_misses.toml` (written by hand) says so: each entry names the cell and metric,
its signed error when it was committed, a cap of the same sign, and the reason. The error may
then go past the bound on that side only, up to the cap (`check_bounds`). A saving must also
keep its sign: where the measured saving is outside its own 95 % interval of zero, the
simulated saving must be of the same sign, whatever a known miss says.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from stepgap.calibrate.measured import MeasuredCell, Setup, load_measured, requests_of
from stepgap.common.compare import compare, pool_results
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_toml
from stepgap.common.run_result import RunResult
from stepgap.sim.config import SimConfig
from stepgap.sim.jitter import run_levels
from stepgap.sim.loop import simulate
from stepgap.sim.profile import load_profile

# The bounds every folder is held to, fixed (docs/explanation/validation.md): |simulated - measured|
# / measured.
BOUNDS = (("mean_tpot_ms", "mean TPOT", 0.05), ("mean_itl_ms", "mean ITL", 0.05),
          ("p99_tpot_ms", "P99 TPOT", 0.10))
# A folder judged by the "prefix" rules (a shared-prefix trace) holds TTFT too: prefix caching
# is what moves it.
TTFT_BOUND = ("mean_ttft_ms", "mean TTFT", 0.05)
# Student's t, two-sided 95 %, by degrees of freedom (beyond the table: 1.96)
T95 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
       18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}
SAVING_BOUND = 0.25   # of the measured saving of async / zero-bubble over sync (mean ITL)
# A vLLM folder's second profile: fitted on its sync runs alone (the async terms estimated from
# them, calibrate/vllm_fit.py estimate_async), judged as the folder's own (tests/test_fidelity.py)
SYNC_ONLY_PROFILE = "profile-sync-only.json"


def sim_config(setup: Setup, run: RunResult, timeline: bool = False,
               **overrides) -> SimConfig:
    """The simulator's configuration of one measured run: the folder's topology and costs, the
    run's mode, k, concurrency and scheduler limits."""
    c = run.config
    s = dict(setup.settings)
    folder = {key: s.pop(key, None) for key in ("max_num_seqs", "max_model_len",
                                                 "num_gpu_blocks_override")}
    limits = {"max_num_seqs": c.get("max_num_seqs") or folder["max_num_seqs"] or 256,
              "max_num_batched_tokens": c.get("max_num_batched_tokens", 8192),
              "max_model_len": c.get("max_model_len") or folder["max_model_len"] or 2048,
              "num_gpu_blocks_override": c.get("num_blocks")
              or folder["num_gpu_blocks_override"]}
    # a run measured before prefix caching existed (its config says neither) ran without it
    settings = {**s, **limits, "mode": c.get("mode", "sync"), "k": c.get("k", 0),
                "enable_prefix_caching": c.get("enable_prefix_caching",
                                               run.prefix_cache is not None),
                "max_concurrency": run.max_concurrency, "replay": True,
                "detailed": True, "timeline": timeline, **overrides}
    return SimConfig(**settings)


def resimulate(setup: Setup, cell: MeasuredCell, timeline: bool = False,
               device_scale: float = 1.0, cpu_factor: float = 1.0, **overrides):
    """(the pooled simulated result, the first run's spans or None, each run's result).

    With a profile that measured the machine's noise, the runs of a cell get the measured
    spread of run-level speeds (stratified, mean 1: `sim.jitter.run_levels`) and each its own
    jitter seed, as the measured runs met the machine at different moments. `device_scale`
    and `cpu_factor` multiply every device op and every CPU cost (the tests show the bounds
    catch a 10 % error in either)."""
    if cpu_factor != 1.0:
        base = overrides.get("cpu_scale", setup.settings.get("cpu_scale", 1.0))
        overrides["cpu_scale"] = base * cpu_factor
    results, spans = [], None
    levels = [1.0] * len(cell.runs)
    prof = overrides.get("profile", setup.settings.get("profile"))
    if prof and overrides.get("jitter", True):
        jitter = load_profile(prof).jitter
        if jitter:
            levels = run_levels(jitter.run_log_factors, len(cell.runs))
    for n, run in enumerate(cell.runs):
        cfg = sim_config(setup, run, timeline and n == 0,
                         **{"speed": levels[n], "device_scale": device_scale, "seed": n,
                            **overrides})
        res, sp = simulate(cfg, requests_of(run, setup.prompts))
        results.append(res)
        if n == 0 and timeline:
            spans = sp
    return pool_results(results), spans, results


# -------------------------------------------------------------------------------------------
# Judging


@dataclass
class Verdict:
    cell: MeasuredCell
    measured: RunResult   # pooled
    simulated: RunResult  # pooled
    errors: dict          # metric -> relative error
    passed: dict          # metric -> bool
    comparison: dict      # common.compare.compare(measured, simulated)
    p99_interval: tuple | None = None   # 95 % interval of the measured P99 TPOT (ms)
    prefix_cache: list | None = None    # per run: (measured, simulated) {queries, hits}

    @property
    def ok(self) -> bool:
        return all(self.passed.values())


def bounds_of(rules: str) -> tuple:
    """The (metric, label, bound) triples a rule set holds every cell to."""
    return BOUNDS + ((TTFT_BOUND,) if RULES[rules]["prefix"] else ())


def judge_cell(cell: MeasuredCell, simulated: RunResult, bounds: tuple = BOUNDS,
               runs: list[RunResult] | None = None) -> Verdict:
    """A cell's pooled errors against `bounds`; with its simulated `runs`, each run's
    prefix-cache counts beside the measured run's."""
    measured = pool_results(cell.runs)
    errors, passed = {}, {}
    for key, _, bound in bounds:
        e = (simulated.metrics.get(key) - measured.metrics.get(key)) / measured.metrics.get(key)
        errors[key], passed[key] = e, abs(e) <= bound
    caches = None
    if runs is not None:
        caches = [(prefix_counts(m.prefix_cache), prefix_counts(r.prefix_cache))
                  for m, r in zip(cell.runs, runs)]
    return Verdict(cell, measured, simulated, errors, passed, compare(measured, simulated),
                   p99_interval(cell.runs), caches)


def prefix_counts(pc: dict | None) -> dict | None:
    """vLLM's prefix-cache counters of a run (tokens queried, tokens found), or None."""
    return None if pc is None else {"queries": pc["queries"], "hits": pc["hits"]}


def p99_interval(runs: list[RunResult], n: int = 2000, seed: int = 0) -> tuple | None:
    """The 95 % interval of a cell's pooled P99 TPOT (ms): a bootstrap over its requests."""
    import numpy as np
    tpots = []
    for i, r in enumerate(runs):
        try:
            ts = r.timings(f"#{i}")
        except UserError:
            return None
        tpots += [(t.chunk_s[-1] - t.chunk_s[0]) / (t.output_len - 1) * 1e3 for t in ts
                  if t.output_len > 1]
    if len(tpots) < 20:
        return None
    x = np.asarray(tpots)
    rng = np.random.default_rng(seed)
    boot = np.percentile(x[rng.integers(0, len(x), (n, len(x)))], 99, axis=1)
    return float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def paired_half_width(base_runs: list[RunResult], runs: list[RunResult]) -> float | None:
    """Half-width (ms) of the 95 % interval of a measured saving: the spread of the per-run
    differences in mean ITL between runs of the two modes on the same slice (they ran back to
    back), over the square root of their number. None with fewer than 3 pairs."""
    def by_slice(rs):
        return {r.config.get("slice", i): r.metrics.mean_itl_ms for i, r in enumerate(rs)}
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
        m = base.measured.metrics.mean_itl_ms - v.measured.metrics.mean_itl_ms
        s = base.simulated.metrics.mean_itl_ms - v.simulated.metrics.mean_itl_ms
        err = (s - m) / abs(m) if m else math.inf
        half = paired_half_width(base.cell.runs, v.cell.runs)
        rows.append({"mode": mode, "k": k, "conc": conc, "measured_ms": m, "simulated_ms": s,
                     "measured_pct": 100 * m / base.measured.metrics.mean_itl_ms,
                     "half_width_ms": half,
                     "within_noise": half is not None and abs(s - m) <= half,
                     "error": err, "passed": abs(err) <= SAVING_BOUND})
    return sorted(rows, key=lambda r: (r["k"], r["conc"] or 0, r["mode"]))


def judge_folder(folder, timeline_cells: tuple = (), cells: tuple | None = None,
                 **overrides) -> tuple[Setup, list[Verdict], dict]:
    """Re-simulate every cell of a measured folder (or those named in `cells`) and judge it,
    with SimConfig `overrides` if given (the tests scale the costs so). Also returns the
    simulated spans of the first run of the cells named in `timeline_cells`."""
    setup, all_cells = load_measured(folder)
    bounds = bounds_of(rules_for(setup))
    verdicts, spans = [], {}
    for cell in all_cells:
        if cells is not None and cell.name not in cells:
            continue
        sim, sp, runs = resimulate(setup, cell, timeline=cell.name in timeline_cells,
                                   **overrides)
        verdicts.append(judge_cell(cell, sim, bounds, runs))
        if sp is not None:
            spans[cell.name] = sp
    return setup, verdicts, spans


# -------------------------------------------------------------------------------------------
# Known misses, written by hand


MISS_METRICS = tuple(key for key, _, _ in BOUNDS + (TTFT_BOUND,)) + ("saving",)
MISSES_FILE = "known_misses.toml"
SYNC_ONLY_MISSES = "known_misses_sync_only.toml"   # SYNC_ONLY_PROFILE's, by the same rules


@dataclass(frozen=True)
class KnownMiss:
    cell: str        # e.g. sync-k0-c4; for a saving, the async or zero-bubble cell
    metric: str      # a BOUNDS key, or "saving"
    error: float     # signed, when it was committed
    cap: float       # same sign: the error may pass its bound on that side, up to here
    reason: str


# A known miss cannot drift, so that a rerun cannot make a regression the new normal: its
# committed error is the error now, within DRIFT
# either way (a change that moves the simulator on that cell, better or worse, fails until the
# file is updated by hand), and its cap lies at most CAP_SLACK x |error| + DRIFT out.
DRIFT = 0.01
CAP_SLACK = 1.25
ROOT = Path(__file__).resolve().parents[1]
# What a reason may cite: a path in the repository (a file, or a folder of committed data).
CITED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.*-]+|[\w-]+\.(?:py|md|toml|json))")


def cited(reason: str, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """The repository paths a reason names that exist (a command's file and folder arguments
    included), and those that name `out/` (not committed). A token that is no path in the
    repository (prose such as "sync/async", or a path outside it) is neither."""
    good, bad = [], []
    for token in CITED.findall(reason):
        token = token.rstrip(".,;:)")
        path = root / token
        if token.startswith("out/") or "/out/" in token:
            bad.append(token)
        elif path.resolve().is_relative_to(root.resolve()) and (
                path.exists() or any(root.glob(token))):
            good.append(token)
    return good, bad


def load_known_misses(folder, metrics: tuple[str, ...] | None = None, name: str = MISSES_FILE
                      ) -> dict[tuple[str, str], KnownMiss]:
    """The folder's known_misses.toml ({} if it has none). Every entry is checked: a known
    metric (of `metrics`, by default MISS_METRICS), a signed error, a cap of the same sign at
    least as far out and at most CAP_SLACK x |error| + DRIFT, and a reason that names a
    committed file or a command over committed data (not `out/`)."""
    metrics = metrics or MISS_METRICS
    path = Path(folder) / name
    if not path.is_file():
        return {}
    doc = read_toml(path)
    entries = doc.get("miss", [])
    if not isinstance(entries, list):
        raise UserError(f"{where(path, field='miss')}: expected [[miss]] tables, got "
                        f"{entries!r}")
    out = {}
    for n, d in enumerate(entries):
        src = where(path, field=f"miss[{n}]")
        try:
            m = KnownMiss(str(d["cell"]), str(d["metric"]), float(d["error"]), float(d["cap"]),
                          str(d["reason"]).strip())
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{src}: expected cell, metric, error, cap and reason") from None
        bad = next((k for k in ("error", "cap") if not math.isfinite(getattr(m, k))), None)
        if bad:
            raise UserError(f"{src}.{bad}: expected a finite fraction, got {d[bad]!r}")
        if m.metric not in metrics:
            raise UserError(f"{src}: metric {m.metric!r} (expected one of "
                            f"{', '.join(metrics)})")
        if not m.reason:
            raise UserError(f"{src}: a known miss needs its reason")
        if m.error * m.cap <= 0 or abs(m.cap) < abs(m.error):
            raise UserError(f"{src}: the cap {m.cap:+.4f} must have the error's sign "
                            f"({m.error:+.4f}) and lie at least as far out")
        if abs(m.cap) > CAP_SLACK * abs(m.error) + DRIFT + 1e-12:
            raise UserError(f"{src}: the cap {m.cap:+.4f} lies further out than "
                            f"{CAP_SLACK:g} x |error| + {DRIFT:g} "
                            f"({CAP_SLACK * abs(m.error) + DRIFT:.4f})")
        good, bad = cited(m.reason)
        if bad or not good:
            raise UserError(f"{src}.reason: it must name a committed file or a command over "
                            f"committed data (`out/` is not committed)"
                            + (f"; {', '.join(bad)} is not" if bad else "; it names none"))
        if (m.cell, m.metric) in out:
            raise UserError(f"{src}: {m.cell} {m.metric} is listed twice")
        out[(m.cell, m.metric)] = m
    return out


def miss_failures(cell: str, label: str, e: float, bound: float, miss: KnownMiss | None,
                  passes: bool) -> list[str]:
    """What one bound of one cell breaks, given its known miss: outside its allowed interval;
    a known miss whose error moved more than DRIFT from the committed one (either way); a
    known miss the cell no longer needs (`passes`: within its bound, or an alternative the
    folder's rules admit). [] when all holds."""
    if miss is None:
        if passes:
            return []
        return [f"{cell}: {label} {e:+.1%} outside [{-bound:+.1%}, {bound:+.1%}]"]
    out = []
    lo, hi = allowed(bound, miss)
    if not lo <= e <= hi:
        out.append(f"{cell}: {label} {e:+.1%} outside [{lo:+.1%}, {hi:+.1%}] (known miss: "
                   f"committed {miss.error:+.1%}, cap {miss.cap:+.1%})")
    if abs(e - miss.error) > DRIFT:
        out.append(f"{cell}: {label} {e:+.1%}, but its known miss was committed at "
                   f"{miss.error:+.1%}: the simulator moved on this cell; update "
                   f"known_misses.toml by hand")
    if passes:
        out.append(f"{cell}: {label} {e:+.1%} passes its bound: the known miss is stale; "
                   "delete it from known_misses.toml")
    return out


def allowed(bound: float, miss: KnownMiss | None) -> tuple[float, float]:
    """The interval an error must stay in: ±bound, widened on the known miss's side to its
    cap."""
    if miss is None:
        return -bound, bound
    return (min(miss.cap, -bound), bound) if miss.cap < 0 else (-bound, max(miss.cap, bound))


def saving_cell(row: dict) -> str:
    from stepgap.calibrate.harness import cell_name
    return cell_name(row["mode"], row["k"], row["conc"])


def sign_flipped(row: dict) -> bool:
    """The measured saving is outside its own 95 % interval of zero, and the simulated one has
    the other sign."""
    half = row.get("half_width_ms")
    m, s = row["measured_ms"], row["simulated_ms"]
    return half is not None and abs(m) > half and m * s < 0


# Which alternatives a folder's bounds admit, and what more it is held to (rules_for;
# docs/explanation/history.md says when each was set): the engine's: the bounds alone; vLLM's: P99
# TPOT within 10 % *or* inside the measured cell's own 95 % interval, and a saving within 25 %
# (right sign) *or* inside its measured interval (a real server's cells vary more from run to run
# than a bound can absorb); the engine's on a trace whose runs hit the prefix cache: the engine's
# bounds, mean TTFT within 5 % too, and every run's prefix-cache queries and hits exactly the
# engine's (no known miss can excuse a count).
RULES = {"engine": {"p99_interval": False, "saving_interval": False, "prefix": False},
         "vllm": {"p99_interval": True, "saving_interval": True, "prefix": False},
         "prefix": {"p99_interval": False, "saving_interval": False, "prefix": True}}


def rules_for(setup: Setup) -> str:
    """A folder's rule set, from what it measured (vLLM's runs: "vllm"; stepgap's engine:
    "engine", or "prefix" where its judged runs found prompt tokens in the prefix cache: a
    trace with shared prefixes), never from a field its builder chose; tests/test_fidelity.py
    pins each committed folder's."""
    if str(setup.manifest.get("device", "")).startswith("vllm"):
        return "vllm"
    return "prefix" if setup.prefix_hits else "engine"


def prefix_failures(v: Verdict) -> list[str]:
    """Each run whose simulated prefix-cache counts are not the measured ones, exactly."""
    out = []
    for n, (m, s) in enumerate(v.prefix_cache or []):
        if m is None or m != s:
            out.append(f"{v.cell.name}: run {n}: prefix cache measured {m}, simulated {s} "
                       "(must be equal)")
    if not v.prefix_cache:
        out.append(f"{v.cell.name}: no run's prefix-cache counts to compare")
    return out


def bound_failures(verdicts: list[Verdict], rows: list[dict],
                   misses: dict[tuple[str, str], KnownMiss], rules: str = "engine") -> list[str]:
    """Every bound the judged folder breaks, one line each ([] when all hold)."""
    rule = RULES[rules]
    out = []
    p99 = {v.cell.name: (v.simulated.metrics.percentile("tpot", 99), v.p99_interval)
           for v in verdicts}
    noise = {saving_cell(r): r.get("within_noise") for r in rows}

    def check(cell: str, key: str, label: str, e: float, bound: float) -> None:
        alternative = (key == "p99_tpot_ms" and rule["p99_interval"]
                       and p99[cell][1] is not None
                       and p99[cell][1][0] <= p99[cell][0] <= p99[cell][1][1]) \
            or (key == "saving" and rule["saving_interval"] and bool(noise.get(cell)))
        passes = abs(e) <= bound or alternative
        out.extend(miss_failures(cell, label, e, bound, misses.get((cell, key)), passes))

    judged = {key for key, _, _ in bounds_of(rules)} | {"saving"}
    out += [f"{cell}: a known miss of {metric}, which the {rules!r} rules do not judge"
            for cell, metric in misses if metric not in judged]
    for v in verdicts:
        for key, label, bound in bounds_of(rules):
            check(v.cell.name, key, label, v.errors[key], bound)
        if rule["prefix"]:
            out.extend(prefix_failures(v))
    for r in rows:
        check(saving_cell(r), "saving", "saving over sync", r["error"], SAVING_BOUND)
        if sign_flipped(r):
            out.append(f"{saving_cell(r)}: the simulated saving {r['simulated_ms']:+.3f} ms has "
                       f"the other sign from the measured {r['measured_ms']:+.3f} "
                       f"± {r['half_width_ms']:.3f} ms")
    return out
