"""The layout is the architecture (docs/explanation/design.md, "Layout"): each folder one concern,
the two halves independent, the layers importing only downwards, everything under the `stepgap.`
namespace through the symlinks in stepgap/, every import resolvable from a plain checkout, and the
map in the docs true to the tree. Imports are read from the source (every `import`, inside functions
too), by the reader the sweep's cache key uses (sim/sweep_keys.py)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.sim.sweep_keys import imports_of, module_path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stepgap"   # stepgap/sim -> ../sim, ...: the one map from a name to its file
# Each layer may import the ones listed for it, and nothing else of the project.
LAYERS = {
    "common": set(),
    "sim": {"common"},
    "engine": {"common"},
    "training": {"common", "engine"},
    "calibrate": {"common", "sim", "engine", "training"},
    "stepgap": {"common"},   # the CLI: it loads every command's module by name (importlib)
}


def modules() -> dict[str, Path]:
    """Every module by its installed name, as Python finds it: stepgap/ and, through its
    symlinks, each layer's folder (stepgap.sim.loop is stepgap/sim/loop.py, i.e. sim/loop.py)."""
    out = {}
    for folder, _, files in os.walk(PACKAGE, followlinks=True):
        for f in sorted(files):
            if f.endswith(".py"):
                path = Path(folder, f)
                parts = ("stepgap", *path.relative_to(PACKAGE).with_suffix("").parts)
                out[".".join(parts).removesuffix(".__init__")] = path.resolve()
    return out


def layer_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "stepgap"


MODULES = modules()
GRAPH = {name: {m for m in imports_of(path) if m in MODULES and m != name}
         for name, path in MODULES.items()}


@pytest.mark.parametrize("layer", list(LAYERS))
def test_each_layer_imports_only_the_layers_below_it(layer):
    bad = {(name, m) for name, deps in GRAPH.items() if layer_of(name) == layer
           for m in deps if layer_of(m) not in LAYERS[layer] | {layer}}
    assert not bad, sorted(bad)


def test_neither_half_imports_the_other():
    for name, deps in GRAPH.items():
        half = layer_of(name)
        if half in ("sim", "engine"):
            other = "engine" if half == "sim" else "sim"
            assert not {m for m in deps if layer_of(m) == other}, name


def test_nothing_imports_a_folder_by_its_bare_name():
    """`import common` would take a generic name from the user's environment (and load a second
    copy of the module beside `stepgap.common`): every import of the project says `stepgap.`."""
    files = list(MODULES.values()) + sorted((ROOT / "tests").rglob("*.py")) \
        + sorted((ROOT / "bench").rglob("*.py"))
    bare = {(str(f.relative_to(ROOT)), m) for f in files for m in imports_of(f)
            if m.split(".")[0] in LAYERS and m.split(".")[0] != "stepgap"}
    assert not bare, sorted(bare)


def test_there_is_no_import_cycle():
    state = {}

    def visit(n, path):
        state[n] = "open"
        for m in GRAPH[n]:
            if state.get(m) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path + [n, m]))
            if m not in state:
                visit(m, path + [n])
        state[n] = "done"

    for n in GRAPH:
        if n not in state:
            visit(n, [])


def test_the_layout_map_in_the_docs_names_every_module_and_nothing_else():
    text = (ROOT / "docs" / "explanation" / "design.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = {m for m in re.findall(r"`([a-z_]+/[a-z_0-9]+\.py)`", section)
             if m.split("/")[0] in LAYERS}
    on_disk = {str(p.relative_to(ROOT)) for p in MODULES.values() if p.name != "__init__.py"}
    assert named == on_disk, {"missing from the map": sorted(on_disk - named),
                              "not in the tree": sorted(named - on_disk)}


def test_each_layer_is_a_relative_symlink_in_the_package():
    """stepgap/X -> ../X for each layer, and src/stepgap -> ../stepgap (what an editable
    install puts on sys.path): relative, so a copy of the checkout keeps working."""
    links = {p.name: os.readlink(p) for p in PACKAGE.iterdir() if p.is_symlink()}
    assert links == {layer: f"../{layer}" for layer in LAYERS if layer != "stepgap"}
    assert os.readlink(ROOT / "src" / "stepgap") == "../stepgap"
    assert sorted(p.name for p in (ROOT / "src").iterdir() if not p.name.endswith(".egg-info")) \
        == ["stepgap"]   # so that an editable install makes no other name importable


def test_every_stepgap_import_in_the_tree_leads_to_a_file():
    """What a static tool does from a plain checkout: the module of each `import stepgap.x` and
    `from stepgap.x import y` anywhere (the project, its tests, its benchmarks) is a file under
    stepgap/, found by following the folders and their symlinks."""
    def is_module(name):
        return name == "stepgap" or module_path(name, PACKAGE) is not None

    files = list(MODULES.values()) + sorted((ROOT / "tests").rglob("*.py")) \
        + sorted((ROOT / "bench").rglob("*.py"))
    unresolved = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_bytes())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            unresolved |= {(str(f.relative_to(ROOT)), n) for n in names
                           if n.split(".")[0] == "stepgap" and not is_module(n)}
    assert not unresolved, sorted(unresolved)


def probe(code: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env})


def test_the_install_puts_stepgap_and_no_generic_name_on_the_path(tmp_path):
    """Away from the checkout, the environment finds this checkout's stepgap and none of the
    layers' bare names (`import common` finds nothing: src/ holds only the link to stepgap/)."""
    code = ("import importlib.util as u, stepgap\nprint(stepgap.__file__)\n"
            "print([n for n in ('common', 'sim', 'engine', 'training', 'calibrate', 'tests', "
            "'bench') if u.find_spec(n)])")
    out = probe(code, tmp_path)
    assert out.returncode == 0, out.stderr
    path, bare = out.stdout.splitlines()
    assert (Path(path).resolve(), bare) == (PACKAGE / "__init__.py", "[]")


def test_another_checkouts_install_fails_the_import_in_one_line(tmp_path):
    """An environment whose stepgap was installed from elsewhere (here a dist-info that comes
    first on the path and names another folder) refuses this checkout's code, naming both."""
    info = tmp_path / "stepgap-0.1.0.dist-info"
    info.mkdir()
    (info / "direct_url.json").write_text(
        '{"dir_info": {"editable": true}, "url": "file:///elsewhere/checkout"}')
    out = probe("import stepgap.sim", ROOT, PYTHONPATH=str(tmp_path))
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and last == (
        f"ImportError: stepgap is loaded from {PACKAGE} but this environment installed it "
        "from /elsewhere/checkout/stepgap: use the .venv of the checkout you run (make install)")
