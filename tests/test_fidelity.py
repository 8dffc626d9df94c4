"""The committed measured runs, re-simulated: the simulator still predicts them (docs/design.md
§7).

Each folder under traces/measured/ holds one machine's measured runs in the measured format
(calibrate/measured.py). This re-simulates every cell from the folder's files alone, with no
engine run, and holds it to the bounds of calibrate/judge.py: mean TPOT and mean ITL within 5 %,
P99 TPOT within 10 %, the saving of async and zero-bubble over sync (mean ITL) within 25 % of its
size, and a saving keeps the sign it was measured with. A bound may be missed only where the
folder's known_misses.toml, written by hand with the reason, says so, on the side of its signed
error and up to its cap (docs/validation.md gives the causes).
"""

import json
from pathlib import Path

import pytest

from stepgap.calibrate.judge import bound_failures, judge_folder, load_known_misses, savings

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p for p in (ROOT / "traces" / "measured").glob("*")
                 if (p / "manifest.json").is_file())


@pytest.fixture(scope="module", params=FOLDERS, ids=lambda p: p.name)
def judged(request):
    folder = request.param
    _, verdicts, _ = judge_folder(folder)
    return folder, verdicts, savings(verdicts)


def test_there_is_a_committed_cpu_validation():
    assert (ROOT / "traces" / "measured" / "cpu" / "manifest.json").is_file()


def test_every_cell_and_saving_stays_within_its_bounds(judged):
    folder, verdicts, rows = judged
    assert verdicts
    rules = json.loads((folder / "manifest.json").read_text()).get("bounds", "engine")
    fails = bound_failures(verdicts, rows, load_known_misses(folder), rules)
    assert not fails, f"{folder.name}:\n" + "\n".join(fails)


def test_every_known_miss_names_a_judged_cell(judged):
    folder, verdicts, rows = judged
    cells = {v.cell.name for v in verdicts}
    for (cell, metric), miss in load_known_misses(folder).items():
        assert cell in cells, f"{folder.name}: known miss of {cell}, which is not judged"
        if metric == "saving":
            assert not cell.startswith("sync"), f"{folder.name}: a saving of sync itself"


def test_the_committed_folder_is_small(judged):
    folder = judged[0]
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 2.5 * 2 ** 20, f"{folder}: {size / 2 ** 20:.1f} MB"
