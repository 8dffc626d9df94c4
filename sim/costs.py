"""What each op costs: the device roofline and the CPU op model (DESIGN.md §3).

Device. `DeviceCosts` is the seam: one method per device op, each giving microseconds for a
`Batch`. `RooflineCosts` derives them from the model's own config and a `Hardware` entry: every
kernel costs max(flops / achievable FLOP/s, bytes / achievable bandwidth) + a fixed per-kernel
cost, summed over the kernels the op launches. `ConstantCosts` gives fixed times (closed-form
tests). A measured profile can later implement the same methods and win wherever it has data.

CPU. Each CPU op costs a + b·num_reqs + c·num_tokens microseconds (`OpCost`), plus three
latencies: launch (CPU launch start to the first kernel running), wake (a blocking wait
returning after its event fires) and IPC (one message between engine and a `process` worker).
A `process` worker on a synchronous device (the CPU) computes each step itself and then sends
its result, so two more terms, also a + b·num_reqs + c·num_tokens, describe it: the result's
latency to the engine and the worker's own turnaround before it can prepare the next step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from sim.hardware import Hardware
from common.errors import UserError
from common.modelcfg import Eagle3Config, ModelConfig

BF16 = 2  # bytes per weight, activation and KV element

# Kernel counts not covered by the GEMMs and attention, after the structure of vLLM's Llama and
# EAGLE-3 forwards and its samplers (docs/sim.md lists them).
TARGET_LAYER_ELEMENTWISE = 5   # 2 fused add+RMSNorm, rotary, KV-cache write, SiLU-and-mul
TARGET_EXTRA = 2               # embedding gather, final norm (the lm_head is a GEMM)
SAMPLE_KERNELS = 3             # plain greedy sampling (k = 0): argmax and output assembly
REJECTION_KERNELS = 6          # greedy rejection: argmax, compare, accept prefix, bonus, output
DRAFT_LAYER_ELEMENTWISE = 8    # 2 input norms, concat, rotary, KV write, add+norm, SiLU, norm
DRAFT_FIRST_BOOKKEEPING = 6    # padded inputs, hidden-state gather, argmax, d2t, ...
DRAFT_NEXT_BOOKKEEPING = 10    # positions, seq lens, slot mapping, input ids, argmax, d2t, ...
FIXUP_KERNELS = 3              # zero-bubble: positions, seq lens, slot mapping from the count


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


class DeviceCosts(Protocol):
    """Microseconds per device op for a batch. Implemented by RooflineCosts and ConstantCosts."""

    def target_forward(self, b: Batch) -> float: ...
    def rejection_sample(self, b: Batch) -> float: ...
    def draft_forward(self, b: Batch, i: int) -> float: ...
    def d2h(self, b: Batch) -> float: ...
    def fixup(self, b: Batch) -> float: ...


@dataclass(frozen=True, slots=True)
class ConstantCosts:
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


class RooflineCosts:
    """Device op times from first principles: the model's shapes on a hardware entry.

    Weight-streaming GEMMs dominate decode; attention reads the KV of every context token; each
    kernel adds `hw.kernel_us`. Dense parts depend only on token counts and are memoized.
    """

    def __init__(self, target: ModelConfig, draft: Eagle3Config | None, hw: Hardware, k: int):
        self.t, self.d, self.hw, self.k = target, draft, hw, k
        self.flops = hw.flops_eff / 1e6   # FLOP per microsecond
        self.bw = hw.bw / 1e6             # bytes per microsecond
        self._target: dict[tuple[int, int], float] = {}
        self._draft: dict[tuple[int, int, int], float] = {}

    # -- kernels --------------------------------------------------------------------------

    def gemm(self, m: int, k: int, n: int) -> float:
        """An (m x k) @ (k x n) bf16 GEMM: weights and activations read once, output written."""
        flops = 2.0 * m * k * n
        nbytes = BF16 * (k * n + m * (k + n))
        return max(flops / self.flops, nbytes / self.bw) + self.hw.kernel_us

    def streaming(self, nbytes: float, kernels: int = 1) -> float:
        """Memory-bound elementwise kernels moving `nbytes` in all."""
        return nbytes / self.bw + kernels * self.hw.kernel_us

    def attention(self, pairs: float, kv_tokens: int, heads: int, kv_heads: int,
                  head_dim: int) -> float:
        """One layer's attention: QK^T and PV over the pairs, the KV of every context read."""
        flops = 4.0 * pairs * heads * head_dim
        nbytes = 2 * BF16 * kv_tokens * kv_heads * head_dim
        return max(flops / self.flops, nbytes / self.bw) + self.hw.kernel_us

    def _layer_gemms(self, m: int, h: int, qkv_in: int, heads: int, kv_heads: int, hd: int,
                     inter: int) -> float:
        q, kv = heads * hd, kv_heads * hd
        return (self.gemm(m, qkv_in, q + 2 * kv) + self.gemm(m, q, h)
                + self.gemm(m, h, 2 * inter) + self.gemm(m, inter, h))

    def _layer_elementwise(self, m: int, h: int, heads: int, kv_heads: int, hd: int,
                           inter: int, kernels: int) -> float:
        q, kv = heads * hd, kv_heads * hd
        elems = 2 * 4 * m * h + 2 * m * (q + kv) + 4 * m * kv + 3 * m * inter
        return self.streaming(BF16 * elems, kernels)

    # -- ops ------------------------------------------------------------------------------

    def _target_dense(self, m: int, logits: int) -> float:
        key = (m, logits)
        t = self._target.get(key)
        if t is None:
            c = self.t
            layer = (self._layer_gemms(m, c.hidden_size, c.hidden_size, c.num_heads,
                                       c.num_kv_heads, c.head_dim, c.intermediate_size)
                     + self._layer_elementwise(m, c.hidden_size, c.num_heads, c.num_kv_heads,
                                               c.head_dim, c.intermediate_size,
                                               TARGET_LAYER_ELEMENTWISE))
            t = (c.num_layers * layer + self.streaming(BF16 * 3 * m * c.hidden_size, TARGET_EXTRA)
                 + (self.gemm(logits, c.hidden_size, c.vocab_size) if logits else 0.0))
            if self.k == 0 and logits:
                t += self.streaming(4 * logits * c.vocab_size, SAMPLE_KERNELS)
            self._target[key] = t
        return t

    def target_forward(self, b: Batch) -> float:
        c = self.t
        attn = self.attention(b.attn_pairs, b.kv_tokens, c.num_heads, c.num_kv_heads, c.head_dim)
        return self._target_dense(b.num_tokens, b.num_logits) + c.num_layers * attn

    def rejection_sample(self, b: Batch) -> float:
        """Greedy verification: argmax over the fp32 logits, then a few tiny kernels."""
        return self.streaming(4 * b.num_logits * self.t.vocab_size, REJECTION_KERNELS)

    def _draft_dense(self, first: bool, m: int, sampling: int) -> float:
        key = (first, m, sampling)
        t = self._draft.get(key)
        if t is None:
            d = self.d
            h = d.hidden_size
            t = (self._layer_gemms(m, h, 2 * h, d.num_heads, d.num_kv_heads, d.head_dim,
                                   d.intermediate_size)
                 + self._layer_elementwise(m, h, d.num_heads, d.num_kv_heads, d.head_dim,
                                           d.intermediate_size, DRAFT_LAYER_ELEMENTWISE)
                 + self.gemm(sampling, h, d.draft_vocab_size)
                 + self.streaming(4 * sampling * d.draft_vocab_size,
                                  DRAFT_FIRST_BOOKKEEPING if first else DRAFT_NEXT_BOOKKEEPING))
            if first:  # fc fuses the three tapped target hidden states, once per step
                t += self.gemm(m, 3 * d.target_hidden_size, h)
            self._draft[key] = t
        return t

    def draft_forward(self, b: Batch, i: int) -> float:
        """Pass 0 runs over every token of the step (padded); passes 1..k-1 one per request."""
        d = self.d
        if i == 0:
            m, pairs, kv = b.num_tokens, b.attn_pairs, b.kv_tokens
        else:
            m, kv = b.num_sampling, b.kv_tokens + i * b.num_sampling
            pairs = float(kv)
        attn = self.attention(pairs, kv, d.num_heads, d.num_kv_heads, d.head_dim)
        return self._draft_dense(i == 0, m, b.num_sampling) + attn

    def d2h(self, b: Batch) -> float:
        return self.hw.d2h_us

    def fixup(self, b: Batch) -> float:
        return FIXUP_KERNELS * self.hw.kernel_us


class Jitter:
    """The machine's own speed noise, as a factor on the device ops of each step.

    A shared machine does not run a step in the same time twice: other tenants share its caches
    and memory. Measured (engine/profile.py `fit_jitter`), the noise has three parts, and so
    does the factor: `level` (a whole run is fast or slow: the machine drifts over seconds and
    minutes), a `trace` of log factors in `bin_us` windows replayed from a seeded offset (bursts
    within a run, with their measured length and height), and an independent per-step part of
    log-std `sigma_step`. The trace and the per-step part are scaled to mean 1, so mean times
    are the fits' times `level`.
    """

    def __init__(self, trace: list[float], bin_us: float, sigma_step: float, level: float = 1.0,
                 seed: int = 0):
        self.rng = np.random.default_rng([seed, 3])
        f = np.exp(np.asarray(trace or [0.0], float))
        self.factors = (f / f.mean()).tolist()
        self.offset = int(self.rng.integers(len(self.factors)))
        self.bin_us, self.sigma_step, self.level = max(bin_us, 1e-9), sigma_step, level
        self.norm = level * math.exp(-sigma_step ** 2 / 2)

    def factor(self, t_us: float) -> float:
        """The factor of a step that starts at `t_us`."""
        i = (self.offset + int(t_us // self.bin_us)) % len(self.factors)
        e = self.rng.standard_normal() if self.sigma_step else 0.0
        return self.factors[i] * math.exp(self.sigma_step * e) * self.norm


def run_levels(log_factors: list[float], n: int, seed: int = 0) -> list[float]:
    """Speed levels for n runs: the measured run-level log factors' quantiles at (j + ½)/n,
    dealt out in a seeded order and scaled to mean 1, so that n runs hold the measured spread
    of machine speeds and their mean is the profile's (as sim/acceptance.py stratifies the
    requests' acceptance)."""
    if not log_factors or n < 1:
        return [1.0] * max(n, 0)
    q = np.quantile(np.asarray(log_factors, float), (np.arange(n) + 0.5) / n)
    f = np.exp(q)
    f = f / f.mean()
    order = np.random.default_rng([seed, 4]).permutation(n)
    return [float(f[j]) for j in order]


# -------------------------------------------------------------------------------------------
# CPU

CPU_OPS = ("schedule", "update_from_output", "prepare_inputs", "launch")
# Terms of the same form that are not ops (no span): a `process` worker on a synchronous device
# (the CPU) computes a step, then collects and sends its result. `result_latency` runs from the
# step's last device op to the engine's update_from_output; `worker_turnaround` is the time the
# worker then spends (collect, send, receive the next step) before it can prepare the next one.
CPU_TERMS = ("result_latency", "worker_turnaround")
# vLLM's topology (`--topology vllm`, docs/vllm.md): terms of its RPC structure and of its API
# server. None where absent (stepgap's engine sends one message per step and has no server).
# `rpc_mid`: the worker idle between its execute_model and sample_tokens RPCs (it answers one
# and takes the next off the shared-memory queue); `rpc_drafts`: in sync with drafts, the engine
# core's take_draft_token_ids round trip after update_from_output; `process_outputs`: the API
# server's work on one step's outputs (num_reqs = the chunks); `add_request`: the API server
# taking in one request (num_tokens = its prompt). The engine core and the API server share one
# core: their work is serialised (the `host` core of sim/loop.py).
VLLM_TERMS = ("rpc_mid", "rpc_drafts", "process_outputs", "add_request")
CPU_COSTS = CPU_OPS + CPU_TERMS + VLLM_TERMS
LATENCIES = ("launch_latency_us", "wake_us", "ipc_us", "client_latency_us")


@dataclass(frozen=True, slots=True)
class OpCost:
    """a + b·num_reqs + c·num_tokens microseconds."""

    a: float
    b: float = 0.0
    c: float = 0.0

    def __post_init__(self):
        for f in ("a", "b", "c"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise UserError(f"cpu cost: {f} must be a number >= 0, got {v!r}")

    def __call__(self, num_reqs: int, num_tokens: int) -> float:
        return self.a + self.b * num_reqs + self.c * num_tokens


@dataclass(frozen=True, slots=True)
class CpuCosts:
    """The CPU side of the step loop. Defaults: a vLLM V1 engine on one core (docs/sim.md)."""

    schedule: OpCost = field(default_factory=lambda: OpCost(60.0, 6.0, 0.02))
    update_from_output: OpCost = field(default_factory=lambda: OpCost(60.0, 8.0, 0.05))
    prepare_inputs: OpCost = field(default_factory=lambda: OpCost(200.0, 4.0, 0.05))
    launch: OpCost = field(default_factory=lambda: OpCost(600.0, 2.0, 0.0))
    launch_latency_us: float = 40.0
    wake_us: float = 15.0
    ipc_us: float = 60.0
    # Process worker on a synchronous device only. None: wake_us + ipc_us, as on a GPU host.
    result_latency: OpCost | None = None
    worker_turnaround: OpCost = field(default_factory=lambda: OpCost(0.0))
    # vLLM's topology only (VLLM_TERMS); the client's latency: from the API server's processing
    # of a chunk to the benchmark client having it (the HTTP path both ways, lumped).
    rpc_mid: OpCost | None = None
    rpc_drafts: OpCost | None = None
    process_outputs: OpCost | None = None
    add_request: OpCost | None = None
    client_latency_us: float = 0.0

    def __post_init__(self):
        for f in LATENCIES:
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or v < 0:
                raise UserError(f"cpu cost: {f} must be a number >= 0, got {v!r}")

    def result_latency_us(self, num_reqs: int, num_tokens: int) -> float:
        if self.result_latency is None:
            return self.wake_us + self.ipc_us
        return self.result_latency(num_reqs, num_tokens)

    def scaled(self, s: float) -> CpuCosts:
        """Every op and latency times `s` (the seed calibration fits one such factor)."""
        def mul(c: OpCost | None) -> OpCost | None:
            return None if c is None else OpCost(c.a * s, c.b * s, c.c * s)
        return CpuCosts(*(mul(getattr(self, op)) for op in CPU_OPS),
                        result_latency=mul(self.result_latency),
                        worker_turnaround=mul(self.worker_turnaround),
                        **{t: mul(getattr(self, t)) for t in VLLM_TERMS},
                        **{lat: getattr(self, lat) * s for lat in LATENCIES})

    def with_ops(self, overrides: dict[str, OpCost]) -> CpuCosts:
        for op in overrides:
            if op not in CPU_COSTS:
                raise UserError(f"cpu cost: unknown op {op!r} (ops: {', '.join(CPU_COSTS)})")
        return replace(self, **overrides)

    def to_dict(self) -> dict:
        d = {op: [c.a, c.b, c.c] if (c := getattr(self, op)) is not None else None
             for op in CPU_COSTS}
        d.update({lat: getattr(self, lat) for lat in LATENCIES})
        return d

    @classmethod
    def from_dict(cls, d: dict, base: CpuCosts | None = None) -> CpuCosts:
        """The inverse of to_dict; keys it lacks keep `base`'s values (default: the defaults)."""
        base = base or cls()
        known = set(CPU_COSTS) | set(LATENCIES)
        unknown = set(d) - known
        if unknown:
            raise UserError(f"cpu costs: unknown key {sorted(unknown)[0]!r} "
                            f"(known: {', '.join(sorted(known))})")

        def us(x) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) \
                and math.isfinite(x) and x >= 0

        kw = {}
        for key, v in d.items():
            if key in CPU_COSTS:
                if v is not None and (not isinstance(v, (list, tuple)) or not 1 <= len(v) <= 3
                                      or not all(us(x) for x in v)):
                    raise UserError(f"cpu costs: {key}: expected [a, b, c], finite "
                                    f"microseconds >= 0, got {v!r}")
                kw[key] = None if v is None else OpCost(*v)
            else:
                if v is not None and not us(v):
                    raise UserError(f"cpu costs: {key}: expected microseconds >= 0, got {v!r}")
                kw[key] = v
        return replace(base, **kw)
