"""Fitting a profile: what every step costs on a machine, from the engine's own timelines.

Two sources, one JSON profile (the format is `sim/profile.py`'s):

1. A microbenchmark grid of the device ops, run through the worker's own execute/collect on
   crafted steps: target forward over token counts x batch sizes x context lengths, with the
   draft's first and one-token passes, rejection sampling and the D2H copy that every step runs.
2. Calibration runs of the engine (the `process` executor, pinned) on a calibration trace cut
   from the corpus's *training* files, never from the judged held-out prompts. Their timelines
   give the device ops in situ and every CPU term the simulator uses (`sim/cpu_costs.py` CpuCosts):
   schedule, update_from_output, prepare_inputs and launch as a + b·reqs + c·tokens, the IPC
   latency of a step's message, and the worker's result latency and turnaround.

Device op fits come from the calibration runs (the engine's real steps, with the other process
running, which is what is being predicted), steadied by the grid: its points join the fit at the
in-situ level, so that shapes the calibration runs rarely take (two or three requests, long prefills
next to decodes) follow the grid's slopes (`fit_shaped`). How far the grid alone sits from the
in-situ times is kept in the profile's `checks` (docs/explanation/validation.md has the numbers).
How a step is cut into device and CPU samples is calibrate/samples.py's.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from stepgap.calibrate.samples import cpu_samples, device_points
from stepgap.common.formats import Span
from stepgap.sim.cpu_costs import CPU_COSTS, OpCost
from stepgap.sim.profile import FEATURES, CpuFit, Fit, Noise, Profile

GRID_REQS = (1, 2, 4)
GRID_CONTEXT = (64, 160, 240)
GRID_QUERY = (16, 64)      # prefill chunks, besides the decode shape 1 + k
GRID_REPEATS = 5


# -------------------------------------------------------------------------------------------
# Least squares


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (costs do not fall with more work): the best
    of the unconstrained fits over every subset of the columns that comes out non-negative.
    Exact for the handful of columns used here."""
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y ** 2))
    cols = range(x.shape[1])
    for mask in range(1, 1 << x.shape[1]):
        idx = [c for c in cols if mask >> c & 1]
        coef, *_ = np.linalg.lstsq(x[:, idx], y, rcond=None)
        if (coef < 0).any():
            continue
        err = float(np.sum((x[:, idx] @ coef - y) ** 2))
        if err < best_err:
            best = np.zeros(x.shape[1])
            best[idx] = coef
            best_err = err
    return best


def fit_points(xs: list[list[float]], ys: list[float], weights: list[float] | None = None
               ) -> tuple[tuple[float, ...], float]:
    """Non-negative least squares of ys on xs: (coefficients, median relative error)."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    w = np.sqrt(np.asarray(weights, float)) if weights is not None else np.ones(len(y))
    coef = nnls(x * w[:, None], y * w)
    pred = x @ coef
    rel = np.abs(y - pred) / np.maximum(np.abs(y), 1e-9)
    return tuple(float(c) for c in coef), float(np.median(rel))


def add_device(acc: dict, points: list[dict]) -> None:
    """Per (op, pass): the measured time and the features, summed (the fits are linear, so
    the profile's prediction for all these steps is its coefficients times the sums)."""
    for p in points:
        a = acc.setdefault(f"{p['op']}/{p['i']}", [0.0, [0.0] * len(p["x"])])
        a[0] += p["us"]
        a[1] = [s + x for s, x in zip(a[1], p["x"])]


def device_vs_profile(acc: dict, profile: Profile, k: int) -> float | None:
    """How much longer (> 0) the judged runs' device ops took than the profile predicts for
    the same steps: the machine's drift between calibration and these runs, not a model error."""
    fits = {(f.op, f.i): f.coef for f in profile.fits if f.k == k}
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
# Fits


def fit_device(points: list[dict], source: str) -> list[Fit]:
    """One fit per (op, draft pass, k) over the points' features."""
    groups = defaultdict(list)
    for p in points:
        groups[(p["op"], p["i"], p["k"])].append(p)
    fits = []
    for (op, i, k), ps in sorted(groups.items(), key=lambda kv: str(kv[0])):
        coef, err = fit_points([p["x"] for p in ps], [p["us"] for p in ps],
                               [p.get("count", 1) for p in ps])
        fits.append(Fit(op, i, k, coef, sum(p.get("count", 1) for p in ps), err, source))
    return fits


def fit_shaped(situ: list[dict], grid: list[dict], grid_fits: list[Fit]) -> list[Fit]:
    """In-situ fits steadied by the grid. The calibration runs set the level, but their steps
    cover few shapes (most are decodes of one size), so a fit on them alone can tilt anywhere
    off those shapes. The grid covers the shapes evenly; its points join the fit rescaled to the
    in-situ level (the ratio of the in-situ times to the grid fit's prediction of them) and
    weighted to a quarter of the in-situ points."""
    by_grid = {(f.op, f.i, f.k): f for f in grid_fits}
    groups = defaultdict(list)
    for p in situ:
        groups[(p["op"], p["i"], p["k"])].append(p)
    gpts = defaultdict(list)
    for p in grid:
        gpts[(p["op"], p["i"], p["k"])].append(p)
    fits = []
    for key, ps in sorted(groups.items(), key=lambda kv: str(kv[0])):
        gfit, gps = by_grid.get(key), gpts.get(key)
        if gfit is None or not gps:
            continue
        predicted = sum(gfit(p["x"]) for p in ps)
        level = sum(p["us"] for p in ps) / predicted if predicted else 1.0
        w = max(1.0, 0.25 * len(ps) / len(gps))
        xs = [p["x"] for p in ps] + [p["x"] for p in gps]
        ys = [p["us"] for p in ps] + [p["us"] * level for p in gps]
        coef, _ = fit_points(xs, ys, [1.0] * len(ps) + [w] * len(gps))
        err = float(np.median([abs(p["us"] - np.dot(coef, p["x"])) / p["us"] for p in ps]))
        fits.append(Fit(key[0], key[1], key[2], coef, len(ps), err,
                        f"calibration runs, shaped by the grid (grid level x{level:.3f})"))
    return fits


def determined(x: np.ndarray, tol: float = 1e-3) -> list[bool]:
    """Columns of x that add to its rank, in order (the first, the fixed term, always): a
    column that is constant, zero or a combination of the ones before it is not determined."""
    norms = np.sqrt((x ** 2).mean(axis=0))
    keep, cols = [], []
    for j in range(x.shape[1]):
        if norms[j] == 0:
            keep.append(False)
            continue
        trial = np.column_stack([*cols, x[:, j] / norms[j]])
        s = np.linalg.svd(trial, compute_uv=False)
        ok = s[-1] > tol * s[0]
        keep.append(bool(ok))
        if ok:
            cols.append(x[:, j] / norms[j])
    return keep


def fit_determined(xs, ys, names, what: str) -> tuple[list[float], float, list[str]]:
    """Non-negative least squares on the determined columns only: (coefficients with 0 for
    the others, median relative error, what was not determined)."""
    x = np.asarray(xs, float)
    keep = determined(x)
    coef_k, err = fit_points(x[:, keep].tolist(), ys)
    coef, it = [], iter(coef_k)
    for k in keep:
        coef.append(next(it) if k else 0.0)
    missing = [f"{what}: {n} not determined by the data" for n, k in zip(names, keep) if not k]
    return coef, err, missing


MIN_POINTS = 5   # samples a term needs to be fitted
CPU_FEATURES = ("a (fixed)", "b (per request)", "c (per token)")   # a CPU fit's columns


def fit_cpu(samples: dict[str, list], only_determined: bool = False,
            trip=statistics.fmean) -> tuple[dict, dict, list[str]]:
    """The one CPU fitter of every profile: CpuCosts fields (to_dict form), per term how well
    the fit holds, and what the samples did not determine. Each term of CPU_COSTS with
    MIN_POINTS samples is a + b·reqs + c·tokens, non-negative; `ipc_us` is the `trip` of its
    samples (the mean of the engine's; vLLM's hook spans take the median).

    With `only_determined` (runs the user chose, which may all share one concurrency) a
    coefficient whose feature the samples do not vary is left at 0 and named; the engine's
    calibration plan varies every feature, and its fits take all three."""
    costs, quality, missing = {}, {}, []
    for term in CPU_COSTS:
        rows = samples.get(term) or []
        if len(rows) < MIN_POINTS:
            continue
        xs, ys = [[1.0, r, t] for r, t, _ in rows], [us for _, _, us in rows]
        if only_determined:
            coef, err, miss = fit_determined(xs, ys, CPU_FEATURES, term)
            missing += [m for m in miss if not m.startswith(f"{term}: a ")]
        else:
            coef, err = fit_points(xs, ys)
        OpCost(*coef)   # validates
        costs[term] = [round(c, 4) for c in coef]
        quality[term] = {"n": len(rows), "median_rel_err": round(err, 4),
                         "mean_us": round(statistics.fmean(us for _, _, us in rows), 2)}
    trips = [us for _, _, us in samples.get("ipc_us") or []]
    if trips:
        costs["ipc_us"] = round(trip(trips), 2)
        quality["ipc_us"] = {"n": len(trips), "median_us": round(statistics.median(trips), 2)}
    return costs, quality, missing


def check_against(fits: list[Fit], points: list[dict]) -> dict:
    """How far `fits` sit from measured points: per op key, the mean of fitted / measured."""
    by_key = {(f.op, f.i, f.k): f for f in fits}
    sums = defaultdict(lambda: [0.0, 0.0])
    for p in points:
        f = by_key.get((p["op"], p["i"], p["k"]))
        if f is not None:
            s = sums[f"{p['op']}{'' if p['i'] is None else '/' + str(p['i'])} k={p['k']}"]
            s[0] += f(p["x"])
            s[1] += p["us"]
    return {key: round(a / b, 4) for key, (a, b) in sorted(sums.items()) if b}


def step_series(points: list[dict], fits: dict) -> list[list[float]]:
    """A run's steps as [t (ms from the run's first step), measured us, fitted us] of its device
    ops (the fitted time by `fits`, keyed (op, i, k))."""
    steps = defaultdict(lambda: [0.0, 0.0, 0.0])
    for p in points:
        f = fits.get((p["op"], p["i"], p["k"]))
        if f is None:
            continue
        a = steps[p["step"]]
        a[0] = p["t"]
        a[1] += p["us"]
        a[2] += f(p["x"])
    rows = sorted(v for v in steps.values() if v[1] > 0 and v[2] > 0)
    t0 = rows[0][0] if rows else 0.0
    return [[round((t - t0) / 1e3, 3), round(m, 1), round(f, 1)] for t, m, f in rows]


JITTER_BIN_MS = 50


def fit_jitter(series: list[list[list[float]]], bin_ms: float = JITTER_BIN_MS) -> Noise | None:
    """The machine's speed noise, from the calibration runs' steps: z = log(measured / fitted
    device time). Three parts (sim/jitter.py Jitter):

    - run level: each run's mean z. The machine's speed drifts over seconds and minutes, so
      whole runs are fast or slow (by ±20 % on the machine of docs/explanation/validation.md); the
      spread of the run means, centred;
    - within a run: the rest, averaged over `bin_ms` windows, one segment per run, as a trace
      the simulator replays from a seeded offset (bursts keep their length and height);
    - per step: what is left, as a standard deviation.
    """
    levels, trace, rest = [], [], []
    for rows in series:
        if len(rows) < 20:
            continue
        t = np.array([r[0] for r in rows])
        z = np.log([r[1] / r[2] for r in rows])
        m = float(z.mean())
        levels.append(m)
        bins = (t // bin_ms).astype(int)
        for b in np.unique(bins):
            zb = z[bins == b] - m
            trace.append(float(zb.mean()))
            rest.extend((zb - zb.mean()).tolist())
    if not levels:
        return None
    levels = np.array(levels) - np.mean(levels)
    return Noise(tuple(round(float(x), 4) for x in np.sort(levels)), bin_ms,
                 tuple(round(x, 3) for x in trace), round(float(np.std(rest)), 4), len(levels),
                 int(sum(len(r) for r in series)))


def build_profile(runs: list[tuple[str, int, list[Span]]], grid_points: list[dict],
                  meta: dict) -> tuple[Profile, list]:
    """The profile of calibration runs [(mode, k, spans)] and grid points (`meta`: what they
    were measured on), and each calibration run's device steps ([t ms, measured us, fitted us])
    it fitted the noise on."""
    situ, cpu, per_run = [], defaultdict(lambda: defaultdict(list)), []
    for mode, k, spans in runs:
        per_run.append(device_points(spans, k))
        situ += per_run[-1]
        for term, rows in cpu_samples(spans, mode).items():
            cpu[k][term] += rows
            cpu[None][term] += rows
    situ_fits = fit_device(situ, "calibration runs") if situ else []
    grid_fits = fit_device(grid_points, "grid") if grid_points else []
    chosen = {(f.op, f.i, f.k): f for f in grid_fits}
    chosen.update({(f.op, f.i, f.k): f for f in situ_fits})
    chosen.update({(f.op, f.i, f.k): f for f in fit_shaped(situ, grid_points, grid_fits)})
    pooled = CpuFit(*fit_cpu(cpu[None])[:2])
    by_k = {k: CpuFit(*fit_cpu(v)[:2]) for k, v in sorted(cpu.items(), key=str)
            if k is not None}
    series = [step_series(pts, chosen) for pts in per_run]
    grid_rows = [{**{k: p[k] for k in ("op", "i", "k", "us")},
                  **dict(zip(FEATURES[1:], p["x"][1:]))} for p in grid_points]
    fits = [f.rounded() for f in sorted(chosen.values(), key=lambda f: str((f.op, f.i, f.k)))]
    checks = {"grid_fit_over_calibration_steps": check_against(grid_fits, situ),
              "calibration_fit_over_calibration_steps": check_against(situ_fits, situ)}
    return Profile(fits, pooled, by_k, fit_jitter(series), about=dict(meta),
                   notes={"checks": checks, "grid": grid_rows}), series


# -------------------------------------------------------------------------------------------
# The microbenchmark grid


@dataclass(frozen=True, slots=True)
class GridShape:
    """The shapes of the microbenchmark grid: requests x context x query length (the decode
    shape 1 + k is always among the queries)."""

    reqs: tuple[int, ...] = GRID_REQS
    contexts: tuple[int, ...] = GRID_CONTEXT
    queries: tuple[int, ...] = GRID_QUERY
    repeats: int = GRID_REPEATS

    def shapes(self, ks: list[int]) -> list[tuple[int, int, int, int]]:
        """(k, reqs, context, query) of every grid point."""
        return [(k, r, ctx, q) for k in ks for r in self.reqs for ctx in self.contexts
                for q in sorted({1 + k, *self.queries}) if q < ctx]


def measure_grid(spec, ks: list[int], cpu: int | None = None, grid: GridShape = GridShape(),
                 progress=None) -> list[dict]:
    """Device op points from crafted steps run by the worker's own execute/collect, in this
    process, pinned to `cpu` (the worker's CPU) with one torch thread. Each point is the median
    of `grid.repeats` runs of one step shape, after one warm-up run."""
    import torch

    from stepgap.common.scheduler import cdiv
    from stepgap.engine.worker import ReqRow, RunConfig, StepMsg, Worker

    saved = os.sched_getaffinity(0) if cpu is not None else None
    threads = torch.get_num_threads()
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        if spec.device == "cpu":
            torch.set_num_threads(1)
        worker = Worker(spec)
        rng = np.random.default_rng(0)
        vocab = worker.target_cfg.vocab_size
        bs = spec.block_size
        points, step = [], 0
        for k, reqs, ctx, q in grid.shapes(ks):
            worker.configure(RunConfig("sync", k))
            nb = cdiv(ctx + k + 1, bs)
            prompts = [rng.integers(1, vocab, ctx + 1).tolist() for _ in range(reqs)]
            ids = [f"g{step}-{j}" for j in range(reqs)]
            blocks = [list(range(j * nb, (j + 1) * nb)) for j in range(reqs)]
            setup = [ReqRow(ids[j], ctx - q, 0, False, 0, blocks[j], prompts[j])
                     for j in range(reqs)]
            worker.collect(worker.execute(StepMsg(step, setup, [], [])))
            step += 1
            ns = k if q == 1 + k else 0
            runs = []
            for rep in range(grid.repeats + 1):
                for j in range(reqs):
                    st = worker.states[ids[j]]
                    st.num_computed, st.tokens = ctx - q, list(prompts[j][:ctx])
                    st.pending, st.drafts = [], []
                timed = [ReqRow(ids[j], q, ns, True, ctx - q, blocks[j]) for j in range(reqs)]
                res = worker.collect(worker.execute(StepMsg(step, timed, [], [])))
                step += 1
                if rep:
                    runs.append(device_points(res.spans, k))
            for ops in zip(*runs):   # the same op of every repeat
                points.append({**ops[0], "us": statistics.median(p["us"] for p in ops),
                               "count": len(ops)})
            if progress is not None:
                progress(1)
        return points
    finally:
        torch.set_num_threads(threads)
        if saved is not None:
            os.sched_setaffinity(0, saved)
