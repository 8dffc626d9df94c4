"""Spans of vLLM's engine core and API server, which its torch profiler does not trace.

vLLM 0.32's profiler writes the worker's and the API server's traces only; the engine core
(schedule, update_from_output, the waits on the worker) is never recorded, and with the Python
tracer off the API server's output processing is not either. This module, loaded in every
process of the vLLM venv by a .pth file (`make vllm`), records those as stepgap spans when
SG_VLLM_TRACE names a folder, and does nothing otherwise:

    engine core   cpu.engine   schedule, update_from_output (args: reqs, tokens),
                               add_request (a request taken off the input queue),
                               wait (blocked on the worker: args.on names the RPC)
    API server    cpu.frontend add_request (tokenize and hand to the engine core),
                               process_outputs (detokenize one step's outputs; args: reqs)
    worker        cpu.worker   op "vllm": vLLM's own scopes, args.vllm their names: the
                               execute_model RPC as the profiler names it
                               (execute_context_N(T)_generation_M(T)), every
                               `gpu_model_runner: ...` scope, and each EAGLE pass
                               ("draft pass", its forward context)

The worker's spans make the same timeline as its torch-profiler trace (calibrate/vllm.py reads
either), without the profiler, whose per-op recording slows a CPU step noticeably.

Times are wall-clock epoch microseconds (time.time), the clock of the torch profiler's traces
(`ts` + baseTimeNanoseconds / 1000), so calibrate/vllm.py merges both into one timeline. Each
process writes SG_VLLM_TRACE/<pid>.jsonl, one JSON span per line. The patches wrap vLLM's
functions after their modules are first imported (a meta-path finder), so nothing is imported
early and nothing changes when the variable is unset.
"""
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

DIR = os.environ.get("SG_VLLM_TRACE")


class _Spans:
    """The process's span file, written through a buffer and flushed at most 4 times a second
    (a per-span write would add a system call to every scope of every step)."""

    def __init__(self, folder):
        self.folder, self.f, self.flushed = folder, None, 0.0

    def add(self, lane, op, t0, t1, args=None):
        if self.f is None:   # opened at the first span: helper processes write no file
            os.makedirs(self.folder, exist_ok=True)
            self.f = open(os.path.join(self.folder, f"{os.getpid()}.jsonl"), "a")
        self.f.write(f'{{"lane": "{lane}", "op": "{op}", "start_us": {t0 * 1e6:.1f}, '
                     f'"end_us": {t1 * 1e6:.1f}, "args": {json.dumps(args) if args else "{}"}}}\n')
        if t1 - self.flushed > 0.25:   # a server stopped by a signal keeps all but the last
            self.f.flush()
            self.flushed = t1

    def flush(self):
        if self.f is not None:
            self.f.flush()


SPANS = None


def _timed(lane, op, args_of=None, after=None):
    """Wrap a function into one span; `args_of(args, result)` gives the span's args."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*a, **kw):
            t0 = time.time()
            try:
                out = fn(*a, **kw)
            finally:
                t1 = time.time()
            try:
                SPANS.add(lane, op, t0, t1, args_of(a, out) if args_of else None)
            except Exception:  # a recording problem must never break the server
                pass
            return out
        return inner
    return wrap


def _sched_args(a, out):
    return {"reqs": len(out.num_scheduled_tokens), "tokens": out.total_num_scheduled_tokens}


def _update_args(a, out):
    so = a[1]
    return {"reqs": len(so.num_scheduled_tokens), "tokens": so.total_num_scheduled_tokens}


def _patch_scheduler(mod):
    cls = mod.Scheduler
    cls.schedule = _timed("cpu.engine", "schedule", _sched_args)(cls.schedule)
    cls.update_from_output = _timed("cpu.engine", "update_from_output",
                                    _update_args)(cls.update_from_output)


def _patch_core(mod):
    import threading
    from concurrent.futures import Future
    core = mod.EngineCore
    orig_result = Future.result
    main = threading.main_thread()

    def result(self, *a, **kw):   # the engine loop blocked on a worker RPC's future
        t0 = time.time()
        out = orig_result(self, *a, **kw)
        t1 = time.time()
        if t1 - t0 > 20e-6 and threading.current_thread() is main:
            SPANS.add("cpu.engine", "wait", t0, t1, {"on": "worker"})
        return out
    Future.result = result
    orig_post = core.post_step

    @functools.wraps(orig_post)
    def post_step(self, *a, **kw):   # sync with drafts: the take_draft_token_ids round trip
        t0 = time.time()
        out = orig_post(self, *a, **kw)
        t1 = time.time()
        if t1 - t0 > 20e-6:
            SPANS.add("cpu.engine", "wait", t0, t1, {"on": "take_draft_token_ids"})
        return out
    core.post_step = post_step
    for cls in (mod.EngineCore, getattr(mod, "EngineCoreProc", None)):
        if cls is not None and "_handle_client_request" in cls.__dict__:
            cls._handle_client_request = _timed("cpu.engine", "add_request", lambda a, out: {
                "type": str(getattr(a[1], "name", a[1]))})(cls._handle_client_request)


def _patch_output_processor(mod):
    cls = mod.OutputProcessor
    cls.process_outputs = _timed("cpu.frontend", "process_outputs",
                                 lambda a, out: {"reqs": len(a[1])})(cls.process_outputs)


def _patch_async_llm(mod):
    cls = mod.AsyncLLM
    orig = cls.add_request

    @functools.wraps(orig)
    async def add_request(self, *a, **kw):
        t0 = time.time()
        try:
            return await orig(self, *a, **kw)
        finally:
            SPANS.add("cpu.frontend", "add_request", t0, time.time())
    cls.add_request = add_request


def _patch_worker(mod):
    from vllm.v1.utils import compute_iteration_details
    cls = mod.Worker

    def name_of(a, out):
        d = compute_iteration_details(a[1])
        return {"vllm": f"execute_context_{d.num_ctx_requests}({d.num_ctx_tokens})_generation_"
                        f"{d.num_generation_requests}({d.num_generation_tokens})"}
    cls.execute_model = _timed("cpu.worker", "vllm", name_of)(cls.execute_model)


class _Scope:
    """vLLM's `record_function_or_nullcontext(name)`, recorded; still the torch profiler's
    record_function when VLLM_CUSTOM_SCOPES_FOR_PROFILING asks for it."""

    def __init__(self, name, inner):
        self.name, self.inner = name, inner

    def __enter__(self):
        self.t0 = time.time()
        return self.inner.__enter__()

    def __exit__(self, *exc):
        out = self.inner.__exit__(*exc)
        SPANS.add(_lane(), "vllm", self.t0, time.time(), {"vllm": self.name})
        return out


_LANE = None


def _lane():
    """The lane of this process's own scopes: the worker's, or the engine core's (which has
    `schedule: ...` scopes of its own), by the process title vLLM gives them."""
    global _LANE
    if _LANE is None:
        try:
            comm = open("/proc/self/comm").read()
        except OSError:
            comm = ""
        _LANE = "cpu.engine" if "EngineCor" in comm else "cpu.worker"
    return _LANE


def _patch_utils(mod):
    import contextlib
    inner = contextlib.nullcontext
    if os.environ.get("VLLM_CUSTOM_SCOPES_FOR_PROFILING") == "1":
        from torch.autograd.profiler import record_function as inner
    mod._PROFILER_FUNC = lambda name: _Scope(name, inner(name))


def _patch_proposer(mod):
    orig = mod.set_forward_context

    def set_forward_context(*a, **kw):   # one per EAGLE pass: the draft model's forward
        return _Scope("draft pass", orig(*a, **kw))
    mod.set_forward_context = set_forward_context


PATCHES = {
    "vllm.v1.utils": _patch_utils,
    "vllm.v1.worker.gpu_worker": _patch_worker,
    "vllm.v1.spec_decode.llm_base_proposer": _patch_proposer,
    "vllm.v1.core.sched.scheduler": _patch_scheduler,
    "vllm.v1.engine.core": _patch_core,
    "vllm.v1.engine.output_processor": _patch_output_processor,
    "vllm.v1.engine.async_llm": _patch_async_llm,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        try:
            self.patch(module)
        except Exception as e:  # an unexpected vLLM: say so once, leave it unpatched
            print(f"stepgap_hooks: {module.__name__} not patched: {e!r}", file=sys.stderr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, patch)
        return spec


if DIR:
    import atexit
    SPANS = _Spans(DIR)
    atexit.register(SPANS.flush)
    sys.meta_path.insert(0, _Finder())
