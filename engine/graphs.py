"""CUDA graphs of the decode forwards, at fixed (batch, KV-window) buckets.

A decode step is uniform: every row verifies 1 + k tokens (the target, and the draft's first
pass) or drafts one token (the draft's later passes). Such a forward is captured once per bucket
of batch size B and KV window W (blocks per row) into a graph with static inputs (token ids,
positions, block tables, and for the draft its hidden states); the attention metadata is built
inside the graph from those, so a replay needs no host work beyond copying the inputs in.
Batches are padded up to the bucket with rows that write only to the scratch block. Prefill and
mixed batches, and anything larger than the largest bucket, run eagerly.

On the CPU the same class can emulate graphs (`GraphPlan.emulate`): a "replay" runs the forward
eagerly on the padded static inputs. Tests use it to check the bucketing and padding on any
machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from stepgap.common.scheduler import cdiv
from stepgap.engine.kv_cache import attention_context, make_context

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)

# A captured forward: (token ids [N], positions [N], hidden states [N, D] or None) -> outputs,
# run under the attention context of its padded grid.
Forward = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], tuple[torch.Tensor, ...]]


def buckets_up_to(limit: int, base: tuple[int, ...]) -> list[int]:
    out = [b for b in base if b < limit]
    return out + [limit]


def window_buckets(max_blocks: int) -> list[int]:
    out, w = [], 4
    while w < max_blocks:
        out.append(w)
        w *= 2
    return out + [max_blocks]


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """Where and at which sizes a worker captures its graphs; the target's and the drafter's
    share it (and one memory pool)."""

    device: torch.device
    dtype: torch.dtype
    scratch: int                  # the KV cache's scratch block: padded rows write there
    block_size: int
    batch_buckets: tuple[int, ...]
    window_buckets: tuple[int, ...]
    pool: object = None           # CUDA: the graphs' shared memory pool
    emulate: bool = False         # the CPU: "replay" runs the forward on the padded inputs

    @classmethod
    def of(cls, device: torch.device, dtype: torch.dtype, scratch: int, block_size: int,
           max_num_seqs: int, max_tokens: int, pool=None) -> "GraphPlan":
        """Buckets up to `max_num_seqs` rows and windows of `max_tokens` tokens."""
        return cls(device, dtype, scratch, block_size,
                   tuple(buckets_up_to(max_num_seqs, BATCH_BUCKETS)),
                   tuple(window_buckets(cdiv(max_tokens, block_size))), pool,
                   emulate=device.type != "cuda")

    def context(self, pos: torch.Tensor, tables: torch.Tensor, q: int):
        """The attention metadata of a uniform batch: each row's q tokens, in order."""
        b = tables.shape[0]
        grid = torch.arange(b * q, device=self.device)
        return make_context(pos, tables, grid.view(b, q), grid, self.scratch, self.dtype,
                            block_size=self.block_size)


class DecodeGraphs:
    """Graphs of one forward, q tokens per row, over the plan's (B, W) buckets. `hidden` is
    the width of its hidden-state input (0: none)."""

    def __init__(self, plan: GraphPlan, forward: Forward, q: int, hidden: int = 0):
        self.plan, self.forward, self.q, self.hidden = plan, forward, q, hidden
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.side = None

    def capture_all(self) -> None:
        # Largest first, so that smaller graphs reuse the pool's memory.
        for b in sorted(self.plan.batch_buckets, reverse=True):
            for w in sorted(self.plan.window_buckets, reverse=True):
                self._capture(b, w)

    def _static(self, b: int, w: int) -> dict:
        dev, n = self.plan.device, b * self.q
        return {"ids": torch.zeros(n, dtype=torch.long, device=dev),
                "pos": torch.zeros(n, dtype=torch.long, device=dev),
                "tables": torch.full((b, w), self.plan.scratch, dtype=torch.long, device=dev),
                "hidden": torch.zeros(n, self.hidden, dtype=self.plan.dtype, device=dev)
                if self.hidden else None}

    def _run_static(self, t: dict) -> tuple[torch.Tensor, ...]:
        with attention_context(self.plan.context(t["pos"], t["tables"], self.q)):
            return self.forward(t["ids"], t["pos"], t["hidden"])

    def _capture(self, b: int, w: int) -> None:
        static = self._static(b, w)
        if self.plan.emulate:
            self.graphs[(b, w)] = (None, static, None)
            return
        side = self.side = self.side or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up kernels and the allocator outside the capture
                self._run_static(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.plan.pool):
            out = self._run_static(static)
        self.graphs[(b, w)] = (graph, static, out)

    def bucket(self, b: int, w: int) -> tuple[int, int] | None:
        bb = next((x for x in self.plan.batch_buckets if x >= b), None)
        wb = next((x for x in self.plan.window_buckets if x >= w), None)
        if bb is None or wb is None or (bb, wb) not in self.graphs:
            return None
        return bb, wb

    def run(self, key: tuple[int, int], ids: torch.Tensor, pos: torch.Tensor,
            tables: torch.Tensor, hidden: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, ...]:
        """Copy the real inputs into the bucket's static ones (padding the rest), replay, and
        return the output rows of the real batch (a view of the static output)."""
        graph, static, out = self.graphs[key]
        b = tables.shape[0]
        static["tables"].fill_(self.plan.scratch)
        static["tables"][:b, :tables.shape[1]].copy_(tables)
        for name, value in (("ids", ids), ("pos", pos), ("hidden", hidden)):
            if value is not None:
                static[name][:value.shape[0]].copy_(value)
                static[name][value.shape[0]:].zero_()
        if graph is None:  # emulated
            out = self._run_static(static)
        else:
            graph.replay()
        return tuple(o[:b * self.q] for o in out)


def capture(plan: GraphPlan, forward: Forward, q: int, hidden: int = 0) -> DecodeGraphs:
    """`forward`'s graphs over every bucket of `plan`."""
    graphs = DecodeGraphs(plan, forward, q, hidden)
    graphs.capture_all()
    return graphs
