"""Measured operator tables as device costs (docs/explanation/design.md §9): a GPU's own kernel
times (sim/tables.py reads the bundle), priced for each step's real mix of prefill chunks,
decodes and verifies.

How a step is priced (docs/explanation/measured-tables.md, "Measured operator tables", states and
tests each rule):

- target forward = embedding + L x (2 layernorm + qkv_proj + rotary_emb + attention + o_proj
  + gate_up_proj + act_fn + down_proj; Qwen3's qk_norm after qkv_proj; a Qwen3-MoE layer's MLP
  its MoE block, `moe` below) + final_layernorm, every dense layer at the step's tokens,
  + lm_head at the step's logit rows (one per request, vLLM V1 takes logits at every request's
  last scheduled position, plus one per draft token verified); with tensor parallelism, the
  tables' `tp<N>`, an all-reduce per layer's attention and MLP and one after the embedding, and
  the logits' all-gather, each as vLLM issues it (sim/hardware.py `all_reduce_path`), measured
  where a hardware.yaml gives them (sim/hardware_file.py), else the interconnect model's.
- attention: the largest prefill chunk and every decode in one lookup (the table's mixed shots
  measure that a mixed batch costs more than its parts); each further prefill chunk adds its own
  pure-prefill time above the kernel's floor (the table's cheapest shot); decodes at their mean
  history (the total KV they read); a request verifying 1 + k tokens reads its KV once, and is
  priced as a decode at its history.
- decodes of unequal histories: a bundle that measured it (meta.yaml `skew_fit`) adds
  alpha x (t at the longest history - t at the mean), alpha from its bucket table
  (`tp<N>/skew_fit.csv`: by chunk, decodes, skew rate, longest history, chunk history) or its
  pooled `alpha_default`; a bundle that did not gets none (no correction that was not
  measured).
- rejection_sample: the sampler at the logit rows.
- an EAGLE-3 head whose decoder layer has the target's shapes: its layer from the same tables
  (qkv over [embedding ‖ fused hidden] as two qkv_proj, its three-tap fc as three o_proj, its
  lm_head as the target's scaled by draft vocab / vocab: a GEMM's time is linear in its inner
  and outer widths); a draft model of the tables' shapes: its layers. Any other drafter, d2h,
  fixup and a drafter's argmax bookkeeping: the roofline, and `sources` says so.
"""

from __future__ import annotations


from stepgap.common.errors import UserError
from stepgap.common.speculation import METHODS
from stepgap.sim.costs import DeviceCosts
from stepgap.sim.drafter_costs import DrafterCosts
from stepgap.sim.hardware import MeasuredLink
from stepgap.sim.tables import FAMILY_LAYERS, MLP_LAYERS, PER_SEQUENCE, OpTables
from stepgap.sim.bundle_match import refuse_another_model, shape_mismatch


class RooflineKernels:
    """The roofline of each kernel a bundle may lack (meta.yaml `not_measured`), on one rank:
    the kernels RooflineCosts sums for a layer, one by one (`roof`: the run's RooflineCosts,
    whose hardware entry is the GPU's fitted or datasheet roofline)."""

    BF16 = 2

    def __init__(self, roof, c, tp: int):
        self.roof, self.c = roof, c
        heads, kvh = max(1, c.num_heads // tp), max(1, c.num_kv_heads // tp)
        self.heads, self.kvh, self.hd = heads, kvh, c.head_dim
        self.q, self.kv, self.h = heads * c.head_dim, kvh * c.head_dim, c.hidden_size
        self.inter = c.intermediate_size // tp
        self.vocab = -(-c.vocab_size // tp)

    def kernel(self, name: str):
        """A function of the token (or row) count: the roofline's time of kernel `name`."""
        g, st, w, B = self.roof.gemm, self.roof.streaming, self.c.weight_bytes, self.BF16
        h, q, kv, i = self.h, self.q, self.kv, self.inter
        return {
            "embedding": lambda m: st(B * 2 * m * h),
            "layernorm": lambda m: st(B * 4 * m * h),          # fused add + RMSNorm
            "qkv_proj": lambda m: g(m, h, q + 2 * kv, w),
            "qk_norm": lambda m: st(B * 2 * m * (q + kv)),
            "rotary_emb": lambda m: st(B * 2 * m * (q + kv)),
            "o_proj": lambda m: g(m, q, h, w),
            "gate_up_proj": lambda m: g(m, h, 2 * i, w),
            "act_fn": lambda m: st(B * 3 * m * i),
            "down_proj": lambda m: g(m, i, h, w),
            "final_layernorm": lambda m: st(B * 2 * m * h),
            "lm_head": lambda m: g(m, h, self.vocab),
            "sampler": lambda m: st(4 * m * self.c.vocab_size, 3),
        }[name]

    def attention(self, prefills, num_decode: int, decode_kv: float) -> float:
        """One layer's attention kernel and its KV-cache write (vLLM writes the cache in the
        attention layer), over the pairs and the KV the mix reads."""
        pairs = float(decode_kv)
        kv_read, new = decode_kv, num_decode
        for chunk, history in prefills:
            pairs += chunk * history + chunk * (chunk + 1) / 2
            kv_read += history + chunk
            new += chunk
        return self.roof.attention(pairs, kv_read, self.heads, self.kvh, self.hd) \
            + self.roof.streaming(self.BF16 * 2 * new * self.kv)


class TableCosts(DeviceCosts):
    """Device op times from measured operator tables; `fallback` (the roofline) prices what
    the tables do not cover, and `sources` says which op came from where."""

    def __init__(self, tables: OpTables, target, draft, k: int, fallback, method: str = "eagle3",
                 tp: int = 1):
        refuse_another_model(tables, target)
        self.tables, self.t, self.d, self.k, self.fallback = tables, target, draft, k, fallback
        self.method, self.tp = method, tp
        self.spec = spec = METHODS[method]
        roof = RooflineKernels(fallback, target, tp)
        self.roof_kernels = roof
        # a kernel the bundle lacks by design (meta.yaml not_measured): the roofline's
        lack = [n for n in tables.not_measured if n != "attention"]
        dense = {**tables.dense, **{n: roof.kernel(n) for n in lack if n not in PER_SEQUENCE}}
        seq = {**tables.per_sequence, **{n: roof.kernel(n) for n in lack if n in PER_SEQUENCE}}
        self._kernels = dense
        self._layer = [dense[n] for n in FAMILY_LAYERS[tables.family]]
        # a MoE target: the layers above are each layer's attention side; the dense layers'
        # MLP (DeepSeek's first layers) from the MLP rows, the MoE blocks from `moe`
        self._mlp = [dense[n] for n in MLP_LAYERS if n in dense] \
            if target.is_moe and target.num_moe_layers < target.num_layers else []
        if len(self._mlp) < len(MLP_LAYERS) and target.is_moe \
                and target.num_moe_layers < target.num_layers:
            raise UserError(f"{tables.path}/tp{tp}/dense.csv: no rows for "
                            f"{', '.join(MLP_LAYERS)} (--model {target.name}'s "
                            f"{target.num_layers - target.num_moe_layers} dense layers need "
                            "them)")
        self.moe = None   # a MoE target's blocks (sim/expert_parallel.py MoeCosts)
        self.embedding, self.final_norm = dense["embedding"], dense["final_layernorm"]
        self.lm_head, self.sampler = seq["lm_head"], seq["sampler"]
        self.attn = tables.attention
        self._dense: dict[int, float] = {}
        self._draft_dense: dict[tuple[bool, int, int], float] = {}
        self.draft_tables = draft is not None and spec.tables \
            and not tables.not_measured and all(n in dense for n in MLP_LAYERS) \
            and shape_mismatch(tables, draft, target.hidden_size,
                               family=spec.needs_checkpoint) is None
        at = f"tables ({tables.describe()})"
        lack = tables.not_measured
        forward = at if not lack else (
            f"{at}; from the roofline ({fallback.hw.name}: {fallback.hw.source}), what they "
            f"did not measure: {', '.join(n for n in lack if n != 'sampler')}")
        self.sources = {"target_forward": forward,
                        "rejection_sample": f"{at}: the sampler" if "sampler" not in lack else
                        f"roofline ({fallback.hw.name}; the tables did not time the sampler)",
                        "d2h": "roofline (no table: the catalog's copy time)",
                        "fixup": "roofline (no table: the catalog's per-kernel cost)"}
        if tp > 1:
            link = fallback.link
            self.sources["target_forward"] += (
                f"; all-reduces and logits all-gather {link.name}"
                if isinstance(link, MeasuredLink) else
                f"; all-reduces and logits all-gather from the interconnect model ({link.name})")
        if k:
            self.sources["draft_forward"] = (
                f"{at}: the drafter's layers; its argmax bookkeeping from the roofline"
                if self.draft_tables else
                f"roofline (the drafter's shapes are not the tables' {tables.model})")

    @property
    def path(self) -> str:
        return self.tables.path

    # -- pieces -----------------------------------------------------------------------------

    def dense(self, m: int) -> float:
        """The target's dense kernels over m tokens: embedding, its layers, final norm (a MoE
        target: every layer's attention side, its dense layers' MLP; the MoE blocks apart)."""
        t = self._dense.get(m)
        if t is None:
            t = self.embedding(m) + self.t.num_layers * sum(f(m) for f in self._layer) \
                + self.final_norm(m)
            if self._mlp:
                t += (self.t.num_layers - self.t.num_moe_layers) * sum(f(m) for f in self._mlp)
            self._dense[m] = t
        return t

    def attention(self, prefills, num_decode: int, decode_kv: float, kv_min: float = 0.0,
                  kv_max: float = 0.0) -> float:
        """One layer's attention for the mix (rules in the module docstring); the roofline's
        where the bundle measured none."""
        if self.attn is None:
            return self.roof_kernels.attention(prefills, num_decode, decode_kv)
        kd = decode_kv / num_decode if num_decode else 0.0
        big = max(prefills) if prefills else (0, 0)
        pc, kp = big
        t = self.attn(pc, kp, num_decode, kd)
        skew = self.tables.skew
        if skew is not None and num_decode > 1 and kv_max > kd:
            alpha = skew.alpha(pc, num_decode, (kd - kv_min) / (kv_max - kv_min), kv_max, kp)
            if alpha:
                t_max = self.attn(pc, kp, num_decode, kv_max)
                if t_max > t:
                    t += alpha * (t_max - t)
        floor = self.attn.floor
        for chunk in prefills:
            if chunk is not big:
                t += max(0.0, self.attn(chunk[0], chunk[1], 0, 0.0) - floor)
        return t

    def _collectives(self, m: int, rows: int, c) -> float:
        if self.tp == 1:
            return 0.0
        f = self.fallback
        return (2 * c.num_layers + 1) * f.all_reduce(m, c.hidden_size) \
            + f.gather_logits(rows, c.vocab_size)

    # -- ops --------------------------------------------------------------------------------

    def target_forward(self, b) -> float:
        rows = b.num_reqs + b.num_drafts
        t = self.dense(b.num_tokens) + self.t.num_layers * self.attention(
            b.prefills, b.num_decode, b.decode_kv, b.decode_kv_min, b.decode_kv_max) \
            + self.lm_head(rows) + self._collectives(b.num_tokens, rows, self.t)
        if self.moe is not None:   # its MoE blocks, and their dispatch and combine under DP
            t += self.moe.forward(b.num_tokens, b.moe_rows or b.num_tokens)
        return t

    def rejection_sample(self, b) -> float:
        return self.sampler(b.num_reqs + b.num_drafts)

    def _head_layer(self, m: int) -> float:
        """An EAGLE-3 head's decoder layer over m tokens, from the target's tables: its two
        input norms, qkv over [embedding ‖ hidden] (twice the qkv_proj), rotary, o_proj, the
        post-attention norm and the MLP (attention apart)."""
        d = self._kernels
        return (3 * d["layernorm"](m) + 2 * d["qkv_proj"](m) + d["rotary_emb"](m)
                + d["o_proj"](m) + d["gate_up_proj"](m) + d["act_fn"](m) + d["down_proj"](m))

    def _draft_pass(self, first: bool, m: int, rows: int) -> float:
        key = (first, m, rows)
        t = self._draft_dense.get(key)
        if t is None:
            d, fb = self._kernels, self.fallback
            if self.spec.needs_checkpoint:
                c = self.d
                t = self.embedding(m) + c.num_layers * sum(f(m) for f in self._layer) \
                    + self.final_norm(m) + self.lm_head(rows) \
                    + fb.streaming(4 * rows * c.vocab_size, DrafterCosts.sample_and_prepare_kernels(first))
            else:   # an EAGLE-3 head: embedding, its layer, its norm and lm_head
                c = self.d
                t = self.embedding(m) + self._head_layer(m) + d["final_layernorm"](rows) \
                    + self.lm_head(rows) * c.draft_vocab_size / self.t.vocab_size \
                    + fb.streaming(4 * rows * c.draft_vocab_size, DrafterCosts.sample_and_prepare_kernels(first))
                if first:   # the three target taps fused once: fc(3h -> h), three o_proj
                    t += c.fc_inputs * d["o_proj"](m)
            self._draft_dense[key] = t
        return t

    def draft_forward(self, b, i: int) -> float:
        if not self.draft_tables:
            return self.fallback.draft_forward(b, i)
        spec = self.spec
        layers = spec.pass_layers(self.d)
        if i == 0:   # every token of the step, the step's own mix
            m = b.num_tokens
            attn = self.attention(b.prefills, b.num_decode, b.decode_kv, b.decode_kv_min,
                                  b.decode_kv_max)
        else:        # one token per sampling request, i tokens past its context
            m = b.num_sampling
            mean = b.kv_tokens / max(b.num_reqs, 1) + i
            attn = self.attention((), m, m * mean, min(b.decode_kv_min + i, mean),
                                  max(b.decode_kv_max + i, mean))
        fb = self.fallback   # an EAGLE-3 pass: three all-reduces and its own logits' gather
        coll = self._collectives(m, b.num_sampling, self.d) if spec.needs_checkpoint else \
            (3 * fb.all_reduce(m, self.t.hidden_size)
             + fb.gather_logits(b.num_sampling, self.d.draft_vocab_size) if self.tp > 1 else 0.0)
        return self._draft_pass(i == 0, m, b.num_sampling) + layers * attn + coll

    def d2h(self, b) -> float:
        return self.fallback.d2h(b)

    def fixup(self, b) -> float:
        return self.fallback.fixup(b)

    def check_request(self, request_id: str, total_tokens: int) -> None:
        """Refuse a request whose context runs past the tables' KV grid."""
        if self.attn is not None and total_tokens > self.attn.max_kv:
            raise UserError(f"request {request_id!r}: prompt_len + output_len = {total_tokens} "
                            f"tokens, past the KV lengths the --device-profile tables measured "
                            f"(up to {self.attn.max_kv:g} in {self.tables.path}); the tables "
                            "cannot price its attention")
