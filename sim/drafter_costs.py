"""The drafter's own price, as vLLM runs it (docs/explanation/drafter-costs.md): what a step
with drafts costs besides the drafter's forwards, which the device costs price (the roofline,
measured tables or a profile).

vLLM's proposer (vllm/v1/spec_decode/llm_base_proposer.py `propose`) runs, for each step:
- on the host, the first pass's inputs: with the padded drafter batch (the default since vLLM
  0.11.0, #24539; `disable_padded_drafter_batch` false) a few kernels launched straight after
  the rejection sampler, with no wait; without it (every earlier version) only after the step's
  sampled tokens reached the host (`_bookkeeping_sync`), as numpy work and a copy up;
- for each pass, on the host: Python, the attention metadata built for that pass, and the
  launch of the forward: one CUDA-graph replay (FULL), the graph's pieces with each attention
  layer launched eagerly between them (PIECEWISE: the V1 model runner's only drafter graphs,
  `initialize_cudagraph_keys`), or every kernel (NONE: `enforce_eager`, or a `cudagraph_mode`
  whose mixed mode is NONE);
- for each pass, on the device: besides the forward, the sampling (argmax over the draft
  vocabulary) and the next pass's inputs (positions, slot mapping, the copies into the graph's
  buffers): `sample_and_prepare_kernels`, which the roofline and the tables both add.
The host runs ahead of the device wherever nothing waits: with the padded batch the drafter's
host work follows the target's launch, so it costs a step only where the host's whole launch
outlasts the device's step (sim/core.py adds it to the worker's `launch`); without it the
drafter waits for the step's tokens, so each pass takes the longer of its host and its device
time, after the wait (`Device.step_ops`).

A CPU proposer (n-gram, suffix decoding) matches on the host after the step's tokens arrive
(vLLM runs them in sync): its cost by requests and context tokens is its method's `propose_us`
(common/speculation.py), as are ngram_gpu's host pass and the sources of both.

Parallel drafting (`parallel_drafting`, vLLM #32887: P-EAGLE, PARD) drafts all k tokens in one
pass over k slots a request.

Every cost here is a band input (`drafter`, sim/bands.py) over the range given beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from stepgap.common.errors import UserError
from stepgap.common.speculation import METHODS, Speculation
from stepgap.sim.costs import Batch
from stepgap.sim.cpu_costs import OpCost

# What the default models: vLLM's V1 model runner with the padded drafter batch and PIECEWISE
# drafter graphs, as its main branch reads (vllm/v1/spec_decode/llm_base_proposer.py).
LATEST = "0.32"
PADDED_SINCE = (0, 11, 0)   # #24539: the padded drafter batch, on by default
# vLLM's compilation_config.cudagraph_mode values, and the drafter graphs each gives in the V1
# model runner: PIECEWISE where the mode's mixed mode is PIECEWISE or FULL, else none.
CUDAGRAPH_MODES = {"NONE": "NONE", "PIECEWISE": "PIECEWISE", "FULL": "PIECEWISE",
                   "FULL_DECODE_ONLY": "NONE", "FULL_AND_PIECEWISE": "PIECEWISE"}
DRAFTER_GRAPHS = ("FULL", "PIECEWISE", "NONE")

# -- the host, per pass (microseconds) -------------------------------------------------------
# base: Python, the pass's attention metadata, the forward's launch; per layer: an attention
# layer launched eagerly between graph pieces (PIECEWISE) or, eager, every kernel of a layer.
HOST_PASS_US = {"FULL": 150.0, "PIECEWISE": 750.0, "NONE": 750.0}
HOST_LAYER_US = {"FULL": 0.0, "PIECEWISE": 30.0, "NONE": 250.0}
HOST_SOURCE = {
    "PIECEWISE": "SpecDecode-Bench's H100 fit of vLLM's EAGLE-3 drafter (arXiv:2601.11580): "
                 "2.1 ms a step at k = 3 beside the drafter's kernels; vLLM #20780: the step "
                 "grows about 1.0 ms a draft token at batch 1 (H100)",
    "FULL": "vLLM #37588 and #34880 (FULL drafter graphs take the per-pass dispatch away; "
            "the metadata build stays)",
    "NONE": "vLLM #49488: an eager draft loop leaves the H100 idle between kernels",
}
# The first pass's inputs: padded, a few kernels launched with no wait; not padded, CPU work
# after the sampled tokens reach the host (numpy indices, a copy up).
HOST_PREP_US = {True: 150.0, False: 900.0}
# The band: every host cost here x LOW .. HIGH (sim/bands.py `drafter`), by graph mode: the
# PIECEWISE host pass is the one with published evidence (two sources within 30 % of each
# other); FULL and eager ones rest on a structure, not a timing.
HOST_RANGE = {"PIECEWISE": (0.6, 1.6), "FULL": (0.4, 2.5), "NONE": (0.5, 2.0)}

# -- the device, per pass (kernels besides the forward's) ------------------------------------
SAMPLE_FIRST_KERNELS = 6    # padded inputs, hidden-state gather, argmax, d2t, ...
SAMPLE_NEXT_KERNELS = 10    # positions, seq lens, slot mapping, input ids, argmax, d2t, ...
NGRAM_GPU_KERNELS = 16      # ngram_gpu: windows, compares, argmaxes, gathers, masks (compiled)
NGRAM_N = 5                 # vLLM's prompt_lookup_min = max default

# -- CPU proposers (their cost a step: common/speculation.py `propose_us`) -------------------
PROPOSE_RANGE = (0.5, 3.0)   # no measurement of either on a serving host: wide


def propose_cost(spec: Speculation) -> OpCost:
    """A CPU proposer's cost a step: a + b·requests + c·context tokens (microseconds)."""
    return OpCost(*spec.propose_us)


def parse_version(text: str) -> tuple[int, ...]:
    """`0.10.1`, `v0.9.2`, `0.11.0rc1` -> (0, 10, 1), ...: its leading numbers."""
    m = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if m is None:
        raise UserError(f"--vllm-version {text!r}: expected a version such as 0.10.1")
    return tuple(int(g) for g in m.groups() if g is not None)


def drafter_graphs(cudagraph_mode: str | None, enforce_eager: bool,
                   given: str | None = None) -> str:
    """The drafter's CUDA graphs: `given` (--drafter-cudagraph-mode), else what vLLM's V1
    model runner derives from compilation_config.cudagraph_mode and speculative_config's
    enforce_eager."""
    if given is not None:
        return given
    if enforce_eager:
        return "NONE"
    return CUDAGRAPH_MODES[cudagraph_mode or "FULL_AND_PIECEWISE"]


@dataclass(frozen=True, slots=True)
class DrafterCosts:
    """A run's drafter as vLLM runs it (`of` resolves it once from the config)."""

    spec: Speculation
    k: int                        # the drafts a request carries into a step (its method's)
    graphs: str = "PIECEWISE"     # the drafter's CUDA graphs (DRAFTER_GRAPHS)
    padded: bool = True           # the padded drafter batch (no wait before drafting)
    parallel: bool = False        # parallel drafting: one pass for the k tokens
    layers: int = 1               # attention layers a pass runs
    host_scale: float = 1.0       # x every host cost (the band's `drafter` input)
    version: str = LATEST

    @classmethod
    def of(cls, cfg, draft, target) -> DrafterCosts:
        version = cfg.vllm_version or LATEST
        unpadded = cfg.disable_padded_drafter_batch if cfg.disable_padded_drafter_batch \
            is not None else parse_version(version) < PADDED_SINCE
        spec = METHODS[cfg.method]
        # (a draft model and ngram_gpu run padded only: vLLM refuses them otherwise)
        padded = not (unpadded and spec.unpadded)
        layers = spec.pass_layers(draft) if draft is not None else 1
        return cls(spec, spec.draft_tokens(cfg.k), cfg.drafter_cudagraph_mode or "PIECEWISE",
                   padded, cfg.parallel_drafting, layers, cfg.drafter_host_scale, version)

    # -- what runs ------------------------------------------------------------------------

    @property
    def method(self) -> str:
        return self.spec.name

    @property
    def on_cpu(self) -> bool:
        return self.spec.on_cpu

    def passes(self, b: Batch) -> int:
        """The device's draft passes of a step: k (one over a step that only prefills, to
        fill the drafter's KV), one for ngram_gpu or parallel drafting, none for a CPU
        proposer."""
        if not self.k or self.on_cpu:
            return 0
        if self.spec.one_pass or self.parallel:
            return 1 if b.num_sampling else 0
        return self.k if b.num_sampling else 1

    def passes_of(self, sampling: np.ndarray) -> np.ndarray:
        """`passes` of every step, from each one's sampling requests."""
        if not self.k or self.on_cpu:
            return np.zeros(len(sampling), np.int64)
        if self.spec.one_pass or self.parallel:
            return (sampling > 0).astype(np.int64)
        return np.where(sampling > 0, self.k, 1)

    def parallel_batch(self, b: Batch) -> Batch:
        """Parallel drafting's one pass: k slots a sampling request (its padded first pass
        plus k − 1 masked slots), sampling k rows each."""
        extra = (self.k - 1) * b.num_sampling
        return replace(b, num_tokens=b.num_tokens + extra, num_sampling=self.k * b.num_sampling,
                       num_logits=b.num_logits + extra, kv_tokens=b.kv_tokens + extra,
                       attn_pairs=b.attn_pairs + extra * (b.kv_tokens / max(b.num_reqs, 1)))

    @staticmethod
    def sample_and_prepare_kernels(first: bool) -> int:
        """Kernels a pass launches besides its forward: the argmax and the next inputs."""
        return SAMPLE_FIRST_KERNELS if first else SAMPLE_NEXT_KERNELS

    # -- the host -------------------------------------------------------------------------

    def host_pass_us(self) -> float:
        if self.spec.host_pass_us is not None:   # a proposer's kernels, without graphs
            return self.spec.host_pass_us * self.host_scale
        return (HOST_PASS_US[self.graphs] + HOST_LAYER_US[self.graphs] * self.layers) \
            * self.host_scale

    def host_prep_us(self) -> float:
        return HOST_PREP_US[self.padded] * self.host_scale

    def launch_us(self, b: Batch) -> float:
        """With the padded batch, the drafter's host work in the step's launch: its first
        inputs and every pass's dispatch (0 for a CPU proposer or without it)."""
        return self.launch_of(self.passes(b))

    def launch_of(self, passes: int) -> float:
        """`launch_us` of a step with that many draft passes."""
        if not passes or not self.padded:
            return 0.0
        return self.host_prep_us() + passes * self.host_pass_us()

    def waits_for_tokens(self) -> bool:
        """Without the padded batch the drafter waits for the step's tokens on the host."""
        return bool(self.k) and not self.on_cpu and not self.padded

    def serialized(self, device: list[float], wake_us: float) -> tuple[float, list[float]]:
        """Without the padded batch: the device's idle time before the first pass (the host's
        wake and the CPU's input preparation) and each pass's time, the longer of its device
        and its host time (the host cannot run ahead)."""
        host = self.host_pass_us()
        return wake_us + self.host_prep_us(), [max(d, host) for d in device]

    # -- what it says ---------------------------------------------------------------------

    def host_range(self) -> tuple[float, float]:
        if self.on_cpu:
            return PROPOSE_RANGE
        return self.spec.host_range or HOST_RANGE[self.graphs]

    def source(self) -> str:
        return self.spec.source or HOST_SOURCE[self.graphs]

    def describe(self) -> str:
        """One line for the result's notes: what the drafter's price models."""
        if self.on_cpu:
            return (f"drafter: {self.method} proposes on the host after each step's tokens "
                    f"arrive ({self.spec.source})")
        batch = "the padded drafter batch" if self.padded else \
            "no padded drafter batch (the drafter waits for the step's tokens)"
        how = "one pass for the k drafts (parallel drafting)" if self.parallel else \
            "a pass a draft"   # (not k: advise's cells at every k share one line)
        return (f"drafter: vLLM {self.version}'s, {batch}, {self.graphs} drafter CUDA graphs, "
                f"{how}; host {self.host_pass_us():.0f} us a pass, "
                f"{self.host_prep_us():.0f} us for the first inputs")

    def to_dict(self) -> dict:
        return {"vllm_version": self.version, "padded_drafter_batch": self.padded,
                "cudagraph_mode": self.graphs, "parallel_drafting": self.parallel,
                "host_pass_us": round(self.host_pass_us(), 3),
                "host_prep_us": round(self.host_prep_us(), 3)}
