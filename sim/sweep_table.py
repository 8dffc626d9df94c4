"""A sweep's table: one row per cell, in grid order (the axes, the run-result metrics, the
cell's hash), written to OUT/sweep.csv and OUT/sweep.json and read back."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json, write_text
from stepgap.common.formats import METRICS, MODES, NONFINITE, save_result
from stepgap.common.limits import is_number
from stepgap.sim.config import SimConfig
from stepgap.sim.sweep_grid import FIELD_TYPES, field_kind

# The columns of the table after the axes: run-result metrics (docs/explanation/design.md §4, §5).
RESULT_METRICS = (
    "completed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
    *(f"{stat}_{m}_ms" for m in METRICS for stat in ("mean", "median", "std", "p99")),
)
COLUMNS = RESULT_METRICS + (
    "mean_step_gap_us", "median_step_gap_us", "p90_step_gap_us", "p99_step_gap_us",
    "acceptance_length", "num_steps", "num_preemptions", "num_kv_blocks",
    "prefix_cache_hit_rate",   # prompt tokens the prefix cache found, of those looked up
    "simulated_mode",   # the mode the cell ran in (an n-gram cell asked for async runs sync)
)
# With --band: each BANDED metric's band (sim/bands.py) and the inputs dominating each band.
BANDED = ("mean_tpot_ms", "mean_itl_ms")
BAND_COLUMNS = tuple(f"{m}_{end}" for m in BANDED for end in ("low", "high")) + \
    ("band_dominant",)
# The x axis of a sweep's figures (sim/plots.py): the load, or the shared fraction of the prompt
X_AXES = ("max_concurrency", "request_rate", "shared_fraction")
TEXT_COLUMNS = ("simulated_mode", "band_dominant")   # not numbers (not plotted)


def is_column_value(key: str, v) -> bool:
    """What a finished cell may hold in a column: a number >= 0 (every metric is a time, a
    count, a rate or a fraction), or one that is not finite (left blank in the figures), a
    mode name in TEXT_COLUMNS, or None where a metric has no value."""
    if v is None:
        return True
    if key == "band_dominant":
        return isinstance(v, str)
    if key in TEXT_COLUMNS:
        return v in MODES
    return is_number(v) and not (math.isfinite(v) and v < 0)


@dataclass(slots=True)
class SweepTable:
    """One row per cell, in grid order: the axes, the metrics and the cell's hash."""

    preset: str | None
    base: dict
    axes: dict
    rows: list[dict]
    path: str | None = None   # the sweep.json it was read from (load_sweep), for messages

    @property
    def columns(self) -> list[str]:
        band = any("band_dominant" in r for r in self.rows)
        return [*self.axes, *COLUMNS, *(BAND_COLUMNS if band else ()), "cell"]

    def csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.columns)
        for row in self.rows:
            w.writerow([_csv_value(row.get(c)) for c in self.columns])
        return buf.getvalue()

    def save(self, out) -> None:
        out = Path(out)
        write_text(out / "sweep.csv", self.csv_text())
        save_result(out / "sweep.json", {"preset": self.preset, "base": self.base,
                                         "axes": self.axes, "columns": self.columns,
                                         "rows": self.rows})

    def select(self, **values) -> list[dict]:
        """The rows whose axes have these values."""
        return [r for r in self.rows if all(r[k] == v for k, v in values.items())]

    def value(self, metric: str, **values):
        """The metric of the one row with these axis values (None if there is none)."""
        rows = self.select(**values)
        return rows[0][metric] if len(rows) == 1 else None

    def setting(self, key: str, **values):
        """A setting as the cell sees it: its axis value, else the base's, else the default."""
        if key in self.axes and key in values:
            return values[key]
        if key in self.axes and len(self.axes[key]) == 1:
            return self.axes[key][0]
        return self.base.get(key, getattr(SimConfig(), key))


def _csv_value(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (tuple, list)):
        return "/".join(str(x) for x in v)
    return str(v)


def load_sweep(path) -> SweepTable:
    """A sweep written by `stepgap sweep`: its folder or its sweep.json."""
    path = Path(path)
    if path.is_dir():
        path = path / "sweep.json"
    if not path.is_file():
        raise UserError(f"{path}: no sweep here (run `stepgap sweep --out DIR` first)")
    doc = read_json(path)
    what = "not a sweep table written by `stepgap sweep`"
    if not isinstance(doc, dict):
        raise UserError(f"{path}: {what} (expected a JSON object)")
    axes, rows = doc.get("axes"), doc.get("rows")
    if not isinstance(axes, dict) or not all(isinstance(v, list) for v in axes.values()):
        raise UserError(f"{where(path, field='axes')}: {what} (expected axis -> values)")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UserError(f"{where(path, field='rows')}: {what} (expected a list of rows)")
    for n, r in enumerate(rows):
        for key, v in r.items():
            known = key in COLUMNS or key in BAND_COLUMNS
            if known and key not in TEXT_COLUMNS and v in NONFINITE:
                r[key] = float(v)   # as save_result wrote it
            elif known and not is_column_value(key, v):
                expected = "a string" if key == "band_dominant" else \
                    "a mode" if key in TEXT_COLUMNS else "a number >= 0 (or none)"
                raise UserError(f"{where(path, field=f'rows[{n}].{key}')}: expected {expected}, "
                                f"got {v!r}")
    if not isinstance(doc.get("base", {}), dict):
        raise UserError(f"{where(path, field='base')}: {what} (expected an object)")
    axes = {k: [_restore(k, v, path) for v in vals] for k, vals in axes.items()}
    rows = [{k: (_restore(k, v, path) if k in axes else v) for k, v in r.items()}
            for r in rows]
    check_cells(axes, rows, path)
    return SweepTable(doc.get("preset"), doc.get("base", {}), axes, rows, str(path))


def check_cells(axes: dict, rows: list[dict], path) -> None:
    """Every axis value a number where it is one (not NaN: a NaN cell matches no row), and one
    row per cell, its axis values the axes': a row given twice, or off the grid, would leave
    its cell without a value and the figures blaming the metric."""
    for key, vals in axes.items():
        if any(isinstance(v, float) and v != v for v in vals):
            raise UserError(f"{where(path, field=f'axes.{key}')}: NaN is no value of an axis")
    seen: dict[tuple, int] = {}
    for n, r in enumerate(rows):
        for key, vals in axes.items():
            if key not in r or r[key] not in vals:
                raise UserError(f"{where(path, field=f'rows[{n}].{key}')}: expected one of the "
                                f"axis's values {vals}, got {r.get(key)!r}")
        cell = tuple(r[key] for key in axes)
        if cell in seen:
            at = ", ".join(f"{k}={v}" for k, v in zip(axes, cell))
            raise UserError(f"{where(path, field=f'rows[{n}]')}: the same cell ({at}) as "
                            f"rows[{seen[cell]}]; a sweep has one row per cell")
        seen[cell] = n


def _restore(key: str, v, path):
    """JSON has no inf and no tuples: undo what saving did to an axis value."""
    if isinstance(v, str) and key in FIELD_TYPES and field_kind(key) == "float":
        try:
            return float(v)
        except ValueError:
            raise UserError(f"{where(path, field=key)}: expected a number, got {v!r}") from None
    if isinstance(v, list):
        return tuple(v)
    return v
