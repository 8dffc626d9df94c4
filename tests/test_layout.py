"""The layout is the architecture (docs/design.md, "Layout"): each folder one concern, the two
halves independent, the layers importing only downwards, everything under the `stepgap.`
namespace, and the map in the docs true to the tree. Imports are read from the source (every
`import`, inside functions too)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
    """Every module by its installed name: the folders install under `stepgap.`
    (pyproject.toml's package-dir), the command line is `stepgap` itself."""
    out = {}
    for pkg in LAYERS:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts if pkg == "stepgap" else ("stepgap", *parts))
            out[name.removesuffix(".__init__")] = f
    return out


def layer_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "stepgap"


def imports_of(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


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
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = {m for m in re.findall(r"`([a-z_]+/[a-z_0-9]+\.py)`", section)
             if m.split("/")[0] in LAYERS}
    on_disk = {str(p.relative_to(ROOT)) for p in MODULES.values() if p.name != "__init__.py"}
    assert named == on_disk, {"missing from the map": sorted(on_disk - named),
                              "not in the tree": sorted(named - on_disk)}
