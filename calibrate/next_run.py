"""`stepgap advise`'s next run: the `vllm bench serve` run whose calibration would narrow the
answer most, and the band to expect after it.

The answer's widest band of what async saves (at one load point) is dominated by an input
(sim/bands.py): the host's CPU, the device, a borrowed acceptance, or what a calibration left
open (`split`). Each candidate run (sync or async, at the answer's best k, at that load or at
the highest load asked about) is judged the way a user's run would be: it is simulated at each
end of that input's range (the truth, for all we know, lies anywhere in it), together with the
runs the profile was already calibrated on (`about.calibration.cells`); `stepgap calibrate`'s
fit (calibrate/bench_fit.py) is run on those simulated bench files; and the band of the saving
is computed again with the profile it makes. The run whose wider end band is narrowest is
named, the cheapest (the least GPU time) among those within NEAR of it; with the band to
expect, the two ends' bands, and the band now, computed alike. A user who made it calibrates on
it (with the runs before) and asks again: the runs in the profile are not proposed again, and
the next one is named.

The judging runs are small (at most PROMPTS prompts of at most OUTPUT tokens of the question's
workload): the bands they give are compared with each other, not with the answer's own.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS = 16
OUTPUT = 64
NEAR = 0.10          # candidates within this share of the narrowest band: the cheapest wins
SETUP_ONLY = ("profile", "cpu_scale", "speed", "cpu_costs", "launch_latency_us", "wake_us",
              "ipc_us", "acceptance", "acceptance_rates", "acceptance_spread", "mode", "k",
              "max_concurrency", "request_rate", "detailed", "timeline")


@dataclass
class Candidate:
    mode: str
    k: int
    conc: int | None
    cost_s: float = 0.0                          # the run's duration at the nominal inputs
    ends: dict = field(default_factory=dict)     # input end -> (low, high) of the saving

    @property
    def width(self) -> float:
        return max(hi - lo for lo, hi in self.ends.values()) if self.ends else math.inf

    def cell(self) -> dict:
        return {"k": self.k, "max_concurrency": self.conc, "mode": self.mode}

    def command(self, base: dict) -> str:
        """The run, as the user types it: the server's line and the bench's."""
        spec = (f" --speculative-config '{{\"method\": \"{base.get('method', 'eagle3')}\", "
                f"\"model\": \"{base.get('draft') or 'HEAD'}\", \"num_speculative_tokens\": "
                f"{self.k}}}'" if self.k else "")
        sched = "--async-scheduling" if self.mode != "sync" else "--no-async-scheduling"
        conc = f" --max-concurrency {self.conc}" if self.conc else ""
        return (f"vllm serve {base.get('model')} {sched}{spec}; vllm bench serve ...{conc} "
                f"--save-result --metadata mode={self.mode} num_speculative_tokens={self.k}")


@dataclass
class NextRun:
    load: dict                  # the load point whose saving band is judged
    input: str                  # the input that dominates it
    now: tuple                  # (low, high) of the saving now, computed as the candidates'
    best: Candidate
    candidates: list
    made: list                  # the cells the profile was calibrated on
    base: dict = field(default_factory=dict)   # the setup (for the run's command line)

    def width_after(self) -> float:
        """How wide the band is to be after the run: the wider of its ends' (the truth may lie
        at either)."""
        return self.best.width

    def to_dict(self) -> dict:
        def band(b):
            return [round(b[0], 4), round(b[1], 4)]
        return {"load": self.load, "input": self.input, "saving_now": band(self.now),
                "run": {**self.best.cell(), "duration_s": round(self.best.cost_s, 1)},
                "width_now": round(self.now[1] - self.now[0], 4),
                "width_after": round(self.width_after(), 4),
                "saving_after_by_end": {e: band(b) for e, b in self.best.ends.items()},
                "candidates": [{**c.cell(), "width": round(c.width, 4),
                                "duration_s": round(c.cost_s, 1)} for c in self.candidates],
                "made": self.made}


def plan(advice) -> NextRun | None:
    """The next run for `advice` (sim/advise.py Advice, with bands), or None where its bands
    have no input that a run narrows."""
    from stepgap.sim.bands import band_inputs
    answers = [a for a in advice.answers if a.async_saving.dominant]
    if not answers:
        return None
    ans = max(answers, key=lambda a: a.async_saving.high - a.async_saving.low)
    name = ans.async_saving.dominant[0]
    inp = next(i for i in advice.inputs if i.name == name)
    base = {key: v for key, v in advice.base.items() if key not in ("detailed", "timeline")}
    small = {**base, "num_prompts": min(PROMPTS, base.get("num_prompts") or PROMPTS),
             "output_len": min(OUTPUT, base.get("output_len") or OUTPUT)}
    ks = {m: int(ans.modes[m].best_k.value) for m in ("sync", "async")}
    made = made_cells(base)
    concs = [a.load.get("max_concurrency") for a in advice.answers]
    given = [c for c in concs if c is not None]
    # the load judged, and the lowest and highest asked about (where the host's share of a
    # step differs most)
    tried = [ans.load.get("max_concurrency")] + ([min(given), max(given)] if given else [])
    cands = []
    for mode in ("sync", "async"):
        for c in dict.fromkeys(tried):
            cand = Candidate(mode, ks[mode], c)
            if cand.cell() not in made:
                cands.append(cand)
    if not cands:
        return None
    inputs = band_inputs(small, max(ks.values()))
    now = saving_band(small, ans.load, ks, inputs)
    with tempfile.TemporaryDirectory(prefix="stepgap-next-") as tmp:
        for i, cand in enumerate(cands):
            cand.cost_s = duration(base, cand)
            for end in ("low", "high"):
                truth = inp.settings(small, end)
                prof = project(truth, made + [cand.cell()], Path(tmp) / f"{i}-{end}.json")
                after = {**fit_setup(small), "profile": str(prof)}
                from stepgap.sim.config import profile_defaults
                after, _ = profile_defaults(after, set())
                cand.ends[end] = saving_band(after, ans.load, ks,
                                             band_inputs(after, max(ks.values())))
    narrowest = min(c.width for c in cands)
    best = min((c for c in cands if c.width <= narrowest * (1 + NEAR)), key=lambda c: c.cost_s)
    return NextRun(ans.load, name, now, best, cands, made, base)


def made_cells(base: dict) -> list[dict]:
    """The cells (k, concurrency, mode) of the runs a bench-file profile was calibrated on."""
    if not base.get("profile"):
        return []
    from stepgap.sim.profile import load_profile
    cal = load_profile(base["profile"]).about.get("calibration")
    cells = cal.get("cells") if isinstance(cal, dict) else None
    return [{"k": c.get("k"), "max_concurrency": c.get("max_concurrency"),
             "mode": c.get("mode")} for c in cells or [] if isinstance(c, dict)]


def fit_setup(settings: dict) -> dict:
    """The setup without what a calibration fits or a run sets (its host, its acceptance, its
    load and mode)."""
    return {key: v for key, v in settings.items() if key not in SETUP_ONLY}


def duration(settings: dict, cand: Candidate) -> float:
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate
    res = simulate(SimConfig(**{**settings, "mode": cand.mode, "k": cand.k,
                                "max_concurrency": cand.conc}))[0]
    return res["duration"]


def bench_doc(res: dict, cell: dict) -> dict:
    """A simulated run as the `vllm bench serve --save-result` file vLLM 0.32 writes of it
    (its spec_decode_* counters included, as it writes them for a server that speculates)."""
    doc = {"date": "20260101-000000", "backend": "vllm", "model_id": "projected",
           "num_prompts": res["completed"], "completed": res["completed"],
           "request_rate": "inf", "burstiness": 1.0, "max_concurrency": cell["max_concurrency"],
           "duration": res["duration"], "mode": cell["mode"],
           "num_speculative_tokens": str(cell["k"]),
           **{m: res[m] for m in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "mean_ttft_ms")}}
    spec = res.get("spec_decode")
    if cell["k"] and spec:
        doc["spec_decode_num_drafts"] = spec["num_drafts"]
        doc["spec_decode_per_position_acceptance_rates"] = spec["acceptance_rate_per_pos"]
    return doc


def project(truth: dict, cells: list[dict], out: Path) -> Path:
    """The profile `stepgap calibrate` would fit on runs of `cells` made on the host `truth`
    (SimConfig settings: the setup at one end of an input's range), written to `out`."""
    from stepgap.calibrate.bench_fit import NOISE, BenchRun, fit_bench
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import build_workload, simulate
    from stepgap.sim.profile import save_profile
    setup = fit_setup(truth)
    runs = []
    for cell in cells:
        cfg = SimConfig(**{**truth, **cell})
        reqs = build_workload(cfg)
        res = simulate(cfg, reqs)[0]
        doc = bench_doc(res, cell)
        rates = doc.get("spec_decode_per_position_acceptance_rates")
        runs.append(BenchRun(Path(f"{cell['mode']}-k{cell['k']}-c{cell['max_concurrency']}.json"),
                             doc, cell["k"], cell["max_concurrency"], cell["mode"], reqs,
                             tuple(rates) if rates else None))
    base = {**setup, "jitter": False, "method": setup.get("method", "eagle3")}
    base["_noise"] = NOISE
    save_profile(out, fit_bench(runs, base, NOISE))
    return out


def saving_band(settings: dict, load: dict, ks: dict, inputs: list) -> tuple[float, float]:
    """The band of what async saves of sync's mean TPOT at `load`, each mode at its k of `ks`,
    over `inputs` (sim/bands.py combine: each input's swing on its side)."""
    from stepgap.sim.bands import combine
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import Recording, simulate
    steps = {m: Recording() for m in ("sync", "async")}

    def tpot(s, m):
        cell = {**s, **load, "mode": m, "k": ks[m]}
        return simulate(SimConfig(**cell), recording=steps[m])[0]["mean_tpot_ms"]

    def saving(s_sync, s_async):
        return 1 - tpot(s_async, "async") / tpot(s_sync, "sync")
    ends = {}
    for inp in inputs:
        if not any(inp.applies(k) for k in ks.values()):
            continue
        ends[inp.name] = tuple(
            saving(inp.settings(settings, e) if inp.applies(ks["sync"]) else settings,
                   inp.settings(settings, e) if inp.applies(ks["async"]) else settings)
            for e in ("low", "high"))
    b = combine(saving(settings, settings), ends)
    return b.low, b.high


def extend(p) -> None:
    """`stepgap advise` (sim/advise_cli.py) with the next run to make: its option, and its
    command given this module's `plan`."""
    import functools

    from stepgap.sim.advise_cli import run
    p.add_argument("--no-next-run", dest="next_run", action="store_false",
                   help="leave out the next run to make (it calibrates on runs simulated at "
                        "each end of the dominant input, a few seconds per candidate run)")
    p.set_defaults(func=functools.partial(run, next_run=plan))
