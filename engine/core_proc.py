"""The engine core in a process of its own, serving requests as they come (vLLM's EngineCoreProc).

`stepgap serve` runs three processes, as `vllm serve` does: the HTTP front end
(engine/api_server.py), this engine core (the scheduler and the step loop), and, with
`--executor process`, the worker; with `--executor inline` the worker runs here. The front end
and the engine core talk over two pipes, one message each way per event, each a class of
engine/core_messages.py: `AddRequest`, `Abort`, `DumpSpans` and `Shutdown` in; `Ready`,
`StepOutputs` after every step, `Idle`, `Rejected`, `SpansDump`, `Failed` and `Bye` out.

The step loop is engine/loop.py's `step_loop`, unchanged: `ServedClient` stands where the
benchmark client stands. Between steps it hands the requests and aborts that came to the
scheduler; after each step it sends that step's chunks; when nothing is in flight it blocks
until a message comes. A reader thread takes messages off the pipe as they arrive (vLLM's
engine core has one too), so the front end never blocks on a full pipe, whatever the step
loop is doing.
"""

from __future__ import annotations

import gc
import os
import queue
import signal
import threading
import traceback

from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest
from stepgap.common.scheduler import EngineCoreOutput
from stepgap.engine.core_messages import (Abort, AddRequest, Bye, Chunk, DumpSpans,
                                          EngineStats, Failed, Idle, Ready, Rejected,
                                          Shutdown, SpansDump, SpecCounts, StepOutputs, ToCore)
from stepgap.engine.executor import exit_now
from stepgap.engine.loop import EngineCore, step_loop
from stepgap.engine.worker import RunConfig

IDLE_POLL_S = 0.5   # how often an idle engine checks that the front end is still there


class ServedClient:
    """The front end, as the step loop sees it (engine/loop.py's Client interface)."""

    def __init__(self, core: EngineCore, inbox: queue.SimpleQueue, out, record: bool,
                 parent_pid: int):
        self.core, self.inbox, self.out = core, inbox, out
        self.record, self.parent_pid = record, parent_pid
        self.shutdown = False
        self.seen = 0               # core.spans already looked at
        self.last_device_end = None
        self.idled = True           # the engine waited for work since the last step

    @property
    def done(self) -> bool:
        return self.shutdown

    def send_due(self, core: EngineCore, at=None) -> None:
        """Every message that came since the last look, in order."""
        while not self.inbox.empty():
            self.handle(self.inbox.get())

    def wait_for_arrival(self) -> None:
        """Nothing in flight, nothing to schedule: say so (the gauges then show what aborts
        freed), and block until the front end says something."""
        if self.shutdown:   # told to stop by the messages of this very iteration
            return
        self.idled = True
        self.out.send(Idle(self.stats()))
        while True:
            try:
                msg = self.inbox.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                if os.getppid() != self.parent_pid:
                    msg = Shutdown()   # the front end is gone
                else:
                    continue
            self.handle(msg)
            return

    def handle(self, msg: ToCore) -> None:
        core = self.core
        match msg:
            case AddRequest(rid, ids, max_tokens, eos):
                try:
                    core.add(TraceRequest(rid, 0.0, len(ids), max_tokens, ids), eos)
                except UserError as e:
                    self.out.send(Rejected(rid, str(e)))
            case Abort(rid):
                core.sched.abort_request(rid)
                core.accepted.pop(rid, None)
            case DumpSpans(token):
                spans = core.spans + core.host.take()
                core.spans, self.seen = [], 0
                self.out.send(SpansDump(token, spans))
            case Shutdown():
                for rid in list(core.sched.requests):
                    core.sched.abort_request(rid)
                self.shutdown = True

    def receive(self, core: EngineCore, emitted: list[EngineCoreOutput], step: int) -> None:
        """One step's chunks, to the front end, with the scheduler's state after it."""
        chunks = []
        for o in emitted:
            chunks.append(Chunk(o.request.request_id, o.new_token_ids, o.finished))
            if o.finished:
                core.accepted.pop(o.request.request_id, None)
        self.out.send(StepOutputs(step, chunks, self.step_gap(core), self.stats()))

    def stats(self) -> EngineStats:
        s = self.core.sched
        return EngineStats(len(s.running), len(s.waiting), s.num_free_blocks, s.num_preemptions,
                           SpecCounts.of(self.core.spec), s.prefix_cache_queries,
                           s.prefix_cache_hits)

    def step_gap(self, core: EngineCore) -> float | None:
        """The device idle time before the step just collected (µs, docs/explanation/design.md §2),
        or None after the engine had waited for work: that idle is the clients', not the loop's."""
        first = last = None
        for sp in core.spans[self.seen:]:
            if sp.lane == "device":
                first = sp.start_us if first is None else min(first, sp.start_us)
                last = sp.end_us if last is None else max(last, sp.end_us)
        if self.record:
            self.seen = len(core.spans)
        else:       # keep nothing: a server runs for days
            core.spans.clear()
            core.host.take()
        if first is None:
            return None
        gap = None if self.idled or self.last_device_end is None else \
            max(0.0, first - self.last_device_end)
        self.last_device_end, self.idled = last, False
        return gap


def _read_pipe(conn, inbox: queue.SimpleQueue) -> None:
    """The reader thread: every message into the inbox; a closed pipe means shut down."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        inbox.put(Shutdown())


def engine_core_main(conn_in, conn_out, engine_args, record: bool, parent_pid: int) -> None:
    """The engine core process: build the worker, serve until told to stop, close the worker,
    and leave without the interpreter's slow teardown (engine/executor.py `exit_now`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the front end handles Ctrl-C and stops us
    _engine_core(conn_in, conn_out, engine_args, record, parent_pid)
    exit_now()


def _tell(conn_out, msg) -> None:
    """Send the front end a last message, if it is still there to read it."""
    try:
        conn_out.send(msg)
    except OSError:   # BrokenPipeError: it is gone (SIGKILL), so nobody is told
        pass


def _engine_core(conn_in, conn_out, engine_args, record: bool, parent_pid: int) -> None:
    try:
        setup = engine_args.create_engine_config()
        executor = setup.make_executor()
    except UserError as e:
        _tell(conn_out, Failed(str(e)))
        return
    except BaseException:
        _tell(conn_out, Failed(f"the engine failed to start:\n{traceback.format_exc()}"))
        return
    with executor:
        try:
            serve(executor, setup, conn_in, conn_out, record, parent_pid)
        except (BrokenPipeError, ConnectionResetError):   # the front end is gone (SIGKILL,
            pass                                          # the OOM killer): stop quietly
        except UserError as e:
            _tell(conn_out, Failed(str(e)))
        except Exception as e:   # a dead worker (WorkerDied), an engine bug
            _tell(conn_out, Failed(f"{type(e).__name__}: {e}"))


def serve(executor, setup, conn_in, conn_out, record: bool, parent_pid: int) -> None:
    cfg = setup.engine_config()
    core = EngineCore(executor, cfg, [], setup.vocab_size, setup.args.seed)
    executor.configure(RunConfig(cfg.mode, cfg.k, cfg.sampling))
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_pipe, args=(conn_in, inbox), name="engine-input",
                     daemon=True).start()
    client = ServedClient(core, inbox, conn_out, record, parent_pid)
    info = {**executor.info(), "engine_pid": os.getpid(),
            "worker_pid": getattr(executor, "pid", os.getpid()),
            "num_blocks": cfg.num_blocks}
    # What start-up built (models, cache) stays out of the cyclic collector, as vLLM's engine core
    # freezes it: a full collection over it stalls the step loop (docs/explanation/engine.md,
    # Traps).
    gc.collect()
    gc.freeze()
    conn_out.send(Ready(info))
    step_loop(core, client)
    conn_out.send(Bye())
