"""What-if sweeps: the simulator over a grid of configurations, in parallel, resumable.

A grid is an ordered set of axes, each a `SimConfig` field with its values. A cell is one
combination of them (the last axis varies fastest), applied on top of a base: a preset's
settings plus fixed overrides. Every cell's config is built and resolved before anything runs,
so a bad key or value stops the sweep before work starts. Every cell runs with the base seed,
never one derived from the order cells happen to run in, so local, parallel and cluster runs
give the same table.

Cells run in local processes (`concurrent.futures`) or on a cluster, Dask distributed or Ray
(`run_cluster`, one piece for both; each an optional extra). Each finished cell is appended to
OUT/cells.jsonl under a hash of its whole config and of the simulator's source; a rerun skips
the cells found there. The tidy table (one row per cell, in grid order: the axes, then the
run-result metrics) is written to OUT/sweep.csv and OUT/sweep.json.

Grid syntax (command line; docs/sweeps.md has the file form):
    mode=sync,async,zero-bubble      a list
    k=0..6                           an inclusive integer range
    max_concurrency=1..64:x2         1, 2, 4, ..., 64 (a geometric range)
    request_rate=0.5..2:0.5          0.5, 1.0, 1.5, 2.0 (an arithmetic range)
    acceptance_rates=0.8/0.6,0.7/0.5 list-valued fields take '/' between their numbers
"""

from __future__ import annotations

import ast
import csv
import functools
import hashlib
import importlib
import io
import itertools
import json
import math
import re
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterator

from stepgap.sim.config import ALIASES, SimConfig, resolve
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import decode_text, parse_json, read_bytes, read_json, read_toml, write_text
from stepgap.common.formats import METRICS, MODES, NONFINITE, save_result

GRID_KEYS = tuple(f.name for f in fields(SimConfig) if f.name not in ("detailed", "timeline"))
_TYPES = {f.name: str(f.type) for f in fields(SimConfig)}
MAX_VALUES = 10_000          # per range: a typo such as 0..1e9 should fail, not hang
STORE_VERSION = "1"          # part of every cell's hash: bump when a metric's meaning changes
CONNECT_TIMEOUT = "10s"      # to reach a Dask scheduler

# The columns of the table after the axes: run-result metrics (DESIGN.md §4, §5).
RESULT_METRICS = (
    "completed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
    *(f"{stat}_{m}_ms" for m in METRICS for stat in ("mean", "median", "std", "p99")),
)
COLUMNS = RESULT_METRICS + (
    "mean_step_gap_us", "median_step_gap_us", "p90_step_gap_us", "p99_step_gap_us",
    "acceptance_length", "num_steps", "num_preemptions", "num_kv_blocks",
    "simulated_mode",   # the mode the cell ran in (an n-gram cell asked for async runs sync)
)
TEXT_COLUMNS = ("simulated_mode",)   # the columns that are not numbers (not plotted)


def is_column_value(key: str, v) -> bool:
    """What a finished cell may hold in a column: a number (a mode name in TEXT_COLUMNS), or
    None where a metric has no value."""
    if v is None:
        return True
    if key in TEXT_COLUMNS:
        return v in MODES
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# -------------------------------------------------------------------------------------------
# Grid syntax


def grid_key(name: str, src: str) -> str:
    """A grid or base key as a SimConfig field name ('max-concurrency' works too, and so do
    the old spellings: worker, num_kv_blocks, num_speculative_tokens)."""
    key = name.strip().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in GRID_KEYS:
        raise UserError(f"{src}: unknown key {name!r}; valid keys: {', '.join(GRID_KEYS)}")
    return key


def _kind(key: str) -> str:
    t = _TYPES[key]
    return next(kind for kind in ("bool", "tuple", "dict", "int", "float", "str") if kind in t)


def parse_scalar(key: str, text: str, src: str):
    """One value of `key` from its text."""
    kind, text = _kind(key), text.strip()
    if text.lower() == "none" and "None" in _TYPES[key]:
        return None
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "tuple":
            return tuple(float(x) for x in text.split("/"))
    except ValueError:
        what = {"int": "an integer", "float": "a number", "tuple": "numbers separated by '/'"}
        raise UserError(f"{src}: {key} expects {what[kind]}, got {text!r}") from None
    if kind == "bool":
        if text.lower() in ("true", "yes", "1"):
            return True
        if text.lower() in ("false", "no", "0"):
            return False
        raise UserError(f"{src}: {key} expects true or false, got {text!r}")
    if kind == "dict":
        raise UserError(f"{src}: {key} takes a table of values; give it in a --grid-file")
    return text


_RANGE = re.compile(r"^(?P<lo>[^.]+(?:\.\d+)?)\.\.(?P<hi>[^:]+)(?::(?P<x>x)?(?P<step>.+))?$")


def parse_range(key: str, text: str, src: str) -> list:
    """`A..B` (inclusive, step 1), `A..B:S` (step S) or `A..B:xF` (times F each step)."""
    m = _RANGE.match(text)
    if not m:
        raise UserError(f"{src}: bad range {text!r}; expected A..B, A..B:STEP or A..B:xFACTOR")
    kind = _kind(key)
    lo, hi = parse_scalar(key, m["lo"], src), parse_scalar(key, m["hi"], src)
    step = 1
    if m["x"]:
        try:
            step = float(m["step"])
        except ValueError:
            raise UserError(f"{src}: range {text!r}: the factor after 'x' must be a number") \
                from None
    elif m["step"]:
        step = parse_scalar(key, m["step"], src)
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        raise UserError(f"{src}: range {text!r} needs finite ends")
    if lo > hi:
        raise UserError(f"{src}: empty range {text!r} (its start is past its end)")
    values = []
    if m["x"]:
        if not (step > 1 and lo > 0):
            raise UserError(f"{src}: geometric range {text!r} needs a factor > 1 and a start > 0")
        i = 0
        while (v := lo * step ** i) <= hi * (1 + 1e-12) and len(values) <= MAX_VALUES:
            values.append(round(v) if kind == "int" else round(v, 12))
            i += 1
    else:
        if not step > 0:
            raise UserError(f"{src}: range {text!r} needs a step > 0")
        n = math.floor((hi - lo) / step + 1e-9) + 1
        if n > MAX_VALUES:
            raise UserError(f"{src}: range {text!r} has {n} values (at most {MAX_VALUES})")
        values = [lo + i * step if kind == "int" else round(lo + i * step, 12) for i in range(n)]
    if len(values) > MAX_VALUES:
        raise UserError(f"{src}: range {text!r} has more than {MAX_VALUES} values")
    return list(dict.fromkeys(values))   # a value the rounding gave twice is one value


def parse_values(key: str, text: str, src: str) -> list:
    """The values of one axis: a comma-separated list whose items are values or ranges."""
    if not text.strip():
        raise UserError(f"{src}: {key} has no values")
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise UserError(f"{src}: empty item in {text!r}")
        if ".." in item and _kind(key) in ("int", "float"):
            values += parse_range(key, item, src)
        else:
            values.append(parse_scalar(key, item, src))
    return values


def parse_assignment(text: str, src: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise UserError(f"{src} {text!r}: expected KEY=VALUES, e.g. k=0..6 or mode=sync,async")
    return grid_key(name, f"{src} {text!r}"), value


def load_grid_file(path) -> tuple[str | None, dict, dict]:
    """(preset, base, axes) from a TOML or JSON file with `preset`, `[base]` and `[grid]`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: grid file not found")
    if path.suffix == ".toml":
        doc = read_toml(path)
    elif path.suffix == ".json":
        doc = read_json(path)
    else:
        raise UserError(f"{path}: a grid file ends in .toml or .json")
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a table with `grid` (and optionally `preset`, `base`)")
    unknown = set(doc) - {"preset", "base", "grid"}
    if unknown:
        raise UserError(f"{path}: unknown section {sorted(unknown)[0]!r}; a grid file holds "
                        "`preset`, `base` and `grid`")
    preset = doc.get("preset")
    if preset is not None and not isinstance(preset, str):
        raise UserError(f"{path}: preset: expected a preset name, got {preset!r}")
    base, axes = doc.get("base", {}), doc.get("grid")
    if not isinstance(base, dict):
        raise UserError(f"{path}: base: expected a table of fixed settings")
    if not isinstance(axes, dict) or not axes:
        raise UserError(f"{path}: grid: expected a table of axes, e.g. k = \"0..6\"")
    base = {grid_key(name, f"{path}: base.{name}"): v for name, v in base.items()}
    parsed = {}
    for name, v in axes.items():
        src = f"{path}: grid.{name}"
        key = grid_key(name, src)
        if isinstance(v, str):
            parsed[key] = parse_values(key, v, src)
        elif isinstance(v, list):
            if not v:
                raise UserError(f"{src}: no values")
            parsed[key] = [tuple(x) if isinstance(x, list) else x for x in v]
        else:
            parsed[key] = [v]
        check_repeats(key, parsed[key], src)
    return preset, base, parsed


# -------------------------------------------------------------------------------------------
# Grid and cells


@dataclass(slots=True)
class GridCell:
    values: dict          # axis -> value
    settings: dict        # the whole SimConfig settings of the cell
    key: str              # hash of the cell's config
    notes: tuple = ()     # what resolving the cell chose for the user (sim/config.py)


@dataclass(slots=True)
class Grid:
    axes: dict                               # axis -> list of values, in grid order
    base: dict = field(default_factory=dict)  # SimConfig settings shared by every cell
    preset: str | None = None

    def __post_init__(self):
        if not self.axes:
            raise UserError("the grid has no axes; give --grid KEY=VALUES or --grid-file")
        for key, values in self.axes.items():
            grid_key(key, "grid")
            if not values:
                raise UserError(f"grid: {key} has no values")
            check_repeats(key, values, "grid")
        for key in self.base:
            grid_key(key, "base")

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.axes.values())

    def cells(self) -> list[GridCell]:
        """Every cell, validated: its SimConfig is built and resolved and its workload checked,
        so that no run starts unless all can."""
        from stepgap.sim.loop import build_workload, check_requests

        cells, workloads = [], {}
        for combo in itertools.product(*self.axes.values()):
            values = dict(zip(self.axes, combo))
            settings = {**self.base, **values}
            try:
                cfg = SimConfig(**settings)
                r = resolve(cfg)
                wkey = (cfg.workload, cfg.num_prompts, cfg.output_len, cfg.seed,
                        cfg.request_rate, cfg.burstiness)
                if wkey not in workloads:
                    workloads[wkey] = build_workload(cfg)
                check_requests(workloads[wkey], r.scheduler)
            except UserError as e:
                raise UserError(f"grid cell {format_cell(values)}: {e}") from None
            except (TypeError, ValueError) as e:   # a value of the wrong shape from a file
                raise UserError(f"grid cell {format_cell(values)}: bad value ({e})") from None
            cells.append(GridCell(values, settings, cell_key(cfg), r.notes))
        return cells


def build_grid(specs: list[str] = (), grid_file=None, preset: str | None = None,
               sets: list[str] = ()) -> Grid:
    """A grid from the command line: file axes first, then --grid axes (which replace a file's
    axis of the same name); base = the preset's settings, the file's base, then --set."""
    from stepgap.sim.presets import get_preset

    file_preset, base, axes = load_grid_file(grid_file) if grid_file else (None, {}, {})
    seen = set()
    for spec in specs:
        key, text = parse_assignment(spec, "--grid")
        if key in seen:
            raise UserError(f"--grid {spec!r}: {key} is given twice")
        seen.add(key)
        axes[key] = check_repeats(key, parse_values(key, text, f"--grid {spec!r}"),
                                  f"--grid {spec!r}")
    for spec in sets:
        key, text = parse_assignment(spec, "--set")
        base[key] = parse_scalar(key, text, f"--set {spec!r}")
    try:
        settings = dict(get_preset(preset or file_preset).settings) \
            if preset or file_preset else {}
    except UserError as e:
        raise UserError(f"{grid_file}: {e}" if not preset else str(e)) from None
    return Grid(axes, {**settings, **base}, preset or file_preset)


def check_repeats(key: str, values: list, src: str) -> list:
    """An axis takes each value once (a value the user gave twice is an error; one a range's
    rounding gave twice is dropped by parse_range)."""
    seen = set()
    for v in values:
        text = json.dumps(v, sort_keys=True, default=str)
        if text in seen:
            raise UserError(f"{src}: {key} is given the value {v!r} twice")
        seen.add(text)
    return values


def format_cell(values: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


# The code a cell's result depends on: the simulator's loop and its scenario presets, and every
# module of the project they import, directly or not (`model_sources`, read from the source as
# tests/test_layout.py reads it). A result kept from another version of any of them is stale.
MODEL_ROOTS = ("stepgap.sim.loop", "stepgap.sim.presets")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # the folder that installs as `stepgap.`


def module_path(name: str, root: Path = PACKAGE_ROOT) -> Path | None:
    """The file of project module `name` (stepgap.sim.loop: sim/loop.py), or None when `name`
    is no module of the project (a class, a function, another package)."""
    parts = name.split(".")
    if parts[0] != "stepgap" or len(parts) < 2:
        return None
    base = root.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def model_sources(roots: tuple[str, ...] = MODEL_ROOTS, root: Path = PACKAGE_ROOT
                  ) -> tuple[str, ...]:
    """The project files `roots` import, transitively (every import, inside functions too, and
    the packages' __init__), relative to `root`, sorted: a module split in two, or a new one
    imported, is covered."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = module_path(name, root)
        if path is None or name in seen:
            continue
        seen[name] = path
        todo.append(name.rpartition(".")[0])   # its package's __init__ runs first
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return tuple(sorted({str(p.relative_to(root)) for p in seen.values()}))


@functools.cache
def model_digest() -> str:
    h = hashlib.sha256()
    for name in model_sources():
        h.update(name.encode() + b"\0")
        h.update((PACKAGE_ROOT / name).read_bytes())
    return h.hexdigest()[:16]


def cell_key(cfg: SimConfig) -> str:
    """The cell's hash: its whole config, the files it names and the simulator's code."""
    h = hashlib.sha256(f"{STORE_VERSION}:{model_digest()}:".encode())
    h.update(json.dumps(cfg.to_dict(), sort_keys=True).encode())
    for name in (cfg.workload, cfg.model, cfg.draft or "", cfg.profile or ""):   # files it names
        path = Path(name)
        path = path / "config.json" if path.is_dir() else path
        if path.is_file():
            h.update(read_bytes(path))
    return h.hexdigest()[:16]


# -------------------------------------------------------------------------------------------
# Running one cell, and many


def run_cell(settings: dict) -> dict:
    """Simulate one cell; its metrics. Runs in a worker process or on a cluster worker."""
    from stepgap.sim.loop import simulate

    res, _ = simulate(SimConfig(**settings))
    return metrics_of(res)


def metrics_of(res: dict) -> dict:
    row = {m: res[m] for m in RESULT_METRICS}
    gaps = res["step_gaps"]
    for stat in ("mean", "median", "p90", "p99"):
        row[f"{stat}_step_gap_us"] = gaps.get(f"{stat}_us")
    spec = res.get("spec_decode")
    row["acceptance_length"] = spec["acceptance_length"] if spec else None
    resolved = res["config"]["resolved"]
    for key in ("num_steps", "num_preemptions", "num_kv_blocks"):
        row[key] = resolved[key]
    row["simulated_mode"] = resolved.get("mode", res["config"]["mode"])
    return row


def _pool_worker_signals() -> None:
    """A pool worker leaves Ctrl-C and SIGTERM to the sweep's own process, which stops it: it
    must not take the SIGTERM handler it forked with (stepgap/cli.py), which would unwind the
    cell and leave the worker waiting for the next one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_pool(ex: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now (an interrupted sweep), so that none outlives the sweep.
    Python 3.14 has terminate_workers(); before it, the processes are reached directly."""
    if hasattr(ex, "terminate_workers"):
        ex.terminate_workers()
        return
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)


def run_local(settings: list[dict], jobs: int) -> Iterator[tuple[int, dict]]:
    """(index, metrics) as cells finish, over `jobs` processes (1: in this process)."""
    if jobs <= 1 or len(settings) <= 1:
        for i, s in enumerate(settings):
            yield i, run_cell(s)
        return
    ex = ProcessPoolExecutor(max_workers=min(jobs, len(settings)),
                             initializer=_pool_worker_signals)
    try:
        futures = {ex.submit(run_cell, s): i for i, s in enumerate(settings)}
        for f in as_completed(futures):
            yield futures[f], f.result()
    except BaseException:   # interrupted, or the consumer stopped (GeneratorExit)
        stop_pool(ex)
        raise
    ex.shutdown()


@dataclass(frozen=True)
class ClusterEngine:
    """One cluster engine as run_cluster drives it: how to reach it (`connect`, a context
    manager whose value is handed to `run`) and how to run the cells on it (`run`, yielding
    (index, metrics) as they finish). The rest, the checks and the messages, is shared."""

    name: str
    module: str           # imported first: missing, the user is told what to install
    extra: str            # the pip extra that installs it
    connect: Callable
    run: Callable


def _dask_connect(address: str):
    from distributed import Client
    return Client(address, timeout=CONNECT_TIMEOUT)


def _dask_run(client, settings: list[dict]) -> Iterator[tuple[int, dict]]:
    from distributed import as_completed as dask_completed
    futures = client.map(run_cell, settings, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    for f in dask_completed(futures):
        yield index[f.key], f.result()


def _ray_connect(address: str):
    import ray
    # `ray`: a local instance for this sweep; ray://HOST:PORT: a running cluster (Ray Client)
    return ray.init(address=None if address == "ray" else address, include_dashboard=False,
                    log_to_driver=False, logging_level="warning")


def _ray_run(_, settings: list[dict]) -> Iterator[tuple[int, dict]]:
    import ray
    cell = ray.remote(num_cpus=1)(run_cell)   # one CPU each: a cell is pure Python
    refs = [cell.remote(s) for s in settings]
    index = {ref: i for i, ref in enumerate(refs)}
    pending = refs
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield index[done[0]], ray.get(done[0])


DASK = ClusterEngine("Dask distributed", "distributed", "cluster", _dask_connect, _dask_run)
RAY = ClusterEngine("Ray", "ray", "ray", _ray_connect, _ray_run)


def cluster_engine(address: str) -> ClusterEngine:
    """Ray for `ray` (a local instance) and ray://HOST:PORT; Dask for any other address."""
    return RAY if address == "ray" or address.startswith("ray://") else DASK


def run_cluster(settings: list[dict], address: str) -> Iterator[tuple[int, dict]]:
    """(index, metrics) as cells finish on the cluster at `address` (`cluster_engine`)."""
    engine = cluster_engine(address)
    try:
        importlib.import_module(engine.module)
    except ImportError:
        raise UserError(f"--cluster {address} needs {engine.name}: "
                        f"pip install 'stepgap[{engine.extra}]'") from None
    try:
        session = engine.connect(address)
    except (OSError, TimeoutError, ValueError, ConnectionError) as e:
        raise UserError(f"--cluster {address}: cannot connect ({e})") from None
    with session:
        yield from engine.run(session, settings)


class CellStore:
    """OUT/cells.jsonl: one line per finished cell, appended as it finishes.

    An interrupted run can leave its last line torn (no newline, not JSON): that cell runs
    again, and the torn line is cut off before the next one is appended. Any other line that is
    not a finished cell is an error naming its line."""

    def __init__(self, path: Path, fresh: bool = False):
        self.path = path
        self.done: dict[str, dict] = {}
        self.cut_at: int | None = None   # a torn last line starts at this byte
        self.newline_due = False         # the last line is whole but has no newline
        if fresh and path.is_file():
            path.unlink()
        if path.exists():
            self._read()
        self._file = None

    def _read(self) -> None:
        data = read_bytes(self.path)
        decode_text(data, self.path)   # names the file if it is not UTF-8 text
        lines = data.split(b"\n")
        offset = 0
        for lineno, line in enumerate(lines, 1):
            text = line.decode("utf-8-sig" if lineno == 1 else "utf-8")
            if text.strip():
                try:
                    d = parse_json(text, self.path, lineno)
                except UserError:
                    if lineno < len(lines):
                        raise UserError(f"{where(self.path, lineno)}: not a finished cell (not "
                                        "valid JSON); delete the line, or rerun with --fresh") \
                            from None
                    self.cut_at = offset
                    return
                key = self._cell(d, lineno)
                self.done[key] = d["metrics"]
            offset += len(line) + 1
        self.newline_due = bool(data) and not data.endswith(b"\n")

    def _cell(self, d, lineno: int) -> str:
        if not isinstance(d, dict) or not isinstance(d.get("cell"), str):
            raise UserError(f"{where(self.path, lineno, 'cell')}: expected a cell's hash; is "
                            "this a store of `stepgap sweep`? (rerun with --fresh)")
        metrics = d.get("metrics")
        if not isinstance(metrics, dict) or not all(is_column_value(k, v)
                                                    for k, v in metrics.items()):
            raise UserError(f"{where(self.path, lineno, 'metrics')}: expected an object of "
                            f"numbers, got {str(metrics)[:60]!r}; delete the line, or rerun "
                            "with --fresh")
        return d["cell"]

    def add(self, cell: GridCell, metrics: dict) -> None:
        if self._file is None:
            self._file = self.path.open("ab")
            if self.cut_at is not None:
                self._file.truncate(self.cut_at)
            elif self.newline_due:
                self._file.write(b"\n")
        self._file.write((json.dumps({"cell": cell.key, "values": cell.values,
                                      "metrics": metrics}) + "\n").encode())
        self._file.flush()
        self.done[cell.key] = metrics

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
              progress: bool = False) -> SweepRun:
    """Run every cell not yet in OUT/cells.jsonl and write OUT/sweep.csv and OUT/sweep.json."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    cells = grid.cells()
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        store = CellStore(out / "cells.jsonl", fresh)
    except OSError as e:
        raise UserError(f"--out {out}: {e.strerror}") from None
    todo = [c for c in cells if c.key not in store.done]
    settings = [c.settings for c in todo]
    runner = run_cluster(settings, cluster) if cluster else run_local(settings, jobs)
    try:
        with tqdm(total=len(cells), initial=len(cells) - len(todo), disable=not progress,
                  unit="cell", desc="sweep", dynamic_ncols=True) as bar:
            for j, metrics in runner:
                store.add(todo[j], metrics)
                bar.update()
    finally:
        runner.close()   # an interrupted sweep stops its workers here
        store.close()
    table = SweepTable(grid.preset, grid.base, grid.axes,
                       [{**c.values, **store.done[c.key], "cell": c.key} for c in cells])
    table.save(out)
    return SweepRun(table, len(todo), len(cells) - len(todo), time.perf_counter() - t0,
                    cell_notes(cells))


# -------------------------------------------------------------------------------------------
# The table


@dataclass(slots=True)
class SweepTable:
    """One row per cell, in grid order: the axes, the metrics and the cell's hash."""

    preset: str | None
    base: dict
    axes: dict
    rows: list[dict]

    @property
    def columns(self) -> list[str]:
        return [*self.axes, *COLUMNS, "cell"]

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
            if key in COLUMNS and key not in TEXT_COLUMNS and v in NONFINITE:
                r[key] = float(v)   # as save_result wrote it
            elif key in COLUMNS and not is_column_value(key, v):
                expected = "a mode" if key in TEXT_COLUMNS else "a number"
                raise UserError(f"{where(path, field=f'rows[{n}].{key}')}: expected {expected}, "
                                f"got {v!r}")
    if not isinstance(doc.get("base", {}), dict):
        raise UserError(f"{where(path, field='base')}: {what} (expected an object)")
    axes = {k: [_restore(k, v, path) for v in vals] for k, vals in axes.items()}
    rows = [{k: (_restore(k, v, path) if k in axes else v) for k, v in r.items()}
            for r in rows]
    return SweepTable(doc.get("preset"), doc.get("base", {}), axes, rows)


def _restore(key: str, v, path):
    """JSON has no inf and no tuples: undo what saving did to an axis value."""
    if isinstance(v, str) and key in _TYPES and _kind(key) == "float":
        try:
            return float(v)
        except ValueError:
            raise UserError(f"{where(path, field=key)}: expected a number, got {v!r}") from None
    if isinstance(v, list):
        return tuple(v)
    return v
