"""The notebooks run from top to bottom (on a small configuration), so they never rot.

They run in one kernel, started once (`nb_kernel`): starting one and importing stepgap, numpy and
matplotlib into it is most of a small notebook's time. Each notebook still starts from nothing
of the others: its namespace is emptied first (`%reset -f`), and it writes to a folder of its
own (STEPGAP_NB_OUT); what stays is only the imported modules."""

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_are_there_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    assert [p.name for p in NOTEBOOKS] == ["01_what_if.ipynb", "02_sim_vs_measured.ipynb",
                                           "03_step_gap_timelines.ipynb"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert all(not c.get("outputs") and not c.get("execution_count")
                   for c in nb.cells if c.cell_type == "code"), f"{path.name}: strip outputs"


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
