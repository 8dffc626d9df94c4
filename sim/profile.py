"""A measured profile: one type, built by every fit and read by every user, with one reader and
one writer of its JSON.

A profile is written by `stepgap profile` (or `stepgap validate`, `validate-gpu`), `stepgap
calibrate` (vLLM's runs) and `stepgap calibrate-served` (served runs), each on the machine it
describes (calibrate/fit.py, vllm_fit.py, serve_fit.py build it). It holds, for each device op, a
least-squares fit of the op's time over features of the step's batch (`Fit`), the CPU terms
fitted from the same calibration runs (`CpuFit`, pooled and per k), the machine's speed noise
(`Noise`), what the data left undetermined, and, as written, what it was measured on (`about`)
and what the fit found besides (`notes`):

    time(op, i, k) = c0 + c1·tokens + c2·reqs + c3·padded          (microseconds)

`tokens` and `reqs` are the step's tokens and requests (for a one-token draft pass, one token
per request); `padded` = reqs · longest chunk · widest block table · block size, the size of the
engine's padded attention grid, which is what its attention costs (engine/kv_cache.py). Fits are
per op, draft pass i and speculation depth k, because on the CPU a step's fixed costs change
with k (the target returns its aux hidden states, logits are taken at 1 + k positions). Why fits
and not a table: mixed steps (a prefill chunk next to decodes) land anywhere in the space of
shapes, and a surface through the measured points extends to them where a table of uniform
batches does not; docs/explanation/validation.md shows how well the fits hold.

`ProfileCosts` (sim/profile_costs.py) answers from the fit of the same k, else of the nearest k
measured, and falls back to another DeviceCosts (the roofline) for ops the profile does not
cover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from stepgap.sim.costs import Batch
from stepgap.sim.cpu_costs import CpuCosts
from stepgap.common.errors import UserError, shown, where
from stepgap.common.fileio import dumps_json, not_a_file, read_json_object, write_json
from stepgap.common.limits import MAX_SCALE, is_finite, is_int, is_number
from stepgap.common.scheduler import BLOCK_SIZE

FORMAT = "stepgap-profile/1"
FEATURES = ("1", "tokens", "reqs", "padded")
DEVICE_OPS = ("target_forward", "rejection_sample", "draft_forward", "d2h", "fixup")


def features(op: str, i: int | None, tokens: int, reqs: int, query: int, blocks: int,
             block_size: int = BLOCK_SIZE) -> list[float]:
    """The fit's features of one op: [1, tokens, reqs, padded attention grid]."""
    if op == "draft_forward" and i:   # a one-token pass over every row
        tokens, query = reqs, 1
    return [1.0, float(tokens), float(reqs), float(reqs * query * blocks * block_size)]


def batch_features(op: str, i: int | None, b: Batch,
                   block_size: int = BLOCK_SIZE) -> list[float]:
    query = b.max_query or -(-b.num_tokens // max(b.num_reqs, 1))
    blocks = b.max_blocks or -(-b.kv_tokens // max(b.num_reqs, 1) // block_size)
    return features(op, i, b.num_tokens, b.num_reqs, query, blocks, block_size)


@dataclass(frozen=True, slots=True)
class Fit:
    """One op's time over FEATURES, fitted on `n` measured points."""

    op: str
    i: int | None        # draft pass (draft_forward only)
    k: int | None        # speculation depth it was measured at (None: any)
    coef: tuple[float, ...]
    n: int
    median_rel_err: float   # median |measured - fitted| / measured over its points
    source: str          # where the points came from ("calibration runs", "grid", ...)

    def __call__(self, x: list[float]) -> float:
        return max(0.0, float(np.dot(self.coef, x)))

    def rounded(self) -> Fit:
        """The fit as its file keeps it (what a profile read back answers with)."""
        return replace(self, coef=tuple(round(c, 6) for c in self.coef),
                       median_rel_err=round(self.median_rel_err, 4))

    def scaled(self, level: float) -> Fit:
        """Every coefficient times `level`, as written."""
        return replace(self, coef=tuple(round(c * level, 6) for c in self.coef))

    def to_dict(self) -> dict:
        return {"op": self.op, "i": self.i, "k": self.k, "coef": [round(c, 6) for c in self.coef],
                "n": self.n, "median_rel_err": round(self.median_rel_err, 4),
                "source": self.source}

    @classmethod
    def from_dict(cls, f, src) -> Fit:
        """One of a file's `device_ops`, checked; `src(sub)` names its field."""
        if not isinstance(f, dict) or f.get("op") not in DEVICE_OPS:
            op = f.get("op") if isinstance(f, dict) else f
            raise UserError(f"{src('.op')}: unknown op {op!r} (ops: {', '.join(DEVICE_OPS)})")
        coef = f.get("coef")
        if not isinstance(coef, list) or len(coef) != len(FEATURES) \
                or not all(is_finite(c) for c in coef):
            raise UserError(f"{src('.coef')}: expected {len(FEATURES)} finite numbers "
                            f"({', '.join(FEATURES)}), got {coef!r}")
        if not (_index(f.get("i")) and _index(f.get("k")) and _index(f.get("n", 0))):
            raise UserError(f"{src()}: i, k and n must be integers >= 0 (or null)")
        err = f.get("median_rel_err", math.nan)
        if err is not None and not is_number(err):
            raise UserError(f"{src('.median_rel_err')}: expected a number, got {err!r}")
        return cls(f["op"], f.get("i"), f.get("k"), tuple(float(c) for c in coef),
                   f.get("n") or 0, math.nan if err is None else float(err),
                   str(f.get("source", "")))


@dataclass(frozen=True, slots=True)
class CpuFit:
    """The CPU terms fitted on a set of runs, as `CpuCosts.to_dict` writes them (op -> [a, b, c]
    microseconds, latency -> microseconds), and how well each fit holds (None: not kept)."""

    terms: dict
    quality: dict | None = None

    def costs(self, base: CpuCosts | None = None) -> CpuCosts:
        return CpuCosts.from_dict(self.terms, base)

    def with_terms(self, terms: dict, quality: dict | None = None) -> CpuFit:
        """These terms over this fit's (new ones after the old), with their quality."""
        q = None if self.quality is None and quality is None else \
            {**(self.quality or {}), **(quality or {})}
        return CpuFit({**self.terms, **terms}, q)


@dataclass(frozen=True, slots=True)
class Noise:
    """The machine's speed noise (calibrate/fit.py `fit_jitter`; sim/jitter.py `Jitter` replays
    it): run-level log factors, a within-run trace of log factors in `bin_ms` windows, and the
    per-step log-std."""

    run_log_factors: tuple[float, ...]
    bin_ms: float
    trace: tuple[float, ...]
    sigma_step: float
    runs: int | None = None     # calibration runs, and their steps, it was fitted on
    steps: int | None = None

    def to_dict(self) -> dict:
        d = {"run_log_factors": list(self.run_log_factors), "bin_ms": self.bin_ms,
             "trace": list(self.trace), "sigma_step": self.sigma_step}
        d.update({k: v for k, v in (("runs", self.runs), ("steps", self.steps))
                  if v is not None})
        return d

    @classmethod
    def from_dict(cls, j, src: str) -> Noise:
        if not (isinstance(j, dict)
                and all(isinstance(j.get(k), list) and all(is_finite(x) for x in j[k])
                        for k in ("trace", "run_log_factors"))
                and is_finite(j.get("bin_ms")) and j["bin_ms"] > 0
                and is_finite(j.get("sigma_step")) and j["sigma_step"] >= 0):
            raise UserError(f"{src}: expected {{run_log_factors: [...], trace: [...], "
                            "bin_ms > 0, sigma_step >= 0}")
        return cls(tuple(j["run_log_factors"]), j["bin_ms"], tuple(j["trace"]),
                   j["sigma_step"], j.get("runs"), j.get("steps"))


# The sections the type holds, in the file's order; the rest is `about` (before them) or
# `notes` (after them), kept as written.
TYPED = ("format", "features", "device_ops", "roofline_level", "draft_level", "cpu",
         "cpu_fit_quality",
         "cpu_by_k", "cpu_fit_quality_by_k", "jitter", "undetermined")


@dataclass(slots=True)
class Profile:
    """A measured profile (module docstring). Typed where the simulator reads it or a fit makes
    it; `about` (what it was measured on: device, machine, model, topology, calibration,
    scheduler) and `notes` (what the fit found besides: checks, grid, level, residuals, ...)
    are kept as written, in order."""

    fits: list[Fit]
    cpu: CpuFit | None = None                                # pooled over every k
    cpu_by_k: dict[int, CpuFit] = field(default_factory=dict)
    jitter: Noise | None = None
    undetermined: list[str] | None = None    # None: the fit does not say
    about: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    path: str | None = None                  # the file it was read from
    # The roofline's device op times x this: the level of the device measured, where the
    # profile has no fits of its own (`stepgap calibrate` on bench files alone fits it)
    roofline_level: float | None = None
    # the drafter's passes x this more, where bench files at two depths told them apart
    draft_level: float | None = None

    @property
    def engine(self) -> str | None:
        """Whose step loop it was measured on (topology.engine: stepgap, vllm, served)."""
        return (self.about.get("topology") or {}).get("engine")

    def cpu_costs(self, base: CpuCosts | None = None, k: int | None = None) -> CpuCosts | None:
        """The CPU costs measured at depth k (the nearest k measured; the message and the
        result grow with the k draft spans and tokens they carry), else pooled over all k."""
        if k is not None and self.cpu_by_k:
            near = min(self.cpu_by_k, key=lambda x: (abs(x - k), -x))
            return CpuCosts.from_dict({**(self.cpu.terms if self.cpu else {}),
                                       **self.cpu_by_k[near].terms}, base)
        if self.cpu is None:
            return None
        return self.cpu.costs(base)

    def measured_on(self) -> dict:
        """What the profile was measured on, as SimConfig settings: the device (`gpu`, the
        catalog entry, where it says; `device`, cpu or cuda) and the executor; `acceptance_rates`
        and `acceptance_spread` where it measured the acceptance (the deepest k measured: its
        later positions are extrapolated). A `--profile` run takes these unless told otherwise
        (sim/cli.py), and says so when told otherwise (sim/plan.py `resolve`)."""
        from stepgap.common.formats import DEVICES, EXECUTORS, OLD_DEVICES
        topo = self.about.get("topology") if isinstance(self.about.get("topology"), dict) else {}
        device = topo.get("device") or self.about.get("device")
        device = "cuda" if device == "gpu" else OLD_DEVICES.get(device, device)
        out = {}
        if device in DEVICES:
            out["device"] = device
        gpu = self.about.get("gpu")
        if isinstance(gpu, str):
            out["gpu"] = gpu
        elif device == "cpu":
            out["gpu"] = "cpu"
        if topo.get("executor") in EXECUTORS:
            out["executor"] = topo["executor"]
        rates, spread = self.acceptance()
        if rates:
            out["acceptance_rates"] = rates
            out["acceptance_spread"] = spread
        return out

    def acceptance(self) -> tuple[tuple[float, ...] | None, float]:
        """The per-position acceptance the profile measured (rates, spread): `about.acceptance`
        (`stepgap calibrate` on bench files), else the deepest k of `acceptance_by_k` (on
        vLLM's timelines and scrapes); (None, 0) where it measured none."""
        from stepgap.common.acceptance import AcceptanceProfile
        acc, name = self.about.get("acceptance"), "acceptance"
        by_k = self.notes.get("acceptance_by_k")
        if acc is None and isinstance(by_k, dict) and by_k:
            deepest = max(by_k, key=lambda k: int(k) if str(k).isdigit() else -1)
            acc, name = by_k[deepest], f"acceptance_by_k.{deepest}"
        if acc is None:
            return None, 0.0
        try:
            prof = AcceptanceProfile("measured", tuple(acc["rates"]), acc.get("spread", 0.0))
        except (UserError, TypeError, KeyError, AttributeError):
            raise UserError(f"{where(self.path or 'profile', field=name)}: expected {{rates: "
                            "[...], spread}, per-position rates as vLLM reports them") from None
        return prof.rates, prof.spread

    def to_dict(self) -> dict:
        """The profile's JSON document (`save_profile` writes it)."""
        doc = {"format": FORMAT, **self.about, "features": list(FEATURES),
               "device_ops": [f.to_dict() for f in self.fits]}
        if self.roofline_level is not None:
            doc["roofline_level"] = self.roofline_level
        if self.draft_level is not None:
            doc["draft_level"] = self.draft_level
        if self.cpu is not None:
            doc["cpu"] = self.cpu.terms
            if self.cpu.quality is not None:
                doc["cpu_fit_quality"] = self.cpu.quality
        if self.cpu_by_k or self.cpu is not None:
            doc["cpu_by_k"] = {str(k): c.terms for k, c in self.cpu_by_k.items()}
        if any(c.quality is not None for c in self.cpu_by_k.values()):
            doc["cpu_fit_quality_by_k"] = {str(k): c.quality for k, c in self.cpu_by_k.items()}
        doc["jitter"] = self.jitter.to_dict() if self.jitter is not None else None
        if self.undetermined is not None:
            doc["undetermined"] = self.undetermined
        return {**doc, **self.notes}

    @classmethod
    def from_dict(cls, doc: dict, path=None) -> Profile:
        """A profile document, every section checked; errors name the file and the field."""
        source = path if path is not None else "profile"
        if doc.get("format") != FORMAT:
            raise UserError(f"{where(source, field='format')}: expected {FORMAT!r} (a profile "
                            "of `stepgap profile`, `stepgap validate` or `stepgap "
                            "validate-gpu`)")
        ops = doc.get("device_ops")
        if not isinstance(ops, list):   # (null is not "no fits": [] says that)
            raise UserError(f"{where(source, field='device_ops')}: expected a list of fits "
                            f"([] for none), got {'nothing' if ops is None else repr(ops)[:60]}")
        fits = [Fit.from_dict(f, lambda sub="", n=n: where(source, field=f"device_ops[{n}]{sub}"))
                for n, f in enumerate(ops)]
        level = doc.get("roofline_level")
        if level is not None and not (is_finite(level) and 0 < level <= 100):
            raise UserError(f"{where(source, field='roofline_level')}: expected a number in "
                            f"(0, 100] (the roofline's device times x it), got {level!r}")
        draft = doc.get("draft_level")
        if draft is not None and not (level is not None and is_finite(draft)
                                      and 0 < draft <= 100):
            raise UserError(f"{where(source, field='draft_level')}: expected a number in (0, "
                            "100] beside a roofline_level (the drafter's passes x it more), got "
                            f"{draft!r}")
        cpu = doc.get("cpu")
        if cpu is not None:
            _cpu_costs(cpu, where(source, field="cpu"))
        jitter = doc.get("jitter")
        if jitter is not None:
            jitter = Noise.from_dict(jitter, where(source, field="jitter"))
        by_k = doc.get("cpu_by_k") or {}
        if not isinstance(by_k, dict):
            raise UserError(f"{where(source, field='cpu_by_k')}: expected k -> CPU costs")
        for k, c in by_k.items():
            if not k.isdigit():
                raise UserError(f"{where(source, field='cpu_by_k')}: key {k!r} is not a k")
            _cpu_costs(c, where(source, field=f"cpu_by_k.{k}"))
        _about(doc, source)
        _bands(doc.get("bands"), source)
        _residuals(doc.get("residuals"), source)
        quality_by_k = doc.get("cpu_fit_quality_by_k")
        keys = list(doc)
        first = min((keys.index(k) for k in TYPED[1:] if k in doc), default=len(keys))
        about = {k: doc[k] for k in keys[:first] if k not in TYPED}
        notes = {k: doc[k] for k in keys[first:] if k not in TYPED}
        return cls(fits, None if cpu is None else CpuFit(cpu, doc.get("cpu_fit_quality")),
                   {int(k): CpuFit(c, (quality_by_k or {}).get(k) if quality_by_k else None)
                    for k, c in by_k.items()},
                   jitter, doc.get("undetermined"), about, notes,
                   None if path is None else str(path),
                   None if level is None else float(level),
                   None if draft is None else float(draft))


def load_profile(path) -> Profile:
    """Read a stepgap profile (a file, or a measured folder's profile.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / "profile.json"
    if not_a_file(path) == "not found":
        raise UserError(f"{path}: profile not found (`stepgap profile` writes one)")
    return Profile.from_dict(read_json_object(path, "a profile"), path)


def save_profile(path, profile: Profile) -> None:
    """Write a profile (atomically, common/fileio.py), after the checks its reader holds it to:
    a fit that its own reader would refuse is not written."""
    import json
    doc = profile.to_dict()
    try:
        Profile.from_dict(json.loads(dumps_json(doc)), "the fitted profile")
    except UserError as e:
        raise UserError(f"{path}: not written: {e}") from None
    write_json(path, doc)


def _about(doc: dict, source) -> None:
    """What the profile says it was measured on: `device` the kind of machine (cpu or cuda;
    `gpu`, validate-gpu's name for a CUDA machine), `topology` an object whose `device` is the
    engine's (cpu or cuda; sync and async, their old names, as SimConfig reads them) and whose
    `executor` is one of the executors. stepgap's engine and vLLM's are measured on CPUs and
    CUDA devices only: a profile of another device (`"tpu"`) is not one of theirs."""
    from stepgap.common.formats import DEVICES, EXECUTORS, OLD_DEVICES
    acc = doc.get("acceptance")
    if acc is not None:   # what the profile measured: rates as vLLM reports them, a spread
        if not isinstance(acc, dict) or not isinstance(acc.get("rates"), list):
            raise UserError(f"{where(source, field='acceptance')}: expected {{rates: [...], "
                            f"spread}}, got {acc!r}"[:200])
        from stepgap.common.acceptance import AcceptanceProfile
        try:
            AcceptanceProfile("measured", tuple(acc["rates"]), acc.get("spread", 0.0))
        except UserError as e:
            raise UserError(f"{where(source, field='acceptance')}: {e}") from None
    name = doc.get("device")
    if name is not None and name not in DEVICES + ("gpu",):
        raise UserError(f"{where(source, field='device')}: expected {' or '.join(DEVICES)} (the "
                        f"machine measured; gpu for a CUDA one), got {name!r}")
    topology = doc.get("topology")
    if topology is None:
        return
    if not isinstance(topology, dict):
        raise UserError(f"{where(source, field='topology')}: expected an object, got "
                        f"{topology!r}")
    device = topology.get("device")
    if device is not None and device not in (*DEVICES, *OLD_DEVICES):
        raise UserError(f"{where(source, field='topology.device')}: expected "
                        f"{' or '.join(DEVICES)}, got {device!r}")
    executor = topology.get("executor")
    if executor is not None and executor not in EXECUTORS:
        raise UserError(f"{where(source, field='topology.executor')}: expected "
                        f"{' or '.join(EXECUTORS)}, got {executor!r}")


# The notes a reader takes numbers from (sim/bands.py): `bands.split`, what a bench-file
# calibration left open (calibrate/bench_fit.py), and each run's `residuals` (relative errors of
# the runs re-simulated: calibrate/bench_fit.py and vllm_fit.py). Each is checked here, where
# the file is read, like every other section: no reader trusts a file because stepgap wrote it.
SPLIT_ENDS = ("low", "high")
SPLIT_FACTORS = ("cpu", "device")


def _factor(v) -> bool:
    """A factor on the CPU costs or the device's times: within what --cpu-scale and --speed
    may be (MAX_SCALE either way; a fit that ran to CPU x 0 wrote 10^9 and more)."""
    return is_finite(v) and 1 / MAX_SCALE <= v <= MAX_SCALE


def _bands(bands, source) -> None:
    """`bands`: {split: {low: {cpu, device}, high: {cpu, device}, source}}, each end a factor
    on the fitted CPU costs and device level, low's CPU at most high's."""
    if bands is None:
        return
    if not isinstance(bands, dict) or not isinstance(bands.get("split"), dict):
        got = bands.get("split") if isinstance(bands, dict) else bands
        field_ = "bands.split" if isinstance(bands, dict) else "bands"
        raise UserError(f"{where(source, field=field_)}: expected {{split: {{low: {{cpu, "
                        f"device}}, high: {{cpu, device}}}}}} (what calibrate left open), got "
                        f"{shown(got)}")
    split = bands["split"]
    for end in SPLIT_ENDS:
        e = split.get(end)
        if not isinstance(e, dict):
            raise UserError(f"{where(source, field=f'bands.split.{end}')}: "
                            f"{'missing' if e is None else f'got {shown(e)}'}; expected "
                            "{cpu, device}: factors on the fitted CPU costs and device level")
        for f in SPLIT_FACTORS:
            if not _factor(e.get(f)):
                raise UserError(f"{where(source, field=f'bands.split.{end}.{f}')}: expected a "
                                f"factor from {1 / MAX_SCALE:g} to {MAX_SCALE:g}, got "
                                f"{shown(e.get(f))}")
    if split["low"]["cpu"] > split["high"]["cpu"]:
        raise UserError(f"{where(source, field='bands.split')}: low.cpu "
                        f"{split['low']['cpu']:g} is above high.cpu {split['high']['cpu']:g}")
    if not isinstance(split.get("source", ""), str):
        raise UserError(f"{where(source, field='bands.split.source')}: expected text, got "
                        f"{shown(split['source'])}")


def _residuals(residuals, source) -> None:
    """`residuals`: a list of objects, one per run, whose `*_ms` fields are relative errors
    (simulated - measured) / measured: above -1 (a simulated time of 0), and such that 1 / (1 +
    error), the band's factor on a profile's level (sim/bands.py), is a factor (`_factor`; a
    run whose chunks were merged has a TPOT error of +1522, the client's, not the server's);
    null where not taken."""
    if residuals is None:
        return
    if not isinstance(residuals, list):
        raise UserError(f"{where(source, field='residuals')}: expected a list of runs' relative "
                        f"errors, got {shown(residuals)}")
    for n, r in enumerate(residuals):
        if not isinstance(r, dict):
            raise UserError(f"{where(source, field=f'residuals[{n}]')}: expected an object, got "
                            f"{shown(r)}")
        for key, v in r.items():
            ok = v is None or (is_finite(v) and v > -1 and _factor(1 / (1 + v)))
            if key.endswith("_ms") and not ok:
                raise UserError(f"{where(source, field=f'residuals[{n}].{key}')}: expected a "
                                f"relative error above -1, at most {MAX_SCALE - 1:g}, got "
                                f"{shown(v)}")


def _index(v) -> bool:
    return v is None or (is_int(v) and v >= 0)


def _cpu_costs(d, src: str) -> None:
    """A profile's CPU costs: CpuCosts.from_dict's checks, with the profile's field named."""
    if not isinstance(d, dict):
        raise UserError(f"{src}: expected an object of CPU costs")
    try:
        CpuCosts.from_dict(d)
    except UserError as e:
        raise UserError(f"{src}: {e}") from None
    except (TypeError, ValueError):
        raise UserError(f"{src}: expected op -> [a, b, c] microseconds and latencies") from None
