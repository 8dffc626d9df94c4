"""The notebooks run from top to bottom (on a small configuration), so they never rot."""

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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("STEPGAP_NB_SMALL", "1")
    monkeypatch.setenv("STEPGAP_NB_OUT", str(tmp_path))     # where a notebook's sweep goes
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()      # raises CellExecutionError, with the failing cell, on any error
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert images >= 2, f"{path.name}: expected figures, got {images}"
