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
