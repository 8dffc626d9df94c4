"""Sweep grids: the grid syntax, grid files, and a grid's cells, each validated before any runs.

A grid is an ordered set of axes, each a `SimConfig` field with its values. A cell is one
combination of them (the last axis varies fastest), applied on top of a base: a preset's
settings plus fixed overrides. Every cell's config is built and resolved before anything runs,
so a bad key or value stops the sweep before work starts.

Grid syntax (command line; docs/reference/sweeps.md has the file form):
    mode=sync,async,zero-bubble      a list
    k=0..6                           an inclusive integer range
    max_concurrency=1..64:x2         1, 2, 4, ..., 64 (a geometric range)
    request_rate=0.5..2:0.5          0.5, 1.0, 1.5, 2.0 (an arithmetic range)
    acceptance_rates=0.8/0.6,0.7/0.5 list-valued fields take '/' between their numbers
    async_scheduling=true,false      vLLM's spellings too: async_scheduling, speculative_config
    random_input_len=256,1024        (JSON), and `vllm bench serve`'s dataset options with
                                     dataset_name (vllm_settings)
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from stepgap.common.errors import UserError
from stepgap.common.fileio import check_file, read_json, read_toml
from stepgap.common.limits import MAX_GRID_CELLS
from stepgap.common.options import WORKLOAD_FLAGS
from stepgap.common.run_spec import ALIASES
from stepgap.sim.config import CONFIG_KEYS, SimConfig, profile_defaults
from stepgap.sim.profile import load_profile
from stepgap.sim.sweep_keys import cell_key

# vLLM's spellings a grid takes besides SimConfig's fields (vllm_settings makes them into the
# cell's settings): async scheduling, the speculative config (a table, or JSON in --set) and
# `vllm bench serve`'s dataset options (common/options.py WORKLOAD_FLAGS).
VLLM_KEYS = {"async_scheduling": "bool", "speculative_config": "dict", "dataset_name": "str",
             "dataset_path": "str", "tokenizer": "str", "disable_shuffle": "bool",
             **{f.lstrip("-").replace("-", "_"): "float" if key == "range_ratio" else "int"
                for f, key, _ in WORKLOAD_FLAGS}}
GRID_KEYS = tuple(k for k in CONFIG_KEYS if k not in ("detailed", "timeline")) + tuple(VLLM_KEYS)
FIELD_TYPES = {**{f.name: str(f.type) for f in fields(SimConfig)},
               **{k: f"{t} | None" for k, t in VLLM_KEYS.items()}}
MAX_VALUES = 10_000          # per range: a typo such as 0..1e9 should fail, not hang


def vllm_settings(d: dict, explicit=None) -> dict:
    """A cell's settings with vLLM's spellings (VLLM_KEYS) made into SimConfig's fields:
    async_scheduling into mode, speculative_config's method, model and num_speculative_tokens
    into method, draft and k, and the dataset options into the workload and its output length.
    They win over a preset's settings; a field also given as such (`explicit`: the keys given,
    not the preset's; default all) must agree."""
    import argparse
    from types import SimpleNamespace
    from stepgap.common.options import speculative_config_arg, workload_spec
    d = dict(d)

    explicit = set(d) if explicit is None else set(explicit)

    def put(key, value, src):
        if value is None:
            return
        if key in explicit and key in d and d[key] != value:
            raise UserError(f"{src} {value!r} and {key} {d[key]!r} disagree; give one")
        d[key] = value
    a = d.pop("async_scheduling", None)
    if a is not None:
        if not (a and "mode" in explicit and d.get("mode") in ("async", "zero-bubble")):
            put("mode", "async" if a else "sync", "async_scheduling's mode")
    spec = d.pop("speculative_config", None)
    if spec is not None:
        try:
            spec = speculative_config_arg(spec if isinstance(spec, str) else json.dumps(spec))
        except argparse.ArgumentTypeError as e:
            raise UserError(f"speculative_config: {e}") from None
        for field_, key in (("method", "method"), ("model", "draft"),
                            ("num_speculative_tokens", "k")):
            put(key, spec.get(field_), f"speculative_config's {field_}")
    names = [k for k in VLLM_KEYS if k not in ("async_scheduling", "speculative_config")]
    given = {k: d.pop(k) for k in names if k in d}
    if given:   # the cell's dataset, in place of the preset's or the base's workload
        ns = SimpleNamespace(trace=None, output_len=None, quiet=True,
                             **{k: given.get(k) for k in names})
        d["workload"] = workload_spec(ns)
        if ns.output_len is not None:
            d["output_len"] = ns.output_len
    return d


def grid_key(name: str, src: str) -> str:
    """A grid or base key as a SimConfig field name ('max-concurrency' works too, and so do
    the old spellings: worker, num_kv_blocks, num_speculative_tokens)."""
    key = name.strip().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in GRID_KEYS:
        raise UserError(f"{src}: unknown key {name!r}; valid keys: {', '.join(GRID_KEYS)}")
    return key


def field_kind(key: str) -> str:
    t = FIELD_TYPES[key]
    return next(kind for kind in ("bool", "tuple", "dict", "int", "float", "str") if kind in t)


def parse_scalar(key: str, text: str, src: str):
    """One value of `key` from its text."""
    kind, text = field_kind(key), text.strip()
    if text.lower() == "none" and "None" in FIELD_TYPES[key]:
        return None
    if key == "speculative_config":   # JSON, as vLLM takes it
        return text
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
    kind = field_kind(key)
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
        if ".." in item and field_kind(key) in ("int", "float"):
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
    check_file(path, "grid file")
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



@dataclass(slots=True)
class GridCell:
    values: dict          # axis -> value
    settings: dict        # the whole SimConfig settings of the cell
    key: str | None       # hash of the cell's config (None: not asked for)
    notes: tuple = ()     # what resolving the cell chose for the user (sim/plan.py)


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

    def cells(self, keyed: bool = True) -> list[GridCell]:
        """Every cell, validated: its SimConfig is built and resolved and its workload checked,
        so that no run starts unless all can. `keyed`: with its store key (`cell_key`, which
        hashes the simulator's source once a process); advise keeps no store and skips it."""
        from stepgap.sim.bands import nominal_host
        from stepgap.sim.loop import build_workload, check_requests
        from stepgap.sim.plan import resolve

        from stepgap.sim.presets import get_preset
        preset = dict(get_preset(self.preset).settings) if self.preset else {}
        explicit = [k for k, v in self.base.items() if k not in preset or preset[k] != v] \
            + list(self.axes)
        count = math.prod(len(v) for v in self.axes.values())
        if count > MAX_GRID_CELLS:
            sizes = " x ".join(f"{len(v)} {k}" for k, v in self.axes.items())
            raise UserError(f"--grid, --grid-file: {count:,} cells ({sizes}), more than one "
                            f"sweep runs ({MAX_GRID_CELLS:,}); give fewer values, or split the "
                            "grid into sweeps of their own")
        cells, workloads, profiles = [], {}, {}
        for combo in itertools.product(*self.axes.values()):
            values = dict(zip(self.axes, combo))
            try:   # a profile runs where it was measured unless the grid says otherwise
                settings = vllm_settings({**self.base, **values}, explicit)
                path = settings.get("profile")
                if path and path not in profiles:   # read once a grid, not twice a cell
                    profiles[path] = load_profile(path)
                measured = profiles.get(path)
                settings, _ = profile_defaults(settings, set(settings), measured)
                settings, nominal = nominal_host(settings, False)   # (simulate's, advise's)
                cfg = SimConfig(**settings)
                r = resolve(cfg, measured)
                wkey = (cfg.workload, cfg.num_prompts, cfg.output_len, cfg.seed,
                        cfg.request_rate, cfg.burstiness, cfg.shared_fraction, cfg.model)
                if wkey not in workloads:
                    workloads[wkey] = build_workload(cfg)
                check_requests(workloads[wkey], r.scheduler, r.target.vocab_size)
            except UserError as e:
                raise UserError(f"grid cell {format_cell(values)}: {e}") from None
            except (TypeError, ValueError) as e:   # a value of the wrong shape from a file
                raise UserError(f"grid cell {format_cell(values)}: bad value ({e})") from None
            notes = r.notes + ((nominal,) if nominal else ())
            cells.append(GridCell(values, settings, cell_key(cfg) if keyed else None, notes))
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
