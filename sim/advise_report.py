"""`stepgap advise`'s answer (sim/advise.py runs the cells and finds it): its parts, what it
rests on, what to watch, the answer in words, and the user's own mode and k against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stepgap.sim.bands import Band, BandInput

MODES = ("sync", "async", "zero-bubble")
METRIC = "mean_tpot_ms"


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


# ---------------------------------------------------------------------------------------------
# What it rests on, and what to watch


def rests_on(base: dict, ks: list[int], inputs: list[BandInput]) -> dict:
    """The sources of the answer: the device costs, the acceptance, the CPU costs, the seed."""
    from stepgap.sim.config import SimConfig
    from stepgap.sim.plan import acceptance_choice, acceptance_profile, resolve
    from stepgap.sim.device_choice import roofline_of
    cfg = SimConfig(**{**base, "k": max(ks)})
    r = resolve(cfg)
    hw, measured = r.hw, r.measured
    sources = r.device_costs.sources
    from stepgap.sim.table_costs import TableCosts
    from stepgap.sim.tables import repo_relative
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
    roofline = roofline_of(r.device_costs)
    moe = roofline.moe if roofline is not None else None
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
