"""Bands: how sure a prediction is, computed by the simulator from the ranges of its inputs.

A prediction rests on inputs nobody measured for the user's setup: the host's CPU costs, the
device's efficiency where the roofline prices an op, the acceptance where it is borrowed from
another model or extrapolated past the depth measured. Each gets a documented range with its source
(`BandInput`; docs/explanation/bands.md, "Bands"). A quantity's band is computed, not pasted: the
quantity is simulated at the nominal inputs, then at each input's low and high end with the others
nominal; each input's swing is what its ends move the quantity, and the band adds, on each side,
every swing that pushes that way (the worst case of independent inputs, to first order). The inputs
whose swings make most of the band are named as dominating it.

A measured profile narrows the inputs it measured: a profile of `stepgap calibrate` on bench
files (calibrate/bench_fit.py) replaces the CPU and device inputs by its own `split` (what the
measured runs still allow of the host's CPU against the device), a profile with fitted device
ops by the spread of its own residuals; measured tables by their error on real runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from stepgap.common.acceptance import PUBLISHED, AcceptanceProfile
from stepgap.common.errors import UserError

# The host's CPU costs, as a factor on stepgap's defaults (sim/cpu_costs.py), from the hosts there
# is evidence for: the lowest and the highest whose CPU side was measured on its own (a gap in a
# trace, what async hides, a fit that separates the forwards), not by subtracting stepgap's
# roofline, which would mix this input with the `device` one (bench/cpu_evidence.py;
# docs/explanation/bands.md, "Bands", has every host found and why each is or is not an end).
CPU_LOW = 1.0
CPU_LOW_SOURCE = ("vLLM #10634: V1 on a GPU, Llama-2-7B, 5-6 ms between two decode steps at 256 "
                  "requests, 1.0-1.2 x the defaults' 5.0 ms there (bench/cpu_evidence.py)")
CPU_SEED = 2.42
CPU_SEED_SOURCE = ("the seed's L20 host: fitted on vLLM #25872's sync mean ITL "
                   "(bench/seed_calibration.py)")
CPU_HIGH = 3.1
CPU_HIGH_SOURCE = ("SpecDecode-Bench's H100 fit of vLLM with Llama-3.1-8B: 1.21 ms per step "
                   "besides the forwards (arXiv:2601.11580), 3.1 x the defaults' 0.39 ms "
                   "(bench/cpu_evidence.py)")
# The nominal host: the CPU factor `simulate`, `sweep` and `advise` take where neither
# --cpu-scale nor a profile's CPU costs say (one for every GPU: a host's CPU is the host's, not
# its GPU's, and the evidence is one host per GPU class; docs/explanation/pinning.md).
NOMINAL_CPU = CPU_SEED
NOMINAL_CPU_SOURCE = CPU_SEED_SOURCE


def nominal_host(settings: dict, given: bool) -> tuple[dict, str | None]:
    """`settings` with the nominal host's CPU factor where the run has none of its own (no
    --cpu-scale given, `given` False, and no --profile: a profile brings its CPU costs), and the
    line that says so; else (settings, None)."""
    if given or settings.get("profile") or "cpu_scale" in settings:
        return settings, None
    return ({**settings, "cpu_scale": NOMINAL_CPU},
            f"host CPU: stepgap's defaults x {NOMINAL_CPU:g}, the nominal host ("
            f"{NOMINAL_CPU_SOURCE}); --cpu-scale sets another, `stepgap calibrate` on a run of "
            "yours measures it")


def host_line(config: dict) -> str:
    """What a result's CPU costs are, in one line: a profile's, or the defaults x a factor."""
    scale = config.get("cpu_scale", 1.0)
    if config.get("profile"):
        return (f"host CPU: the profile {config['profile']}'s CPU costs"
                + (f" x {scale:g}" if scale != 1 else ""))
    why = (f" (the nominal host: {NOMINAL_CPU_SOURCE}; --cpu-scale sets another, `stepgap "
           "calibrate` on a run of yours measures it)" if scale == NOMINAL_CPU else
           " (stepgap's defaults as they are)" if scale == 1 else "")
    return f"host CPU: stepgap's defaults x {scale:g}{why}"


# The roofline's device times against real GPUs where no table prices an op: with the L20's
# efficiencies, +9.2 % mean TPOT on the RTX 4090, -11.8 % on the RTX PRO 6000
# (docs/explanation/measured-tables.md, "Measured operator tables"): the true device time is the
# roofline's x 1/1.092 .. 1/0.882.
DEVICE_LOW, DEVICE_HIGH = 1 / 1.092, 1 / 0.882
DEVICE_SOURCE = ("the roofline against real vLLM runs on the RTX 4090 (+9.2 % mean TPOT) and "
                 "the RTX PRO 6000 (-11.8 %), docs/explanation/bands.md")
TABLES_LOW, TABLES_HIGH = 0.99, 1.01
TABLES_SOURCE = ("measured operator tables against real vLLM runs on the same GPUs: mean TPOT "
                 "within 1 % (docs/explanation/bands.md)")
PROFILE_BOUND = 0.05
PROFILE_SOURCE = ("the validation bound of a measured profile, mean ITL within 5 % "
                  "(docs/explanation/validation.md)")
# Acceptance past a profile's measured depth: each further position's conditional rate x r per
# position, r from 0.83 (the steepest fall between two published positions: Qwen3-8B's third
# against its second) to 1 (the last rate repeats, stepgap's rule; #26191's rose by up to 4 %).
EXTRAPOLATED_LOW = 0.83
EXTRAPOLATED_SOURCE = ("the published profiles' conditional rates: a position's is 0.83 to "
                       "1.04 x the one before (common/acceptance.py)")
# A profile borrowed from another model or method: every conditional rate shifted on the logit
# scale by up to the largest difference between two published EAGLE-3 profiles at one position
# (Qwen3-8B's third against #26191's Llama-3.1-8B third: 1.12).
BORROWED_SHIFT = 1.1
BORROWED_SOURCE = ("the published EAGLE-3 profiles' conditional rates differ by up to 1.1 on "
                   "the logit scale at one position (common/acceptance.py)")
# Synthetic profiles (what-ifs, not measurements): no band of their own.
SYNTHETIC = ("none", "full")
DOMINANT_SHARE = 0.2   # an input dominates a band when its swing is this share of the largest


@dataclass(frozen=True)
class BandInput:
    """One uncertain input: its range (`low`..`high` around `nominal`, in `unit`), its source,
    and the settings of a run at each end. `min_k`: the input changes runs with k >= min_k
    only (an extrapolated acceptance, past the depth measured)."""

    name: str
    what: str
    nominal: float
    low: float
    high: float
    unit: str
    source: str
    at_low: dict
    at_high: dict
    min_k: int = 0

    def applies(self, k: int) -> bool:
        return k >= self.min_k

    def settings(self, base: dict, end: str) -> dict:
        """The settings of `base` with this input at its `end` ('low' or 'high')."""
        over = self.at_low if end == "low" else self.at_high
        out = dict(base)
        for key, v in over.items():
            if key == "device_scale":   # device time x v
                out["device_scale"] = out.get("device_scale", 1.0) * v
            elif key == "cpu_factor":
                out["cpu_scale"] = out.get("cpu_scale", 1.0) * v
            else:
                out[key] = v
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "what": self.what, "nominal": self.nominal, "low": self.low,
                "high": self.high, "unit": self.unit, "source": self.source,
                **({"from_k": self.min_k} if self.min_k else {})}


@dataclass(frozen=True)
class Band:
    """A quantity, its band and what dominates it (`swings`: input -> (at its low end, at its
    high end), each the change of the quantity)."""

    value: float
    low: float
    high: float
    swings: dict = field(default_factory=dict)

    @property
    def dominant(self) -> list[str]:
        """The inputs whose swing is at least DOMINANT_SHARE of the largest, largest first."""
        size = {n: max(abs(a), abs(b)) for n, (a, b) in self.swings.items()}
        top = max(size.values(), default=0.0)
        if not top:
            return []
        return sorted((n for n, s in size.items() if s >= DOMINANT_SHARE * top),
                      key=lambda n: -size[n])

    def to_dict(self, digits: int = 4) -> dict:
        def r(x):
            return None if x is None or not math.isfinite(x) else round(x, digits)
        return {"value": r(self.value), "low": r(self.low), "high": r(self.high),
                "dominant": self.dominant,
                "swings": {n: [r(a), r(b)] for n, (a, b) in self.swings.items()}}


def combine(value: float, ends: dict[str, tuple[float, float]]) -> Band:
    """The band of a quantity whose value is `value` at the nominal inputs and `ends[name]` =
    (value with that input at its low end, at its high end): each side adds the swings that
    push that way."""
    swings = {n: (lo - value, hi - value) for n, (lo, hi) in ends.items()}
    down = sum(min(0.0, a, b) for a, b in swings.values())
    up = sum(max(0.0, a, b) for a, b in swings.values())
    return Band(value, value + down, value + up, swings)


def int_band(value: int, values: list[int]) -> Band:
    """A discrete quantity (a best k): its range over the inputs' ends, not a sum of swings."""
    return Band(value, min([value, *values]), max([value, *values]))


# ---------------------------------------------------------------------------------------------
# The inputs of a run


def band_inputs(settings: dict, max_k: int | None = None) -> list[BandInput]:
    """The uncertain inputs of runs of `settings` (SimConfig fields) up to depth `max_k`: the
    host's CPU and the device (or what a measured profile or tables leave of them), and the
    acceptance where it is borrowed or extrapolated."""
    from stepgap.sim.config import SimConfig
    from stepgap.sim.plan import resolve

    cfg = SimConfig(**settings)
    r = resolve(cfg)
    measured, inputs = r.measured, []
    split = (measured.notes.get("bands") or {}).get("split") if measured is not None else None
    if isinstance(split, dict):
        inputs.append(split_input(split))
    elif measured is not None and (measured.fits or measured.cpu is not None):
        inputs.append(profile_input(measured))
    else:
        inputs.append(cpu_input(cfg.cpu_scale))
    if measured is None or not measured.fits:
        device = device_input(r, isinstance(split, dict))
        if device is not None:
            inputs.append(device)
    for link in (collectives_input(cfg, r), kernel_input(cfg, r)):
        if link is not None:
            inputs.append(link)
    deep = max_k if max_k is not None else cfg.k
    inputs += acceptance_inputs(cfg, r.target, deep)
    # the drafter's as the deepest run prices it (advise and sweep pass k = 0 with max_k)
    drafted = r if cfg.k or not deep else resolve(replace(cfg, k=deep))
    if drafted.drafter_host:
        inputs.append(drafter_input(drafted.drafter, cfg.drafter_host_scale))
    check_ends(inputs, settings)
    return inputs


def check_ends(inputs: list[BandInput], settings: dict) -> None:
    """Each input's ends keep the host's levels within their limits, the CPU's (--cpu-scale)
    and the device's (--speed x --device-scale): a band that would take them past is refused
    naming the option the user gave and the input, not with the derived value as if the user
    had given it."""
    from stepgap.common.limits import MAX_SCALE, MIN_SPEED
    device = "--device-scale" if settings.get("device_scale", 1.0) != 1.0 else "--speed"
    limits = {"--cpu-scale": (lambda s: s.get("cpu_scale", 1.0), 0.0),
              device: (lambda s: s.get("speed", 1.0) * s.get("device_scale", 1.0), MIN_SPEED)}
    for inp in inputs:
        for end in ("low", "high"):
            at = inp.settings(settings, end)
            for option, (level, lo) in limits.items():
                v = level(at)
                if not lo <= v <= MAX_SCALE:
                    given, edge = level(settings), MAX_SCALE if v > MAX_SCALE else lo
                    value = inp.low if end == "low" else inp.high
                    raise UserError(f"{option} {given:g}: the band's {inp.name} input at its "
                                    f"{end} end ({value:g} {inp.unit}) takes it to {v:g}, past "
                                    f"{edge:g}; give a {option} nearer 1, or leave the band out")


def device_input(r, split: bool) -> BandInput | None:
    """The device's input, by what prices it: measured tables that price every kernel, their
    error on real runs; a GPU whose roofline was fitted on tables (`Hardware.device_band`), the
    fit's spread, also under tables that price part of a step (the roofline prices the rest);
    a datasheet GPU, the datasheet roofline's error on the two GPUs with real runs. None where
    a bench-file calibration's `split` already holds the device."""
    from stepgap.sim.table_costs import TableCosts

    hw, costs = r.hw, r.device_costs   # (always the outer costs: config.py)
    tables = costs.tables if isinstance(costs, TableCosts) else None
    if tables is not None and not tables.not_measured:
        return BandInput("device", "the device ops the measured tables price", 1.0, TABLES_LOW,
                         TABLES_HIGH, "x device time", TABLES_SOURCE, {"device_scale": TABLES_LOW},
                         {"device_scale": TABLES_HIGH})
    if split and tables is None:
        return None
    roof = (f"{hw.name}: bw_eff {hw.bw_eff:g}, flop_eff {hw.flop_eff:g}, {hw.kernel_us:g} us "
            "a kernel")
    what = (f"the tables' device ops and the roofline's of the kernels they did not measure "
            f"({', '.join(tables.not_measured)}; {roof})" if tables is not None
            else f"the roofline's device op times ({roof})")
    lo, hi, source = (*hw.device_band, hw.device_band_source) if hw.device_band is not None \
        else (DEVICE_LOW, DEVICE_HIGH, DEVICE_SOURCE)
    return BandInput("device", what, 1.0, lo, hi, "x device time", source, {"device_scale": lo},
                     {"device_scale": hi})


def collectives_input(cfg, r) -> BandInput | None:
    """Where this repository holds more than one measurement of the run's link (the same GPU
    over as many GPUs: sim/hardware_file.py other_measurements), the collectives priced by
    each: the band spans the measurement that prices a decode's all-reduce fastest and the one
    that prices it slowest, and names every one."""
    from stepgap.sim.hardware import MeasuredLink
    from stepgap.sim.hardware_file import load_collectives, other_measurements

    link = r.hw.interconnect
    n = cfg.tensor_parallel_size if cfg.tensor_parallel_size > 1 else \
        cfg.data_parallel_size if r.target.is_moe else 1
    if n < 2 or not isinstance(link, MeasuredLink) or not link.path:
        return None
    others = other_measurements(link.path)
    if not others:
        return None
    nbytes = 2 * 8 * r.target.hidden_size   # a decode step of 8 tokens' all-reduce

    def speed(path) -> float:
        m = load_collectives(path, link.fully_connected, link.p2p, model=link.model)
        return m.all_reduce_us(nbytes, n) if n == m.npus else math.inf
    times = sorted((speed(p), str(p)) for p in [link.path, *others])
    (t_lo, fast), (t_hi, slow) = times[0], times[-1]
    from stepgap.sim.tables import repo_relative
    named = "; ".join(f"{repo_relative(p)} ({t:.1f} us)" for t, p in times)
    return BandInput("collectives", f"the collectives over {n} GPUs, as each measurement of "
                     f"the link prices them (a {nbytes // 1024} KiB all-reduce: {named})",
                     t_lo if link.path == fast else t_hi, t_lo, t_hi, "us a decode all-reduce",
                     f"{len(times)} measurements of one link disagree: {named}",
                     {"collectives": fast}, {"collectives": slow})


def kernel_input(cfg, r) -> BandInput | None:
    """Which all-reduce vLLM issues, where the link's NCCL was measured and vLLM's own kernel
    was not (the interconnect model prices it: vLLM's own benchmarks of its custom and
    symmetric-memory kernels, sim/hardware.py): the measured NCCL at every size is the other
    end (vLLM without its kernel: --disable-custom-all-reduce, GPUs without peer access, or a
    version that takes NCCL), the two measurements of one link's small all-reduce."""
    from stepgap.sim.hardware import MeasuredLink
    from stepgap.sim.tables import repo_relative

    link, tp = r.hw.interconnect, cfg.tensor_parallel_size
    if tp < 2 or not isinstance(link, MeasuredLink) or link.model is None or not link.p2p \
            or "all_reduce" not in link.sizes:
        return None
    nbytes = 2 * 8 * r.target.hidden_size   # a decode step of 8 tokens' all-reduce
    ours, nccl = link.all_reduce_us(nbytes, tp), link.at("all_reduce", nbytes)
    return BandInput("allreduce", f"the all-reduce vLLM issues over {tp} GPUs: its own kernel "
                     f"({link.model.name}'s model, {ours:.1f} us at {nbytes // 1024} KiB) or "
                     f"NCCL's ({link.path and repo_relative(link.path)}, {nccl:.1f} us)", ours,
                     min(ours, nccl), max(ours, nccl), "us a decode all-reduce",
                     f"{link.model.source}; {link.source}",
                     {}, {"disable_custom_all_reduce": True})


def drafter_input(d, nominal: float) -> BandInput:
    """The drafter's host costs (sim/drafter_costs.py): its dispatch a pass and its first
    inputs, or a CPU proposer's matching, over the range of their evidence."""
    lo, hi = d.host_range()
    what = (f"the {d.method} proposer's matching on the host" if d.on_cpu else
            f"the drafter's host costs ({d.graphs} drafter graphs, "
            f"{'padded' if d.padded else 'unpadded'} drafter batch: "
            f"{d.host_pass_us():.0f} us a pass)")
    return BandInput("drafter", what, nominal, nominal * lo, nominal * hi, "x host costs",
                     d.source(), {"drafter_host_scale": nominal * lo},
                     {"drafter_host_scale": nominal * hi}, 1)


def cpu_input(nominal: float) -> BandInput:
    lo, hi = min(CPU_LOW, nominal), max(CPU_HIGH, nominal)
    return BandInput("cpu", "the host's CPU costs, x stepgap's defaults", nominal, lo, hi,
                     "x defaults", f"low: {CPU_LOW_SOURCE}; {CPU_SEED:g}: {CPU_SEED_SOURCE}; "
                     f"high: {CPU_HIGH_SOURCE}",
                     {"cpu_factor": lo / nominal if nominal else 1.0},
                     {"cpu_factor": hi / nominal if nominal else 1.0})


def split_input(split: dict) -> BandInput:
    """What a bench-file calibration left open: the host's CPU against the device, along the
    measured runs (`stepgap calibrate`; each end a CPU factor and a device factor, relative to
    the profile's fitted values)."""
    lo, hi = split["low"], split["high"]
    return BandInput("split", "host CPU against device, as far as the measured runs allow "
                     "(the profile's calibration)", 1.0, lo["cpu"], hi["cpu"], "x fitted CPU",
                     split.get("source", "the profile's calibration"),
                     {"cpu_factor": lo["cpu"], "device_scale": lo["device"]},
                     {"cpu_factor": hi["cpu"], "device_scale": hi["device"]})


def profile_input(measured) -> BandInput:
    """A profile with measured device fits or CPU costs: its own residuals' spread on mean
    ITL, as a level on the whole step, else the validation bound."""
    residuals = measured.notes.get("residuals") or []
    errors = [e for e in (r.get("mean_itl_ms") for r in residuals if isinstance(r, dict))
              if isinstance(e, (int, float))]
    if errors:
        lo, hi = 1 / (1 + max(max(errors), 0.0)), 1 / (1 + min(min(errors), 0.0))
        source = (f"its own runs re-simulated: mean ITL {100 * min(errors):+.1f} to "
                  f"{100 * max(errors):+.1f} % (the profile's residuals)")
    else:
        lo, hi, source = 1 - PROFILE_BOUND, 1 + PROFILE_BOUND, PROFILE_SOURCE
    return BandInput("profile", f"the measured profile's level ({measured.path})", 1.0, lo, hi,
                     "x step time", source, {"device_scale": lo, "cpu_factor": lo},
                     {"device_scale": hi, "cpu_factor": hi})


def acceptance_inputs(cfg, target, max_k: int) -> list[BandInput]:
    """The acceptance's inputs: `acceptance`, where it is borrowed (the published profile of
    another model or method, or a named one that is not this model's: every conditional rate
    shifted on the logit scale) or else extrapolated past its depth (k > the rates measured:
    the later positions' rates); and `dataset`, the published spread of the run's dataset
    (common/acceptance.py DATASETS) where the acceptance is the default one."""
    from stepgap.sim.plan import acceptance_choice, acceptance_profile
    prof, _ = acceptance_profile(cfg, target)
    if max_k < 1 or prof.name in SYNTHETIC:
        return []
    out = []
    choice = None if cfg.acceptance_rates is not None or cfg.acceptance is not None else \
        acceptance_choice(cfg, target)[0]
    own = PUBLISHED.get((target.name, cfg.method))
    # (a profile not among the named ones is the user's own: rates, or a file they measured)
    borrowed = choice.borrowed if choice is not None else cfg.acceptance_rates is None and \
        prof.name in _named() and (own is None or prof.name != own)
    depth, deep = len(prof.rates), max(max_k, len(prof.rates))
    if borrowed:
        out.append(BandInput("acceptance", f"acceptance borrowed from {prof.name} "
                             f"({prof.source})", 0.0, -BORROWED_SHIFT, BORROWED_SHIFT,
                             "logit shift", BORROWED_SOURCE,
                             {"acceptance_rates": prof.shifted(-BORROWED_SHIFT, deep),
                              "acceptance_spread": prof.spread},
                             {"acceptance_rates": prof.shifted(BORROWED_SHIFT, deep),
                              "acceptance_spread": prof.spread}, 1))
    elif max_k > depth:
        out.append(BandInput("acceptance", f"acceptance past position {depth} of {prof.name}, "
                             "extrapolated", 1.0, EXTRAPOLATED_LOW, 1.0, "x conditional rate "
                             "per position", EXTRAPOLATED_SOURCE,
                             {"acceptance_rates": extrapolated(prof, EXTRAPOLATED_LOW, max_k),
                              "acceptance_spread": prof.spread},
                             {}, depth + 1))   # the high end is stepgap's rule: the nominal run
    if choice is not None and choice.band != (0.0, 0.0):
        lo, hi = choice.band
        out.append(BandInput("dataset", f"the {choice.dataset} dataset's effect on "
                             f"acceptance ({prof.name})", 0.0, lo, hi, "logit shift",
                             choice.band_source,
                             {"acceptance_rates": prof.shifted(lo, deep),
                              "acceptance_spread": prof.spread},
                             {"acceptance_rates": prof.shifted(hi, deep),
                              "acceptance_spread": prof.spread}, 1))
    return out


def _named() -> set[str]:
    from stepgap.common.acceptance import PROFILES
    return set(PROFILES)


def extrapolated(prof: AcceptanceProfile, r: float, k: int) -> tuple[float, ...]:
    """The profile's rates to depth k, each position past its depth at the conditional rate of
    the one before x r."""
    rates, cond = list(prof.rates), prof.conditional(len(prof.rates))[-1]
    while len(rates) < k:
        cond *= r
        rates.append(rates[-1] * cond)
    return tuple(rates)


def shifted(prof: AcceptanceProfile, d: float, k: int) -> tuple[float, ...]:
    """The profile's rates to depth k with every conditional rate shifted by d on the logit
    scale (AcceptanceProfile.shifted)."""
    return prof.shifted(d, k)
