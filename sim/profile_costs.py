"""A measured profile as `DeviceCosts` (sim/costs.py): each device op from the profile's fits
(sim/profile.py) at the run's k, else the nearest k measured (said so in `sources`), and from
another DeviceCosts (the roofline) for the ops the profile does not cover."""

from __future__ import annotations

from stepgap.common.scheduler import BLOCK_SIZE
from stepgap.sim.costs import Batch, DeviceCosts
from stepgap.sim.profile import DEVICE_OPS, Fit, Profile, batch_features


class ProfileCosts(DeviceCosts):
    """Device op times from a profile's fits at depth k; `fallback` answers for the rest."""

    def __init__(self, profile: Profile, k: int, fallback: DeviceCosts,
                 block_size: int = BLOCK_SIZE):
        self.profile, self.k, self.fallback, self.block_size = profile, k, fallback, block_size
        self.fits: dict[tuple[str, int | None], Fit] = {}
        self.sources: dict[str, str] = {}
        for op in DEVICE_OPS:
            mine = [f for f in profile.fits if f.op == op]
            ks = sorted({f.k for f in mine}, key=lambda x: (x is None, x))
            chosen = None if not ks else None if ks == [None] else \
                min((x for x in ks if x is not None), key=lambda x: (abs(x - k), -x))
            pick = [f for f in mine if f.k == chosen] or [f for f in mine if f.k is None]
            if op == "draft_forward":   # passes 0 and 1.. of a profile measured at k >= 1
                pick = [f for f in pick if f.k is None or f.k >= 1]
            for f in pick:
                self.fits[(op, f.i if op == "draft_forward" else None)] = f
            if not pick:
                self.sources[op] = (fallback.sources or {}).get(
                    op, "roofline (not in the profile)")
            else:
                at = "any k" if pick[0].k is None else f"k={pick[0].k}" + (
                    "" if pick[0].k == k else f", the nearest measured to k={k}")
                n = sum(f.n for f in pick)
                err = max(f.median_rel_err for f in pick)
                self.sources[op] = (f"profile ({at}; {pick[0].source}; {n} points, median "
                                    f"error up to {100 * err:.1f} %)")

    @property
    def path(self) -> str:
        return self.profile.path

    def _fit(self, op: str, i: int | None = None) -> Fit | None:
        if op != "draft_forward":
            return self.fits.get((op, None))
        fit = self.fits.get((op, i))
        if fit is None and i:   # a later pass than measured: the last one measured
            later = [j for (o, j) in self.fits if o == op and j]
            fit = self.fits[(op, max(later))] if later else None
        return fit

    def _time(self, op: str, b: Batch, i: int | None = None) -> float:
        """The profile's fit of `op` (draft pass i) at b; the fallback's price where the profile
        has none."""
        fit = self._fit(op, i)
        if fit is None:
            fallback = getattr(self.fallback, op)
            return fallback(b) if i is None else fallback(b, i)
        return fit(batch_features(op, i, b, self.block_size))

    def target_forward(self, b: Batch) -> float:
        return self._time("target_forward", b)

    def rejection_sample(self, b: Batch) -> float:
        """The engine's rejection sampler, which also samples at k = 0."""
        return self._time("rejection_sample", b)

    def draft_forward(self, b: Batch, i: int) -> float:
        return self._time("draft_forward", b, i)

    def d2h(self, b: Batch) -> float:
        return self._time("d2h", b)

    def fixup(self, b: Batch) -> float:
        return self._time("fixup", b)
