"""`stepgap advise`: does `--async-scheduling` pay, and which `num_speculative_tokens`?

One answer per load point, every number with its band, after what the answer rests on.

The question is a vLLM setup (SimConfig settings: model, drafter, GPU or measured tables or a
profile, scheduler, workload) and the loads to judge. The simulator runs every k of the range
in sync, async and zero-bubble at every load (the nominal grid, checked by the sweep machinery,
sim/sweep_grid.py; a load's sync cells, and its async and zero-bubble ones, are a column that
one process runs whole, sim/sweep_runners.py), and takes each mode's best k by mean TPOT.
Then it reruns the cells the answer reads with each uncertain input at the ends of its range
(sim/bands.py): around each mode's best k (k-1..k+1, further where the best moves to the edge
of that window) and at k = 0, so that the best k, its TPOT, the speedup over k = 0 and what
async and zero-bubble save each get a band, and the inputs that dominate it.
"""

from __future__ import annotations

import gc
import json
import math
import time

from stepgap.common.errors import UserError
from stepgap.common.limits import MAX_LOADS
from stepgap.common.speculation import METHODS
from stepgap.sim.advise_report import (METRIC, MODES, Advice, LoadAnswer, ModeAnswer, rests_on,
                                       warnings)
from stepgap.sim.bands import Band, BandInput, band_inputs, combine, int_band

DEFAULT_MAX_K = 8
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32)
EDGE_ROUNDS = 4    # how far a moved best k is followed past its window, per input end


def loads_of(concurrency: list | None, rates: list | None) -> list[dict]:
    """The load points: every concurrency at every rate (either list may be absent)."""
    cs = concurrency if concurrency is not None else [None]
    rs = rates if rates is not None else [None]
    if not cs or not rs:
        raise UserError("--max-concurrency / --request-rate: the load list is empty; give at "
                        "least one load point (e.g. --max-concurrency 1,2,4,8,16,32)")
    if len(cs) * len(rs) > MAX_LOADS:
        given = " x ".join(f"{len(v)} {name}" for v, name in (
            (concurrency, "--max-concurrency"), (rates, "--request-rate")) if v is not None)
        raise UserError(f"{given}: {len(cs) * len(rs):,} load points, past the {MAX_LOADS} one "
                        "question judges (each is two columns of simulations at every k); "
                        "ask about fewer loads at a time")
    return [{k: v for k, v in (("max_concurrency", c), ("request_rate", r)) if v is not None}
            for r in rs for c in cs]


def depths(settings: dict, max_k: int) -> list[int]:
    """k = 0..max_k, as the drafter allows (MTP: up to its layers, then multiples of them)."""
    from stepgap.common.model_presets import load_model_config
    method = METHODS.get(settings.get("method"))   # (None: the default, eagle3)
    if method is not None and method.uses_mtp_layers:
        n = load_model_config(settings.get("model", "llama-3.1-8b")).num_mtp_layers or 1
        return [k for k in range(max_k + 1) if k <= n or k % n == 0]
    return list(range(max_k + 1))


# ---------------------------------------------------------------------------------------------
# Running cells


class Cells:
    """Simulated cells by their settings, each run once, in this process. A cell that differs
    from one run before only in how long things take (a band's CPU and device ends, at the k
    of a nominal cell; zero-bubble at async's k and ends) replays that run's steps
    (sim/steps.py `Recording`, kept per `steps_key` as long as this object): the same
    metrics, in a fraction of the time (docs/reports/2026-12-07-simulator-speed.md)."""

    def __init__(self):
        self.done: dict = {}
        self.idle: dict = {}    # the share of each cell's run the device sat idle
        self.steps: dict = {}   # steps_key(settings) -> the first such run's Recording

    @staticmethod
    def key(settings: dict) -> str:
        return json.dumps(settings, sort_keys=True, default=str)

    def run(self, cells: list[dict]) -> None:
        from stepgap.sim.config import SimConfig
        from stepgap.sim.loop import Recording, simulate
        from stepgap.sim.steps import steps_key
        from stepgap.sim.sweep_runners import metrics_of
        for s in cells:
            key = self.key(s)
            if key not in self.done:
                rec = self.steps.setdefault(steps_key(s), Recording())
                res = simulate(SimConfig(**s), recording=rec)[0]
                self.done[key] = metrics_of(res)
                gap, duration = res.step_gaps.mean_us, res.metrics.duration
                self.idle[key] = gap * res.plan.num_steps / (duration * 1e6) \
                    if gap and duration else 0.0

    def tpot(self, settings: dict) -> float:
        """The cell's mean TPOT; inf where it has none, or was not simulated."""
        v = self.done.get(self.key(settings), {}).get(METRIC)
        return v if v is not None and math.isfinite(v) else math.inf


def column(task: tuple) -> tuple[dict, dict]:
    """One load's answer for sync, or for async and zero-bubble, in one process (a worker's):
    the nominal cells of every k, then the searches of the input ends (`search`), whose CPU
    and device ends replay the nominal cells' steps. (the cells' metrics, `search`'s dict)

    Python's cycle collector is paused meanwhile: the recordings kept are many long-lived
    objects that each full collection would scan again (about a tenth of the question's time,
    docs/reports/2026-12-03-advise-speed.md), and a run leaves almost no cyclic garbage
    (`Clock.close`)."""
    base, load, modes, ks, inputs = task
    cells = Cells()
    collecting = gc.isenabled()
    gc.disable()
    try:
        cells.run([cell(base, load, m, k) for m in modes if m != "zero-bubble" for k in ks])
        if "zero-bubble" in modes:
            cells.run([cell(base, load, "zero-bubble", k)
                       for k in zero_bubble_ks(cells, base, load, ks)])
        return cells.done, search(cells, base, load, modes, ks, inputs)
    finally:
        if collecting:
            gc.enable()


def zero_bubble_ks(cells: Cells, base: dict, load: dict, ks: list[int]) -> list[int]:
    """The ks where zero-bubble could beat async at its best k: zero-bubble differs from async
    only in not waiting for the accepted counts (and a device fixup), so it can save at most the
    time async left the device idle, a share f of its run; a k where async's TPOT x (1 - 2f) is
    still above async's best is not simulated (twice the bound, for safety). Async's best k is
    always simulated, to say what zero-bubble adds there."""
    keys = {k: cells.key(cell(base, load, "async", k)) for k in ks}
    best = min(cells.done[key][METRIC] for key in keys.values())
    keep = []
    for k, key in keys.items():
        tpot = cells.done[key][METRIC]
        if tpot == best or tpot * (1 - 2 * cells.idle[key]) <= best:
            keep.append(k)
    return keep


def cell(base: dict, load: dict, mode: str, k: int) -> dict:
    return {**base, **load, "mode": mode, "k": k}


def best_of(tpots: dict) -> int:
    """The k with the smallest mean TPOT (the smaller k on a tie)."""
    return min(sorted(tpots), key=lambda k: tpots[k])


# ---------------------------------------------------------------------------------------------
# The answer


def advise(base: dict, loads: list[dict], ks: list[int], band: bool = True, jobs: int = 1,
           progress=None) -> Advice:
    """Answer the question for every load (module docstring)."""
    from stepgap.sim.sweep import cell_notes
    from stepgap.sim.sweep_grid import Grid
    from stepgap.sim.sweep_runners import run_local

    t0 = time.perf_counter()
    base = {k: v for k, v in base.items() if k not in ("detailed", "timeline")}
    if not loads:
        raise UserError("the load list is empty; give --max-concurrency or --request-rate")
    axes = {"mode": list(MODES), "k": ks}
    for name in ("request_rate", "max_concurrency"):
        values = list(dict.fromkeys(ld[name] for ld in loads if name in ld))
        if values:
            axes[name] = values
    grid = Grid(axes, {k: v for k, v in base.items() if k not in axes})
    checked = grid.cells(keyed=False)   # every cell built, resolved, its workload checked
    check_tokens_to_time(cell(base, loads[0], "sync", 0))
    inputs = band_inputs(base, max(ks)) if band else []
    # a column per load and mode (zero-bubble with async, whose best k it is judged at), the
    # longest first (the fewest requests at once: the most steps), so that the processes end
    # together
    tasks = sorted(((li, modes) for li in range(len(loads))
                    for modes in (("async", "zero-bubble"), ("sync",))),
                   key=lambda t: loads[t[0]].get("max_concurrency") or math.inf)
    results = [None] * len(tasks)
    for i, res in run_local([(base, loads[li], modes, ks, inputs) for li, modes in tasks],
                            jobs, column):
        results[i] = res
        if progress is not None:
            progress(len(res[0]))
    cells, found = Cells(), [{} for _ in loads]
    for (li, _), (done, f) in zip(tasks, results):   # in task order: the same bytes each time
        cells.done.update(done)
        found[li].update(f)
    answers = [answer(cells, base, load, ks, inputs, f) for load, f in zip(loads, found)]
    advice = Advice(base, ks, inputs, rests_on(base, ks, inputs), answers, cell_notes(checked))
    advice.sims, advice.seconds = len(cells.done), time.perf_counter() - t0
    advice.cells = [json.loads(key) for key in cells.done]
    return advice


def check_tokens_to_time(settings: dict) -> None:
    """The question is the mean TPOT: a workload whose every request ends at its first token
    (--output-len 1, one prompt of one token) has none, so no k or mode is better than another.
    Refused before the simulations, not divided by."""
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import build_workload
    cfg = SimConfig(**settings)
    if all(r.output_len <= 1 for r in build_workload(cfg)):
        given = f"--output-len {cfg.output_len}" if cfg.output_len is not None else \
            f"the workload {cfg.workload}"
        raise UserError(f"{given}: every request ends at its first token, so there is no time "
                        "per output token to choose k or the scheduling by; ask with 2 or more "
                        "output tokens")


def answer(cells: Cells, base: dict, load: dict, ks: list[int], inputs: list[BandInput],
           found: dict) -> LoadAnswer:
    """One load's answer from the nominal grid and `found` (`search`: each input end's best k
    per mode, its TPOT and the TPOT at k = 0)."""
    grids = {m: {k: cells.tpot(cell(base, load, m, k)) for k in ks} for m in MODES}
    best = {m: best_of(grids[m]) for m in MODES}
    ends = [(inp, end) for inp in inputs for end in ("low", "high")]

    def at(w, m):
        return found[(w[0].name, w[1], m)]
    modes = {}
    for m in MODES:
        k0, tp = grids[m].get(0, math.nan), grids[m][best[m]]
        zb = m == "zero-bubble"   # searched at its nominal best k only (`search`)
        modes[m] = ModeAnswer(
            int_band(best[m], [] if zb else [at(w, m)[0] for w in ends]),
            combine(tp, per_input(inputs, lambda w: at(w, m)[1])),
            Band(k0 / tp, k0 / tp, k0 / tp) if zb else
            combine(k0 / tp, per_input(inputs, lambda w: at(w, m)[2] / at(w, m)[1])),
            grids[m])

    def saving(a, b):   # what mode b saves of mode a's TPOT, each at its best k
        return combine(1 - grids[b][best[b]] / grids[a][best[a]],
                       per_input(inputs, lambda w: 1 - at(w, b)[1] / at(w, a)[1]))
    ans = LoadAnswer(load, modes, saving("sync", "async"), saving("async", "zero-bubble"))
    ans.warnings = warnings(ans, ks, inputs)
    return ans


def per_input(inputs: list[BandInput], value) -> dict:
    """input name -> (value at its low end, at its high end)."""
    return {inp.name: (value((inp, "low")), value((inp, "high"))) for inp in inputs}


def search(cells: Cells, base: dict, load: dict, modes: tuple, ks: list[int],
           inputs: list[BandInput]) -> dict:
    """For one load: (input, end, mode) -> (best k, its mean TPOT, mean TPOT at k = 0) with
    that input at that end, found from the nominal best k: its neighbours and k = 0 first, then
    on, a step a round, while the best sits at the edge of what was tried. Zero-bubble (with
    async among `modes`): at its nominal best k and at async's best k at that end."""
    searches = []   # (input, end, mode, the ks tried)
    for m in modes:
        k_best = best_of({k: cells.tpot(cell(base, load, m, k)) for k in ks})
        # zero-bubble answers one question (does it add anything over async at their best
        # k?): its nominal best k, and (below) async's best k at the same end
        window = {k_best} if m == "zero-bubble" else \
            {k for k in (k_best - 1, k_best, k_best + 1, 0) if k in ks}
        searches += [(inp, end, m, set(window)) for inp in inputs for end in ("low", "high")]

    def settings(inp, end, m, k):
        return inp.settings(cell(base, load, m, k), end)

    def tpot(inp, end, m, k):
        if not inp.applies(k):   # the input changes nothing here: the nominal cell
            return cells.tpot(cell(base, load, m, k))
        return cells.tpot(settings(inp, end, m, k))
    async_tried = {(inp.name, end): tried for inp, end, m, tried in searches if m == "async"}
    new = [(s, sorted(s[3])) for s in searches]
    for _ in range(EDGE_ROUNDS + 1):
        cells.run([settings(inp, end, m, k) for (inp, end, m, _), add in new
                   for k in add if inp.applies(k)])
        new = []
        for s in searches:
            inp, end, m, tried = s
            if m == "zero-bubble":
                continue
            b = best_of({k: tpot(inp, end, m, k) for k in tried})
            step = [k for k in (b - 1, b + 1) if k in ks and k not in tried]
            if step:
                tried.update(step)
                new.append((s, step))
        if not new:
            break
    # zero-bubble at each end also where async's best k moved to (the question is what it
    # adds over async at their best k: at its nominal best k alone, an end that moves
    # async's best would compare zero-bubble at a k that end does not favour)
    for inp, end, m, tried in searches:
        if m == "zero-bubble":
            k = best_of({k: tpot(inp, end, "async", k) for k in async_tried[(inp.name, end)]})
            if k not in tried:
                tried.add(k)
                cells.run([settings(inp, end, m, k) if inp.applies(k)
                           else cell(base, load, m, k)])
    out = {}
    for inp, end, m, tried in searches:
        found = {k: tpot(inp, end, m, k) for k in tried}
        b = best_of(found)
        out[(inp.name, end, m)] = (b, found[b], found.get(0, math.nan))
    return out
