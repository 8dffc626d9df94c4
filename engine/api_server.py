"""The HTTP front end of `stepgap serve`: FastAPI + uvicorn, as vLLM's API server.

This process tokenizes, hands requests to the engine core (engine/core_proc.py, a process of
its own), detokenizes what each step gives back, and streams it. `EngineClient` is its side of
the two pipes: the outputs pipe is read by the event loop itself (`loop.add_reader`), so a
step's chunks reach their streams as soon as the step's message lands.

- a request arrives: its body is parsed and checked (engine/protocol.py), its prompt tokenized
  and checked against the vocabulary, --max-model-len and the KV cache, and it is sent to the
  engine core (`add_request` on the `cpu.frontend` lane of the timeline);
- a step's message lands: every chunk in it is detokenized (engine/tokenizer.py) and put on
  its request's queue (`process_outputs`); the request's handler takes it off, times it (its
  TTFT and ITL, as the server sees them) and writes it out (`stream`): one SSE chunk per step;
- a client goes away mid-request: its requests are aborted, and the engine core frees their KV
  blocks before its next step;
- the engine core dies (or its worker: the engine core then reports and exits): /health answers
  503, requests in flight end with an error, new ones get a 503;
- SIGINT or SIGTERM: every stream in flight ends at once with an error chunk, uvicorn closes
  the connections, the timeline and run result are written, and the engine core is stopped
  (then terminated, then killed) within a few seconds.

With --timeline or --result-json the served traffic is recorded from start-up, or from the last
`POST /start_profile`, to shutdown or `POST /stop_profile` (which writes both files): the
endpoints `vllm bench serve --profile` calls around its measured run, so that a served run's
timeline and result bracket exactly the benchmark's requests.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp
import os
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from stepgap.common.cpu_load import cpu_state
from stepgap.common.errors import UserError
from stepgap.common.formats import (RequestTiming, Span, save_chrome_trace,
                            save_result, save_timeline, step_gaps)
from stepgap.common.limits import MAX_BODY_BYTES, MAX_HTTP_HEAD_BYTES, MAX_URL_BYTES
from stepgap.common.run_result import RunResult
from stepgap.engine.core_messages import (Abort, AddRequest, Bye, DumpSpans, Failed, FromCore,
                                          Idle, Ready, Rejected, Shutdown, SpansDump,
                                          SpecCounts, StepOutputs)
from stepgap.engine.core_proc import engine_core_main
from stepgap.engine.metrics import CONTENT_TYPE, Metrics
from stepgap.engine.protocol import (SSE_DONE, APIError, ChatCompletionRequest, CompletionRequest,
                             Shapes, check_sampling, completion_prompts, message_text, new_id,
                             parse, sse, usage)
from stepgap.engine.tokenizer import Detokenizer, ServedTokenizer

START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 3.0
# The watchdog (EngineClient.watch): an engine core that, with requests due, has sent nothing
# while it and its worker used no CPU for this long is stuck (stopped, deadlocked) and is ended
# as a dead one is: /health 503, its requests fail; a stopped one (SIGSTOP) is reported by
# /health at once. A step of this engine is milliseconds; a loaded machine stalls a second.
ENGINE_STUCK_S = 15.0
WATCH_S = 1.0
INLINE_CHARS = 1 << 16   # a text longer than this is tokenized off the event loop
DRAIN_BYTES = 16 * MAX_BODY_BYTES   # a refused body is read (and dropped) up to this much, so
                                    # that its client gets the 413 rather than a reset


class EngineError(Exception):
    """The engine core failed (or was told to stop) while a request was in flight."""


@dataclass(eq=False)
class Sub:
    """One engine request: one prompt of an HTTP request (one choice)."""

    batch: "Choices"
    index: int
    rid: str
    prompt_len: int
    max_tokens: int
    timing: RequestTiming
    detok: Detokenizer
    finished: bool = False
    num_tokens: int = 0
    last_s: float = 0.0          # when its last chunk went out (front-end clock, seconds)
    reason: str | None = None
    eos: int | None = None       # the token it stops at (None: ignore_eos)


@dataclass(eq=False)
class Choices:
    """One HTTP request's choices and the queue their chunks come through."""

    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    subs: list[Sub] = field(default_factory=list)

    @property
    def unfinished(self) -> int:
        return sum(not s.finished for s in self.subs)


class EngineClient:
    """The front end's side of the engine core: start it, feed it, read it, stop it."""

    def __init__(self, engine_args, tokenizer: ServedTokenizer | None, model_name: str,
                 record: bool):
        self.ea, self.tok, self.model_name, self.record = engine_args, tokenizer, model_name, record
        self.cfg = engine_args.engine_config()
        self.sched_cfg = self.cfg.scheduler_config()
        self.vocab_size = engine_args.target_config().vocab_size
        self.metrics = Metrics(model_name, self.cfg.k, self.cfg.max_model_len,
                               self.cfg.num_blocks)
        self.subs: dict[str, Sub] = {}
        self.dead: str | None = None
        self.stopping = False
        self.saved = False      # a window was written (a /stop_profile)
        self.info: dict = {}
        self.spec = SpecCounts(accepted_per_pos=(0,) * self.cfg.k)   # the engine's, cumulative
        self._dumps: dict[int, asyncio.Future] = {}
        self._next_dump = 0
        self.heard = time.monotonic()       # the engine core's last message
        self.save_error: str | None = None  # the recorded run could not be written at shutdown
        self.reset_window()

    # -- the engine core process --------------------------------------------------------------

    def start(self) -> None:
        """Spawn the engine core and wait until its worker is built."""
        ctx = mp.get_context("spawn")
        child_in, self.conn_in = ctx.Pipe(duplex=False)      # engine reads, we write
        self.conn_out, child_out = ctx.Pipe(duplex=False)    # we read, engine writes
        self.proc = ctx.Process(target=engine_core_main, name="stepgap-engine-core",
                                args=(child_in, child_out, self.ea, self.record, os.getpid()))
        self.proc.start()
        child_in.close()
        child_out.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.conn_out.poll(0.1):
            if not self.proc.is_alive():
                raise UserError(f"the engine core (pid {self.proc.pid}) exited with code "
                                f"{self.proc.exitcode} while starting")
            if time.monotonic() > deadline:
                raise UserError(f"the engine core sent nothing for {START_TIMEOUT_S:.0f} s")
        try:
            msg = self.conn_out.recv()
        except EOFError:
            raise UserError("the engine core exited while starting") from None
        if not isinstance(msg, Ready):
            raise UserError(msg.message if isinstance(msg, Failed) else
                            f"the engine core sent {type(msg).__name__} while starting")
        self.info = msg.info

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the engine's messages from the event loop, as they come; watch the engine."""
        self.loop = loop
        loop.add_reader(self.conn_out.fileno(), self._on_readable)
        self._watch = loop.create_task(self.watch())

    def _pids(self) -> list[int]:
        pids = [self.info.get("engine_pid"), self.info.get("worker_pid")]
        return list(dict.fromkeys(p for p in pids if p is not None))

    def stopped(self) -> str | None:
        """Which of the engine's processes is stopped (SIGSTOP, a debugger), if one is."""
        for pid, who in zip(self._pids(), ("engine core", "worker")):
            state = cpu_state(pid)
            if state is not None and state[0] in "Tt":
                return f"the {who} (pid {pid}) is stopped"
        return None

    async def watch(self) -> None:
        """The watchdog: with requests due, an engine core that sends nothing while it and its
        worker use no CPU for ENGINE_STUCK_S is stuck; it is killed and ended as a dead one
        (its worker follows it), so that no request waits on it for ever."""
        cpu, progress = None, time.monotonic()
        while not self.dead and not self.stopping:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            states = [cpu_state(p) for p in self._pids()]   # None where there is no /proc
            used = sum(st[1] for st in states) if all(states) else None
            if used != cpu or not self.subs:
                progress = now
            cpu, progress = used, max(progress, self.heard)
            if now - progress > ENGINE_STUCK_S and not self.dead:
                why = self.stopped() or "the engine core sent nothing and its processes used " \
                    "no CPU"
                if self.proc is not None and self.proc.is_alive():
                    self.proc.kill()
                self._on_dead(f"{why} for {ENGINE_STUCK_S:.0f} s while requests were due; "
                              "it was ended (the server must be restarted)")

    def stop(self) -> None:
        """Stop the engine core: ask, then terminate, then kill. Idempotent."""
        self.stopping = True
        proc = getattr(self, "proc", None)
        if proc is None:
            return
        loop = getattr(self, "loop", None)
        if loop is not None and not loop.is_closed():
            try:
                loop.remove_reader(self.conn_out.fileno())
            except (ValueError, OSError):
                pass
        if proc.is_alive():
            try:
                self.conn_in.send(Shutdown())
            except (OSError, BrokenPipeError):
                pass
            proc.join(STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.terminate()
            proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join(2.0)
        self.conn_in.close()
        self.conn_out.close()
        self.proc = None

    def _send(self, msg) -> None:
        try:
            self.conn_in.send(msg)
        except (OSError, BrokenPipeError):
            self._on_dead("the engine core's pipe is closed")

    # -- requests ---------------------------------------------------------------------------

    async def tokenize(self, prompts: list, field_name: str = "prompt",
                       add_special_tokens: bool = True) -> list[list[int]]:
        """Every prompt's token ids, checked (prompt_ids). A text longer than any of
        --max-model-len tokens can be is refused before it is tokenized; one longer than
        INLINE_CHARS is tokenized off the event loop, which serves on meanwhile."""
        out = []
        for prompt in prompts:
            if isinstance(prompt, str) and self.tok is not None:
                limit = self.tok.max_chars(self.cfg.max_model_len)
                if len(prompt) > limit:
                    raise APIError(f"{field_name}: {len(prompt)} characters, more than "
                                   f"{self.cfg.max_model_len} tokens (--max-model-len) of at "
                                   f"most {self.tok.longest_token} characters each can hold",
                                   field_name)
                if len(prompt) > INLINE_CHARS:
                    prompt = await asyncio.to_thread(self.tok.encode, prompt,
                                                     add_special_tokens)
            out.append(self.prompt_ids(prompt, field_name, add_special_tokens))
        return out

    def prompt_ids(self, prompt, field_name: str, add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            if self.tok is None:
                raise APIError(f"{field_name}: this model has no tokenizer (no tokenizer.json "
                               "beside it): give the prompt as token ids", field_name)
            ids = self.tok.encode(prompt, add_special_tokens)
        else:
            ids = list(prompt)
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise APIError(f"{field_name}: token id {bad[0]} is outside the vocabulary "
                               f"(0..{self.vocab_size - 1})", field_name)
        if not ids:
            raise APIError(f"{field_name}: the prompt is empty", field_name)
        limit = self.cfg.max_model_len
        if len(ids) >= limit:
            raise APIError(f"{field_name}: this model's maximum context length is {limit} "
                           f"tokens (--max-model-len); the prompt has {len(ids)}, which leaves "
                           "no room for output", field_name)
        return ids

    def check_alive(self) -> None:
        if self.dead:
            raise APIError(f"the engine is dead: {self.dead}", status=503)
        if self.stopping:
            raise APIError("the server is shutting down", status=503)

    def submit(self, all_ids: list[list[int]], max_tokens: int | None, ignore_eos: bool,
               arrival_ns: int, field_name: str = "prompt") -> Choices:
        """Hand checked prompts (tokenize) to the engine (add_request)."""
        self.check_alive()
        batch, base = Choices(), new_id("req")
        eos = None if ignore_eos or self.tok is None else self.tok.eos_token_id
        plans = []
        for i, ids in enumerate(all_ids):
            n = self.cfg.max_model_len - len(ids)   # as vLLM: what the context leaves
            n = n if max_tokens is None else min(max_tokens, n)
            rid = f"{base}-{i}"
            try:
                self.sched_cfg.check_fits(rid, len(ids), n)
            except UserError as e:
                raise APIError(f"{field_name}: {e}", field_name) from None
            plans.append((rid, ids, n))
        for i, (rid, ids, n) in enumerate(plans):
            timing = RequestTiming(rid, len(ids), (arrival_ns - self.t0_ns) / 1e9)
            sub = Sub(batch, i, rid, len(ids), n, timing, Detokenizer(self.tok),
                      last_s=timing.send_s, eos=eos)
            batch.subs.append(sub)
            self.subs[rid] = sub
            self._send(AddRequest(rid, ids, n, eos))
        if self.record:
            self.spans.append(Span("cpu.frontend", "add_request", -1,
                                   (arrival_ns - self.t0_ns) / 1e3, self._now_us(),
                                   {"reqs": len(plans), "tokens": sum(map(len, all_ids))}))
        return batch

    def release(self, batch: Choices) -> None:
        """A request is done with: abort whatever of it the engine still holds."""
        for sub in batch.subs:
            if not sub.finished:
                sub.finished, sub.reason = True, "abort"
                if self.subs.pop(sub.rid, None) is not None and not self.dead:
                    self._send(Abort(sub.rid))
                self.metrics.on_finish("abort", sub.prompt_len, sub.num_tokens, 0.0, 0.0)
                self.num_aborted += 1

    def fail(self, sub: Sub, error: Exception) -> None:
        """A request the engine refused or lost: it ends with an error."""
        self.subs.pop(sub.rid, None)
        sub.finished, sub.reason = True, "error"
        self.metrics.on_finish("error", sub.prompt_len, sub.num_tokens, 0.0, 0.0)
        sub.batch.queue.put_nowait(error)

    def end_all(self, message: str) -> None:
        """End every request in flight with an error (shutdown)."""
        self.stopping = True
        for sub in list(self.subs.values()):
            sub.batch.queue.put_nowait(EngineError(message))

    def took(self, sub: Sub, num_tokens: int, finish: str | None) -> None:
        """A chunk goes out now: time it (the served run's TTFT, ITL) and count it."""
        now = self._now_s()
        first = sub.num_tokens == 0
        self.metrics.on_chunk(num_tokens, now - sub.last_s, first, sub.prompt_len)
        sub.timing.add_chunk(now, num_tokens)
        sub.num_tokens += num_tokens
        sub.last_s = now
        if finish is not None:
            sub.finished, sub.reason = True, finish
            t = sub.timing
            self.metrics.on_finish(finish, sub.prompt_len, sub.num_tokens, now - t.send_s,
                                   now - t.chunk_s[0])
            if self.record:
                self.timings.append(t)
            self.last_done = max(self.last_done, now)

    # -- what the engine says ---------------------------------------------------------------

    def _on_readable(self) -> None:
        self.heard = time.monotonic()
        try:
            while self.conn_out.poll():
                self._on_message(self.conn_out.recv())
        except (EOFError, OSError):
            self.loop.remove_reader(self.conn_out.fileno())
            code = self.proc.exitcode if self.proc is not None else None
            self._on_dead(f"the engine core (pid {self.info.get('engine_pid')}) exited"
                          + (f" with code {code}" if code is not None else ""))

    def _on_message(self, msg: FromCore) -> None:
        match msg:
            case StepOutputs():
                self._on_step(msg)
            case Idle(stats):
                self.spec = stats.spec
                self.metrics.on_step(stats, None)
            case Rejected(rid, message):
                sub = self.subs.get(rid)
                if sub is not None:
                    self.fail(sub, APIError(message))
            case SpansDump(token, spans):
                fut = self._dumps.pop(token, None)
                if fut is not None and not fut.done():
                    fut.set_result(spans)
            case Failed(message):
                self._on_dead(message)
            case Bye():
                pass

    def _on_step(self, out: StepOutputs) -> None:
        """One step's chunks: detokenize each and hand it to its request (process_outputs)."""
        t0, step = self._now_us(), out.step
        for rid, new, finished in out.chunks:
            sub = self.subs.get(rid)
            if sub is None:
                continue   # aborted while the step ran
            text = sub.detok.step(new)
            reason = None
            if finished:
                del self.subs[rid]
                text += sub.detok.finish()
                reason = "stop" if sub.eos is not None and new and new[-1] == sub.eos \
                    else "length"
            sub.batch.queue.put_nowait((sub, text, new, reason, step))
        self.spec = out.stats.spec
        self.metrics.on_step(out.stats, out.gap_us)
        if out.chunks and self.record:
            self.spans.append(Span("cpu.frontend", "process_outputs", step, t0, self._now_us(),
                                   {"reqs": len(out.chunks)}))

    def _on_dead(self, message: str) -> None:
        if self.dead:
            return
        self.dead = message
        print(f"stepgap serve: error: {message}", file=sys.stderr)
        for fut in self._dumps.values():
            if not fut.done():
                fut.set_result([])
        for sub in list(self.subs.values()):
            self.fail(sub, EngineError(f"the engine is dead: {message}"))

    # -- the recorded window: timeline and run result ----------------------------------------

    def _now_us(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e3

    def _now_s(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9

    def reset_window(self) -> None:
        """Start recording afresh (start-up, /start_profile)."""
        old_t0 = getattr(self, "t0_ns", None)
        self.t0_ns = time.perf_counter_ns()
        if old_t0 is not None:   # requests in flight keep their times, on the new clock
            shift = (self.t0_ns - old_t0) / 1e9
            for sub in self.subs.values():
                t = sub.timing
                t.send_s -= shift
                t.chunk_s[:] = [c - shift for c in t.chunk_s]
                sub.last_s -= shift
        self.spans: list[Span] = []
        self.timings: list[RequestTiming] = []
        self.num_aborted = 0
        self.last_done = 0.0
        self.spec_at_t0 = self.spec

    async def engine_spans(self) -> list[Span]:
        """The engine core's spans since the last ask (and it forgets them)."""
        if self.dead or self.proc is None:
            return []
        token, self._next_dump = self._next_dump, self._next_dump + 1
        fut = self.loop.create_future()
        self._dumps[token] = fut
        self._send(DumpSpans(token))
        try:
            return await asyncio.wait_for(fut, 5.0)
        except asyncio.TimeoutError:
            return []

    async def save(self, timeline: str | None, result_json: str | None, config: dict) -> None:
        """Write the window's timeline and run result, then start a new window. A write that
        fails (a full disk) raises UserError naming the file and keeps the window, the engine's
        spans taken for it included, for the next try."""
        t0_us = self.t0_ns / 1e3
        self.spans += [s._replace(start_us=s.start_us - t0_us, end_us=s.end_us - t0_us)
                       for s in await self.engine_spans()]
        spans = sorted((s for s in self.spans if s.end_us >= 0),
                       key=lambda s: (s.start_us, s.end_us))
        if timeline:
            save_timeline(timeline, spans)
            save_chrome_trace(chrome_path(timeline), spans, "stepgap serve")
        if result_json:
            save_result(result_json, self.window_result(spans, config))
        self.saved = True
        self.reset_window()

    async def save_at_exit(self, timeline: str | None, result_json: str | None,
                           config: dict) -> None:
        """The last window, at shutdown. Where its files cannot be written, they go to a
        folder of the temporary directory instead, and `save_error` says where (or that they
        are lost): a shutdown never fails half way."""
        try:
            await self.save(timeline, result_json, config)
            return
        except UserError as e:
            why = str(e)
        import tempfile
        folder = Path(tempfile.gettempdir()) / f"stepgap-serve-{os.getpid()}"
        try:
            await self.save(timeline and str(folder / Path(timeline).name),
                            result_json and str(folder / Path(result_json).name), config)
            self.save_error = f"{why}; the served run is in {folder}/ instead"
        except UserError as e:
            self.save_error = f"{why}; the served run is lost ({e})"

    def window_result(self, spans: list[Span], config: dict) -> RunResult:
        timings = sorted(self.timings, key=lambda t: t.send_s)
        first = timings[0].send_s if timings else 0.0
        spec = self.spec.since(self.spec_at_t0, self.cfg.k) if self.cfg.k else None
        return RunResult.build(timings, max(self.last_done - first, 0.0),
                               backend="stepgap-serve",
                               config={**config, "aborted": self.num_aborted},
                               gaps_us=step_gaps(spans), spec=spec, detailed=True)


# ---------------------------------------------------------------------------------------------
# The app


def build_app(engine: EngineClient, model_name: str, sampling, *, timeline=None,
              result_json=None, config: dict | None = None):
    config = dict(config or {})
    recording = bool(timeline or result_json)

    @asynccontextmanager
    async def lifespan(app):
        engine.attach(asyncio.get_running_loop())
        try:
            yield
        finally:
            # the last window, unless it is an empty one after a /stop_profile (which would
            # overwrite the run that call saved)
            if recording and (engine.timings or engine.subs or not engine.saved):
                await engine.save_at_exit(timeline, result_json, config)
            engine.stop()

    app = FastAPI(title="stepgap serve", lifespan=lifespan, docs_url=None, redoc_url=None)

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(f"The model `{name}` does not exist.", "model", status=404)

    async def answer(raw: Request, batch: Choices, shapes: Shapes, stream: bool,
                     include_usage: bool):
        if stream:
            return StreamingResponse(stream_chunks(batch, shapes, include_usage),
                                     media_type="text/event-stream")
        task = asyncio.ensure_future(collect(batch, shapes))
        gone = asyncio.ensure_future(disconnected(raw))
        try:
            done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():    # the client went away (or the server stops): stop it
                task.cancel()
                engine.release(batch)
        if task not in done:
            return Response(status_code=499)   # nobody is there to read it
        try:
            return JSONResponse(task.result())
        except APIError as e:
            return error(e)
        except EngineError as e:
            return error(APIError(str(e), status=500 if engine.dead else 503))

    async def disconnected(raw: Request) -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    async def collect(batch: Choices, shapes: Shapes) -> dict:
        texts = {s.index: [] for s in batch.subs}
        ids = {s.index: [] for s in batch.subs}
        try:
            while batch.unfinished:
                item = await batch.queue.get()
                if isinstance(item, Exception):
                    raise item
                sub, text, new, finish, _ = item
                engine.took(sub, len(new), finish)
                texts[sub.index].append(text)
                ids[sub.index] += new
        finally:
            engine.release(batch)
        choices = [("".join(texts[s.index]), ids[s.index], s.reason) for s in batch.subs]
        return shapes.whole(choices, usage(sum(s.prompt_len for s in batch.subs),
                                           sum(s.num_tokens for s in batch.subs)))

    async def stream_chunks(batch: Choices, shapes: Shapes, include_usage: bool):
        try:
            started = set()
            while batch.unfinished:
                item = await batch.queue.get()
                if isinstance(item, Exception):
                    e = item if isinstance(item, APIError) else \
                        APIError(str(item), status=500 if engine.dead else 503)
                    yield sse(e.body())
                    break
                sub, text, new, finish, step = item
                t0 = engine._now_us() if engine.record else 0.0
                if shapes.chat and sub.index not in started:
                    started.add(sub.index)
                    yield shapes.role_chunk(sub.index)
                engine.took(sub, len(new), finish)
                yield shapes.chunk(sub.index, text, new, finish)
                if engine.record:   # the chunk is written (Starlette resumes us after send)
                    engine.spans.append(Span("cpu.frontend", "stream", step, t0,
                                             engine._now_us(), {"reqs": 1, "tokens": len(new)}))
            else:
                if include_usage:
                    yield shapes.usage_chunk(usage(sum(s.prompt_len for s in batch.subs),
                                                   sum(s.num_tokens for s in batch.subs)))
            yield SSE_DONE
        finally:
            engine.release(batch)

    async def serve_request(raw: Request, kind, chat: bool, prompt_ids):
        """Both endpoints: the body read, parsed and checked, its prompts' ids
        (`prompt_ids(req, body)`: ids, max_tokens, the field they came from) handed to the
        engine, and the answer streamed or whole."""
        arrival = time.perf_counter_ns()
        try:
            body = await _body(raw)
            if body is None:
                return Response(status_code=499)   # the client closed the request half-sent
            req = parse(kind, body)
            check_model(req.model)
            check_sampling(req, sampling)
            ids, max_tokens, field_name = await prompt_ids(req, body)
            batch = engine.submit(ids, max_tokens, req.ignore_eos, arrival, field_name)
        except APIError as e:
            return error(e)
        shapes = Shapes(chat, new_id("chatcmpl" if chat else "cmpl"), model_name,
                        bool(req.return_token_ids))
        return await answer(raw, batch, shapes, bool(req.stream),
                            bool(req.stream_options and req.stream_options.include_usage))

    async def completion_ids(req: CompletionRequest, body: bytes):
        engine.check_alive()
        return await engine.tokenize(completion_prompts(req)), req.max_tokens, "prompt"

    async def chat_ids(req: ChatCompletionRequest, body: bytes):
        if engine.tok is None or not engine.tok.chat_template:
            raise APIError("this model has no chat template (its tokenizer_config.json "
                           "has no chat_template, and there is no chat_template.jinja): "
                           "use /v1/completions with a prompt", "messages")
        messages = [{"role": m.role, "content": message_text(m.content,
                                                             f"messages.{i}.content")}
                    for i, m in enumerate(req.messages)]
        engine.check_alive()
        limit = engine.tok.max_chars(engine.cfg.max_model_len)
        render = functools.partial(engine.tok.render_chat, messages,
                                   req.add_generation_prompt, limit)
        try:
            text = await asyncio.to_thread(render) if len(body) > INLINE_CHARS else render()
        except ValueError as e:
            raise APIError(f"messages: {e}", "messages") from None
        ids = await engine.tokenize([text], "messages", add_special_tokens=False)
        return ids, req.max_completion_tokens or req.max_tokens, "messages"

    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await serve_request(raw, CompletionRequest, False, completion_ids)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        return await serve_request(raw, ChatCompletionRequest, True, chat_ids)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()),
            "owned_by": "stepgap", "root": engine.ea.model, "parent": None,
            "max_model_len": engine.cfg.max_model_len, "permission": []}]}

    @app.get("/health")
    async def health():
        """200 while the engine serves; 503 once it is dead (or stuck: the watchdog), while
        one of its processes is stopped, or while the server shuts down."""
        down = engine.dead or engine.stopping or engine.stopped()
        return Response(status_code=503 if down else 200)

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/version")
    async def version():
        from importlib.metadata import PackageNotFoundError, version
        try:
            return {"version": version("stepgap")}
        except PackageNotFoundError:
            return {"version": "unknown"}

    if recording:
        @app.post("/start_profile")
        async def start_profile():
            await engine.engine_spans()   # what the engine recorded so far is dropped
            engine.reset_window()
            return Response(status_code=200)

        @app.post("/stop_profile")
        async def stop_profile():
            try:
                await engine.save(timeline, result_json, config)
            except UserError as e:   # a full disk: the window is kept for the next try
                return error(APIError(f"{e}; the recorded window is kept: POST /stop_profile "
                                      "again once it can be written", status=507,
                                      type_="InsufficientStorageError"))
            return Response(status_code=200)

    return app


def chrome_path(timeline) -> Path:
    """Where a served timeline's Chrome trace goes: beside it, `.trace.json`."""
    return Path(timeline).with_suffix(".trace.json")


async def _body(raw: Request) -> bytes | None:
    """The request's body, or None when the client went away before sending all of it (a
    half-sent body is no request: nothing to answer, nothing to log). One longer than
    MAX_BODY_BYTES (its Content-Length, or what has come) is a 413 before more is kept; what
    is left of it is read and dropped (up to DRAIN_BYTES), so that the client, still sending,
    reads the answer instead of a reset connection."""
    def too_large(size: str) -> APIError:
        return APIError(f"the body is {size} bytes, more than the {MAX_BODY_BYTES} this server "
                        "takes (a prompt of --max-model-len tokens needs far less)", status=413,
                        type_="RequestEntityTooLarge")

    declared = raw.headers.get("content-length", "")
    chunks, total = [], 0
    try:
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _drain(raw, 0)
            raise too_large(declared)
        async for chunk in raw.stream():
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                await _drain(raw, total)
                raise too_large(f"more than {total}")
            chunks.append(chunk)
    except ClientDisconnect:
        return None
    return b"".join(chunks)


async def _drain(raw: Request, seen: int) -> None:
    """Read and drop the rest of a refused body: up to DRAIN_BYTES, and while it keeps coming
    (a client that stops sending and waits gets its answer a second later)."""
    chunks = raw.stream().__aiter__()
    try:
        while seen <= DRAIN_BYTES:
            seen += len(await asyncio.wait_for(chunks.__anext__(), 1.0))
    except (StopAsyncIteration, asyncio.TimeoutError, ClientDisconnect):
        pass


def limit_url(app):
    """The app behind a check of the URL's length: one past MAX_URL_BYTES is a 414 with
    OpenAI's error object (uvicorn reads request lines up to MAX_HTTP_HEAD_BYTES, vLLM's h11
    limit; past that it answers 400 itself)."""
    async def checked(scope, receive, send):
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            if size > MAX_URL_BYTES:
                e = APIError(f"the URL is {size} bytes, more than {MAX_URL_BYTES}", status=414,
                             type_="URITooLong")
                await JSONResponse(e.body(), status_code=414)(scope, receive, send)
                return
        await app(scope, receive, send)
    return checked


def run_server(app, engine: EngineClient, sock, log_level: str) -> None:
    """uvicorn on the bound socket `sock`, with a signal handler that ends the streams in
    flight first, so that a shutdown does not wait for them to finish generating."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            loop = getattr(engine, "loop", None)
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(engine.end_all, "the server is shutting down")
            super().handle_exit(sig, frame)

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(limit_url(app), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=STOP_TIMEOUT_S, access_log=False,
                            http="h11", h11_max_incomplete_event_size=MAX_HTTP_HEAD_BYTES)
    Server(config).run(sockets=[sock])
