"""A measured profile: its device op fits and the CPU costs measured with it, read from its file.

A profile is a JSON file written by `stepgap profile` (or `stepgap validate`) on the machine it
describes. It holds, for each device op, a least-squares fit of the op's time over features of
the step's batch, and the CPU terms (`CpuCosts`) fitted from the same calibration runs:

    time(op, i, k) = c0 + c1·tokens + c2·reqs + c3·padded          (microseconds)

`tokens` and `reqs` are the step's tokens and requests (for a one-token draft pass, one token
per request); `padded` = reqs · longest chunk · widest block table · block size, the size of the
engine's padded attention grid, which is what its attention costs (engine/kv_cache.py). Fits are
per op, draft pass i and speculation depth k, because on the CPU a step's fixed costs change
with k (the target returns its aux hidden states, logits are taken at 1 + k positions). Why fits
and not a table: mixed steps (a prefill chunk next to decodes) land anywhere in the space of
shapes, and a surface through the measured points extends to them where a table of uniform
batches does not; docs/validation.md shows how well the fits hold.

`ProfileCosts` (sim/profile_costs.py) answers from the fit of the same k, else of the nearest k
measured, and falls back to another DeviceCosts (the roofline) for ops the profile does not
cover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepgap.sim.costs import Batch
from stepgap.sim.cpu_costs import CpuCosts
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json_object

FORMAT = "stepgap-profile/1"
FEATURES = ("1", "tokens", "reqs", "padded")
DEVICE_OPS = ("target_forward", "rejection_sample", "draft_forward", "d2h", "fixup")


def features(op: str, i: int | None, tokens: int, reqs: int, query: int, blocks: int,
             block_size: int = 16) -> list[float]:
    """The fit's features of one op: [1, tokens, reqs, padded attention grid]."""
    if op == "draft_forward" and i:   # a one-token pass over every row
        tokens, query = reqs, 1
    return [1.0, float(tokens), float(reqs), float(reqs * query * blocks * block_size)]


def batch_features(op: str, i: int | None, b: Batch, block_size: int = 16) -> list[float]:
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

    def to_dict(self) -> dict:
        return {"op": self.op, "i": self.i, "k": self.k, "coef": [round(c, 6) for c in self.coef],
                "n": self.n, "median_rel_err": round(self.median_rel_err, 4),
                "source": self.source}



# -------------------------------------------------------------------------------------------
# The file


@dataclass(slots=True)
class Profile:
    path: str
    fits: list[Fit]
    cpu: dict | None          # CpuCosts.to_dict() form, or None
    topology: dict            # worker, device, pinned, executor
    meta: dict                # machine, model, config: what it was measured on
    jitter: dict | None = None   # the machine's speed noise (sim/jitter.py Jitter)

    def cpu_costs(self, base: CpuCosts | None = None, k: int | None = None) -> CpuCosts | None:
        """The CPU costs measured at depth k (the nearest k measured; the message and the
        result grow with the k draft spans and tokens they carry), else pooled over all k."""
        by_k = self.meta.get("cpu_by_k") or {}
        if k is not None and by_k:
            near = min(by_k, key=lambda x: (abs(int(x) - k), -int(x)))
            return CpuCosts.from_dict({**(self.cpu or {}), **by_k[near]}, base)
        if self.cpu is None:
            return None
        return CpuCosts.from_dict(self.cpu, base)


def load_profile(path) -> Profile:
    """Read a stepgap profile (a file, or a measured folder's profile.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / "profile.json"
    if not path.is_file():
        raise UserError(f"{path}: profile not found (`stepgap profile` writes one)")
    doc = read_json_object(path, "a profile")
    if doc.get("format") == FORMAT:
        return _stepgap_profile(path, doc)
    raise UserError(f"{where(path, field='format')}: expected {FORMAT!r} (a profile of "
                    "`stepgap profile`, `stepgap validate` or `stepgap validate-gpu`)")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _index(v) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def _stepgap_profile(path: Path, doc: dict) -> Profile:
    fits = []
    ops = doc.get("device_ops") or []
    if not isinstance(ops, list):
        raise UserError(f"{where(path, field='device_ops')}: expected a list of fits")
    for n, f in enumerate(ops):
        def src(sub: str = "") -> str:
            return where(path, field=f"device_ops[{n}]{sub}")
        if not isinstance(f, dict) or f.get("op") not in DEVICE_OPS:
            op = f.get("op") if isinstance(f, dict) else f
            raise UserError(f"{src('.op')}: unknown op {op!r} (ops: {', '.join(DEVICE_OPS)})")
        coef = f.get("coef")
        if not isinstance(coef, list) or len(coef) != len(FEATURES) \
                or not all(_finite(c) for c in coef):
            raise UserError(f"{src('.coef')}: expected {len(FEATURES)} finite numbers "
                            f"({', '.join(FEATURES)}), got {coef!r}")
        if not (_index(f.get("i")) and _index(f.get("k")) and _index(f.get("n", 0))):
            raise UserError(f"{src()}: i, k and n must be integers >= 0 (or null)")
        err = f.get("median_rel_err", math.nan)
        if err is not None and (not isinstance(err, (int, float)) or isinstance(err, bool)):
            raise UserError(f"{src('.median_rel_err')}: expected a number, got {err!r}")
        fits.append(Fit(f["op"], f.get("i"), f.get("k"), tuple(float(c) for c in coef),
                        f.get("n") or 0, math.nan if err is None else float(err),
                        str(f.get("source", ""))))
    cpu = doc.get("cpu")
    if cpu is not None:
        _cpu_costs(cpu, where(path, field="cpu"))
    jitter = doc.get("jitter")
    if jitter is not None and not (
            isinstance(jitter, dict)
            and all(isinstance(jitter.get(k), list) and all(_finite(x) for x in jitter[k])
                    for k in ("trace", "run_log_factors"))
            and _finite(jitter.get("bin_ms")) and jitter["bin_ms"] > 0
            and _finite(jitter.get("sigma_step")) and jitter["sigma_step"] >= 0):
        raise UserError(f"{where(path, field='jitter')}: expected {{run_log_factors: [...], "
                        "trace: [...], bin_ms > 0, sigma_step >= 0}")
    by_k = doc.get("cpu_by_k") or {}
    if not isinstance(by_k, dict):
        raise UserError(f"{where(path, field='cpu_by_k')}: expected k -> CPU costs")
    for k, c in by_k.items():
        if not k.isdigit():
            raise UserError(f"{where(path, field='cpu_by_k')}: key {k!r} is not a k")
        _cpu_costs(c, where(path, field=f"cpu_by_k.{k}"))
    meta = {k: v for k, v in doc.items() if k not in ("device_ops", "cpu", "grid", "topology",
                                                       "jitter")}
    topology = doc.get("topology") or {}
    if not isinstance(topology, dict):
        raise UserError(f"{where(path, field='topology')}: expected an object")
    return Profile(str(path), fits, cpu, topology, meta, jitter)


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
