"""The device cost seam (docs/explanation/design.md §3): what each device op of a step costs.

`DeviceCosts` is the seam: one method per device op, each giving microseconds for a `Batch`.
Its sources: `RooflineCosts` (sim/roofline.py) derives them from the model's own config and a
`Hardware` entry; `ProfileCosts` (sim/profile.py) answers from a measured profile's fits and
falls back to the roofline where the profile has none; `ConstantCosts` gives fixed times
(closed-form tests). The CPU side is sim/cpu_costs.py's; the machine's noise, sim/jitter.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Batch:
    """What the device ops of one step depend on."""

    num_tokens: int     # tokens the target runs: prefill chunks plus 1 + drafts per decode
    num_reqs: int
    num_sampling: int   # requests that sample (decoding, or finishing their prefill)
    num_logits: int     # target positions that need logits: 1 + drafts per sampling request
    num_drafts: int     # draft tokens verified this step
    kv_tokens: int      # context tokens attention reads, summed over requests
    attn_pairs: float   # (query, key) pairs attended, causal within a chunk
    max_query: int = 0  # the longest chunk of one request (a padded attention grid's width)
    max_blocks: int = 0  # the most KV blocks one request holds (a block table's width)
    # The mix, for measured attention tables: requests decoding or verifying (1 + drafts new
    # tokens) and the history they read, and the prefill chunks as (tokens, history).
    num_decode: int = 0
    decode_kv: int = 0
    decode_kv_min: int = 0
    decode_kv_max: int = 0
    prefills: list = field(default_factory=list)
    # Data parallelism of a MoE target: the rows every rank's MoE blocks see, gathered from the
    # DP ranks (sim/data_parallel.py), in the forward and in the draft passes after the first;
    # 0: the step's own tokens (num_tokens, num_sampling).
    moe_rows: int = 0
    draft_moe_rows: int = 0


class DeviceCosts:
    """Microseconds per device op for a batch, one method per op, and what else a run asks of
    its source: these defaults are a source's that has none of it. Implemented by
    RooflineCosts, ProfileCosts, TableCosts, LevelCosts and ConstantCosts."""

    sources: dict[str, str] | None = None   # op -> what prices it (the result's device_costs)
    path: str | None = None       # the profile or bundle it read
    fallback: DeviceCosts | None = None   # the source under it: the roofline of a profile's
    # fits or of tables, or the one a level scales (sim/device_choice.py roofline_of)
    moe = None        # a MoE target's blocks (sim/expert_parallel.py MoeCosts)
    tables = None     # measured operator tables (sim/tables.py OpTables)
    # (Batch) -> tuple | None: a key that fixes the step's op times (sim/device_lane.py
    # Device.known); None: every step priced
    step_key = None
    # (Batch, passes) -> [times]: every draft pass priced in one call; None: one call a pass
    draft_forwards = None

    def target_forward(self, b: Batch) -> float:
        raise NotImplementedError

    def rejection_sample(self, b: Batch) -> float:
        raise NotImplementedError

    def draft_forward(self, b: Batch, i: int) -> float:
        raise NotImplementedError

    def d2h(self, b: Batch) -> float:
        raise NotImplementedError

    def fixup(self, b: Batch) -> float:
        raise NotImplementedError

    def check_request(self, request_id: str, total_tokens: int) -> None:
        """Refuse, naming it, a request this source cannot price (tables past their grid)."""


@dataclass(frozen=True, slots=True)
class ConstantCosts(DeviceCosts):
    """Fixed microseconds per device op, whatever the batch (for closed-form tests)."""

    target: float = 1000.0
    rejection: float = 0.0
    draft: float = 0.0
    copy: float = 0.0
    fix: float = 0.0

    def target_forward(self, b): return self.target
    def rejection_sample(self, b): return self.rejection
    def draft_forward(self, b, i): return self.draft
    def d2h(self, b): return self.copy
    def fixup(self, b): return self.fix


class LevelCosts(DeviceCosts):
    """Another source's device op times x `level`: the roofline at the level of a device that
    was measured (a profile fitted on `vllm bench serve` files: `Profile.roofline_level`); the
    drafter's passes x `draft_level` more where the runs told them apart (`Profile.draft_level`)."""

    def __init__(self, costs: DeviceCosts, level: float, source: str, path: str | None = None,
                 draft_level: float | None = None):
        self.fallback, self.level, self.path = costs, level, path
        # the drafter's passes at a level of their own, where runs at two depths measured it
        self.draft = level * (draft_level if draft_level is not None else 1.0)
        self.sources = {op: f"roofline x {level:.4g} ({source})" for op in
                        ("target_forward", "rejection_sample", "d2h", "fixup")}
        self.sources["draft_forward"] = f"roofline x {self.draft:.4g} ({source})"

    def target_forward(self, b): return self.fallback.target_forward(b) * self.level
    def rejection_sample(self, b): return self.fallback.rejection_sample(b) * self.level
    def draft_forward(self, b, i): return self.fallback.draft_forward(b, i) * self.draft
    def d2h(self, b): return self.fallback.d2h(b) * self.level
    def fixup(self, b): return self.fallback.fixup(b) * self.level
