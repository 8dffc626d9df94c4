"""The committed measured runs, re-simulated: the simulator still predicts them (docs/design.md
§7).

Each folder under traces/measured/ holds one machine's measured runs in the measured format
(calibrate/measured.py). This re-simulates every cell from the folder's files alone, with no
engine run, and holds it to the bounds of calibrate/judge.py: mean TPOT and mean ITL within 5 %,
P99 TPOT within 10 %, the saving of async and zero-bubble over sync (mean ITL) within 25 % of its
size, and a saving keeps the sign it was measured with. A bound may be missed only where the
folder's known_misses.toml, written by hand with the reason, says so, on the side of its signed
error and up to its cap (docs/validation.md gives the causes).

Each folder under traces/peers/ holds a peer's real GPU runs as it published them (with its
licence and source commit) and the same GPUs' operator tables; each run is re-simulated from
its tables and held to calibrate/peers.py's PEER_BOUNDS (issue 22's targets: mean TPOT 1 %,
P99 TPOT 3 %, mean TTFT 3 %, P99 TTFT 5 %, mean E2EL 2 %, the running-requests peak 5 %).
"""

import json
from pathlib import Path

import pytest

from stepgap.calibrate.judge import bound_failures, judge_folder, load_known_misses, savings
from stepgap.calibrate.peers import PEER_METRICS, judge_run, load_peers, peer_failures

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


PEER_FOLDERS = sorted(p for p in (ROOT / "traces" / "peers").glob("*")
                      if (p / "peers.json").is_file())


@pytest.fixture(scope="module", params=PEER_FOLDERS, ids=lambda p: p.name)
def peer_judged(request):
    folder = request.param
    source, runs = load_peers(folder)
    return folder, source, {run.name: judge_run(run) for run in runs}


def test_there_are_committed_peer_gpu_runs():
    assert (ROOT / "traces" / "peers" / "llmservingsim" / "peers.json").is_file()


def test_every_peer_run_stays_within_its_bounds(peer_judged):
    folder, _, judged = peer_judged
    misses = load_known_misses(folder, PEER_METRICS)
    fails = [f for name, j in judged.items() for f in peer_failures(name, j["errors"], misses)]
    assert not fails, f"{folder.name}:\n" + "\n".join(fails)


def test_a_peer_folder_carries_its_licence_and_its_source(peer_judged):
    folder, source, _ = peer_judged
    assert "MIT" in (folder / "LICENSE").read_text()
    assert len(source.get("commit", "")) == 40 and source.get("repository")


def test_every_peer_run_is_priced_from_its_own_tables(peer_judged):
    for name, j in peer_judged[2].items():
        dc = j["simulated"]["config"]["resolved"]["device_costs"]
        assert dc["target_forward"].startswith("tables"), name
