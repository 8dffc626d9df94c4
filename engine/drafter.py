"""The EAGLE-3 drafter: its head, its two passes, their CUDA graphs, and its step's drafting.

Drafting runs in the padded-batch form (docs/explanation/design.md §1, vLLM #24539), right after the
target's verification of step N, on the device and with no host sync:

1. the first pass covers every slot the target just computed, with the tokens shifted by one
   (each slot predicts the token after it) and each row's freshly sampled token written after
   its last accepted one; rejected slots ride along as padding. Its input hidden state is the
   target's three aux hidden states, fused by the head's `fc`;
2. each row's hidden state at its last accepted slot gives draft token 1;
3. k - 1 one-token passes follow, each from the previous pass's hidden state and token, one
   position further on.

A pass is one function, `first_pass` or `next_pass`: captured into a CUDA graph per (batch,
KV window) bucket and replayed when the batch is uniform (every row verified 1 + k tokens and
samples), run eagerly with the batch's own attention metadata otherwise. The CPU runs the same
code: graphs there are absent (every pass eager) or emulated (tests: the padded path, eagerly).
"""

from __future__ import annotations

from typing import Callable

import torch

from stepgap.engine.eagle3 import Eagle3Head
from stepgap.engine.graphs import DecodeGraphs, GraphPlan, capture
from stepgap.engine.kv_cache import Context, attention_context

# (positions, block tables, pad index [B, Q], unpad index [N], write mask or None) -> metadata
MakeContext = Callable[..., Context]


class Eagle3Drafter:
    """Owns the EAGLE-3 head and the graphs of its passes at one depth k (`capture`)."""

    def __init__(self, head: Eagle3Head, target_hidden_size: int, context: MakeContext):
        self.head = head
        self.target_hidden_size = target_hidden_size
        self.context = context     # attention metadata on the worker's KV cache
        self.first_graphs: DecodeGraphs | None = None   # k > 0: the pass over 1 + k slots
        self.next_graphs: DecodeGraphs | None = None    # k > 1: the one-token passes

    def first_pass(self, ids, pos, aux) -> tuple[torch.Tensor]:
        """Hidden states [N, H] of the first pass, from the target's aux hidden states."""
        return (self.head(ids, pos, self.head.combine(aux)),)

    def next_pass(self, ids, pos, hidden) -> tuple[torch.Tensor]:
        """Hidden states [B, H] one token further, from the previous pass's."""
        return (self.head(ids, pos, hidden),)

    def capture(self, k: int, plan: GraphPlan | None) -> None:
        """The graphs of both passes at depth k (none without a plan)."""
        self.first_graphs = self.next_graphs = None
        if plan is None or k == 0:
            return
        self.first_graphs = capture(plan, self.first_pass, 1 + k, 3 * self.target_hidden_size)
        if k > 1:
            self.next_graphs = capture(plan, self.next_pass, 1, self.head.cfg.hidden_size)

    @staticmethod
    def _run(graphs: DecodeGraphs | None, key, forward, context, ids, pos, tables, hidden):
        """One pass: replayed from its graph at `key`, or eagerly under `context()`."""
        if key is not None:
            return graphs.run(key, ids, pos, tables, hidden)[0]
        with attention_context(context()):
            return forward(ids, pos, hidden)[0]

    def propose(self, k: int, ids, pos, tables, last, next_token, aux, samples, uniform: bool,
                first_context, timed) -> torch.Tensor:
        """k draft tokens per row [B, k] after a verification (steps 1-3 above).

        ids, pos [N]: the tokens and positions the target computed; tables [B, W]; last [B]:
        the flat index of each row's last accepted token; next_token [B]: the token each row
        feeds the next step; aux [N, 3 * H_target]; samples [B]: the rows that sample (the
        others write their KV to the scratch block); uniform: the batch fits the graphs;
        first_context(): the first pass's attention metadata (the target's, when it ran
        eagerly); timed(i, graph): the timing of pass i."""
        b, w = tables.shape
        rows = torch.arange(b, device=ids.device)
        drafts = torch.empty(b, k, dtype=torch.long, device=ids.device)
        g = self.first_graphs
        key = g.bucket(b, w) if uniform and g is not None else None
        with timed(0, key is not None):
            shifted = ids.roll(-1).index_put((last,), next_token)
            hidden = self._run(g, key, self.first_pass, first_context, shifted, pos, tables, aux)
            hidden = hidden[last]
            tok = self.head.propose(hidden)
        drafts[:, 0] = tok
        pos = pos[last]
        g = self.next_graphs
        key = g.bucket(b, w) if uniform and g is not None else None
        for i in range(1, k):
            pos = pos + 1
            with timed(i, key is not None):
                hidden = self._run(g, key, self.next_pass,
                                   lambda: self.context(pos, tables, rows.view(b, 1), rows,
                                                        samples),
                                   tok, pos, tables, hidden)
                tok = self.head.propose(hidden)
            drafts[:, i] = tok
        return drafts
