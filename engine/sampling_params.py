"""How a run samples and accepts drafts (`SamplingConfig`, as vLLM's sampling_params.py holds
SamplingParams): plain settings, validated, and free of torch, so that the command line builds
its options without importing it (engine/sampler.py is the sampler that reads them).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepgap.common.acceptance import AcceptanceProfile
from stepgap.common.errors import UserError


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0            # 0: off
    top_p: float = 1.0
    synthetic: AcceptanceProfile | None = None  # accept drafts as this profile says
    replay: bool = False      # accept as each request's recorded `accepted` list says
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise UserError(f"--temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"--top-k must be >= 0 (0 is off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.synthetic is not None and self.replay:
            raise UserError("give --synthetic-acceptance rates or replay, not both")
        if isinstance(self.synthetic, (tuple, list)):   # bare rates: every request alike
            object.__setattr__(self, "synthetic", AcceptanceProfile(
                "custom", tuple(self.synthetic), 0.0, "--synthetic-acceptance"))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def forced(self) -> bool:
        """Drafts are accepted by given counts, not by comparing with the target."""
        return self.synthetic is not None or self.replay

