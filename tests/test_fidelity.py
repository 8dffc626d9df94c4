"""The committed measured runs, re-simulated: the simulator still predicts them (DESIGN.md §7).

Each folder under traces/measured/ holds one device's measured runs, as `stepgap validate`
writes them (bench/gpu_measure.py's output is converted to the same form by
`stepgap validate --from-measured`). This re-simulates every cell from the folder's files alone,
with no engine run, and holds it to the issue's bounds: mean TPOT and mean ITL within 5 %, P99
TPOT within 10 % and the saving of async and zero-bubble over sync (mean ITL) within 25 % of
its size. A bound that a cell missed when the folder was committed is listed in its manifest
(`misses`; docs/validation.md gives the cause): that error may not grow; every other cell must
stay within its bounds.
"""

import json
from pathlib import Path

import pytest

from calibrate.validate import saving_name
from calibrate.measured import BOUNDS, SAVING_BOUND, judge_folder, savings

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p for p in (ROOT / "traces" / "measured").glob("*")
                 if (p / "manifest.json").is_file())
SLACK = 0.005   # a known miss may move by half a percentage point (float summation order)


@pytest.fixture(scope="module", params=FOLDERS, ids=lambda p: p.name)
def judged(request):
    folder = request.param
    setup, verdicts, _ = judge_folder(folder)
    misses = json.loads((folder / "manifest.json").read_text()).get("misses", {})
    return folder, verdicts, savings(verdicts), misses


def test_there_is_a_committed_cpu_validation():
    assert (ROOT / "traces" / "measured" / "cpu" / "manifest.json").is_file()


def test_every_cell_stays_within_its_bounds(judged):
    folder, verdicts, _, misses = judged
    assert verdicts
    for v in verdicts:
        for key, name, bound in BOUNDS:
            e = v.errors[key]
            known = misses.get(v.cell.name, {}).get(key)
            if known is None:
                assert abs(e) <= bound, f"{folder.name} {v.cell.name}: {name} {e:+.1%} " \
                                        f"outside ±{bound:.0%}"
            else:   # a documented miss: it may not grow
                assert abs(e) <= abs(known) + SLACK, \
                    f"{folder.name} {v.cell.name}: {name} {e:+.1%}, committed {known:+.1%}"


def test_every_saving_over_sync_stays_within_its_bound(judged):
    folder, _, rows, misses = judged
    for r in rows:
        known = misses.get(saving_name(r))
        if known is None:
            assert abs(r["error"]) <= SAVING_BOUND, f"{folder.name} {saving_name(r)}: " \
                                                    f"{r['error']:+.1%}"
        else:
            assert abs(r["error"]) <= abs(known) + SLACK


def test_the_committed_folder_is_small(judged):
    folder = judged[0]
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 2.5 * 2 ** 20, f"{folder}: {size / 2 ** 20:.1f} MB"
