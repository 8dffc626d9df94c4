"""Executors: where the worker runs.

- `inline`: in the engine process, as vLLM runs one GPU. On a GPU, overlap comes from CUDA
  streams: the CPU launches step N+1 while N runs.
- `process`: in its own process (spawned, one torch thread), as vLLM's multiprocess executor.
  On a CPU-only machine this is what makes overlap real: the engine process (schedule, update,
  the client) runs while the worker process computes. Threads could not do it; both sides' Python
  work would contend for the GIL.

Both offer configure / execute / collect / close. The process executor sends one compact message
per step (token ids only for fresh requests) and gets back the sampled ids and the worker's
spans. Over its pipe every message is an object of its own kind: to the worker a `RunConfig`, a
`StepMsg` or `Close`; from it `Ready`, `Configured`, a `StepResult` or `Failed`. Shutdown is
robust: a dead worker is detected while waiting (WorkerDied, with its exit code), a stuck one by
the watchdog (`Watchdog`: stopped, or no CPU used, for stall_timeout_s while a step is due), the
worker exits when the engine goes away, and close() always reaps the process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass

from stepgap.common.cpu_load import cpu_state
from stepgap.common.errors import UserError
from stepgap.common.formats import EXECUTORS
from stepgap.engine.worker import RunConfig, StepMsg, StepResult, Worker, WorkerSpec


@dataclass(slots=True)
class Close:
    """To the worker process: exit."""


@dataclass(slots=True)
class Ready:
    """From the worker process, once built: what it built (`Worker.info`)."""

    info: dict


@dataclass(slots=True)
class Configured:
    """From the worker process: the run's configuration is in place (CUDA graphs captured)."""


@dataclass(slots=True)
class Failed:
    """From the worker process: bad input (`user`: a UserError's one line), or a traceback."""

    text: str
    user: bool


class WorkerDied(RuntimeError):
    """The worker process exited, failed or stopped answering."""


# A step is seconds at most, and a worker computing it uses CPU (on a GPU too: the host side
# launches and waits). One stopped (SIGSTOP) or stuck without using any CPU this long while a
# step is due ends the run. Start-up and configure (weights, CUDA-graph capture) are not held
# to it: they have their own, longer timeouts.
STALL_TIMEOUT_S = 60.0
CONFIGURE_TIMEOUT_S = 1800.0


class Watchdog:
    """Fires when a process has used no CPU for `timeout_s` (it is stopped, or stuck waiting
    on something that never comes)."""

    def __init__(self, pid: int, timeout_s: float):
        self.pid, self.timeout_s = pid, timeout_s
        state = cpu_state(pid)
        self.cpu = state[1] if state else None
        self.since = time.monotonic()

    def check(self) -> str | None:
        """None while the process makes progress; else why it is stuck."""
        state = cpu_state(self.pid)
        if state is None:
            return None
        now = time.monotonic()
        if state[1] != self.cpu:
            self.cpu, self.since = state[1], now
            return None
        if now - self.since < self.timeout_s:
            return None
        how = "is stopped (SIGSTOP, or a debugger)" if state[0] in "Tt" else \
            "has used no CPU"
        return (f"the worker process (pid {self.pid}) {how} and answered nothing for "
                f"{self.timeout_s:.0f} s while a step was due; the run is ended")


class InlineExecutor:
    name = "inline"

    def __init__(self, spec: WorkerSpec):
        self.worker = Worker(spec)

    def info(self) -> dict:
        return self.worker.info()

    def configure(self, run: RunConfig) -> None:
        self.worker.configure(run)

    def execute(self, msg: StepMsg):
        return self.worker.execute(msg)

    def collect(self, handle) -> StepResult:
        return self.worker.collect(handle)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _worker_main(conn, spec: WorkerSpec, parent_pid: int, cpus: set[int] | None = None) -> None:
    """The worker process: execute steps as they come, send each result once it is ready."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine handles Ctrl-C and stops us
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        worker = Worker(spec)
        conn.send(Ready(worker.info()))
        pending = deque()
        while True:
            if pending and pending[0].ready():
                conn.send(worker.collect(pending.popleft()))
                continue
            if not conn.poll(0 if pending else 1.0):
                if os.getppid() != parent_pid:
                    return  # the engine is gone
                continue
            match conn.recv():
                case StepMsg() as msg:
                    pending.append(worker.execute(msg))
                case RunConfig() as run:
                    try:
                        worker.configure(run)
                        conn.send(Configured())
                    except UserError as e:
                        conn.send(Failed(str(e), user=True))
                case Close():
                    return
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return
    except UserError as e:
        _try_send(conn, Failed(str(e), user=True))
    except BaseException:
        _try_send(conn, Failed(traceback.format_exc(), user=False))


def _worker_process(*args) -> None:
    """The worker process's entry: run, then leave without the interpreter's teardown, which
    with torch loaded took 0.5-2.3 s on a busy 2-core machine and held up every shutdown
    (there is nothing left to flush but stderr)."""
    _worker_main(*args)
    exit_now()


def exit_now(code: int = 0) -> None:
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _try_send(conn, obj) -> None:
    try:
        conn.send(obj)
    except (OSError, BrokenPipeError):
        pass


def pin_plan(pin: bool = True) -> tuple[set[int], set[int]] | None:
    """(engine CPUs, worker CPUs) when pinning applies: asked for, and at least two CPUs."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, {cpus[1]}) if len(cpus) >= 2 else None


class ProcessExecutor:
    """The worker in its own process. With `pin` (the default) and at least two CPUs, the engine
    process is pinned to the first CPU it may use and the worker to the second, as a serving machine
    gives each its own core; `close()` gives the engine its CPUs back. Unpinned, the two can land on
    one core, and then a message wakes the receiver, which preempts the sender, and the overlap the
    process executor exists for vanishes (docs/explanation/engine.md, "Measured overlap")."""

    name = "process"

    def __init__(self, spec: WorkerSpec, start_timeout_s: float = 600.0,
                 step_timeout_s: float = 600.0, pin: bool = True,
                 stall_timeout_s: float = STALL_TIMEOUT_S):
        if spec.num_threads is None:
            from dataclasses import replace
            spec = replace(spec, num_threads=1)
        plan = pin_plan(pin)
        self.pinned = plan is not None
        self._affinity = os.sched_getaffinity(0) if plan else None
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_process,
                                args=(child, spec, os.getpid(), plan[1] if plan else None),
                                name="stepgap-worker", daemon=True)
        self.proc.start()
        child.close()
        if plan:
            os.sched_setaffinity(0, plan[0])
        self.step_timeout_s = step_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.in_flight = 0
        try:
            self._info = self._recv(Ready, start_timeout_s).info
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def info(self) -> dict:
        return {**self._info, "pinned": self.pinned}

    def _send(self, obj) -> None:
        try:
            self.conn.send(obj)
        except (OSError, BrokenPipeError):
            raise WorkerDied(self._death()) from None

    def _death(self) -> str:
        self.proc.join(0.5)
        code = self.proc.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else \
            f"exited with code {code}" if code is not None else "stopped answering"
        return f"the worker process (pid {self.proc.pid}) {how}"

    def _recv(self, want: type, timeout_s: float, watch: bool = False):
        deadline = time.monotonic() + timeout_s
        dog = None   # made at the first wait, so that a step's result that is ready costs none
        while not self.conn.poll(0.05):
            if not self.proc.is_alive():
                raise WorkerDied(self._death())
            if time.monotonic() > deadline:
                raise WorkerDied(f"the worker process (pid {self.proc.pid}) sent nothing for "
                                 f"{timeout_s:.0f} s")
            if watch:
                dog = dog or Watchdog(self.proc.pid, self.stall_timeout_s)
                stuck = dog.check()
                if stuck:
                    raise WorkerDied(stuck)
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            raise WorkerDied(self._death()) from None
        if isinstance(msg, Failed) and msg.user:
            raise UserError(msg.text)
        if isinstance(msg, Failed):
            raise WorkerDied(f"the worker process failed:\n{msg.text}")
        if not isinstance(msg, want):
            raise WorkerDied(f"the worker process sent {type(msg).__name__} where "
                             f"{want.__name__} was expected")
        return msg

    def configure(self, run: RunConfig) -> None:
        self._send(run)
        self._recv(Configured, max(self.step_timeout_s, CONFIGURE_TIMEOUT_S))

    def execute(self, msg: StepMsg):
        self._send(msg)
        self.in_flight += 1
        return msg.step

    def collect(self, step: int) -> StepResult:
        res = self._recv(StepResult, self.step_timeout_s, watch=True)
        self.in_flight -= 1
        if res.step != step:
            raise WorkerDied(f"the worker answered step {res.step} where step {step} was due")
        return res

    def close(self) -> None:
        if self._affinity is not None:
            os.sched_setaffinity(0, self._affinity)
            self._affinity = None
        state = cpu_state(self.proc.pid) if self.proc.is_alive() else None
        if state and state[0] in "Tt":   # stopped: it would take no message, no SIGTERM
            self.proc.kill()
        if self.proc.is_alive():
            try:
                self.conn.send(Close())
            except (OSError, BrokenPipeError):
                pass
            self.proc.join(5.0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2.0)
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_executor(kind: str, spec: WorkerSpec, pin: bool = True):
    if kind == "inline":
        return InlineExecutor(spec)
    if kind == "process":
        return ProcessExecutor(spec, pin=pin)
    raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")
