"""A sweep cell's key: the hash under which its result is kept, of its whole config, the files
it names and the simulator's source (a result kept from another version of any is stale)."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from pathlib import Path

from stepgap.common.fileio import read_bytes
from stepgap.sim.config import SimConfig

STORE_VERSION = "1"          # part of every cell's hash: bump when a metric's meaning changes

# The code a cell's result depends on: the simulator's loop and its scenario presets, and every
# module of the project they import, directly or not (`model_sources`, read from the source as
# tests/test_layout.py reads it). A result kept from another version of any of them is stale.
MODEL_ROOTS = ("stepgap.sim.loop", "stepgap.sim.presets")
# The `stepgap` package's folder, as loaded (not resolved): stepgap.sim.loop is its sim/loop.py,
# through the symlink stepgap/sim -> ../sim in a checkout, a copied file in a wheel.
PACKAGE_ROOT = Path(__file__).parents[1]


def module_path(name: str, root: Path = PACKAGE_ROOT) -> Path | None:
    """The file of project module `name` (stepgap.sim.loop: `root`/sim/loop.py), found as Python
    finds it, or None when `name` is no module of the project (a class, a function, another
    package, `stepgap` itself)."""
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
        todo += imports_of(path)
    return tuple(sorted({str(p.relative_to(root)) for p in seen.values()}))


def imports_of(path: Path) -> list[str]:
    """Every name `path` imports (inside functions too), absolute imports only; `from a import b`
    gives both `a` and `a.b`, since b may be a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


@functools.cache
def model_digest(roots: tuple[str, ...] = MODEL_ROOTS, root: Path = PACKAGE_ROOT) -> str:
    """A hash of the project's code that `roots` import (`model_sources`): the simulator's,
    by default (the tests key their tiny checkpoints by training/tiny.py's)."""
    h = hashlib.sha256()
    for name in model_sources(roots, root):
        h.update(name.encode() + b"\0")
        h.update((root / name).read_bytes())
    return h.hexdigest()[:16]


def tables_of(cfg: SimConfig):
    """The operator tables a cell is priced from: its --device-profile, else the ones committed
    for its GPU and model (sim/device_choice.py committed_tables; --device-profile none: none)."""
    from stepgap.sim.device_choice import NO_TABLES, committed_tables
    from stepgap.sim.plan import quantized
    if cfg.device_profile == NO_TABLES:
        return None
    if cfg.device_profile is not None:
        return cfg.device_profile
    from stepgap.common.errors import UserError
    from stepgap.common.model_presets import load_model_config
    from stepgap.sim.hardware_file import load_gpu
    try:
        hw = load_gpu(cfg.gpu)
        return committed_tables(cfg, hw, quantized(load_model_config(cfg.model), cfg, hw)[0])
    except UserError:   # (the cell's run says what is wrong)
        return None


def cell_key(cfg: SimConfig) -> str:
    """The cell's hash: its whole config, the files it names and the simulator's code."""
    h = hashlib.sha256(f"{STORE_VERSION}:{model_digest()}:".encode())
    h.update(json.dumps(cfg.to_dict(), sort_keys=True).encode())
    from stepgap.common.workloads import workload_files
    for name in (*workload_files(cfg.workload), cfg.model, cfg.draft or "",
                 cfg.profile or "", cfg.gpu):   # files it names
        path = Path(name)
        path = path / "config.json" if path.is_dir() else path
        if path.is_file():
            h.update(read_bytes(path))
    bundle = tables_of(cfg)
    if bundle is not None:   # the tables it may price from, found as sim/device_choice.py finds them
        from stepgap.sim.hardware_file import bundle_collectives
        from stepgap.sim.tables import find_bundle
        root = find_bundle(bundle)
        # every variant beside it (find_variant takes a sibling for fp8 weights or KV cache):
        # its meta.yaml and every tp<N> table
        for variant in sorted(d for d in root.parent.iterdir() if (d / "meta.yaml").is_file()):
            for path in sorted([variant / "meta.yaml", *variant.glob("tp*/*.csv")]):
                h.update(str(path.relative_to(root.parent)).encode())
                h.update(read_bytes(path))
        found = bundle_collectives(root)   # the GPU's collectives, as collectives() finds them
        if found is not None:
            h.update(read_bytes(found))
    return h.hexdigest()[:16]
