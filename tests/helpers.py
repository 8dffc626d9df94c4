"""Shared helpers of the tests: tiny checkpoints (made once per version of the code that makes
them, cached on disk), a reference greedy decoder, and a one-call engine runner. Tests import
them as `from tests.helpers import ...`."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import safetensors
import torch

from stepgap.common.formats import TraceRequest
from stepgap.engine.args import EngineArgs
from stepgap.engine.loop import run_trace

TRAIN_STEPS = 150
ROOT = Path(__file__).resolve().parents[1]
# Where the tiny checkpoints are kept between runs (.pytest_cache is git-ignored).
TINY_CACHE = ROOT / ".pytest_cache" / "stepgap-tiny"

# One torch thread: the tiny models gain nothing from more, and on a machine whose cores are busy
# with other work, spinning OpenMP threads make these tests 30 times slower.
torch.set_num_threads(1)


@functools.lru_cache(maxsize=None)
def tiny_checkpoints(train_steps: int = TRAIN_STEPS) -> dict:
    """OUT/target, OUT/eagle3-yuhuili, OUT/eagle3-speculators; the head distilled so that drafts
    are accepted at every position (training/tiny.py `make_tiny`, seed 0).

    Distilling takes seconds, so the folder is kept in TINY_CACHE under a key of everything it
    depends on (`tiny_key`), and made again only when that changes or a file in it no longer
    has the bytes it was written with. Test processes that ask at once (pytest-xdist's workers)
    make it once: the first takes a lock, makes it in a temporary folder and renames that into
    place whole; the others wait for the lock and read it. Tests must not write into it (copy
    a folder first, as test_engine_checkpoint.py does)."""
    from stepgap.training.tiny import make_tiny
    key = tiny_key(train_steps)
    folder = TINY_CACHE / key
    TINY_CACHE.mkdir(parents=True, exist_ok=True)
    with locked(TINY_CACHE / "lock"):
        made = read_made(folder)
        if made is None:
            for old in TINY_CACHE.iterdir():    # other versions' folders, and broken builds
                if old.is_dir():
                    shutil.rmtree(old)
            tmp = Path(tempfile.mkdtemp(prefix="build-", dir=TINY_CACHE))
            tmp.chmod(0o755)
            made = make_tiny(tmp, seed=0, train_steps=train_steps)
            made = {k: Path(v).relative_to(tmp).as_posix() if k != "agreement" else v
                    for k, v in made.items()}
            (tmp / "made.json").write_text(json.dumps({"result": made, "sha256": digests(tmp)}))
            tmp.rename(folder)
    return {k: str(folder / v) if k != "agreement" else v for k, v in made.items()}


def tiny_key(train_steps: int) -> str:
    """What the tiny checkpoints depend on: the code that makes them (training/tiny.py and every
    project module it imports, read from the source), the arguments, and the versions of torch
    and safetensors."""
    from stepgap.sim.sweep_keys import model_digest
    text = f"{model_digest(('stepgap.training.tiny',))}:{train_steps}:{torch.__version__}:" \
           f"{safetensors.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "made.json"}


def read_made(folder: Path) -> dict | None:
    """make_tiny's result, relative to `folder`, if every file there is as it was written."""
    try:
        doc = json.loads((folder / "made.json").read_text())
    except (OSError, ValueError):
        return None
    return doc["result"] if digests(folder) == doc["sha256"] else None


@contextmanager
def locked(path: Path):
    """An exclusive lock on `path` (created if need be), held while the block runs."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tiny_args(dtype: str = "float64", num_blocks: int = 512, draft: str | None = "eagle3-yuhuili",
              **kw) -> EngineArgs:
    """The tiny checkpoints' engine: float64 on the CPU, 512 KV blocks, up to 64 sequences of
    512 tokens, k up to 5."""
    paths = tiny_checkpoints()
    return EngineArgs(model=paths["target"], draft=paths[draft] if draft else None,
                      dtype=dtype, num_gpu_blocks_override=num_blocks, max_model_len=512,
                      max_num_seqs=64, max_k=5, **kw)


@functools.lru_cache(maxsize=None)
def inline_executor(dtype: str = "float64", num_blocks: int = 512, draft: str = "eagle3-yuhuili"):
    """One inline worker per configuration, reused across runs (configure resets it)."""
    return tiny_args(dtype, num_blocks, draft).make_executor()


def mixed_requests(n: int, base_prompt: int = 5, step: int = 9, out_len: int = 14,
                   out_step: int = 3) -> list[TraceRequest]:
    return [TraceRequest(f"r{i}", 0.0, base_prompt + (step * i) % 70, out_len + (out_step * i) % 11)
            for i in range(n)]


REQS = mixed_requests(10)  # more than max_num_seqs = 4


def run(executor, requests, mode="sync", k=0, num_blocks=512, max_num_seqs=4,
        max_num_batched_tokens=8192, sampling=None, max_concurrency=None,
        enable_prefix_caching=True, **kw):
    from stepgap.engine.sampler import SamplingConfig
    cfg = EngineArgs(model="tiny", mode=mode, num_gpu_blocks_override=num_blocks,
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     max_model_len=512, sampling=sampling or SamplingConfig(),
                     enable_prefix_caching=enable_prefix_caching).engine_config(k=k)
    return run_trace(executor, requests, cfg, vocab_size=512, max_concurrency=max_concurrency,
                     **kw)


@torch.no_grad()
def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy continuation, recomputed from scratch for every token with no
    KV cache (the dense path)."""
    seq = list(prompt)
    for _ in range(n):
        ids = torch.tensor(seq)
        hidden, _ = model(ids, torch.arange(len(seq)), return_aux=False)
        seq.append(int(model.compute_logits(hidden[-1]).argmax()))
    return seq[len(prompt):]


@functools.lru_cache(maxsize=None)
def reference_model(dtype=torch.float64):
    from stepgap.engine.checkpoint import load_target
    model, _ = load_target(tiny_checkpoints()["target"], torch.device("cpu"), dtype)
    return model


@functools.lru_cache(maxsize=None)
def expected(rid: str, prompt_len: int, output_len: int) -> tuple[int, ...]:
    """The target's own greedy output for a request of the tiny checkpoints."""
    from stepgap.engine.loop import prompt_ids
    req = TraceRequest(rid, 0.0, prompt_len, output_len)
    return tuple(reference_greedy(reference_model(), prompt_ids(req, 512, 0), output_len))


def assert_lossless(out, reqs=REQS):
    """Every request's tokens are the target's own greedy output; no KV block leaked."""
    for r in reqs:
        assert out.output_token_ids[r.request_id] == list(expected(r.request_id, r.prompt_len,
                                                                   r.output_len)), r.request_id
    assert out.num_free_blocks == out.num_blocks  # no KV block leaks


# ---------------------------------------------------------------------------------------------
# Servers: a real `python -m stepgap serve` process, and an HTTP client for it


PAIR = ROOT / "checkpoints" / "pystdlib"   # the committed trained pair
SERVED_K = 4           # the shared pair_server's k (tests/conftest.py)
CHAT_TEMPLATE = ("{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}# assistant:{% endif %}")
START_S = 90.0
# How long a test waits for something that must happen (a process ending, a chunk, an idle
# engine) before it calls it a hang. Only a hang fails: the tests check what the server does,
# not how fast a machine does it (a loaded one takes seconds where an idle one takes a tenth).
HANG_S = 60.0


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, **{"timeout": HANG_S, **kwargs})


def post(url: str, **kwargs) -> httpx.Response:
    return httpx.post(url, **{"timeout": HANG_S, **kwargs})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


class Server:
    """`stepgap serve ARGS` on a free port of 127.0.0.1; its three pids once it is up."""

    def __init__(self, *args: str):
        for _ in range(3):   # another process may take the free port before the server binds it
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.log = tempfile.NamedTemporaryFile("w+", prefix="stepgap-serve-",
                                                   suffix=".log")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stepgap", "serve", *args, "--host", "127.0.0.1",
                 "--port", str(self.port)], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
            if self._wait_up():
                break
        else:
            raise AssertionError(f"no free port held:\n{self.text()}")
        m = re.search(r"engine core pid (\d+), worker pid (\d+)", self.text())
        self.pids = [self.proc.pid, int(m[1]), int(m[2])]

    def _wait_up(self) -> bool:
        """True once /health answers; False if the port was taken meanwhile (the server exits
        saying so, and another port is tried)."""
        deadline = time.monotonic() + START_S
        while True:
            if self.proc.poll() is not None and "cannot listen there" in self.text():
                return False
            assert self.proc.poll() is None, f"the server exited:\n{self.text()}"
            try:
                if get(self.url + "/health", timeout=1.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the server did not start:\n{self.text()}"
            time.sleep(0.2)

    def text(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig=signal.SIGTERM) -> bool:
        """Signal the front end; whether every one of its processes then ended by itself (not
        hanging for HANG_S, when the test kills what is left)."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        while any(alive(p) for p in self.pids) and time.monotonic() - t0 < HANG_S:
            time.sleep(0.05)
        ended = not any(alive(p) for p in self.pids)
        for p in self.pids:      # never leave one behind, even when the test fails
            if alive(p):
                os.kill(p, signal.SIGCONT)
                subprocess.run(["kill", "-9", str(p)], check=False)
        self.proc.wait(5)
        return ended

    def metrics(self) -> dict[str, float]:
        """Every series of /metrics by its name and labels, engine and model labels dropped."""
        out = {}
        for line in get(self.url + "/metrics").text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            name = re.sub(r'(engine|model_name)="[^"]*",?', "", name)
            name = name.replace(",}", "}").replace("{}", "")
            out[name] = float(value)
        return out


def stream(url: str, body: dict, timeout: float = 60.0, events: list | None = None) -> list:
    """A streamed completion: the decoded data events, [DONE] as the string (appended to
    `events` as they come, when given)."""
    events = [] if events is None else events
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def wait_idle(server: Server) -> dict:
    """The server's metrics once it runs and waits for nothing and holds no KV block."""
    deadline = time.monotonic() + HANG_S
    while True:
        m = server.metrics()
        if (m["vllm:num_requests_running"], m["vllm:num_requests_waiting"],
                m["vllm:kv_cache_usage_perc"]) == (0, 0, 0):
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.05)


def run_result(timings, duration_s: float, **kw) -> dict:
    """One run's result as a document (common/run_result.py `RunResult.build`, written)."""
    from stepgap.common.run_result import RunResult
    return RunResult.build(timings, duration_s, **kw).to_dict()
