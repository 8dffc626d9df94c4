"""`stepgap sweep`: grid syntax and validation, the table, resuming, determinism everywhere."""

import csv
import json
import time

import pytest

import stepgap.sim.sweep_keys as sweep_keys
import stepgap.sim.sweep_runners as sweep_runners
from stepgap.sim.sweep import run_sweep
from stepgap.sim.sweep_grid import Grid, build_grid, load_grid_file, parse_values
from stepgap.sim.sweep_table import COLUMNS, load_sweep
from stepgap.cli import main
from stepgap.common.errors import UserError

# A tiny seed-l20: 4 prompts of 24 tokens, so a cell takes milliseconds.
TINY = ["num_prompts=4", "output_len=24"]


def tiny_grid(*specs, sets=()):
    return build_grid(list(specs), preset="seed-l20", sets=[*TINY, *sets])


# -- grid syntax ---------------------------------------------------------------------------

@pytest.mark.parametrize("key, text, values", [
    ("k", "0..6", [0, 1, 2, 3, 4, 5, 6]),
    ("k", "0..8:2", [0, 2, 4, 6, 8]),
    ("max_concurrency", "1..64:x2", [1, 2, 4, 8, 16, 32, 64]),
    ("max_concurrency", "1,2,8..10", [1, 2, 8, 9, 10]),
    ("request_rate", "0.5..2:0.5,inf", [0.5, 1.0, 1.5, 2.0, float("inf")]),
    ("mode", "sync, async,zero-bubble", ["sync", "async", "zero-bubble"]),
    ("acceptance_rates", "0.8/0.6,0.7", [(0.8, 0.6), (0.7,)]),
    ("replay", "true,false", [True, False]),
    ("num_gpu_blocks_override", "none,512", [None, 512]),
])
def test_axis_values_parse_to_typed_values(key, text, values):
    assert parse_values(key, text, "--grid") == values


def test_an_unknown_key_lists_the_valid_ones():
    with pytest.raises(UserError, match=r"unknown key 'concurrency'; valid keys: mode, k, .*"
                                        r"max_concurrency"):
        tiny_grid("concurrency=1,2")


@pytest.mark.parametrize("spec, message", [
    ("k=6..2", "empty range '6..2'"),
    ("k=", "k has no values"),
    ("k=1,,2", "empty item"),
    ("k=1.5", "k expects an integer, got '1.5'"),
    ("max_concurrency=1..64:x1", "factor > 1"),
    ("k=0..100000", "at most 10000"),
    ("k=1,1", "k is given the value 1 twice"),
    ("k", "expected KEY=VALUES"),
])
def test_bad_axes_are_refused_with_the_reason(spec, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny_grid(spec)


def test_a_bad_cell_names_the_cell_and_the_field():
    with pytest.raises(UserError, match=r"grid cell k=0 max_concurrency=0: --max-concurrency: "
                                        r"must be an integer from 1 to 1000000, got 0"):
        tiny_grid("k=0", "max_concurrency=1,0").cells()
    with pytest.raises(UserError, match=r"grid cell gpu=x100: gpu: unknown device 'x100'"):
        tiny_grid("gpu=h100,x100").cells()


def test_a_bad_grid_fails_before_any_cell_runs(tmp_path, monkeypatch, capsys):
    def must_not_run(settings):
        raise AssertionError("a cell ran")
    monkeypatch.setattr(sweep_runners, "run_cell", must_not_run)
    out = tmp_path / "out"
    rc = main(["sweep", "--preset", "seed-l20", "--grid", "k=0..2", "--grid",
               "max_concurrency=1,2,0", "--out", str(out), "--jobs", "1"])
    assert rc == 2 and not out.exists()
    assert "grid cell k=0 max_concurrency=0" in capsys.readouterr().err


def test_grid_file_toml_and_json_give_the_same_grid(tmp_path):
    (tmp_path / "g.toml").write_text('preset = "seed-l20"\n[base]\nnum_prompts = 4\n'
                                     '[grid]\nmode = ["sync", "async"]\nk = "0..2"\n'
                                     'max-concurrency = [1, 4]\n')
    (tmp_path / "g.json").write_text(json.dumps({
        "preset": "seed-l20", "base": {"num_prompts": 4},
        "grid": {"mode": "sync,async", "k": [0, 1, 2], "max_concurrency": "1,4"}}))
    a, b = (build_grid(grid_file=tmp_path / n) for n in ("g.toml", "g.json"))
    assert a.axes == b.axes == {"mode": ["sync", "async"], "k": [0, 1, 2],
                                "max_concurrency": [1, 4]}
    assert a.base == b.base and a.base["num_prompts"] == 4 and a.base["gpu"] == "l20"
    # --grid adds axes after the file's and replaces one of the same name
    c = build_grid(["k=4", "gpu=h100,h200"], grid_file=tmp_path / "g.toml")
    assert list(c.axes) == ["mode", "k", "max_concurrency", "gpu"] and c.axes["k"] == [4]


@pytest.mark.parametrize("text, message", [
    ('[grid]\nk = []\n', "grid.k: no values"),
    ('[grid]\nkk = [1]\n', "grid.kk: unknown key 'kk'"),
    ('[grids]\nk = [1]\n', "unknown section 'grids'"),
    ('preset = "seed-l20"\n', "grid: expected a table of axes"),
    ('[grid\nk = 1\n', "not valid TOML"),
])
def test_grid_file_errors_name_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=f"{path}.*{message}"):
        load_grid_file(path)


# -- the table -----------------------------------------------------------------------------

def test_the_table_has_one_row_per_cell_in_grid_order(tmp_path):
    run = run_sweep(tiny_grid("mode=sync,async", "k=0,2", "max_concurrency=1,4"), tmp_path)
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert list(rows[0]) == ["mode", "k", "max_concurrency", *COLUMNS, "cell"]
    assert [(r["mode"], r["k"], r["max_concurrency"]) for r in rows] == [
        (m, k, c) for m in ("sync", "async") for k in ("0", "2") for c in ("1", "4")]
    assert all(r["completed"] == "4" for r in rows)
    assert rows[0]["acceptance_length"] == "" and float(rows[2]["acceptance_length"]) > 1
    # speculation helps at concurrency 1, and sync has the larger step gap
    tpot = {(r["mode"], r["k"], r["max_concurrency"]): float(r["mean_tpot_ms"]) for r in rows}
    assert tpot["sync", "2", "1"] < tpot["sync", "0", "1"]
    gap = {(r["mode"], r["k"]): float(r["mean_step_gap_us"]) for r in rows
           if r["max_concurrency"] == "1"}
    assert gap["sync", "0"] > 10 * gap["async", "0"]
    table = load_sweep(tmp_path)
    assert table.rows == run.table.rows and table.preset == "seed-l20"
    assert table.value("mean_tpot_ms", mode="async", k=2, max_concurrency=4) == \
        tpot["async", "2", "4"]


def test_each_cell_runs_with_the_base_seed():
    cells = tiny_grid("k=0,2", sets=["seed=7"]).cells()
    assert [c.settings["seed"] for c in cells] == [7, 7]


def test_a_rerun_skips_the_cells_already_done(tmp_path, monkeypatch):
    first = run_sweep(tiny_grid("k=0,2", "max_concurrency=1,4"), tmp_path)
    assert (first.ran, first.skipped) == (4, 0)
    ran = []
    real = sweep_runners.run_cell
    monkeypatch.setattr(sweep_runners, "run_cell", lambda s: ran.append(s) or real(s))
    second = run_sweep(tiny_grid("k=0,2,4", "max_concurrency=1,4"), tmp_path)
    assert (second.ran, second.skipped) == (2, 4)
    assert sorted((s["k"], s["max_concurrency"]) for s in ran) == [(4, 1), (4, 4)]
    assert second.table.rows[:2] == first.table.rows[:2]
    # a changed base is a different cell
    third = run_sweep(tiny_grid("k=0,2,4", "max_concurrency=1,4", sets=["seed=1"]), tmp_path)
    assert third.ran == 6
    assert run_sweep(tiny_grid("k=0", "max_concurrency=1"), tmp_path, fresh=True).ran == 1


def test_a_change_to_the_simulator_reruns_every_cell(tmp_path, monkeypatch):
    assert run_sweep(tiny_grid("k=0,2"), tmp_path).ran == 2
    monkeypatch.setattr(sweep_keys, "model_digest", lambda: "another version")
    assert run_sweep(tiny_grid("k=0,2"), tmp_path).ran == 2


def test_the_cache_key_covers_every_module_the_simulator_loads():
    """The sources in a cell's hash are read from the imports: whatever the simulator loads
    (here, in a fresh interpreter) is among them, so a split module cannot leave cells stale."""
    import subprocess
    import sys
    code = ("import sys, stepgap.sim.loop, stepgap.sim.presets\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('stepgap.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    files = {sweep_keys.module_path(m) for m in loaded} - {None}
    named = {sweep_keys.PACKAGE_ROOT / f for f in sweep_keys.model_sources()}
    assert files - {sweep_keys.PACKAGE_ROOT / "__init__.py"} <= named   # (the CLI's package)
    assert {"sim/loop.py", "sim/config.py", "common/scheduler.py"} <= \
        set(sweep_keys.model_sources())


def test_the_cache_key_follows_imports_inside_functions_too(tmp_path):
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "loop.py").write_text("from stepgap.sim.costs import Batch\n")
    (tmp_path / "sim" / "costs.py").write_text(
        "import math\n\ndef roofline():\n    from stepgap.sim import roofline\n")
    (tmp_path / "sim" / "roofline.py").write_text("from stepgap.sim.costs import Batch\n")
    (tmp_path / "sim" / "unused.py").write_text("")
    (tmp_path / "sim" / "__init__.py").write_text("")
    assert sweep_keys.model_sources(("stepgap.sim.loop",), tmp_path) == (
        "sim/__init__.py", "sim/costs.py", "sim/loop.py", "sim/roofline.py")


def test_a_changed_simulator_file_changes_the_digest_through_the_symlinked_layout(tmp_path):
    """The digest reads the files the package's symlinks lead to (stepgap/sim -> ../sim), as an
    import does: a byte changed in sim/costs.py is a new digest, so every cell runs again."""
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "__init__.py").write_text("")
    (tmp_path / "sim" / "loop.py").write_text("from stepgap.sim.costs import Batch\n")
    (tmp_path / "sim" / "costs.py").write_text("SCALE = 1.0\n")
    (tmp_path / "stepgap").mkdir()
    (tmp_path / "stepgap" / "sim").symlink_to("../sim")
    package = tmp_path / "stepgap"
    before = sweep_keys.model_digest(("stepgap.sim.loop",), package)
    (tmp_path / "sim" / "costs.py").write_text("SCALE = 1.1\n")
    sweep_keys.model_digest.cache_clear()
    assert sweep_keys.model_digest(("stepgap.sim.loop",), package) != before


def test_a_changed_trace_file_reruns_its_cells(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"request_id": "a", "arrival_s": 0, "prompt_len": 8, "output_len": 16}\n')
    grid = build_grid(["k=0,2"], sets=[f"workload={trace}", "model=llama-3.2-1b"])
    assert run_sweep(grid, tmp_path / "out").ran == 2
    assert run_sweep(grid, tmp_path / "out").ran == 0
    trace.write_text('{"request_id": "a", "arrival_s": 0, "prompt_len": 8, "output_len": 20}\n')
    assert run_sweep(grid, tmp_path / "out").ran == 2


def test_a_torn_last_line_is_run_again(tmp_path):
    run_sweep(tiny_grid("k=0,2"), tmp_path)
    store = tmp_path / "cells.jsonl"
    lines = store.read_text().splitlines()
    store.write_text(lines[0] + "\n" + lines[1][:40])     # killed while writing cell 2
    again = run_sweep(tiny_grid("k=0,2"), tmp_path)
    assert (again.ran, again.skipped) == (1, 1)
    cells = [json.loads(x)["cell"] for x in store.read_text().splitlines()]  # the torn one cut
    assert len(cells) == 2 and len(set(cells)) == 2


def test_local_parallel_and_dask_cluster_give_identical_tables(tmp_path):
    distributed = pytest.importorskip("distributed")
    grid = tiny_grid("mode=sync,zero-bubble", "k=0,3", "max_concurrency=1,3")
    run_sweep(grid, tmp_path / "one", jobs=1)
    run_sweep(grid, tmp_path / "two", jobs=2)
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=":0") as cluster:
        run_sweep(grid, tmp_path / "dask", cluster=cluster.scheduler_address)
    one = (tmp_path / "one" / "sweep.csv").read_bytes()
    assert (tmp_path / "two" / "sweep.csv").read_bytes() == one
    assert (tmp_path / "dask" / "sweep.csv").read_bytes() == one
    assert (tmp_path / "dask" / "sweep.json").read_bytes() == \
        (tmp_path / "one" / "sweep.json").read_bytes()


def test_a_local_ray_instance_gives_the_local_table(tmp_path):
    """`--cluster ray` (skipped without the ray extra: it is not in the dev extra)."""
    pytest.importorskip("ray")
    grid = tiny_grid("mode=sync,zero-bubble", "k=0,3", "max_concurrency=1,3")
    run_sweep(grid, tmp_path / "one", jobs=1)
    run_sweep(grid, tmp_path / "ray", cluster="ray")
    for name in ("sweep.csv", "sweep.json"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()


@pytest.mark.parametrize("address, engine, extra", [("ray", "Ray", "ray"),
                                                    ("ray://head:10001", "Ray", "ray"),
                                                    ("tcp://h:8786", "Dask distributed",
                                                     "cluster")])
def test_a_missing_cluster_engine_says_what_to_install(tmp_path, monkeypatch, address, engine,
                                                       extra):
    def no_module(name):
        raise ImportError(name)
    monkeypatch.setattr(sweep_runners.importlib, "import_module", no_module)
    with pytest.raises(UserError, match=rf"--cluster {address} needs {engine}: "
                                        rf"pip install 'stepgap\[{extra}\]'"):
        run_sweep(tiny_grid("k=0"), tmp_path, cluster=address)


def test_an_unreachable_cluster_is_a_clear_error(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep_runners, "CONNECT_S", 1.0)
    with pytest.raises(UserError, match="--cluster tcp://127.0.0.1:9: cannot connect"):
        run_sweep(tiny_grid("k=0"), tmp_path, cluster="tcp://127.0.0.1:9")


def test_an_address_that_is_no_address_fails_at_once_and_leaves_no_folder(tmp_path):
    pytest.importorskip("distributed")   # "word": Dask's Client raised, then its __del__
    out = tmp_path / "sw"                # printed a TimeoutError traceback 20 s later
    with pytest.raises(UserError, match="--cluster word: cannot connect .*missing port"):
        run_sweep(tiny_grid("k=0"), out, cluster="word")
    assert not out.exists()   # the folder the sweep made, with no cell in it, is gone


def test_a_grid_of_more_cells_than_a_sweep_runs_is_refused_before_any_is_built():
    grid = tiny_grid("max_num_seqs=1..10000", "max_concurrency=1..10000")
    with pytest.raises(UserError, match=r"100,000,000 cells \(10000 max_num_seqs x 10000 "
                                        r"max_concurrency\), more than one sweep runs"):
        grid.cells()   # (it validated them one by one, past 90 s)


@pytest.fixture
def quick_cluster_limits(monkeypatch):
    """The cluster's timeouts at a second or two, so that a failing cluster fails fast here."""
    monkeypatch.setattr(sweep_runners, "CONNECT_S", 1.0)
    monkeypatch.setattr(sweep_runners, "WORKERS_S", 2.0)
    monkeypatch.setattr(sweep_runners, "POLL_S", 0.1)


@pytest.mark.parametrize("peer", ["silent", "http"])
def test_a_port_that_is_no_dask_scheduler_fails_in_bounded_time(tmp_path, quick_cluster_limits,
                                                                 peer):
    """A port that accepts and never speaks, or speaks HTTP, used to hang the sweep past 150 s:
    distributed's own connect timeout does not cover the wait for the scheduler's answer."""
    pytest.importorskip("distributed")
    import http.server
    import socket
    import threading
    if peer == "http":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                 http.server.SimpleHTTPRequestHandler)
        server.daemon_threads = True   # (each waits for a request line that never comes)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port, close = server.server_address[1], server.shutdown
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        port, close = listener.getsockname()[1], listener.close
    try:
        t0 = time.monotonic()
        with pytest.raises(UserError, match=rf"--cluster tcp://127.0.0.1:{port}: cannot "
                                            "connect"):
            run_sweep(tiny_grid("k=0"), tmp_path, cluster=f"tcp://127.0.0.1:{port}")
        assert time.monotonic() - t0 < 60
    finally:
        close()


def test_a_scheduler_without_workers_ends_the_sweep_and_keeps_the_cells(tmp_path,
                                                                       quick_cluster_limits):
    distributed = pytest.importorskip("distributed")
    run_sweep(tiny_grid("k=0"), tmp_path, jobs=1)   # one cell done before
    with distributed.LocalCluster(n_workers=0, dashboard_address=":0") as cluster:
        with pytest.raises(UserError, match=r"no worker for 2 s .* the cells finished before "
                                            "it are stored"):
            run_sweep(tiny_grid("k=0,1"), tmp_path, cluster=cluster.scheduler_address)
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 1
    assert run_sweep(tiny_grid("k=0,1"), tmp_path, jobs=1).skipped == 1   # and it resumes


def cell_behind_a_gate(settings: dict) -> dict:
    """A cell that, but for k = 0, waits for the gate file named in $STEPGAP_TEST_GATE (a test
    decides when, not the machine's speed), then runs as any cell does."""
    import os
    from pathlib import Path
    gate = Path(os.environ["STEPGAP_TEST_GATE"])
    deadline = time.monotonic() + 120
    while settings["k"] and not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return sweep_runners.run_cell(settings)


def test_a_killed_scheduler_ends_the_sweep_in_one_line(tmp_path, quick_cluster_limits,
                                                       monkeypatch):
    """The scheduler is closed when the first cell is stored, while the others wait behind a
    gate: the sweep ends in one line, the stored cell kept."""
    distributed = pytest.importorskip("distributed")
    from stepgap.sim import sweep_store
    gate = tmp_path / "gate"
    monkeypatch.setenv("STEPGAP_TEST_GATE", str(gate))
    monkeypatch.setattr(sweep_runners, "run_cell", cell_behind_a_gate)
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=8, processes=True,
                                       dashboard_address=":0")
    add = sweep_store.CellStore.add

    def add_then_kill(store, cell, metrics):
        add(store, cell, metrics)
        cluster.close()

    monkeypatch.setattr(sweep_store.CellStore, "add", add_then_kill)
    try:
        with pytest.raises(UserError, match="--cluster tcp://.*: (the cluster failed|cannot "
                                            "connect|the scheduler has had no worker)"):
            run_sweep(tiny_grid("k=0..7"), tmp_path / "out", cluster=cluster.scheduler_address)
    finally:
        gate.touch()
        cluster.close()
    assert len((tmp_path / "out" / "cells.jsonl").read_text().splitlines()) == 1


def test_grid_without_axes_is_refused():
    with pytest.raises(UserError, match="no axes"):
        Grid({})


# -- the command ---------------------------------------------------------------------------

def test_sweep_command_writes_table_and_figures(tmp_path, capsys):
    out = tmp_path / "s"
    args = ["sweep", "--preset", "seed-l20", "--set", "num_prompts=4", "--set", "output_len=24",
            "--grid", "mode=sync,async", "--grid", "k=0..2", "--grid", "max_concurrency=1,4",
            "--out", str(out), "--jobs", "1", "--quiet"]
    assert main([*args, "--dry-run"]) == 0
    assert "12 cells, all valid; 0 already done" in capsys.readouterr().out
    assert main([*args, "--plot"]) == 0
    assert capsys.readouterr().out == ""
    for name in ("heatmap", "speedup", "saving"):
        assert (out / "plots" / f"{name}_mean_tpot_ms.png").stat().st_size > 10_000
    best = list(csv.DictReader((out / "plots" / "best_k.csv").open()))
    assert len(best) == 4 and {r["mode"] for r in best} == {"sync", "async"}
    assert main([*args[:-1], "--dry-run"]) == 0
    assert "12 already done" in capsys.readouterr().out


def test_help_teaches_the_grid_syntax_with_examples():
    from stepgap.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = sub.choices["sweep"].format_help()
    for needle in ("k=0..6", "1..64:x2", "--grid-file", "--cluster", "[grid]", "examples:",
                   "rerun", "grid", "execution", "output"):
        assert needle in text
    for action in sub.choices["sweep"]._actions:
        assert action.help, action.option_strings


def test_a_range_whose_rounding_repeats_a_value_keeps_it_once():
    # 1, 1.5, 2.25, 3.4, 5.1, 7.6 round to 1, 2, 2, 3, 5, 8: the range means each one once
    assert parse_values("max_concurrency", "1..8:x1.5", "--grid") == [1, 2, 3, 5, 8]
    grid = build_grid(["max_concurrency=1..8:x1.5"])
    assert grid.axes["max_concurrency"] == [1, 2, 3, 5, 8]
    with pytest.raises(UserError, match=r"--grid 'k=0..2,1': k is given the value 1 twice"):
        build_grid(["k=0..2,1"])   # one the user typed twice is an error, naming the option


def test_the_shared_fraction_is_a_sweep_axis_and_an_x_axis_of_its_figures(tmp_path, capsys):
    """A sweep over the shared fraction of the prompt. The more of each prompt is
    shared, the more of it the prefix cache finds, and the less TTFT prefill costs."""
    out = tmp_path / "s"
    assert main(["sweep", "--set", "workload=prefix_repetition:num_prefixes=4:prefix_len=0:"
                 "suffix_len=512", "--set", "num_prompts=16", "--set", "output_len=8",
                 "--set", "request_rate=4", "--grid", "shared_fraction=0,0.5,0.9",
                 "--grid", "mode=sync,async", "--grid", "k=0,2", "--out", str(out),
                 "--jobs", "1", "--quiet"]) == 0
    table = load_sweep(out)
    hits = [table.value("prefix_cache_hit_rate", shared_fraction=f, mode="sync", k=2)
            for f in (0, 0.5, 0.9)]
    ttft = [table.value("mean_ttft_ms", shared_fraction=f, mode="sync", k=2)
            for f in (0, 0.5, 0.9)]
    assert hits[0] == 0 < hits[1] < hits[2] < 0.9   # 4 of 16 prompts find nothing cached
    assert ttft[0] > ttft[1] > ttft[2]
    assert main(["plot", "sweep", str(out), "--x", "shared_fraction", "--metric",
                 "mean_ttft_ms", "--quiet"]) == 0
    assert (out / "plots" / "saving_mean_ttft_ms.png").stat().st_size > 10_000
    capsys.readouterr()
    # on mtbench (lengths only, no prefix to size) the grid is refused before any cell runs
    assert main(["sweep", "--grid", "shared_fraction=0,0.5", "--out", str(tmp_path / "x"),
                 "--dry-run"]) != 0
    assert "--shared-fraction: sizes the shared prefix of prefix_repetition" in \
        capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# vLLM's spellings as keys


def test_vllms_spellings_make_each_cells_settings():
    grid = build_grid(["async_scheduling=false,true", "random_input_len=256,1024"],
                      preset="seed-l20",
                      sets=["dataset_name=random", "random_output_len=64", "num_prompts=4",
                            'speculative_config={"method": "eagle3", '
                            '"num_speculative_tokens": 2}'])
    cells = grid.cells()
    got = [(c.settings["mode"], c.settings["k"], c.settings["workload"],
            c.settings["output_len"]) for c in cells]
    assert got == [("sync", 2, "random:input_len=256", 64), ("sync", 2, "random:input_len=1024", 64),
                   ("async", 2, "random:input_len=256", 64),
                   ("async", 2, "random:input_len=1024", 64)]
    assert cells[0].values == {"async_scheduling": False, "random_input_len": 256}


def test_a_setting_given_both_ways_must_agree():
    grid = build_grid(["async_scheduling=true"], sets=["mode=sync"])
    with pytest.raises(UserError, match="async_scheduling's mode 'async' and mode 'sync' "
                                        "disagree"):
        grid.cells()
    grid = build_grid(["k=1,3"], sets=['speculative_config={"num_speculative_tokens": 2}'])
    with pytest.raises(UserError, match="num_speculative_tokens 2 and k 1 disagree"):
        grid.cells()
    grid = build_grid(["dataset_name=sonnet"])
    with pytest.raises(UserError, match="--dataset-name sonnet: a vLLM dataset stepgap does "
                                        "not sample"):
        grid.cells()


def test_a_grid_file_takes_the_speculative_config_as_a_table(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[base]\nnum_prompts = 4\nspeculative_config = {method = "eagle3", '
                 'num_speculative_tokens = 3}\n[grid]\nasync_scheduling = [true]\n')
    cell, = build_grid(grid_file=f).cells()
    assert (cell.settings["mode"], cell.settings["k"], cell.settings["method"]) == \
        ("async", 3, "eagle3")


def test_data_parallel_size_is_an_axis(tmp_path):
    """A MoE target at DP 1 and 2 with expert parallelism: each row is the simulator's
    cell, the DP 2 one run by two engine cores (at the nominal host, the sweep's default)."""
    from stepgap.sim.bands import NOMINAL_CPU
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate
    sets = ["model=qwen3-30b-a3b", "gpu=h100", "enable_expert_parallel=true", "num_prompts=6",
            "output_len=24", "workload=mtbench", "k=2"]
    run_sweep(build_grid(["data_parallel_size=1,2"], sets=sets), tmp_path)
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [r["data_parallel_size"] for r in rows] == ["1", "2"]
    for r in rows:
        dp = int(r["data_parallel_size"])
        res = simulate(SimConfig(model="qwen3-30b-a3b", gpu="h100", enable_expert_parallel=True,
                                 num_prompts=6, output_len=24, workload="mtbench", k=2,
                                 data_parallel_size=dp, cpu_scale=NOMINAL_CPU))[0]
        assert float(r["mean_tpot_ms"]) == pytest.approx(res["mean_tpot_ms"], rel=1e-12)
        assert (res["config"]["resolved"].get("data_parallel") is not None) == (dp == 2)
    assert rows[0]["mean_tpot_ms"] != rows[1]["mean_tpot_ms"]


def test_a_grid_reads_its_profile_once_not_twice_a_cell(monkeypatch):
    """Validating a grid over a measured profile reads the profile once, and each cell's
    settings are those the profile gives when read for the cell alone."""
    import stepgap.sim.config as config
    import stepgap.sim.sweep_grid as sweep_grid
    from stepgap.sim.profile import load_profile
    profile = "traces/measured/cpu/profile.json"
    base = {"profile": profile, "model": "checkpoints/pystdlib/target",
            "draft": "checkpoints/pystdlib/eagle3",
            "workload": "checkpoints/pystdlib/heldout.jsonl", "num_prompts": 4,
            "max_model_len": 256}
    alone = config.profile_defaults(dict(base, mode="async", k=2), set(base) | {"mode", "k"})[0]
    reads = []
    monkeypatch.setattr(sweep_grid, "load_profile", lambda p: reads.append(p) or load_profile(p))
    monkeypatch.setattr(config, "load_profile", lambda p: pytest.fail("read again"))
    cells = Grid({"mode": ["sync", "async"], "k": [0, 2]}, base).cells(keyed=False)
    assert reads == [profile] and len(cells) == 4
    assert cells[-1].settings == alone
