"""Execute the notebooks in place, top to bottom, at their full size, so that the repository's
web view shows their outputs and figures (`make notebooks`; about a minute each on two cores).

Each executed notebook records, in its metadata (`stepgap.code_sha256`), the hash of its code
cells as they were run; tests/test_notebooks.py holds the committed outputs to the current code
cells with it, so that a cell edited without executing the notebook again fails CI in a
second. Usage: python notebooks/execute.py [NOTEBOOK ...] (default: every notebook here).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 1200   # a cell's limit: the full what-if sweep of notebook 01 is the longest


def code_hash(nb) -> str:
    """The sha256 of the notebook's code cells, in order (their sources, nothing else)."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode())
            h.update(b"\0")
    return h.hexdigest()


def execute(path: Path) -> None:
    import nbclient
    import nbformat
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     record_timing=False,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    nb.metadata["stepgap"] = {"code_sha256": code_hash(nb),
                              "executed_by": "python notebooks/execute.py (make notebooks)"}
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(HERE.glob("*.ipynb"))
    for path in paths:
        print(f"executing {path} ...", flush=True)
        execute(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
