"""The device roofline: device op times from first principles, the model's shapes on a
hardware entry (docs/explanation/design.md §3, docs/explanation/device-costs.md).

Every kernel costs max(flops / achievable FLOP/s, bytes / achievable bandwidth) + a fixed
per-kernel cost, summed over the kernels the op launches.
"""

from __future__ import annotations

import functools

import numpy as np

from stepgap.common.errors import UserError
from stepgap.common.modelcfg import ModelConfig
from stepgap.common.scheduler import MAX_MODEL_LEN
from stepgap.common.speculation import METHODS
from stepgap.sim.costs import Batch, DeviceCosts
from stepgap.sim.drafter_costs import NGRAM_GPU_KERNELS, NGRAM_N, DrafterCosts
from stepgap.sim.hardware import Hardware
from stepgap.sim.moe_tables import mtp_wrapper

BF16 = 2  # bytes per weight, activation and KV element

# Kernel counts not covered by the GEMMs and attention, after the structure of vLLM's Llama and
# EAGLE-3 forwards and its samplers (docs/explanation/device-costs.md lists them).
TARGET_LAYER_ELEMENTWISE = 5   # 2 fused add+RMSNorm, rotary, KV-cache write, SiLU-and-mul
TARGET_EXTRA = 2               # embedding gather, final norm (the lm_head is a GEMM)
SAMPLE_KERNELS = 3             # plain greedy sampling (k = 0): argmax and output assembly
REJECTION_KERNELS = 6          # greedy rejection: argmax, compare, accept prefix, bonus, output
DRAFT_LAYER_ELEMENTWISE = 8    # 2 input norms, concat, rotary, KV write, add+norm, SiLU, norm
FIXUP_KERNELS = 3              # zero-bubble: positions, seq lens, slot mapping from the count
MLA_EXTRA_KERNELS = 3          # latent attention: q_a and kv_a norms, the absorbed V up-projection
MOE_ROUTING_KERNELS = 4        # top-k softmax, align and sort by expert, sum of the k outputs
MTP_EXTRA_KERNELS = 4          # MTP: embedding gather, enorm, hnorm, the concatenation


def expected_experts(num_experts: int, top_k: int, tokens: int, skew: float = 0.0) -> float:
    """The expected number of distinct experts `tokens` tokens touch in one MoE layer, each
    routing to `top_k` of `num_experts`, independently of the others.

    Uniform routing (skew 0): E·(1 − (1 − k/E)^T): k at T = 1, E as T grows. With skew s, the
    experts' popularities fall as a Zipf law, p_e ∝ (e + 1)^−s, and a token picks expert e with
    q_e = min(1, c·p_e), c set so that Σ q_e = k (a token always picks k distinct experts);
    then E[distinct] = Σ_e 1 − (1 − q_e)^T. Skew means fewer distinct experts at moderate T
    (popular experts are shared), and a slower approach to all E."""
    if tokens <= 0:
        return 0.0
    if skew == 0:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    q = _routing_probs(num_experts, top_k, skew)
    return float(np.sum(1.0 - (1.0 - q) ** tokens))


@functools.cache
def _routing_probs(num_experts: int, top_k: int, skew: float) -> np.ndarray:
    p = (np.arange(num_experts) + 1.0) ** -skew
    p /= p.sum()
    q = np.zeros(num_experts)
    capped = np.zeros(num_experts, bool)
    for _ in range(num_experts):   # water-filling: cap the most popular at 1, rescale the rest
        free = ~capped
        q[free] = p[free] * (top_k - capped.sum()) / p[free].sum()
        q[capped] = 1.0
        over = free & (q > 1.0)
        if not over.any():
            break
        capped |= over
    return q


class RooflineCosts(DeviceCosts):
    """Device op times from first principles: the model's shapes on a hardware entry.

    Weight-streaming GEMMs dominate decode; attention reads the KV of every context token; each
    kernel adds `hw.kernel_us`. Dense parts depend only on token counts and are memoized.

    With tensor parallelism over `tp` GPUs every op is one rank's: each GEMM's sharded width is
    divided by tp (column-parallel: the output; row-parallel: the input), each rank attends over its
    own heads and KV heads, and the collectives of vLLM's sharding are added: an all-reduce of the
    hidden states after the vocabulary-parallel embedding, after every attention and every MLP (or
    MoE), and an all-gather of the logits. A MoE layer reads the experts its tokens touch
    (`expected_experts`). `method` says what the draft passes are
    (docs/explanation/past-one-gpu.md).

    `moe` (sim/expert_parallel.py `MoeCosts`, set by the run's resolution) prices the target's
    MoE blocks where measured tables or data and expert parallelism say more than this: None
    leaves every MoE layer to the roofline below, as before it existed.
    """

    def __init__(self, target: ModelConfig, draft, hw: Hardware, k: int, tp: int = 1,
                 method: str = "eagle3", routing_skew: float = 0.0,
                 max_model_len: int = MAX_MODEL_LEN, kv_bytes: int = BF16):
        self.t, self.d, self.hw, self.k = target, draft, hw, k
        self.kv_bytes = kv_bytes          # a KV-cache element (--kv-cache-dtype)
        self.tp, self.method, self.skew, self.max_model_len = tp, method, routing_skew, \
            max_model_len
        self.spec = spec = METHODS[method]
        self.flops = hw.flops_eff / 1e6   # FLOP per microsecond
        self.fp8 = hw.fp8_flops_eff / 1e6
        self.bw = hw.bw / 1e6             # bytes per microsecond
        self.link = hw.interconnect
        if tp > 1 and self.link is None:
            raise UserError(f"--tensor-parallel-size {tp}: --gpu {hw.name} has no interconnect "
                            "in the catalog")
        self._target: dict[tuple[int, int], float] = {}
        self._draft: dict[tuple, float] = {}
        self._sampled: dict[tuple[int, int], float] = {}     # k = 0: the dense part + sampling
        self._attn: tuple[Batch | None, float] = (None, 0.0)   # the last forward's attention
        self.moe = None   # MoeCosts: the target's MoE blocks from tables or under DP/EP
        # a GQA target without windowed layers: its attention summed in one expression, term
        # for term as `_attention` sums it (the simulator's hot path; MoE blocks change nothing
        # of the attention, so a GQA MoE target takes it too)
        t = target
        self._plain = None if t.is_mla or t.num_sliding_layers else \
            (t.num_layers, *self._heads(t), t.head_dim)
        self._keyed = self._plain is not None and not t.is_moe and \
            (not k or spec.uses_head)   # step_key

    # -- kernels --------------------------------------------------------------------------

    def gemm(self, m: int, k: int, n: int, wbytes: float = BF16) -> float:
        """An (m x k) @ (k x n) GEMM: weights (wbytes each) and bf16 activations read once,
        the output written. One-byte (fp8) weights run at the fp8 rate where there is one."""
        flops = 2.0 * m * k * n
        nbytes = wbytes * k * n + BF16 * m * (k + n)
        peak = self.fp8 if wbytes == 1 else self.flops
        return _most(flops / peak, nbytes / self.bw) + self.hw.kernel_us

    def streaming(self, nbytes: float, kernels: int = 1) -> float:
        """Memory-bound elementwise kernels moving `nbytes` in all."""
        return nbytes / self.bw + kernels * self.hw.kernel_us

    def attention(self, pairs: float, kv_tokens: int, heads: int, kv_heads: int,
                  head_dim: int) -> float:
        """One layer's attention: QK^T and PV over the pairs, the KV of every context read
        (`kv_bytes` an element)."""
        flops = 4.0 * pairs * heads * head_dim
        nbytes = 2 * self.kv_bytes * kv_tokens * kv_heads * head_dim
        return max(flops / self.flops, nbytes / self.bw) + self.hw.kernel_us

    def all_reduce(self, m: int, width: int) -> float:
        """All-reduce of m rows of bf16 hidden states over the tensor-parallel group."""
        return 0.0 if self.tp == 1 else self.link.all_reduce_us(BF16 * m * width, self.tp)

    def gather_logits(self, rows: int, vocab: int) -> float:
        return 0.0 if self.tp == 1 or not rows else \
            self.link.all_gather_us(BF16 * rows * vocab, self.tp)

    def _layer_gemms(self, m: int, h: int, qkv_in: int, heads: int, kv_heads: int, hd: int,
                     inter: int, w: float = BF16) -> float:
        q, kv = heads * hd, kv_heads * hd
        return (self.gemm(m, qkv_in, q + 2 * kv, w) + self.gemm(m, q, h, w)
                + self.gemm(m, h, 2 * inter, w) + self.gemm(m, inter, h, w))

    def _layer_elementwise(self, m: int, h: int, heads: int, kv_heads: int, hd: int,
                           inter: int, kernels: int) -> float:
        return self._elementwise(m, h, heads * hd, kv_heads * hd, inter, kernels)

    def _elementwise(self, m: int, h: int, q: int, kv: int, inter: int, kernels: int) -> float:
        elems = 2 * 4 * m * h + 2 * m * (q + kv) + 4 * m * kv + 3 * m * inter
        return self.streaming(BF16 * elems, kernels)

    # -- one decoder layer of any family, on one rank ----------------------------------------

    def _heads(self, c) -> tuple[int, int]:
        """(attention heads, KV heads) of one rank."""
        return c.num_heads // self.tp, max(1, c.num_kv_heads // self.tp)

    def _dense_layer(self, c: ModelConfig, m: int, qkv_in: int | None = None) -> float:
        """A dense GQA layer's GEMMs and elementwise kernels (no attention kernel)."""
        heads, kv = self._heads(c)
        inter = c.intermediate_size // self.tp
        return (self._layer_gemms(m, c.hidden_size, qkv_in or c.hidden_size, heads, kv,
                                  c.head_dim, inter, c.weight_bytes)
                + self._layer_elementwise(m, c.hidden_size, heads, kv, c.head_dim, inter,
                                          TARGET_LAYER_ELEMENTWISE))

    def _layer(self, c: ModelConfig, m: int, moe: bool, rows: int = 0) -> float:
        """Any layer's projections, MLP or MoE and elementwise kernels (no attention kernel);
        `rows`: the tokens a MoE block sees, gathered from every DP rank (0: its own m)."""
        if not (moe or c.is_mla):
            return self._dense_layer(c, m)
        h, w, tp = c.hidden_size, c.weight_bytes, self.tp
        heads, kv = self._heads(c)
        if c.is_mla:   # weight-absorbed latent attention (vLLM's MLA decode path)
            qk = c.qk_nope_head_dim + c.qk_rope_head_dim
            latent = c.kv_lora_rank + c.qk_rope_head_dim
            q_width, kv_width = heads * qk, latent
            proj = (self.gemm(m, h, c.q_lora_rank, w) + self.gemm(m, c.q_lora_rank, q_width, w)
                    if c.q_lora_rank else self.gemm(m, h, q_width, w))
            proj += (self.gemm(m, h, latent, w)
                     + self.gemm(m, c.kv_lora_rank, heads * (c.qk_nope_head_dim
                                                             + c.v_head_dim), w)
                     + self.gemm(m, heads * c.v_head_dim, h, w))
            kernels = TARGET_LAYER_ELEMENTWISE + MLA_EXTRA_KERNELS
        else:
            q_width, kv_width = heads * c.head_dim, kv * c.head_dim
            proj = (self.gemm(m, h, q_width + 2 * kv_width, w) + self.gemm(m, q_width, h, w))
            kernels = TARGET_LAYER_ELEMENTWISE
        if moe:
            mlp, act = self._moe(c, m, rows)
        else:
            inter = c.intermediate_size // tp
            mlp, act = self.gemm(m, h, 2 * inter, w) + self.gemm(m, inter, h, w), inter
        return proj + mlp + self._elementwise(m, h, q_width, kv_width, act, kernels)

    def _moe(self, c: ModelConfig, m: int, rows: int = 0) -> tuple[float, int]:
        """A MoE MLP over m tokens on one rank, and the width of its activations; the target's
        from `self.moe` where it is set, else `moe_block`."""
        act = c.num_experts_per_tok * (c.moe_intermediate_size // self.tp) \
            + c.shared_expert_intermediate_size // self.tp
        if self.moe is not None and c is self.t:
            return self.moe.block(m, rows or m), act
        return self.moe_block(c, m), act

    def moe_block(self, c: ModelConfig, m: int, rows: int = 0, ep: int = 1,
                  moe_tp: int = 0) -> float:
        """A MoE MLP on one rank: the router, the routed experts' two grouped GEMMs over the
        experts touched, routing kernels, and the shared experts. By default over the rank's m
        tokens, each expert's width split over the TP ranks; under data or expert parallelism
        (sim/expert_parallel.py) the routed experts see `rows` tokens gathered from every DP
        rank, the rank holds 1/ep of the experts, each split `moe_tp` ways along its width."""
        h, tp, k = c.hidden_size, self.tp, c.num_experts_per_tok
        rows = rows or m
        inter = c.moe_intermediate_size // (moe_tp or tp)
        touched = expected_experts(c.num_experts, k, rows, self.skew) / ep
        ew = c.expert_weight_bytes
        flops = 2.0 * rows * k * 3 * h * inter / ep
        nbytes = ew * touched * 3 * h * inter + BF16 * rows * k * (2 * h + 3 * inter) / ep
        peak = self.fp8 if ew == 1 else self.flops
        experts = max(flops / peak, nbytes / self.bw) + 2 * self.hw.kernel_us
        t = self.gemm(m, h, c.num_experts) + experts + MOE_ROUTING_KERNELS * self.hw.kernel_us
        if c.shared_expert_intermediate_size:
            si = c.shared_expert_intermediate_size // tp
            t += self.gemm(m, h, 2 * si, c.weight_bytes) + self.gemm(m, si, h, c.weight_bytes)
        return t

    def _attention(self, c: ModelConfig, b_tokens: int, reqs: int, pairs: float,
                   kv_tokens: int, layers: int, sliding: int = 0) -> float:
        """`layers` layers' attention kernels on one rank (`sliding` of them windowed)."""
        heads, kv = self._heads(c)
        if c.is_mla:   # over the latent cache, which every rank holds whole
            latent = c.kv_lora_rank + c.qk_rope_head_dim
            flops = 2.0 * pairs * heads * (latent + c.kv_lora_rank)
            one = max(flops / self.flops, self.kv_bytes * kv_tokens * latent / self.bw) \
                + self.hw.kernel_us
            return layers * one
        full = self.attention(pairs, kv_tokens, heads, kv, c.head_dim)
        if not sliding:
            return layers * full
        w = c.sliding_window
        windowed = self.attention(min(pairs, b_tokens * w), min(kv_tokens, reqs * w), heads,
                                  kv, c.head_dim)
        return (layers - sliding) * full + sliding * windowed

    def _forward(self, c: ModelConfig, m: int, logits: int, rows: int = 0) -> float:
        """A whole model's forward on one rank, attention kernels aside: its layers, embedding
        and final norm, lm_head at `logits` positions, and the collectives (`rows`: the
        tokens its MoE blocks see, gathered from every DP rank; 0: its own m)."""
        dense = c.num_layers - c.num_moe_layers
        t = dense * self._layer(c, m, False)
        if c.is_moe:
            t += c.num_moe_layers * self._layer(c, m, True, rows)
            if self.moe is not None and c is self.t:   # expert parallelism's dispatch/combine
                t += c.num_moe_layers * self.moe.exchange(rows or m)
        # (summed in this order so that one GPU's dense model keeps its exact old times)
        head = self.gemm(logits, c.hidden_size, _ceil(c.vocab_size, self.tp))
        t = (t + self.streaming(BF16 * 3 * m * c.hidden_size, TARGET_EXTRA)
             + (np.where(logits > 0, head, 0.0) if type(logits) is np.ndarray else
                head if logits else 0.0))
        if self.tp > 1:
            t += ((2 * c.num_layers + 1) * self.all_reduce(m, c.hidden_size)
                  + self.gather_logits(logits, c.vocab_size))
        return t

    # -- ops ------------------------------------------------------------------------------

    def step_key(self, b: Batch) -> tuple | None:
        """What a step's op times depend on, where that is a few of the batch's numbers: a GQA
        target without MoE blocks or windowed layers, and an EAGLE head or no drafter.
        Two batches with the same key have the same times, so the device lane looks a step's
        times up by it (sim/device_lane.py `Device.place`); None: compute them every step."""
        if not self._keyed or self.moe is not None:
            return None
        return (b.num_tokens, b.num_sampling, b.num_logits, b.num_drafts, b.kv_tokens,
                b.attn_pairs)

    def _target_dense(self, m: int, logits: int, rows: int = 0) -> float:
        key = (m, logits, rows) if rows else (m, logits)
        t = self._target.get(key)
        if t is None:
            t = self._target[key] = self._forward(self.t, m, logits, rows)
        return t

    def _target_attention(self, b: Batch) -> float:
        if self._plain is not None:
            layers, heads, kvh, hd = self._plain
            return layers * (max(4.0 * b.attn_pairs * heads * hd / self.flops,
                                 2 * self.kv_bytes * b.kv_tokens * kvh * hd / self.bw)
                             + self.hw.kernel_us)
        c = self.t
        return self._attention(c, b.num_tokens, b.num_reqs, b.attn_pairs, b.kv_tokens,
                               c.num_layers, c.num_sliding_layers)

    def target_forward(self, b: Batch) -> float:
        attn = self._target_attention(b)
        if not self.k:
            self._attn = (b, attn)   # the sampler's share needs it (rejection_sample)
        return self._target_dense(b.num_tokens, b.num_logits, b.moe_rows) + attn

    def rejection_sample(self, b: Batch) -> float:
        """Greedy verification: argmax over the fp32 logits, then a few tiny kernels. At k = 0,
        plain sampling (SAMPLE_KERNELS), as what it adds to the forward it follows: the
        forward summed with its sampling, less the forward (exact while sampling costs less
        than the forward, Sterbenz's lemma), so that the device's sum of the two is the sum
        the roofline made when it counted the sampler in the forward: results bit for bit."""
        if self.k:
            return self.streaming(4 * b.num_logits * self.t.vocab_size, REJECTION_KERNELS)
        key = (b.num_tokens, b.num_logits)
        sampled = self._sampled.get(key)   # the forward's dense part with its sampling
        if sampled is None:
            sampled = self._sampled[key] = self._target_dense(*key) + self.streaming(
                4 * b.num_logits * self.t.vocab_size, SAMPLE_KERNELS)
        last, attn = self._attn
        if last is not b:
            attn = self._target_attention(b)
        return (sampled + attn) - (self._target[key] + attn)

    def _draft_dense(self, first: bool, m: int, sampling: int, rows: int = 0) -> float:
        """One draft pass's token-count-dependent part, per method."""
        key = (first, m, sampling, rows) if rows else (first, m, sampling)
        t = self._draft.get(key)
        if t is None:
            t = self._draft_pass(first, m, sampling, rows)
            self._draft[key] = t
        return t

    def _draft_pass(self, first: bool, m: int, sampling: int, rows: int = 0) -> float:
        kernels = DrafterCosts.sample_and_prepare_kernels(first)   # the sampling, next inputs
        tp = self.tp
        spec = self.spec
        if spec.needs_checkpoint:
            d = self.d
            return (self._forward(d, m, sampling)
                    + self.streaming(4 * sampling * d.vocab_size, kernels))
        if spec.uses_mtp_layers:   # eh_proj over [embedding ‖ hidden], the target's own layer
            c = self.t
            h = c.hidden_size
            mtp = self.moe.mtp if self.moe is not None else None
            if mtp is None:
                t = (self.gemm(m, 2 * h, h) + self._layer(c, m, c.is_moe, rows)
                     + self.streaming(BF16 * 5 * m * h, MTP_EXTRA_KERNELS)
                     + self.gemm(sampling, h, _ceil(c.vocab_size, tp))
                     + self.streaming(4 * sampling * c.vocab_size, kernels))
            else:   # its own kernels measured (mtp.csv): embedding, norms, eh_proj, glue
                t = (mtp_wrapper(mtp, m) + self._layer(c, m, c.is_moe, rows)
                     + self.gemm(sampling, h, _ceil(c.vocab_size, tp))
                     + self.streaming(4 * sampling * c.vocab_size, kernels))
            if c.is_moe and self.moe is not None:   # its MoE block's dispatch/combine
                t += self.moe.exchange(rows or m)
            if tp > 1:
                t += 3 * self.all_reduce(m, h) + self.gather_logits(sampling, c.vocab_size)
            return t
        d = self.d   # an EAGLE head
        h = d.hidden_size
        heads, kv = self._heads(d)
        inter = d.intermediate_size // tp
        eagle3 = d.fuses_taps
        vocab = d.draft_vocab_size
        t = (self._layer_gemms(m, h, 2 * h if eagle3 else h, heads, kv, d.head_dim, inter)
             + self._layer_elementwise(m, h, heads, kv, d.head_dim, inter,
                                       DRAFT_LAYER_ELEMENTWISE)
             + self.gemm(sampling, h, _ceil(vocab, tp))
             + self.streaming(4 * sampling * vocab, kernels))
        if first or not eagle3:   # EAGLE-3 fuses the taps once; EAGLE's fc runs every pass
            t += self.gemm(m, d.fc_inputs * d.target_hidden_size, h)
        if tp > 1:
            t += 3 * self.all_reduce(m, h) + self.gather_logits(sampling, vocab)
        return t

    def draft_forward(self, b: Batch, i: int) -> float:
        """Pass 0 runs over every token of the step (padded); passes 1..k-1 one per request.
        ngram_gpu's one pass matches n-grams over every request's token history."""
        spec = self.spec
        if spec.one_pass:   # the GPU n-gram proposer's kernels
            nbytes = 4 * b.num_reqs * self.max_model_len * (NGRAM_N + 2)
            return self.streaming(nbytes, NGRAM_GPU_KERNELS)
        if i == 0:
            m, pairs, kv, rows = b.num_tokens, b.attn_pairs, b.kv_tokens, b.moe_rows
        else:
            m, kv, rows = b.num_sampling, b.kv_tokens + i * b.num_sampling, b.draft_moe_rows
            pairs = float(kv)
        c = spec.pass_model(self.t, self.d)
        if spec.uses_head:
            heads, kvh = self._heads(c)
            attn = self.attention(pairs, kv, heads, kvh, c.head_dim)
        else:
            attn = self._attention(c, m, b.num_reqs, pairs, kv, spec.pass_layers(c),
                                   spec.sliding_layers(c))
        return self._draft_dense(i == 0, m, b.num_sampling, rows) + attn

    def draft_forwards(self, b: Batch, n: int) -> list[float]:
        """Passes 0..n-1 of draft_forward, in one call (the device lane asks for all of a
        step's passes at once): an EAGLE head's passes computed here as draft_forward computes
        them, term for term, so the times are the same floats; other drafters, and the passes
        of a data-parallel MoE group's step (`draft_moe_rows`), pass by pass."""
        if not self.spec.uses_head or b.draft_moe_rows:
            return [self.draft_forward(b, i) for i in range(n)]
        heads, kvh = self._heads(self.d)
        hd, flops, bw, kernel = self.d.head_dim, self.flops, self.bw, self.hw.kernel_us
        kv_bytes = self.kv_bytes
        out = [self.draft_forward(b, 0)] if n else []
        sampling = b.num_sampling
        if n > 1:
            dense = self._draft_dense(False, sampling, sampling)
            for i in range(1, n):
                kv = b.kv_tokens + i * sampling
                out.append(dense + (max(4.0 * float(kv) * heads * hd / flops,
                                        2 * kv_bytes * kv * kvh * hd / bw) + kernel))
        return out

    def step_times(self, cols, passes: np.ndarray, fixup: np.ndarray | None):
        """Every step's op times, for steps given as columns (sim/steps.py `Columns`: each
        one's tokens, sampling requests, logits, context tokens and attended pairs), its draft
        passes and whether a zero-bubble fixup runs first: one array an op, in the lane order
        of `Device.step_ops`, each the same floats as its op's call (0.0 where a step does not
        run it), and how many come before the accepted counts are known. Only where every op
        is this roofline's own closed form (a GQA target without MoE blocks or windowed
        layers, an EAGLE head's passes or none on the device); None elsewhere."""
        if type(self) is not RooflineCosts or self._plain is None or self.t.is_moe \
                or self.moe is not None or passes.any() and not self.spec.uses_head:
            return None
        tokens, sampling, logits = cols.tokens, cols.sampling, cols.logits
        kv, pairs = cols.kv, cols.pairs
        layers, heads, kvh, hd = self._plain
        flops, bw, kernel, kvb = self.flops, self.bw, self.hw.kernel_us, self.kv_bytes
        # the dense parts' formulas over arrays of token counts, on one GPU (the collectives'
        # models take one count); else each distinct count's memoized float
        once = self.tp == 1
        dense = _each(lambda m, n: self._forward(self.t, m, n), tokens, logits, True) if once \
            else _each(self._target_dense, tokens, logits)
        attn = layers * (np.maximum(4.0 * pairs * heads * hd / flops,
                                    2 * kvb * kv * kvh * hd / bw) + kernel)
        target = dense + attn
        if not self.k:   # the sampler as what it adds to the forward (`rejection_sample`)
            sampled = _each(lambda m, n: (self._forward(self.t, m, n) if once else
                                          self._target_dense(m, n)) + self.streaming(
                4 * n * self.t.vocab_size, SAMPLE_KERNELS), tokens, logits, once)
            target = np.where(sampling > 0, target + ((sampled + attn) - (dense + attn)),
                              target)
        ops = [np.where(fixup, FIXUP_KERNELS * kernel, 0.0)] if fixup is not None else []
        ops.append(target)
        if self.k:
            ops.append(np.where(sampling > 0, 4 * logits * self.t.vocab_size / bw
                                + REJECTION_KERNELS * kernel, 0.0))
        nverify = len(ops)
        if passes.any():   # an EAGLE head's passes (`draft_forwards`)
            c = self.spec.pass_model(self.t, self.d)
            d_heads, d_kvh = self._heads(c)
            draft = self._draft_pass if once else self._draft_dense
            first = _each(lambda m, n: draft(True, m, n), tokens, sampling, once) + (
                np.maximum(4.0 * pairs * d_heads * c.head_dim / flops,
                           2 * kvb * kv * d_kvh * c.head_dim / bw) + kernel)
            ops.append(np.where(passes > 0, first, 0.0))
            heads, kvh = self._heads(self.d)
            hd = self.d.head_dim
            later = _each(lambda n, _: draft(False, n, n), sampling, sampling, once)
            for i in range(1, int(passes.max())):
                kv_i = kv + i * sampling
                ops.append(np.where(passes > i, later + (
                    np.maximum(4.0 * kv_i.astype(np.float64) * heads * hd / flops,
                               2 * kvb * kv_i * kvh * hd / bw) + kernel), 0.0))
        ops.append(np.full(len(tokens), self.hw.d2h_us))
        return ops, nverify

    def d2h(self, b: Batch) -> float:
        return self.hw.d2h_us

    def fixup(self, b: Batch) -> float:
        return FIXUP_KERNELS * self.hw.kernel_us


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _most(a, b):
    """max(a, b) of two floats, or of two arrays element by element (a roofline formula
    priced for many token counts at once, `_each`)."""
    return np.maximum(a, b) if type(a) is np.ndarray else max(a, b)


def _each(f, a: np.ndarray, b: np.ndarray, at_once: bool = False) -> np.ndarray:
    """f(a_i, b_i) for every i (non-negative ints), called once for each distinct pair, or
    (`at_once`) once for them all: f's formula over arrays, each element the float its call
    on that pair's ints gives."""
    width = int(b.max(initial=0)) + 1
    keys, at = np.unique(a * width + b, return_inverse=True)
    x, y = divmod(keys, width)
    if at_once:
        return np.broadcast_to(np.asarray(f(x, y), np.float64), x.shape)[at]
    return np.array([f(int(i), int(j)) for i, j in zip(x, y)], np.float64)[at]
