"""CUDA graphs of the decode forwards, at fixed (batch, KV-window) buckets.

A decode step is uniform: every row verifies 1 + k tokens (the target, and the draft's first
pass) or drafts one token (the draft's later passes). Such a forward is captured once per bucket
of batch size B and KV window W (blocks per row) into a graph with static inputs (token ids,
positions, block tables, and for the draft its hidden states); the attention metadata is built
inside the graph from those, so a replay needs no host work beyond copying the inputs in.
Batches are padded up to the bucket with rows that write only to the scratch block. Prefill and
mixed batches, and anything larger than the largest bucket, run eagerly.

On the CPU the same class can emulate graphs (`emulate=True`): a "replay" runs the forward eagerly
on the padded static inputs. Tests use it to check the bucketing and padding on any machine.
"""

from __future__ import annotations

from typing import Callable

import torch

from stepgap.engine.kv_cache import make_context, set_context
from stepgap.common.scheduler import cdiv

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def buckets_up_to(limit: int, base: tuple[int, ...]) -> list[int]:
    out = [b for b in base if b < limit]
    return out + [limit]


def window_buckets(max_blocks: int) -> list[int]:
    out, w = [], 4
    while w < max_blocks:
        out.append(w)
        w *= 2
    return out + [max_blocks]


class DecodeGraphs:
    """Graphs of one forward `fn(static inputs) -> output tensors` over (B, W) buckets."""

    def __init__(self, fn: Callable[[dict], tuple[torch.Tensor, ...]], q: int,
                 batch_buckets: list[int], window_buckets_: list[int],
                 make_inputs: Callable[[int, int], dict], pool, emulate: bool = False):
        self.fn, self.q = fn, q
        self.batch_buckets, self.window_buckets = batch_buckets, window_buckets_
        self.make_inputs, self.pool, self.emulate = make_inputs, pool, emulate
        self.graphs: dict[tuple[int, int], tuple] = {}

    def capture_all(self) -> None:
        # Largest first, so that smaller graphs reuse the pool's memory.
        for b in sorted(self.batch_buckets, reverse=True):
            for w in sorted(self.window_buckets, reverse=True):
                self._capture(b, w)

    def _capture(self, b: int, w: int) -> None:
        inputs = self.make_inputs(b, w)
        if self.emulate:
            self.graphs[(b, w)] = (None, inputs, None)
            return
        side = self.side = getattr(self, "side", None) or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up kernels and the allocator outside the capture
                self.fn(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.fn(inputs)
        self.graphs[(b, w)] = (graph, inputs, out)

    def bucket(self, b: int, w: int) -> tuple[int, int] | None:
        bb = next((x for x in self.batch_buckets if x >= b), None)
        wb = next((x for x in self.window_buckets if x >= w), None)
        if bb is None or wb is None or (bb, wb) not in self.graphs:
            return None
        return bb, wb

    def run(self, key: tuple[int, int], real: dict, b: int) -> tuple[torch.Tensor, ...]:
        """Copy the real inputs into the bucket's static ones (padding the rest), replay, and
        return the output rows of the real batch (a view of the static output)."""
        graph, static, out = self.graphs[key]
        for name, value in real.items():
            dst = static[name]
            if name == "block_tables":
                dst.fill_(static["scratch"])
                dst[:value.shape[0], :value.shape[1]].copy_(value)
            else:
                n = value.shape[0]
                dst[:n].copy_(value)
                dst[n:].zero_()
        if graph is None:  # emulated
            out = self.fn(static)
        else:
            graph.replay()
        return tuple(o[:b * self.q] for o in out)


@torch.inference_mode()
def capture_decode_graphs(worker, k: int) -> dict[str, DecodeGraphs]:
    """The worker's decode forwards at depth k, over every (batch, window) bucket: the target
    (1 + k tokens per row), and with k > 0 the draft's first pass (1 + k) and its one-token
    passes. On the CPU they are emulated (the padded path, run eagerly)."""
    emulate = not worker.cuda
    dev, scratch, bs = worker.device, worker.scratch, worker.kv.block_size
    if not emulate:
        torch.cuda.synchronize(dev)
        if worker.graph_pool is None:
            worker.graph_pool = torch.cuda.graph_pool_handle()
    spec = worker.spec
    bb = buckets_up_to(spec.max_num_seqs, BATCH_BUCKETS)
    wb = window_buckets(cdiv(spec.max_model_len + spec.max_k, bs))
    q = k + 1

    def inputs(rows_q: int, hidden: str | None = None, dim: int = 0):
        def make(b, w):
            t = {"ids": torch.zeros(b * rows_q, dtype=torch.long, device=dev),
                 "pos": torch.zeros(b * rows_q, dtype=torch.long, device=dev),
                 "block_tables": torch.full((b, w), scratch, dtype=torch.long, device=dev),
                 "scratch": scratch}
            if hidden:
                t[hidden] = torch.zeros(b * rows_q, dim, dtype=worker.dtype, device=dev)
            return t
        return make

    def meta(t, rows_q):
        b = t["block_tables"].shape[0]
        grid = torch.arange(b * rows_q, device=dev)
        return make_context(t["pos"], t["block_tables"], grid.view(b, rows_q), grid, scratch,
                            worker.dtype, block_size=bs)

    def target_fn(t):
        set_context(meta(t, q))
        hidden, aux = worker.target(t["ids"], t["pos"], return_aux=k > 0)
        set_context(None)
        logits = worker.target.compute_logits(hidden)
        return (logits, aux) if aux is not None else (logits,)

    def first_fn(t):
        set_context(meta(t, q))
        out = worker.draft(t["ids"], t["pos"], worker.draft.combine(t["aux"]))
        set_context(None)
        return (out,)

    def step_fn(t):
        set_context(meta(t, 1))
        out = worker.draft(t["ids"], t["pos"], t["hidden"])
        set_context(None)
        return (out,)

    pool = worker.graph_pool
    graphs = {"target": DecodeGraphs(target_fn, q, bb, wb, inputs(q), pool, emulate)}
    if k:
        graphs["draft_first"] = DecodeGraphs(
            first_fn, q, bb, wb, inputs(q, "aux", 3 * worker.target_cfg.hidden_size), pool,
            emulate)
        if k > 1:
            graphs["draft_step"] = DecodeGraphs(
                step_fn, 1, bb, wb, inputs(1, "hidden", worker.draft_cfg.hidden_size), pool,
                emulate)
    for g in graphs.values():
        g.capture_all()
    set_context(None)
    if not emulate:
        torch.cuda.synchronize(dev)
    return graphs
