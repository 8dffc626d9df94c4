"""What-if sweeps: the simulator over a grid of configurations, in parallel, resumable.

A grid (sim/sweep_grid.py) is an ordered set of axes, each a `SimConfig` field with its values,
on top of a base; every cell is built and resolved before anything runs. Every cell runs with
the base seed, never one derived from the order cells happen to run in, so local, parallel and
cluster runs give the same table.

Cells run in local processes or on a cluster (sim/sweep_runners.py). Each finished cell is
appended to OUT/cells.jsonl (sim/sweep_store.py) under a hash of its whole config and of the
simulator's source (sim/sweep_keys.py); a rerun skips the cells found there. The tidy table
(sim/sweep_table.py: one row per cell, in grid order: the axes, then the run-result metrics) is
written to OUT/sweep.csv and OUT/sweep.json.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from stepgap.common.errors import UserError
from stepgap.sim.sweep_grid import Grid, GridCell
from stepgap.sim.sweep_runners import run_cluster, run_local
from stepgap.sim.sweep_store import CellStore
from stepgap.sim.sweep_table import SweepTable


@dataclass(slots=True)
class SweepRun:
    table: "SweepTable"
    ran: int          # cells simulated by this call
    skipped: int      # cells found done in the store
    seconds: float
    notes: list = field(default_factory=list)   # each distinct note of the cells, once


def cell_notes(cells: list[GridCell]) -> list[str]:
    """The cells' notes, each once, with how many cells it concerns."""
    counts: dict[str, int] = {}
    for c in cells:
        for n in c.notes:
            counts[n] = counts.get(n, 0) + 1
    return [f"{n} ({c} of {len(cells)} cells)" for n, c in counts.items()]


def run_sweep(grid: Grid, out, jobs: int = 1, cluster: str | None = None, fresh: bool = False,
              progress: bool = False, band: bool = False) -> SweepRun:
    """Run every cell not yet in OUT/cells.jsonl and write OUT/sweep.csv and OUT/sweep.json;
    `band`: each cell with its bands (sim/bands.py), kept under a key of its own."""
    import hashlib

    from tqdm import tqdm
    from stepgap.sim.sweep_runners import run_band_cell, run_cell

    t0 = time.perf_counter()
    cells = grid.cells()
    if band:
        for c in cells:
            c.key = hashlib.sha256(f"{c.key}:band".encode()).hexdigest()[:16]
    out = Path(out)
    made = not out.exists()   # a folder this run made is removed again if no cell reaches it
    try:
        out.mkdir(parents=True, exist_ok=True)
        store = CellStore(out / "cells.jsonl", fresh)
    except OSError as e:
        raise UserError(f"--out {out}: {e.strerror}") from None
    todo = [c for c in cells if c.key not in store.done]
    settings = [c.settings for c in todo]
    fn = run_band_cell if band else run_cell
    runner = run_cluster(settings, cluster, fn) if cluster else run_local(settings, jobs, fn)
    stored = 0
    try:
        try:
            # (a bar on a terminal only, as advise's: in a log its \r-updates are lines of noise)
            with tqdm(total=len(cells), initial=len(cells) - len(todo),
                      disable=None if progress else True,
                      unit="cell", desc="sweep", dynamic_ncols=True) as bar:
                for j, metrics in runner:
                    store.add(todo[j], metrics)
                    stored += 1
                    bar.update()
        finally:
            runner.close()   # an interrupted sweep stops its workers here
            store.close()
    except BaseException:   # a cluster that never answered, a first cell's bad input
        if made and not stored:
            shutil.rmtree(out, ignore_errors=True)
        raise
    table = SweepTable(grid.preset, grid.base, grid.axes,
                       [{**c.values, **store.done[c.key], "cell": c.key} for c in cells],
                       str(out / "sweep.json"))
    table.save(out)
    return SweepRun(table, len(todo), len(cells) - len(todo), time.perf_counter() - t0,
                    cell_notes(cells))
