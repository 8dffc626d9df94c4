"""A MoE layer under data and expert parallelism, as vLLM's FusedMoE runs it, and what it
costs: its block from measured tables (sim/moe_tables.py) or the roofline, and the dispatch and
combine of the tokens.

How vLLM spreads a MoE layer (`FusedMoEParallelConfig.make`) over `dp` engine cores of `tp` GPUs
each (`MoeParallel`):

- with `--enable-expert-parallel`, by expert: each of the dp·tp GPUs holds E/(dp·tp) of the
  experts, whole (ep = dp·tp);
- without it, by width: every GPU holds every expert, 1/(dp·tp) of its width (the MoE layer's
  tensor parallelism is flattened across the DP ranks);
- attention, the dense layers and the shared experts stay each DP rank's own (TP inside it).

With dp > 1, every MoE layer runs over the tokens of all the DP ranks: vLLM's default
all2all backend, `allgather_reducescatter`, all-gathers each rank's hidden states and router
logits over the DP group before the experts and reduce-scatters the experts' outputs after, so
each rank's experts see the gathered rows; hence the ranks' lockstep (sim/data_parallel.py).
The other backends (DeepEP, pplx, FlashInfer all-to-all) are not modelled. At dp = 1 the
tokens are the rank's own (replicated over TP): no dispatch, and expert parallelism only
changes which experts a rank holds.

The experts a rank touches are the routing model's expected count over the rows it sees
(sim/roofline.py `expected_experts`, `--moe-routing-skew`), its 1/ep share: the ranks are taken
as balanced (LLMServingSim's BALANCED); the slowest rank's extra experts are not modelled.

A block's time (`MoeCosts.block`): the bundle's moe.csv at the EP degree it measured nearest the
run's, where it covers the rows; past its last token count, its last measured time grown as
the roofline grows from there (counted in the result); the roofline alone where no table is
given. The dispatch and combine (`MoeCosts.exchange`): one all-gather of rows x (hidden +
experts) bf16 and one reduce-scatter of rows x hidden bf16 per MoE layer, over `MoeCosts.link`:
the collectives measured over the dp GPUs where a hardware.yaml gives them (sim/hardware.py
`MeasuredLink`, found by sim/device_choice.py `collectives`), else the GPU's interconnect model
(`Interconnect`); both answer `all_gather_us` and `reduce_scatter_us`.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepgap.common.modelcfg import BF16
from stepgap.sim.hardware import MeasuredLink
from stepgap.sim.roofline import expected_experts


@dataclass(frozen=True, slots=True)
class MoeParallel:
    """How a deployment spreads its MoE layers (module docstring)."""

    dp: int = 1
    tp: int = 1
    expert_parallel: bool = False

    @property
    def ep(self) -> int:
        """GPUs the experts are spread over by count (1: split by width)."""
        return self.dp * self.tp if self.expert_parallel else 1

    @property
    def moe_tp(self) -> int:
        """Ways each expert's width is split."""
        return 1 if self.expert_parallel else self.dp * self.tp

    def describe(self) -> str:
        if self.expert_parallel:
            how = f"MoE layers expert-parallel over {self.ep} GPUs (each 1/{self.ep} of the " \
                  "experts)"
        elif self.moe_tp > 1:
            how = f"MoE layers split by width over {self.moe_tp} GPUs"
        else:
            how = "MoE layers whole on each GPU"
        if self.dp > 1:
            how += (f"; the {self.dp} DP ranks' tokens all-gathered before the experts and "
                    "reduce-scattered after (allgather_reducescatter)")
        return how


class MoeCosts:
    """The target's MoE blocks, and their dispatch and combine, on one rank (module
    docstring). `table`: a MoeTable; `mtp`: an MTP module's measured kernels (mtp.csv), read
    by the roofline's MTP pass; `link`: the collectives' costs (measured, or the GPU's
    interconnect model)."""

    def __init__(self, target, roofline, plan: MoeParallel, link, table=None, mtp=None):
        self.t, self.roof, self.plan, self.link = target, roofline, plan, link
        self.table, self.mtp = table, mtp
        self.ep = table.degree(plan.ep) if table is not None else None   # the grid it reads
        self.grid = table.grids[self.ep] if table is not None else None
        self.looked: set[int] = set()   # distinct row counts priced from the table
        self.past: set[int] = set()     # of them, past its last token count
        self._block: dict[tuple[int, int], float] = {}

    def activated(self, rows: float) -> float:
        """The experts one rank touches for `rows` tokens (its share, balanced)."""
        c = self.t
        return expected_experts(c.num_experts, c.num_experts_per_tok, rows,
                                self.roof.skew) / self.plan.ep

    def block(self, m: int, rows: int) -> float:
        """One MoE block on one rank: m tokens of its own, `rows` gathered from the DP ranks."""
        key = (m, rows)
        t = self._block.get(key)
        if t is None:
            t = self._block[key] = self._price(m, rows)
        return t

    def _price(self, m: int, rows: int) -> float:
        c, plan, roof = self.t, self.plan, self.roof
        if self.grid is None:
            return roof.moe_block(c, m, rows, plan.ep, plan.moe_tp)
        self.looked.add(rows)
        t = self.grid(rows, self.activated(rows))
        if t is None:   # past the grid: its last measured time, grown as the roofline grows
            top = int(self.grid.max_tokens)
            self.past.add(rows)
            t = self.grid(top, self.activated(top)) \
                * roof.moe_block(c, rows, rows, plan.ep, plan.moe_tp) \
                / roof.moe_block(c, top, top, plan.ep, plan.moe_tp)
        return t

    def exchange(self, rows: int) -> float:
        """One MoE layer's dispatch and combine over the DP ranks (0 at dp = 1)."""
        n = self.plan.dp
        if n == 1:
            return 0.0
        c = self.t
        gathered = BF16 * rows * (c.hidden_size + c.num_experts)   # hidden states, logits
        outputs = BF16 * rows * c.hidden_size                       # partial sums, every row
        return self.link.all_gather_us(gathered, n) + self.link.reduce_scatter_us(outputs, n)

    def forward(self, m: int, rows: int) -> float:
        """Every MoE layer of the target's forward: its blocks, dispatches and combines."""
        return self.t.num_moe_layers * (self.block(m, rows) + self.exchange(rows))

    def source(self) -> str:
        """Where the blocks' times come from, for the result's device_costs."""
        where = (f"tables ({self.table.path}, the ep {self.ep} grid)" if self.grid is not None
                 else "the roofline")
        out = f"{self.plan.describe()}; blocks from {where}"
        if self.plan.dp > 1:
            link = self.link
            out += ("; dispatch and combine from the collectives " + link.name
                    if isinstance(link, MeasuredLink) else
                    f"; dispatch and combine from the interconnect model ({link.name})")
        return out

    def fastest_read(self) -> tuple[float, float, float]:
        """The table's point that reads the routed experts' weights fastest: (bytes/s implied
        by its time, its tokens, its activated experts), for a check against the GPU's
        bandwidth (a table that implies more than the card's peak understates the block)."""
        c, grid = self.t, self.grid
        per = 3 * c.hidden_size * (c.moe_intermediate_size // self.plan.moe_tp) \
            * c.expert_weight_bytes
        return max((a * per / (t * 1e-6), tok, a)
                   for tok, (xs, ys) in zip(grid.tokens, grid.rows) for a, t in zip(xs, ys)
                   if t > 0)

    def coverage(self) -> dict:
        """How many distinct row counts the table priced, and how many past its grid."""
        return {"row_counts": len(self.looked), "past_grid": len(self.past),
                "grid_tokens": self.grid.max_tokens,
                "most_rows": max(self.looked) if self.looked else 0}
