"""Shared helpers of the tests: tiny checkpoints (made once per test process), a reference greedy
decoder, and a one-call engine runner. Tests import them as `from tests.helpers import ...`."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from stepgap.common.formats import TraceRequest
from stepgap.engine.args import EngineArgs
from stepgap.engine.loop import run_trace

TRAIN_STEPS = 150

# One torch thread: the tiny models gain nothing from more, and on a machine whose cores are busy
# with other work, spinning OpenMP threads make these tests 30 times slower.
torch.set_num_threads(1)


@functools.lru_cache(maxsize=None)
def tiny_checkpoints(train_steps: int = TRAIN_STEPS) -> dict:
    """OUT/target, OUT/eagle3-yuhuili, OUT/eagle3-speculators; the head distilled so that drafts
    are accepted at every position. Built once per test process (a few seconds)."""
    from stepgap.training.tiny import make_tiny
    out = Path(tempfile.mkdtemp(prefix="stepgap-tiny-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    return make_tiny(out, seed=0, train_steps=train_steps)


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
