"""Measured operator tables interpolated (sim/tables.py reads them, sim/table_costs.py prices a
step from them).

Interpolation: 1-D tables linear between grid points, the first point's time below the grid,
and above it in proportion to the count (t(x_max)·x / x_max: at the grid's top the GEMMs are
compute-bound, and two neighbours 16 tokens apart give a noisy slope). Attention: linear on each
axis, nested (history within a row, then decodes within a chunk size, then chunk size), each
axis over the points measured there, and above an axis's top linearly from its top two
points. A request whose context exceeds the tables' KV grid is refused before the run.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from stepgap.sim.hardware import axis_interp


@dataclass(frozen=True, slots=True)
class Table1D:
    """Times by one count, linear between points (the rules in the module docstring)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * x / xs[-1]
        j = bisect.bisect_right(xs, x)
        x0, x1 = xs[j - 1], xs[j]
        return ys[j - 1] + (ys[j] - ys[j - 1]) * (x - x0) / (x1 - x0)


class AttentionTable:
    """One layer's attention time over (prefill chunk, its history, decodes, their history),
    on whatever points were measured: each (chunk, decodes) slice holds rows by history of
    the chunk, each row its own decode histories."""

    def __init__(self, rows: list[tuple[float, float, float, float, float]]):
        slices: dict[tuple[float, float], dict[float, dict[float, float]]] = {}
        for pc, kp, nd, kd, t in rows:
            slices.setdefault((pc, nd), {}).setdefault(kp, {})[kd] = t
        self.slices = {key: {kp: (sorted(r), [r[kd] for kd in sorted(r)])
                             for kp, r in by_kp.items()} for key, by_kp in slices.items()}
        self.kps = {key: sorted(by_kp) for key, by_kp in self.slices.items()}
        self.nds: dict[float, list[float]] = {}
        for pc, nd in self.slices:
            self.nds.setdefault(pc, []).append(nd)
        for v in self.nds.values():
            v.sort()
        self.pcs = sorted(self.nds)
        self.floor = min(t for *_, t in rows)
        self.max_kv = max(max(kp, kd) for _, kp, _, kd, _ in rows)

    def _row(self, key, kp: float, kd: float) -> float:
        kds, ts = self.slices[key][kp]
        return axis_interp(kds, lambda x: ts[kds.index(x)], kd)

    def _slice(self, pc: float, nd: float, kp: float, kd: float) -> float:
        key = (pc, nd)
        return axis_interp(self.kps[key], lambda x: self._row(key, x, kd), kp)

    def __call__(self, pc: float, kp: float, nd: float, kd: float) -> float:
        """Microseconds of one layer's attention kernel for this mix."""
        def at_pc(p: float) -> float:
            return axis_interp(self.nds[p], lambda n: self._slice(p, n, kp, kd), nd)
        pcs = self.pcs if nd else [p for p in self.pcs if 0.0 in self.nds[p]]
        return max(0.0, axis_interp(pcs, at_pc, pc))


@dataclass(frozen=True, slots=True)
class SkewFit:
    """A bundle's measured cost of unequal decode histories: t = t_mean + alpha (t_max -
    t_mean), alpha by bucket (`bucket_axes` bins, a bin (lo, hi] by its label), else the pooled
    `alpha_default`."""

    alpha_default: float
    axes: dict
    alphas: dict

    @staticmethod
    def label(bins, labels, v: float) -> str:
        for i in range(len(labels)):
            if v <= bins[i + 1]:
                return labels[i]
        return labels[-1]

    def alpha(self, pc: float, n: int, rate: float, kv_big: float, kp: float) -> float:
        if not self.alphas:
            return self.alpha_default
        a = self.axes
        key = "|".join((f"pc={int(pc)}", self.label(a["n_bins"], a["n_labels"], n),
                        self.label(a["skew_rate_bins"], a["skew_rate_labels"], rate),
                        self.label(a["kv_big_bins"], a["kv_big_labels"], kv_big),
                        self.label(a["kp_bins"], a["kp_labels"], kp)))
        return self.alphas.get(key, self.alpha_default)
