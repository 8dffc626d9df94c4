"""The committed measured runs, re-simulated: the simulator still predicts them
(docs/explanation/design.md §7).

Each folder under traces/measured/ holds one machine's measured runs in the measured format
(calibrate/measured.py). This re-simulates every cell from the folder's files alone, with no
engine run, and holds it to the bounds of calibrate/judge.py: mean TPOT and mean ITL within 5 %,
P99 TPOT within 10 %, the saving of async and zero-bubble over sync (mean ITL) within 25 % of its
size, and a saving keeps the sign it was measured with.

Which rule set a folder is judged by is fixed here (FOLDER_RULES), not by the command that
built it:
- "engine" (stepgap's own engine): the bounds alone;
- "vllm" (the real vLLM): P99 TPOT within 10 % *or* inside the measured
  cell's own 95 % interval, and a saving within 25 % with its sign *or* inside its measured
  interval.
- "prefix" (stepgap's engine on a shared-prefix trace with prefix caching): the
  engine's bounds, mean TTFT within 5 % too, and every run's prefix-cache queries and hits
  exactly the engine's (a count has no known miss).

A bound may be missed only where the folder's known_misses.toml, written by hand, says so: on
the side of its signed error, up to its cap (at most 1.25 x |error| + 1 point), with a reason
that names a committed file or a command over committed data. A known miss cannot drift: the
committed error must be the error now within 1 point either way, and an entry whose cell now
passes fails as stale (calibrate/judge.py `miss_failures`). The last tests show that these
bounds catch what they are for: 10 % more or less on every device op, or on every CPU cost,
fails; so does a known miss deleted, widened or given a false error. A vLLM folder is judged a
second way too, by the same rules: with its profile-sync-only.json (fitted on its sync runs
alone, the async path's terms estimated from them) against its known_misses_sync_only.toml.

Each folder under traces/peers/ holds a peer's real GPU runs as it published them (with its
licence and source commit) and the same GPUs' operator tables; each run is re-simulated from
its tables and held to calibrate/peers.py's PEER_BOUNDS (fixed targets: mean TPOT 1 %,
P99 TPOT 3 %, mean TTFT 3 %, P99 TTFT 5 %, mean E2EL 2 %, the running-requests peak 5 %).
"""

import functools
from dataclasses import replace
from pathlib import Path

import pytest

from stepgap.calibrate.judge import (DRIFT, MISSES_FILE, SYNC_ONLY_MISSES, SYNC_ONLY_PROFILE,
                                    bound_failures, bounds_of, judge_cell, judge_folder,
                                    load_known_misses, resimulate, rules_for, savings)
from stepgap.calibrate.measured import load_measured
from stepgap.calibrate.peers import PEER_METRICS, judge_run, load_peers, peer_failures
from stepgap.common.errors import UserError
from stepgap.sim.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p for p in (ROOT / "traces" / "measured").glob("*")
                 if (p / "manifest.json").is_file())
# The rule set of each committed folder (module docstring): fixed here, never by the folder.
FOLDER_RULES = {"cpu": "engine", "vllm-cpu": "vllm", "prefix-cpu": "prefix"}


@functools.lru_cache(maxsize=None)
def judge(folder: Path):
    """The folder's cells re-simulated and judged (judge_folder), once per test process."""
    return judge_folder(folder)


@pytest.fixture(scope="module", params=FOLDERS, ids=lambda p: p.name)
def judged(request):
    folder = request.param
    _, verdicts, _ = judge(folder)
    return folder, verdicts, savings(verdicts)


def test_there_is_a_committed_cpu_validation():
    assert (ROOT / "traces" / "measured" / "cpu" / "manifest.json").is_file()


def test_every_cell_and_saving_stays_within_its_bounds(judged):
    folder, verdicts, rows = judged
    assert verdicts
    assert folder.name in FOLDER_RULES, f"{folder.name}: add its rule set to FOLDER_RULES"
    # the report judges by the rules of what the folder measured: the same as pinned here
    assert rules_for(load_measured(folder)[0]) == FOLDER_RULES[folder.name]
    fails = bound_failures(verdicts, rows, load_known_misses(folder), FOLDER_RULES[folder.name])
    assert not fails, f"{folder.name}:\n" + "\n".join(fails)


# The vLLM folders judged a second way: with the profile of their sync runs alone (the async
# terms estimated, calibrate/vllm_fit.py estimate_async), against their own known misses.
SYNC_ONLY = [p for p in FOLDERS if (p / SYNC_ONLY_PROFILE).is_file()]


def test_the_vllm_folder_has_its_sync_only_profile():
    assert ROOT / "traces" / "measured" / "vllm-cpu" in SYNC_ONLY


@pytest.mark.parametrize("folder", SYNC_ONLY, ids=lambda p: p.name)
def test_with_sync_runs_only_every_cell_stays_within_its_bounds(folder):
    about = load_profile(folder / SYNC_ONLY_PROFILE).about["calibration"]
    assert about["async_terms"]["runs"] == [], "the sync-only profile fitted an async run"
    _, verdicts, _ = judge_folder(folder, profile=str(folder / SYNC_ONLY_PROFILE))
    fails = bound_failures(verdicts, savings(verdicts),
                           load_known_misses(folder, name=SYNC_ONLY_MISSES),
                           FOLDER_RULES[folder.name])
    assert not fails, f"{folder.name} ({SYNC_ONLY_PROFILE}):\n" + "\n".join(fails)


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
    # (vllm-cpu's grid of 40 cells x 3 runs is 2.6 MB, its runs gzipped)
    assert size < 3 * 2 ** 20, f"{folder}: {size / 2 ** 20:.1f} MB"


# -- the bounds catch what they are for ---------------------------------------------------------

def within_bounds(folder, verdicts) -> list[str]:
    rows = savings(verdicts)
    return bound_failures(verdicts, rows, load_known_misses(folder), FOLDER_RULES[folder.name])


def first_failures(folder, **scale) -> list[str]:
    """The bounds the folder's cells break when re-simulated with scaled costs, judged a cell at
    a time up to the first cell that breaks one: that is the verdict of all the cells, sooner.
    (A bound broken among some cells is broken among all: each cell's bounds are its own, and a
    saving is judged only once both its cells are in.)"""
    setup, cells = load_measured(folder)
    bounds = bounds_of(rules_for(setup))
    verdicts = []
    for cell in cells:
        simulated, _, runs = resimulate(setup, cell, **scale)
        verdicts.append(judge_cell(cell, simulated, bounds, runs))
        fails = within_bounds(folder, verdicts)
        if fails:
            return fails
    return []


@pytest.mark.parametrize("device_scale, cpu_factor", [(1.10, 1.0), (0.90, 1.0), (1.0, 1.10),
                                                      (1.0, 0.90)],
                         ids=["device+10%", "device-10%", "cpu+10%", "cpu-10%"])
def test_ten_percent_on_every_device_op_or_every_cpu_cost_fails(judged, device_scale,
                                                                  cpu_factor):
    folder = judged[0]
    assert first_failures(folder, device_scale=device_scale, cpu_factor=cpu_factor), \
        f"{folder.name}: costs x{device_scale} (device), x{cpu_factor} (CPU) pass every bound"


def misses_or_skip(folder):
    misses = load_known_misses(folder)
    if not misses:
        pytest.skip(f"{folder.name} has no known misses")
    return misses


def test_deleting_a_known_miss_fails(judged):
    folder, verdicts, rows = judged
    misses = misses_or_skip(folder)
    for key in misses:
        rest = {k: m for k, m in misses.items() if k != key}
        assert bound_failures(verdicts, rows, rest, FOLDER_RULES[folder.name]), key


def test_a_known_miss_with_a_false_error_fails(judged):
    folder, verdicts, rows = judged
    misses = misses_or_skip(folder)
    for key, m in misses.items():
        shifted = replace(m, error=m.error + 2 * DRIFT * (1 if m.error > 0 else -1),
                          cap=m.cap + 2 * DRIFT * (1 if m.cap > 0 else -1))
        fails = bound_failures(verdicts, rows, {**misses, key: shifted},
                               FOLDER_RULES[folder.name])
        assert any("known miss was committed" in f for f in fails), key


def test_a_widened_known_miss_is_refused(judged, tmp_path):
    folder = judged[0]
    misses_or_skip(folder)
    text = (folder / MISSES_FILE).read_text()
    first = text.index("cap = ")
    line_end = text.index("\n", first)
    cap = float(text[first + 6:line_end])
    wide = text[:first] + f"cap = {cap * 3 + (0.05 if cap > 0 else -0.05):.4f}" + text[line_end:]
    (tmp_path / MISSES_FILE).write_text(wide)
    with pytest.raises(UserError, match=r"the cap .* lies further out than 1.25 x \|error\|"):
        load_known_misses(tmp_path)


def test_a_known_miss_must_name_committed_evidence(tmp_path):
    entry = ('[[miss]]\ncell = "sync-k0-c1"\nmetric = "mean_tpot_ms"\nerror = -0.06\n'
             'cap = -0.07\nreason = "{}"\n')
    (tmp_path / MISSES_FILE).write_text(entry.format("python bench/vllm/ops.py out/vllm-cpu"))
    with pytest.raises(UserError, match=r"out/vllm-cpu is not"):
        load_known_misses(tmp_path)
    (tmp_path / MISSES_FILE).write_text(entry.format("the machine was slow"))
    with pytest.raises(UserError, match=r"it names none"):
        load_known_misses(tmp_path)
    (tmp_path / MISSES_FILE).write_text(entry.format("device vs profile +7 %, "
                                                     "traces/measured/cpu/report.md"))
    assert load_known_misses(tmp_path)


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
        dc = j["simulated"].resolved["device_costs"]
        assert dc["target_forward"].startswith("tables"), name


QWEN_TP2 = "rtxpro6000-qwen3-32b-tp2"


def test_the_tp2_run_is_priced_from_the_pairs_measured_collectives(peer_judged):
    folder, _, judged = peer_judged
    j = judged[QWEN_TP2]
    assert j["config"].tensor_parallel_size == 2
    dc = j["simulated"].resolved["device_costs"]["target_forward"]
    assert "all-gather measured" in dc and "at-e08dc38" in dc
    assert any(n.startswith("collectives: ") and "vLLM's path" in n for n in j["notes"])


def test_the_tp2_run_priced_with_the_later_measurement_breaks_its_bounds(peer_judged):
    # The pair's collectives as measured 2026-09-26 (1b2cc02, beside the tables) are about half
    # what the run's own step times show (bench/peer_tp.py): priced with them, the run misses.
    folder, _, _ = peer_judged
    run = next(r for r in load_peers(folder)[1] if r.name == QWEN_TP2)
    errs = judge_run(run, gpu="rtxpro6000")["errors"]
    assert peer_failures(run.name, errs, {}) and errs["mean_tpot_ms"] < -0.10


# -- prefix caching against the real vLLM ------------------------------------------------------

PREFIX_HITS = ROOT / "traces" / "measured" / "prefix-cpu" / "vllm_prefix_hits.json"


def test_the_simulator_finds_exactly_the_prefix_hits_vllm_counted():
    """bench/vllm/prefix_hits.py sent the shared-prefix trace to the real vLLM (prefix caching
    on) one request at a time and read its /metrics counters; the simulator, on the same trace,
    must find the same hit and query counts, not close ones (the engine finds the simulator's:
    tests/test_engine_prefix_cache.py)."""
    import json
    from stepgap.calibrate.pair import PAIR, shared_prefix_trace
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate
    doc = json.loads(PREFIX_HITS.read_text())
    trace = shared_prefix_trace(PAIR)
    assert doc["trace"].endswith(f"{len(trace)} prompts")
    res, _ = simulate(SimConfig(mode="sync", max_concurrency=1, gpu="cpu", device="cpu",
                                model=str(PAIR / "target"), block_size=doc["block_size"],
                                max_model_len=256, enable_prefix_caching=True), trace)
    pc = res["config"]["resolved"]["prefix_cache"]
    assert {"queries": pc["queries"], "hits": pc["hits"]} == \
        {"queries": doc["vllm"]["queries"], "hits": doc["vllm"]["hits"]} == \
        {"queries": doc["engine"]["queries"], "hits": doc["engine"]["hits"]}
    assert doc["vllm"]["hits"] > 0


# -- the engine against the simulator on a shared-prefix trace ---------------------------------

PREFIX = ROOT / "traces" / "measured" / "prefix-cpu"


@pytest.mark.xdist_group("judged-prefix-cpu")   # with `judged`'s prefix-cpu tests: judged once
def test_the_prefix_folder_judges_the_pairs_shared_prefix_trace():
    """Its judged.jsonl is calibrate/pair.py's shared_prefix_trace, as
    docs/explanation/validation.md says, and every run of every cell found the prefix cache (hits >
    0), counted as the simulator counts them."""
    from stepgap.calibrate.pair import shared_prefix_trace
    from stepgap.common.formats import load_trace
    assert load_trace(PREFIX / "judged.jsonl") == shared_prefix_trace()
    _, verdicts, _ = judge(PREFIX)
    assert len(verdicts) >= 4
    for v in verdicts:
        assert "mean_ttft_ms" in v.errors and len(v.prefix_cache) == len(v.cell.runs)
        for measured, simulated in v.prefix_cache:
            assert measured["hits"] > 0 and measured == simulated, v.cell.name


def test_a_simulator_without_prefix_caching_fails_the_prefix_folder():
    """Off in the simulator, every run's counts differ and the prefill it prices is the whole
    prompt: the judge says so (cells at concurrency 1, where TTFT is prefill alone)."""
    cells = tuple(f"{m}-k{k}-c1" for m in ("sync", "async") for k in (0, 2))
    _, verdicts, _ = judge_folder(PREFIX, cells=cells, enable_prefix_caching=False)
    fails = within_bounds(PREFIX, verdicts)
    assert sum("prefix cache measured" in f for f in fails) == sum(len(v.cell.runs)
                                                                  for v in verdicts)
    assert any("mean TTFT" in f for f in fails), fails
