"""Interrupted and stuck runs (docs/reference/robustness.md): SIGTERM stops a command as Ctrl-C
does, with no process of it left behind (checked by pid), a stopped worker ends its run with a clear
error, and a closed stdout is no traceback."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepgap.engine.executor import ProcessExecutor, WorkerDied
from stepgap.engine.worker import WorkerSpec
from tests.helpers import REQS, run, tiny_checkpoints

ROOT = Path(__file__).resolve().parents[1]


def stepgap(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stepgap", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def children(pid: int) -> set[int]:
    """The live child processes of `pid` (Linux /proc)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


def gone(pid: int, wait_s: float = 10.0) -> bool:
    """The process has exited (a zombie whose parent has gone counts: it runs nothing)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in "ZX":
            return True
        time.sleep(0.05)
    return False


def wait_for(predicate, timeout_s: float = 60.0, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_sigterm_stops_a_sweep_and_leaves_no_pool_worker(tmp_path):
    out = tmp_path / "sweep"
    proc = stepgap("sweep", "--preset", "seed-l20", "--grid", "mode=sync,async,zero-bubble",
                   "--grid", "k=0..6", "--grid", "max_concurrency=1..64:x2", "--jobs", "2",
                   "--out", str(out), "--quiet")
    workers = wait_for(lambda: len(children(proc.pid)) >= 2 and children(proc.pid),
                       what="the sweep's pool workers")
    wait_for(lambda: (out / "cells.jsonl").is_file(), what="the first finished cell")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert all(gone(pid) for pid in workers), f"pool workers left running: {workers}"
    assert not (out / "sweep.csv").exists()   # no table unless it is whole
    for line in (out / "cells.jsonl").read_text().splitlines():   # the store resumes
        assert line.startswith('{"cell"') and line.endswith("}")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_sweep_killed_with_sigkill_leaves_no_pool_worker_and_resumes(tmp_path):
    """SIGKILL cannot be handled, so the sweep cannot stop its pool: each worker notices that
    its parent is gone (sim/sweep_runners.py exit_with_parent) and ends, where it used to wait
    for its next cell forever. The store, its last line maybe torn, resumes. (Behaviour, not
    speed: the bound is generous.)"""
    out = tmp_path / "sweep"
    grid = ["--grid", "mode=sync,async,zero-bubble", "--grid", "k=0..6", "--grid",
            "max_concurrency=1..64:x2"]
    proc = stepgap("sweep", "--preset", "seed-l20", *grid, "--jobs", "2", "--out", str(out),
                   "--quiet")
    workers = set()
    try:
        workers = wait_for(lambda: len(children(proc.pid)) >= 2 and children(proc.pid),
                           what="the sweep's pool workers")
        wait_for(lambda: (out / "cells.jsonl").is_file(), what="the first finished cell")
        proc.kill()
        assert proc.wait(timeout=60) == -signal.SIGKILL
        left = [pid for pid in workers if not gone(pid, wait_s=60)]
        assert not left, f"pool workers left running after the sweep's SIGKILL: {left}"
        proc.communicate(timeout=60)   # the workers held its pipes: closed now
    finally:
        for pid in workers:   # (only if the test failed)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    resumed = stepgap("sweep", "--preset", "seed-l20", "--grid", "mode=sync", "--grid",
                      "k=0,1", "--grid", "max_concurrency=1", "--jobs", "2", "--out", str(out),
                      "--quiet")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    for line in (out / "cells.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda word: pytest.fail(f"{word} in the store"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_sigterm_stops_a_run_and_its_worker_process(tmp_path):
    result = tmp_path / "r.json"
    proc = stepgap("run", "--model", "tiny", "--draft", "tiny-eagle3", "-k", "2",
                   "--executor", "process", "--num-prompts", "400", "--output-len", "64",
                   "--result-json", str(result))
    worker = wait_for(lambda: children(proc.pid), what="the worker process")
    wait_for(lambda: "requests, mode" in (proc.stderr.readline() or ""), what="the run")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert all(gone(pid) for pid in worker), f"worker left running: {worker}"
    assert not result.exists()


def test_a_stopped_worker_ends_the_run_with_a_clear_error():
    paths = tiny_checkpoints()
    spec = WorkerSpec(paths["target"], None, "cpu", "float32", 256, max_model_len=512,
                      max_num_seqs=8)
    ex = ProcessExecutor(spec, stall_timeout_s=1.0)
    pid = ex.pid

    def stop_at_step_3(step):
        if step == 3:
            os.kill(pid, signal.SIGSTOP)

    t0 = time.monotonic()
    with pytest.raises(WorkerDied, match=rf"worker process \(pid {pid}\) is stopped"):
        with ex:
            run(ex, REQS, mode="async", k=0, on_step=stop_at_step_3)
    assert time.monotonic() - t0 < 30   # the watchdog, not the 600 s step timeout
    assert not ex.proc.is_alive() and gone(pid)


def test_a_request_too_long_is_refused_before_anything_is_built_for_it(monkeypatch):
    import stepgap.engine.loop as engine_loop
    from stepgap.common.errors import UserError
    from stepgap.common.formats import TraceRequest
    from tests.helpers import inline_executor
    ex = inline_executor()

    def no_prompt_ids(*a):   # 10^9 prompt ids would be gigabytes
        raise AssertionError("prompt ids were built before the request-fits check")
    monkeypatch.setattr(engine_loop, "prompt_ids", no_prompt_ids)
    with pytest.raises(UserError, match=r"request 'big': prompt_len \+ output_len"):
        run(ex, [TraceRequest("ok", 0.0, 4, 4), TraceRequest("big", 0.0, 10 ** 9, 4)])


def test_a_closed_stdout_is_no_traceback(tmp_path):
    from stepgap.common.formats import RequestTiming, save_result
    from tests.helpers import run_result
    t = RequestTiming("a", 4, 0.0)
    t.add_chunk(0.1, 1)
    t.add_chunk(0.2, 1)
    path = tmp_path / "r.json"
    save_result(path, run_result([t], 0.2, backend="x", config={}))
    read, write = os.pipe()
    os.close(read)   # `| head` that has already gone
    proc = subprocess.run([sys.executable, "-m", "stepgap", "compare", str(path), str(path)],
                          cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    os.close(write)
    assert proc.returncode == 141
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# Round 3 (docs/reference/robustness.md): the first seconds of a command, closed streams, gzip bombs


# `python -c` this: the command, signalled by itself in the middle of building its parser, once
# the first command module has registered its commands (the parser no longer imports torch, so
# no moment of a real start is long enough to be hit from outside every time).
# It takes the signal as a terminal's Ctrl-C finds a command: not blocked, and SIGINT not
# ignored (a process started from a background job, or from a thread that blocks it, inherits
# that; one CI run under xdist saw the SIGINT case run to the end, status 0).
SIGNAL_WHILE_PARSING = """
import importlib, os, signal, sys
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.{sig}])
if signal.{sig} == signal.SIGINT:
    signal.signal(signal.SIGINT, signal.default_int_handler)
import stepgap.cli as cli

class Importer:
    calls = 0

    def import_module(self, name):
        Importer.calls += 1
        if Importer.calls == 2:
            os.kill(os.getpid(), signal.{sig})
        return importlib.import_module(name)

cli.importlib = Importer()
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_while_the_parser_is_built_is_one_line(sig, code, word):
    """Ctrl-C in a command's first moment, while the parser is built, used to print a
    KeyboardInterrupt traceback: the parser was built outside main()'s try."""
    p = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_PARSING.format(sig=sig.name),
                        "simulate", "--num-prompts", "2", "--quiet"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == code, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith(word) and "Traceback" not in p.stderr


def test_bad_input_with_stderr_and_stdout_closed_is_still_status_2():
    r = subprocess.run(["bash", "-c", f"{sys.executable} -m stepgap simulate --trace missing "
                        "2>&- >&-"], cwd=ROOT, timeout=120)
    assert r.returncode == 2


def test_help_on_an_ascii_stdout_replaces_what_it_cannot_encode():
    r = subprocess.run([sys.executable, "-m", "stepgap", "sweep", "--help"], cwd=ROOT,
                       capture_output=True, timeout=120, env={**os.environ,
                                                              "PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0 and b"Traceback" not in r.stderr
    assert b"ms (?s for step gaps)" in r.stdout   # µs, as the ASCII codec can write it


def test_a_gzip_bomb_is_refused_at_the_limit_without_filling_the_memory(tmp_path):
    """3 GB of spaces packed into 3 MB, as a --trace: decompressed a piece at a time and refused
    past MAX_DECOMPRESSED_BYTES (1 GiB), under an address-space limit of 3 GiB that the whole
    of it would pass."""
    import gzip
    import resource

    from stepgap.common.limits import MAX_DECOMPRESSED_BYTES
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        piece = b" " * (64 << 20)
        for _ in range(48):   # 3 GiB
            f.write(piece)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    r = subprocess.run([sys.executable, "-m", "stepgap", "simulate", "--trace", str(path),
                        "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       preexec_fn=limit)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"stepgap simulate: error: {path}: decompresses to more than "
                                f"{MAX_DECOMPRESSED_BYTES >> 20} MiB (a gzip bomb?); stepgap "
                                "reads no larger input")
