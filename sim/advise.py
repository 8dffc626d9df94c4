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
from dataclasses import dataclass, field

from stepgap.common.errors import UserError
from stepgap.common.limits import MAX_LOADS
from stepgap.common.speculation import METHODS
from stepgap.sim.bands import Band, BandInput, band_inputs, combine, int_band

MODES = ("sync", "async", "zero-bubble")
METRIC = "mean_tpot_ms"
DEFAULT_MAX_K = 8
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32)
EDGE_ROUNDS = 4    # how far a moved best k is followed past its window, per input end


@dataclass
class ModeAnswer:
    best_k: Band
    tpot_ms: Band       # mean TPOT at the best k
    speedup: Band       # over k = 0 in the same mode
    grid: dict          # k -> nominal mean TPOT

    def to_dict(self) -> dict:
        return {"best_k": self.best_k.to_dict(), "mean_tpot_ms": self.tpot_ms.to_dict(),
                "speedup_over_k0": self.speedup.to_dict(),
                "mean_tpot_ms_by_k": {str(k): round(v, 4) if math.isfinite(v) else None
                                      for k, v in self.grid.items()}}


@dataclass
class LoadAnswer:
    load: dict                  # max_concurrency and/or request_rate
    modes: dict                 # mode -> ModeAnswer
    async_saving: Band          # of sync's mean TPOT, each at its best k
    zero_bubble_saving: Band    # of async's mean TPOT, each at its best k
    warnings: list = field(default_factory=list)

    @property
    def label(self) -> str:
        return load_label(self.load)

    def to_dict(self) -> dict:
        return {"load": self.load, "verdict": verdict(self),
                **{m.replace("-", "_"): a.to_dict() for m, a in self.modes.items()},
                "async_saving": self.async_saving.to_dict(),
                "zero_bubble_saving": self.zero_bubble_saving.to_dict(),
                "near_best_k": {m: near_best(self.modes[m].grid) for m in ("sync", "async")},
                "warnings": self.warnings}


@dataclass
class Advice:
    base: dict                  # the setup's SimConfig settings
    ks: list
    inputs: list                # BandInput
    rests_on: dict
    answers: list               # LoadAnswer, in load order
    notes: list = field(default_factory=list)
    sims: int = 0               # simulations run
    seconds: float = 0.0
    cells: list = field(default_factory=list)   # the settings of every simulation run
    yours: dict | None = None   # the user's own mode and k, and where they came from (`Yours`)
    next_run: object = None     # the run to make next (calibrate/bench_fit.py NextRun), if asked

    def to_dict(self) -> dict:
        """The document `--result-json` writes (docs/reference/advise.md, "stepgap advise": its
        schema)."""
        from stepgap.common.fileio import jsonable
        return {"format": FORMAT, "setup": jsonable(self.base), "ks": self.ks,
                "modes": list(MODES), "metric": METRIC, "rests_on": self.rests_on,
                "band_inputs": [i.to_dict() for i in self.inputs],
                "loads": [a.to_dict() for a in self.answers], "notes": self.notes,
                "simulations": self.sims, "yours": yours_dict(self),
                **({"next_run": self.next_run.to_dict()} if self.next_run is not None else {})}


FORMAT = "stepgap-advise/1"


def load_label(load: dict) -> str:
    parts = []
    if load.get("request_rate") is not None:
        r = load["request_rate"]
        parts.append("rate inf" if r == math.inf else f"rate {r:g}/s")
    if load.get("max_concurrency") is not None:
        parts.append(f"conc {load['max_concurrency']}")
    return ", ".join(parts) or "unlimited"


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
    of a nominal cell) replays that run's steps (sim/steps.py `Recording`, kept per steps as
    long as this object): the same metrics, in about half the time."""

    def __init__(self):
        self.done: dict = {}
        self.steps: dict = {}   # the settings but TIME_ONLY -> the first such run's Recording

    @staticmethod
    def key(settings: dict) -> str:
        return json.dumps(settings, sort_keys=True, default=str)

    def run(self, cells: list[dict]) -> None:
        from stepgap.sim.config import SimConfig
        from stepgap.sim.loop import Recording, simulate
        from stepgap.sim.steps import TIME_ONLY
        from stepgap.sim.sweep_runners import metrics_of
        for s in cells:
            key = self.key(s)
            if key not in self.done:
                steps = self.key({k: v for k, v in s.items() if k not in TIME_ONLY})
                rec = self.steps.setdefault(steps, Recording())
                self.done[key] = metrics_of(simulate(SimConfig(**s), recording=rec)[0])

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
    runs = {k: cells.done[cells.key(cell(base, load, "async", k))] for k in ks}
    best = min(r[METRIC] for r in runs.values())
    keep = []
    for k, r in runs.items():
        idle = r["mean_step_gap_us"] * r["num_steps"] / (r["duration"] * 1e6) \
            if r.get("mean_step_gap_us") and r.get("duration") else 0.0
        if r[METRIC] == best or r[METRIC] * (1 - 2 * idle) <= best:
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


# ---------------------------------------------------------------------------------------------
# What it rests on, and what to watch


def rests_on(base: dict, ks: list[int], inputs: list[BandInput]) -> dict:
    """The sources of the answer: the device costs, the acceptance, the CPU costs, the seed."""
    from stepgap.sim.config import SimConfig, acceptance_choice, acceptance_profile, resolve, roofline_of
    cfg = SimConfig(**{**base, "k": max(ks)})
    r = resolve(cfg)
    hw, measured = r.hw, r.measured
    sources = getattr(r.device_costs, "sources", None)
    from stepgap.sim.tables import TableCosts, repo_relative
    # tables given (--device-profile, `none` apart) or committed for the GPU (a TableCosts)
    tables = repo_relative(r.device_costs.path) if isinstance(r.device_costs, TableCosts) \
        else cfg.device_profile if cfg.device_profile not in (None, "none") else None
    if tables:
        device = (f"measured operator tables {tables}; the roofline of {hw.name} "
                  "for " + ", ".join(sorted(op for op, s in (sources or {}).items()
                                            if "roofline" in s))
                  + " (docs/explanation/measured-tables.md)")
    elif measured is not None and measured.fits:
        device = f"the device op fits of the profile {measured.path}"
    else:
        level = measured.roofline_level if measured is not None else None
        device = (f"the roofline of the {hw.name} catalog entry: {hw.flops / 1e12:g} TFLOP/s "
                  f"x {hw.flop_eff:g}, {hw.mem_bw / 1e9:g} GB/s x {hw.bw_eff:g}, "
                  f"{hw.kernel_us:g} us a kernel" + (
                      f", x {level:.4g} (the device level calibrated in {measured.path})"
                      if level is not None else "; no measured table or profile"))
    moe = getattr(roofline_of(r.device_costs), "moe", None)
    if moe is not None:   # a MoE target's blocks from moe.csv, or under data/expert parallelism
        device += f"; {moe.source()}"
    prof, note = acceptance_profile(cfg, r.target)
    # the note says how the default was chosen (by dataset); only another's profile is borrowed
    borrowed = note is not None and (cfg.acceptance is not None
                                     or cfg.acceptance_rates is not None
                                     or acceptance_choice(cfg, r.target)[0].borrowed)
    depth = len(prof.rates)
    name, source = prof.name, prof.source
    if measured is not None and cfg.acceptance_rates is not None \
            and tuple(cfg.acceptance_rates) == measured.acceptance()[0]:
        about = measured.about.get("acceptance")
        name = f"measured ({measured.path})"
        source = about.get("source", "the profile") if isinstance(about, dict) else \
            "the profile's acceptance_by_k (vLLM's /metrics)"
    acc = {"profile": name, "source": source, "rates": list(prof.rates),
           "spread": prof.spread, "measured_depth": depth,
           "extrapolated_positions": [k for k in range(depth + 1, max(ks) + 1)],
           "borrowed": note if borrowed else None, "chosen": None if borrowed else note}
    if measured is not None and measured.cpu is not None:
        cal = measured.about.get("calibration") if isinstance(measured.about, dict) else None
        cpu = f"the profile {measured.path}" + (f" ({cal['what']})" if isinstance(cal, dict)
                                                and "what" in cal else "") + (
            f", x {cfg.cpu_scale:g}" if cfg.cpu_scale != 1 else "")
    else:
        from stepgap.sim.bands import CPU_SEED, CPU_SEED_SOURCE
        why = f": {CPU_SEED_SOURCE}" if cfg.cpu_scale == CPU_SEED else ""
        cpu = f"stepgap's defaults x {cfg.cpu_scale:g}{why}; not calibrated on this host"
    from stepgap.sim.loop import build_workload
    reqs = build_workload(cfg)
    p, o = [r.prompt_len for r in reqs], [r.output_len for r in reqs]
    workload = (f"{cfg.workload}: {len(reqs)} prompts of {min(p)}-{max(p)} tokens (mean "
                f"{sum(p) / len(p):.0f}), " + (f"{o[0]} output tokens each" if min(o) == max(o)
                                               else f"outputs of {min(o)}-{max(o)} tokens"))
    return {"device": device, "acceptance": acc, "cpu": cpu, "seed": cfg.seed,
            "workload": workload, "gpu": hw.name, "model": r.target.name,
            "draft": r.draft.name if r.draft is not None else None, "method": cfg.method,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "data_parallel_size": cfg.data_parallel_size,
            "expert_parallel": moe is not None and moe.plan.expert_parallel}


ADVICE = {"cpu": "pin the host with one sync run (stepgap calibrate BENCH.json --gpu ...)",
          "split": "a second sync run at another k or concurrency tells the host from the "
                   "device (stepgap calibrate)",
          "device": "price the device from measured tables (--device-profile) or calibrate on "
                    "a sync run (stepgap calibrate)",
          "acceptance": "measure the acceptance (vLLM's /metrics: stepgap ingest vllm-metrics)",
          "profile": "calibrate on more runs"}


def warnings(ans: LoadAnswer, ks: list[int], inputs: list[BandInput]) -> list[str]:
    """The best k at the edge of the range or past the measured acceptance, and a saving whose
    band reaches both sides of paying (`GAIN`): each as printed, with this load's detail."""
    return [f"{message} ({detail})" if detail else message
            for message, detail in warning_parts(ans, ks, inputs)]


def warning_parts(ans: LoadAnswer, ks: list[int], inputs: list[BandInput]) \
        -> list[tuple[str, str]]:
    """(the warning, the same at every load it holds at; this load's detail, or '')."""
    out = []
    acc = next((i for i in inputs if i.name == "acceptance" and i.min_k > 1), None)
    for m in ("sync", "async"):
        a = ans.modes[m]
        k = int(a.best_k.value)
        if k == max(ks) and max(ks) > 0:
            out.append((f"{m}: the best k={k} is the deepest tried; a deeper one may be better "
                        "(--max-k)", ""))
        if acc is not None and a.best_k.high >= acc.min_k:
            out.append((f"{m}: the best k reaches past the acceptance measured "
                        f"({acc.min_k - 1} positions): positions from {acc.min_k} on are "
                        "extrapolated", _krange(a.best_k)))
    for what, b in (("async saves", ans.async_saving),
                    ("zero-bubble saves", ans.zero_bubble_saving)):
        if b.low < GAIN < b.high:   # the band holds both "pays" and "does not pay"
            top = b.dominant[0] if b.dominant else "cpu"
            out.append((f"whether {what.split()[0]} pays rests on {top}: "
                        f"{ADVICE.get(top, 'measure it')}",
                        f"{what} {_pct(b.low)} to {_pct(b.high)} %"))
    return out


# ---------------------------------------------------------------------------------------------
# The answer in words


GAIN = 0.005    # a saving under half a per cent of TPOT is no gain
NEAR = 0.01     # a k within 1 % of the best k's mean TPOT is as good


def near_best(grid: dict, within: float = NEAR) -> list[int]:
    """The ks whose mean TPOT is within `within` of the best's (simulated ones only)."""
    best = min(grid.values())
    return [k for k, v in sorted(grid.items()) if math.isfinite(v) and v <= best * (1 + within)]


def ks_text(ks: list[int]) -> str:
    """5-7, or 2, 4-5 where the ks are not one run."""
    runs, out = [], []
    for k in ks:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    for a, b in runs:
        out.append(f"{a}" if a == b else f"{a}-{b}")
    return ", ".join(out)


def saving_text(b: Band) -> str:
    """10.5 % (3.6-13.8 %): the value and its band, the band left out where it rounds to it."""
    lo, hi = _pct(b.low), _pct(b.high)
    return f"{_pct(b.value)} %" + ("" if lo == hi else f" ({lo}-{hi} %)")


def verdict(ans: LoadAnswer) -> str:
    """One line: does async pay, which k (in the mode that wins), does zero-bubble add anything.
    "yes" and "no" only where the whole band says so (`GAIN`), else "maybe"."""
    s, z = ans.async_saving, ans.zero_bubble_saving
    if s.low > GAIN:
        a = f"async: yes, saves {saving_text(s)} of TPOT"
    elif s.high < -GAIN:
        a = f"async: no, costs {saving_text(Band(-s.value, -s.high, -s.low))} of TPOT"
    elif s.high < GAIN:
        a = "async: no gain"
    else:
        a = f"async: maybe, saves {_pct(s.value)} % ({_pct(s.low)} to {_pct(s.high)} %)"
    mode = "async" if s.value > 0 else "sync"
    k = f"k: {ks_text(near_best(ans.modes[mode].grid))} (within 1 % of the best" + \
        ("" if mode == "async" else ", in sync") + ")"
    if z.low > GAIN:
        zb = f"zero-bubble: yes, saves {saving_text(z)} more"
    elif z.high < GAIN:
        zb = "zero-bubble: no gain"
    else:
        zb = f"zero-bubble: maybe, {_pct(z.value)} % ({_pct(z.low)} to {_pct(z.high)} %)"
    return f"{a}; {k}; {zb}"


@dataclass
class Yours:
    """The user's own mode and k against the best at one load (nominal mean TPOT)."""
    mode: str
    k: int
    tpot_ms: float
    best_mode: str
    best_k: int
    best_ms: float

    @property
    def loss(self) -> float:
        """What the user's choice costs over the best, a share of the best's TPOT."""
        return self.tpot_ms / self.best_ms - 1

    def to_dict(self) -> dict:
        return {"mode": self.mode, "k": self.k, "mean_tpot_ms": round(self.tpot_ms, 4),
                "best": {"mode": self.best_mode, "k": self.best_k,
                         "mean_tpot_ms": round(self.best_ms, 4)},
                "loss": round(self.loss, 5)}


def yours(ans: LoadAnswer, mode: str, k: int) -> Yours | None:
    """The user's (mode, k) at this load against the best of sync and async (zero-bubble is no
    vLLM option of its own); None where that cell was not simulated."""
    mine = ans.modes[mode].grid.get(k, math.inf)
    if not math.isfinite(mine):
        return None
    best_mode = min(("sync", "async"), key=lambda m: ans.modes[m].tpot_ms.value)
    b = ans.modes[best_mode]
    return Yours(mode, k, mine, best_mode, int(b.best_k.value), b.grid[int(b.best_k.value)])


def yours_dict(advice: Advice) -> dict | None:
    """The user's choice and, per load, what it loses against the best (`--result-json`)."""
    if advice.yours is None:
        return None
    y = advice.yours
    per_load = [yours(a, y["mode"], y["k"]) if y.get("k") is not None else None
                for a in advice.answers]
    return {**y, "loads": [x.to_dict() if x is not None else None for x in per_load]}


def _krange(b: Band) -> str:
    return f"k={int(b.low)}" if b.low == b.high else f"k={int(b.low)}-{int(b.high)}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"
