"""Running sweep cells: one in this process, many in local processes (`concurrent.futures`) or
on a cluster, Dask distributed or Ray (`run_cluster`, one piece for both; each an optional
extra). Every cell runs with its own settings' seed, so every runner gives the same table."""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Callable, Iterator

from stepgap.common.errors import UserError
from stepgap.common.run_result import RunResult
from stepgap.sim.config import SimConfig
from stepgap.sim.sweep_table import BANDED, RESULT_METRICS

# A cluster that is none, or that loses its workers, ends a sweep in bounded time, one line
# (run_cluster); the cells done by then stay stored (sim/sweep_store.py).
CONNECT_S = 10.0        # to reach a scheduler and hear it speak (an HTTP port never does)
WORKERS_S = 30.0        # the most a sweep waits with no worker: at start, or after losing them
POLL_S = 0.5            # how often a sweep with no cell finished looks at the workers


def run_cell(settings: dict) -> dict:
    """Simulate one cell; its metrics. Runs in a worker process or on a cluster worker."""
    from stepgap.sim.loop import simulate

    res, _ = simulate(SimConfig(**settings))
    return metrics_of(res)


def run_band_cell(settings: dict) -> dict:
    """Simulate one cell and its bands (sim/bands.py): its metrics, with the low and high end
    of each BANDED metric and the inputs that dominate its band."""
    from stepgap.sim.band_runs import run_bands
    res, _, bands, _ = run_bands(settings, metrics=BANDED)
    row = metrics_of(res)
    for m, b in bands.items():
        row[f"{m}_low"], row[f"{m}_high"] = b.low, b.high
    row["band_dominant"] = "; ".join(f"{m}: {', '.join(b.dominant) or '-'}"
                                     for m, b in bands.items())
    return row


def metrics_of(res: RunResult) -> dict:
    """A simulated result's row of the sweep's table (sweep_table.COLUMNS)."""
    metrics = res.metrics.to_dict()   # (once: the percentiles are keys, not attributes)
    row = {m: metrics.get(m) for m in RESULT_METRICS}
    gaps = res.step_gaps
    row.update(mean_step_gap_us=gaps.mean_us, median_step_gap_us=gaps.median_us,
               p90_step_gap_us=gaps.p90_us, p99_step_gap_us=gaps.p99_us)
    row["acceptance_length"] = res.spec_decode.acceptance_length if res.spec_decode else None
    row["num_steps"] = res.plan.num_steps
    row["num_preemptions"] = res.num_preemptions
    row["num_kv_blocks"] = res.plan.num_kv_blocks
    pc = res.prefix_cache   # vLLM's counters: prompt tokens found / looked up
    row["prefix_cache_hit_rate"] = pc["hits"] / pc["queries"] if pc and pc["queries"] else None
    row["simulated_mode"] = res.mode
    return row


def _pool_worker_signals(sweep_pid: int | None = None, forked: bool = False) -> None:
    """A pool worker leaves Ctrl-C and SIGTERM to the sweep's own process, which stops it: it
    must not take the SIGTERM handler it forked with (stepgap/cli.py), which would unwind the
    cell and leave the worker waiting for the next one. And it ends when the sweep's process
    ends without stopping it (SIGKILL, the OOM killer): `exit_with_parent`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    exit_with_parent(sweep_pid, forked)


PR_SET_PDEATHSIG = 1   # linux/prctl.h
PARENT_POLL_S = 1.0    # where there is no prctl: how often a worker looks for its parent


def exit_with_parent(sweep_pid: int | None = None, forked: bool = False) -> None:
    """End this process (SIGTERM, whose default action a pool worker keeps) when its parent
    ends. A pool worker waits for its next cell on a pipe whose writing end it holds itself, so
    a parent killed with SIGKILL never closes it: the worker would wait forever, through any
    resumed sweep. On Linux the kernel sends the signal (prctl(PR_SET_PDEATHSIG); it fires when
    the thread that forked the worker ends, the sweep's thread that runs the pool, or the
    forkserver's, which ends with the sweep); elsewhere a daemon thread polls the parent's pid.
    A sweep (`sweep_pid`) gone before the signal is armed ends the worker at once: `forked`, the
    worker's parent must still be the sweep; else the sweep must still run."""
    import sys
    import threading

    parent = os.getppid()
    armed = False
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if not armed:
        def watch():
            import time
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
    if sweep_pid is None:
        return
    gone = os.getppid() != sweep_pid if forked else not _running(sweep_pid)
    if gone:
        os.kill(os.getpid(), signal.SIGTERM)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def stop_pool(ex: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now (an interrupted sweep), so that none outlives the sweep.
    Python 3.14 has terminate_workers(); before it, the processes are reached directly."""
    if hasattr(ex, "terminate_workers"):
        ex.terminate_workers()
        return
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)


def local_pool(jobs: int) -> ProcessPoolExecutor:
    """`jobs` worker processes that end with this one (`_pool_worker_signals`)."""
    ctx = multiprocessing.get_context()
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx,
                               initializer=_pool_worker_signals,
                               initargs=(os.getpid(), ctx.get_start_method() == "fork"))


def run_local(settings: list[dict], jobs: int, fn: Callable = run_cell
              ) -> Iterator[tuple[int, dict]]:
    """(index, fn(settings)) as cells finish, over `jobs` processes (1: in this process)."""
    if jobs <= 1 or len(settings) <= 1:
        for i, s in enumerate(settings):
            yield i, fn(s)
        return
    ex = local_pool(min(jobs, len(settings)))
    try:
        futures = {ex.submit(fn, s): i for i, s in enumerate(settings)}
        for f in as_completed(futures):
            yield futures[f], f.result()
    except BrokenProcessPool:   # a worker killed (SIGKILL, the OOM killer): one line
        stop_pool(ex)
        raise UserError(f"--jobs {jobs}: a worker process died while it ran cells (killed from "
                        "outside, or by the OOM killer when memory ran out); run again, with "
                        "fewer --jobs if memory is short") from None
    except BaseException:   # interrupted, or the consumer stopped (GeneratorExit)
        stop_pool(ex)
        raise
    ex.shutdown()


@dataclass(frozen=True)
class ClusterEngine:
    """One cluster engine as run_cluster drives it: how to reach it (`connect`, a context
    manager whose value is handed to `run`) and how to run the cells on it (`run`, yielding
    (index, metrics) as they finish). The rest, the checks and the messages, is shared."""

    name: str
    module: str           # imported first: missing, the user is told what to install
    extra: str            # the pip extra that installs it
    connect: Callable
    run: Callable


def _dask_connect(address: str):
    """A Dask client of the scheduler at `address`. Made in a thread of its own, so that an
    address that accepts and never answers as a Dask scheduler (a port that speaks HTTP, or
    nothing) fails after CONNECT_S: distributed's own timeout leaves that wait unbounded."""
    import threading

    from distributed import Client
    from distributed.comm import parse_address, parse_host_port
    scheme, location = parse_address(address)   # ValueError: no host:port in it ("word")
    if scheme != "inproc":
        parse_host_port(location)
    made: dict = {}

    def connect() -> None:
        try:
            made["client"] = Client(address, timeout=f"{CONNECT_S:g}s", set_as_default=False)
        except BaseException as e:
            made["error"] = e

    t = threading.Thread(target=connect, name="dask-connect", daemon=True)
    t.start()
    t.join(CONNECT_S + 5.0)
    if "error" in made:
        raise made["error"]
    if "client" not in made:
        raise TimeoutError(f"no Dask scheduler answered within {CONNECT_S:g} s (a port that "
                           "speaks another protocol, or none, gives no answer)")
    return made["client"]


def _dask_workers(client) -> int:
    """How many workers the scheduler has now (it answers within CONNECT_S, or the error
    says it is gone)."""
    return len(client.nthreads(callback_timeout=CONNECT_S))


def _dask_run(client, settings: list[dict], fn: Callable = run_cell
              ) -> Iterator[tuple[int, dict]]:
    """(index, metrics) as cells finish. With no worker for WORKERS_S (none joined, or the last
    one died) the sweep ends: a Dask scheduler would hold its tasks for a worker forever."""
    import time

    from distributed import as_completed as dask_completed
    futures = client.map(fn, settings, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    with client.as_current():   # as_completed finds its client there
        pending = dask_completed(futures)
    seen_worker = time.monotonic()
    while not pending.is_empty():
        finished = pending.next_batch(block=False)
        for f in finished:
            yield index[f.key], f.result()
        if finished:
            continue
        if _dask_workers(client):
            seen_worker = time.monotonic()
        elif time.monotonic() - seen_worker > WORKERS_S:
            raise NoWorkers(f"the scheduler has had no worker for {WORKERS_S:g} s (none "
                            "joined, or they died), with cells still to run")
        time.sleep(POLL_S)


def _ray_connect(address: str):
    import ray
    # `ray`: a local instance for this sweep; ray://HOST:PORT: a running cluster (Ray Client)
    return ray.init(address=None if address == "ray" else address, include_dashboard=False,
                    log_to_driver=False, logging_level="warning")


def _ray_run(_, settings: list[dict], fn: Callable = run_cell) -> Iterator[tuple[int, dict]]:
    import ray
    cell = ray.remote(num_cpus=1)(fn)   # one CPU each: a cell is pure Python
    refs = [cell.remote(s) for s in settings]
    index = {ref: i for i, ref in enumerate(refs)}
    pending = refs
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield index[done[0]], ray.get(done[0])


DASK = ClusterEngine("Dask distributed", "distributed", "cluster", _dask_connect, _dask_run)
RAY = ClusterEngine("Ray", "ray", "ray", _ray_connect, _ray_run)


def cluster_engine(address: str) -> ClusterEngine:
    """Ray for `ray` (a local instance) and ray://HOST:PORT; Dask for any other address."""
    return RAY if address == "ray" or address.startswith("ray://") else DASK


class NoWorkers(TimeoutError):
    """A Dask scheduler without workers while cells wait: its message is the whole story (a
    library's own timeout, a scheduler gone, is told as the cluster failing)."""


def run_cluster(settings: list[dict], address: str, fn: Callable = run_cell
                ) -> Iterator[tuple[int, dict]]:
    """(index, fn(settings)) as cells finish on the cluster at `address` (`cluster_engine`)."""
    engine = cluster_engine(address)
    try:
        importlib.import_module(engine.module)
    except ImportError:
        raise UserError(f"--cluster {address} needs {engine.name}: "
                        f"pip install 'stepgap[{engine.extra}]'") from None
    try:
        session = engine.connect(address)
    except (OSError, TimeoutError, ValueError, ConnectionError) as e:
        raise UserError(f"--cluster {address}: cannot connect ({e})") from None
    with session:
        try:
            yield from engine.run(session, settings, fn)
        except UserError:   # a cell's own bad input, raised where it ran
            raise
        except (Exception, asyncio.CancelledError) as e:   # Dask's FutureCancelledError is
            why = str(e).splitlines()[0] if str(e) else "no message"   # not an Exception
            why = why if isinstance(e, NoWorkers) else \
                f"the cluster failed: {type(e).__name__}: {why}"
            raise UserError(f"--cluster {address}: {why}; the cells finished before it are "
                            "stored, and the sweep resumes from them when run again") from None
