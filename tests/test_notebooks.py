"""The notebooks are committed executed, with their figures (GitHub shows them), and stay fresh:
their outputs were made by the code cells they hold (`make notebooks` executes them again and
records the cells' hash, notebooks/execute.py); and they still run from top to bottom (on a
small configuration) against the current code.

They run in one kernel, started once (`nb_kernel`): starting one and importing stepgap, numpy and
matplotlib into it is most of a small notebook's time. Each notebook still starts from nothing
of the others: its namespace is emptied first (`%reset -f`), and it writes to a folder of its
own (STEPGAP_NB_OUT); what stays is only the imported modules."""

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))


def execute_module():
    spec = importlib.util.spec_from_file_location("nb_execute", HERE / "execute.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_three_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01_what_if.ipynb", "02_sim_vs_measured.ipynb",
                                           "03_step_gap_timelines.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_committed_notebook_holds_the_outputs_of_its_code_cells_and_its_figures(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    recorded = nb.metadata.get("stepgap", {}).get("code_sha256")
    assert recorded == execute_module().code_hash(nb), \
        f"{path.name}: its code cells changed since it was executed: run `make notebooks`"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        f"{path.name}: not executed top to bottom in one kernel: run `make notebooks`"
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
    images = sum("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    assert images >= 2, f"{path.name}: expected its figures, got {images}"


def test_the_hash_sees_a_code_cell_changed_and_not_a_markdown_one():
    nbformat = pytest.importorskip("nbformat")
    code_hash = execute_module().code_hash
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# a"),
                                         nbformat.v4.new_code_cell("x = 1")])
    h = code_hash(nb)
    nb.cells[0].source = "# b"
    assert code_hash(nb) == h
    nb.cells[1].source = "x = 2"
    assert code_hash(nb) != h


@pytest.fixture(scope="module")
def nb_kernel():
    """One python3 kernel in notebooks/, with the notebooks' quick configuration."""
    pytest.importorskip("nbclient")
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(NOTEBOOKS[0].parent), env={**os.environ, "STEPGAP_NB_SMALL": "1"})
    yield km
    km.shutdown_kernel(now=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, nb_kernel, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    # first, forget the notebook run before, and send this one's outputs (a sweep) to tmp_path
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        f"%reset -f\nimport os\nos.environ['STEPGAP_NB_OUT'] = {str(tmp_path)!r}\ndel os"))
    client = nbclient.NotebookClient(nb, km=nb_kernel, timeout=120,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()      # raises CellExecutionError, with the failing cell, on any error
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert images >= 2, f"{path.name}: expected figures, got {images}"
