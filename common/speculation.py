"""The speculation methods (speculative_config's method), one object each: what a step verifies,
what drafts and where its passes run, what prices a pass, a proposer's host cost, and which
acceptance model it takes. Both halves ask a method's object (`method_of`) instead of comparing
its name: the plan (sim/config.py), the scheduler's token budget, the device costs
(sim/roofline.py, sim/tables.py), the drafter's costs (sim/drafter_costs.py), the acceptance
(common/acceptance.py), the memory (common/memory.py) and the engine (engine/args.py).

A new method is one object and its registration (`register`): a module of its own that builds a
`Speculation` (or a subclass, where its verify width is not 1 + k) and registers it; what it
drafts with must be one of the drafters below, which the device costs know how to price.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from stepgap.common.model_heads import eagle3_for, eagle_for

# What drafts, and so what prices a draft pass:
HEAD = "head"          # an EAGLE head: one decoder layer over the target's hidden states
MODEL = "model"        # a draft checkpoint: all its layers (vLLM's draft_model)
MTP = "mtp"            # the target's own next-token (MTP) layers, run in turn
KERNELS = "kernels"    # device kernels, no model: one pass over every request's history
HOST = "host"          # a CPU proposer: matching on the host after the step's tokens arrive
DRAFTERS = (HEAD, MODEL, MTP, KERNELS, HOST)
# Which acceptance model a method takes (common/acceptance.py `dataset_acceptance`):
BY_DRAFTER = "drafter"   # the drafter's published profile (else mtbench), shifted by dataset
BY_NGRAM = "ngram"       # the dataset's own n-gram matching profile
BY_SUFFIX = "suffix"     # suffix decoding's MT-bench profile


@dataclass(frozen=True, slots=True)
class Speculation:
    """One speculation method, as vLLM runs it."""

    name: str                  # speculative_config's method
    drafter: str               # DRAFTERS: what drafts
    # an EAGLE head shaped from the target when none is given (eagle3_for, eagle_for)
    derive_head: Callable | None = None
    eagle1_heads: bool = False    # EAGLE-1 heads: published ids (EAGLE_IDS) or head folders
    unpadded: bool = False        # vLLM's use_eagle(): it has the unpadded drafter batch too
    tables: bool = False          # measured operator tables price its passes (sim/tables.py)
    profiled: bool = False        # measured profiles (sim/profile.py) time its drafter
    engine: bool = False          # stepgap's engine drafts with it
    acceptance: str = BY_DRAFTER
    # a CPU proposer's cost a step, microseconds: a + b·requests + c·context tokens
    propose_us: tuple[float, float, float] | None = None
    # a device proposer launched without CUDA graphs: its host time a pass and that cost's band
    host_pass_us: float | None = None
    host_range: tuple[float, float] | None = None
    source: str = ""              # where its host cost comes from
    # What drafts, as the step loop asks it every step: plain fields, set from `drafter`.
    # on_cpu: proposes on the host from the sampled tokens (vLLM runs it with sync scheduling
    # only, vllm/config/vllm.py; no device passes); one_pass: its device drafts the k tokens in
    # one pass; uses_head: an EAGLE head drafts; needs_checkpoint: a draft model of its own
    # (speculative_config's model); uses_mtp_layers: the target's MTP layers draft (their
    # weights and KV cache are the drafter's).
    on_cpu: bool = field(init=False)
    one_pass: bool = field(init=False)
    uses_head: bool = field(init=False)
    needs_checkpoint: bool = field(init=False)
    uses_mtp_layers: bool = field(init=False)

    def __post_init__(self):
        for name, drafter in (("on_cpu", HOST), ("one_pass", KERNELS), ("uses_head", HEAD),
                              ("needs_checkpoint", MODEL), ("uses_mtp_layers", MTP)):
            object.__setattr__(self, name, self.drafter == drafter)

    def draft_tokens(self, k: int) -> int:
        """Draft tokens a decoding request carries into a step (the scheduler's
        num_spec_tokens): k."""
        return k

    def verify_tokens(self, k: int) -> int:
        """Tokens a step verifies for each decoding request: the drafts and the bonus token."""
        return 1 + self.draft_tokens(k)

    def pass_model(self, target, draft):
        """The config whose layers a draft pass runs: the head or the draft model, else the
        target (its MTP layer)."""
        return draft if self.drafter in (HEAD, MODEL) else target

    def pass_layers(self, c) -> int:
        """Decoder layers a draft pass runs of `c` (pass_model's): a draft model's all, one
        otherwise."""
        return c.num_layers if self.drafter == MODEL else 1

    def sliding_layers(self, c) -> int:
        return c.num_sliding_layers if self.drafter == MODEL else 0


METHODS: dict[str, Speculation] = {}


def register(method: Speculation) -> Speculation:
    """Add `method` to the methods both halves take (`--speculative-config`'s choices)."""
    METHODS[method.name] = method
    return method


def method_of(name: str) -> Speculation:
    """The method named `name` (a name the options have checked against METHODS)."""
    return METHODS[name]


# vLLM's methods, in the order the help and the errors list them
for _m in (
    Speculation("eagle3", HEAD, derive_head=eagle3_for, unpadded=True, tables=True,
                profiled=True, engine=True),
    Speculation("eagle", HEAD, derive_head=eagle_for, eagle1_heads=True, unpadded=True),
    Speculation("mtp", MTP, unpadded=True),
    Speculation("draft_model", MODEL, tables=True),
    Speculation("ngram", HOST, acceptance=BY_NGRAM, propose_us=(20.0, 1.0, 0.002),
                source="vLLM's NgramProposer (numba KMP over the context; sim/cpu_costs.py's "
                       "default)"),
    # NgramProposerGPU: its compiled kernels (windows, compares, argmaxes, gathers, masks),
    # launched without CUDA graphs
    Speculation("ngram_gpu", KERNELS, acceptance=BY_NGRAM, host_pass_us=150.0,
                host_range=(0.5, 2.0),
                source="NgramProposerGPU: its compiled kernels, launched without CUDA graphs"),
    # SuffixDecodingProposer: Arctic Inference's suffix tree per request, about 20 us a
    # request's speculation (arXiv:2411.04975), and a Python loop over the batch
    Speculation("suffix", HOST, acceptance=BY_SUFFIX, propose_us=(30.0, 20.0, 0.0),
                source="SuffixDecoding (arXiv:2411.04975): about 20 us of speculation a "
                       "request"),
):
    register(_m)
