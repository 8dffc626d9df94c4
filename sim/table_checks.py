"""Measured tables held to physics, once the model they price is known (sim/device_choice.py
`device_costs_of` calls `check_tables`).

As a perf bundle is read (sim/tables.py, sim/moe_tables.py) every time is a number above 0 and
under MAX_TIME_US; that alone lets through a table whose units are wrong (nanoseconds or
milliseconds written as microseconds) or whose recorder broke: an mtp.csv at 10^9 us gave a
mean TPOT of 2.8 x 10^6 ms with exit 0 (issue 55). Each point of the tables a run reads is
held to the model's own shapes at that point (the roofline's bytes and FLOPs): no faster than
a device of PEAK_FLOPS and PEAK_BW with no per-kernel cost could run it (past any GPU's
physics: a unit error, or a kernel that did not run), no slower than SLOWEST x the --gpu's
roofline of the same kernels at the same size. Each refusal is one line naming the table's
file and the point; checked once a process for the same tables, GPU and model (a grid's cells
each resolve the same run).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from stepgap.sim.roofline import BF16, MTP_EXTRA_KERNELS, RooflineCosts, _ceil
from stepgap.sim.moe_tables import mtp_path
from stepgap.common.errors import UserError

# No device is this fast: 44 x a B200's dense bf16 peak (2.25 PFLOP/s) and 22 x its fp8 one;
# 12.5 x its memory bandwidth (8 TB/s), above any GPU's L2 bandwidth too.
PEAK_FLOPS = 1e17
PEAK_BW = 1e14
# A point this many times slower than the --gpu's roofline at the datasheet peak is not a
# measurement. The committed bundles' points (on their own GPUs; DeepSeek's on --gpu h200) lie
# at 19 x the ideal device's time or more and at 23 x the roofline or less (attention.csv's
# long prefills; the rest within 3.3 x): docs/reference/robustness-round4.md has the script.
SLOWEST = 1000.0

_TABLES_CHECKED: set = set()


def ideal_hardware(hw):
    """`hw` as no device is: PEAK_FLOPS, PEAK_BW, every kernel free of fixed costs."""
    return replace(hw, flops=PEAK_FLOPS, fp8_flops=PEAK_FLOPS, mem_bw=PEAK_BW, flop_eff=1.0,
                   bw_eff=1.0, kernel_us=0.0)


class TableJudge:
    """One table's points against the fast bound (`fast`, us) and the slow one (SLOWEST x
    `ref`, us)."""

    def __init__(self, path, gpu: str):
        self.path, self.gpu = path, gpu

    def __call__(self, what: str, t: float, fast: float, ref: float) -> None:
        if t < fast:
            raise UserError(f"{self.path}: {what}: {t:g} us, faster than any device runs it "
                            f"(at {PEAK_FLOPS / 1e15:g} PFLOP/s and {PEAK_BW / 1e12:g} TB/s it "
                            f"takes {fast:.3g} us): a unit error (ns as us?) or a kernel that "
                            "did not run")
        if t > SLOWEST * ref:
            raise UserError(f"{self.path}: {what}: {t:g} us, over {SLOWEST:g} x the roofline "
                            f"of --gpu {self.gpu} ({ref:.3g} us): a unit error (ms or ns as "
                            "us?) or a broken recorder")


def check_tables(costs, roofline: RooflineCosts, bundle: Path | None, tp: int) -> None:
    """Hold the measured tables under `costs` (sim/table_costs.py TableCosts) and the MoE
    block's and MTP module's (roofline.moe) to physics (the comment above)."""
    tables = costs.tables
    moe = roofline.moe
    grid_table = moe.table if moe is not None else None
    mtp = moe.mtp if moe is not None else None
    if tables is None and grid_table is None and mtp is None:
        return
    c, hw = roofline.t, roofline.hw
    key = (id(tables), id(grid_table), id(mtp), c.name, tp, roofline.kv_bytes,
           hw.name, hw.flops, hw.mem_bw, hw.flop_eff, hw.bw_eff, hw.kernel_us)
    if key in _TABLES_CHECKED:
        return
    ref = RooflineCosts(c, None, hw, 0, tp, kv_bytes=roofline.kv_bytes)
    fast = RooflineCosts(c, None, ideal_hardware(hw), 0, tp, kv_bytes=roofline.kv_bytes)
    if tables is not None:
        _dense(costs, ref, fast, tp)
        _attention(tables, ref, fast, tp)
    if grid_table is not None:
        _moe(moe, ref, hw.name)
    if mtp is not None and bundle is not None:
        _mtp(mtp, ref, fast, bundle, tp)
    _TABLES_CHECKED.add(key)


def _attention_side(r: RooflineCosts, m: int) -> float:
    """One GQA layer's projections and elementwise kernels over m tokens (no MLP, no attention
    kernel), on one rank."""
    c = r.t
    heads, kv = r._heads(c)
    q, kvw, h, w = heads * c.head_dim, kv * c.head_dim, c.hidden_size, c.weight_bytes
    return (r.gemm(m, h, q + 2 * kvw, w) + r.gemm(m, q, h, w)
            + r._elementwise(m, h, q, kvw, 0, 1))


def _dense(costs, ref: RooflineCosts, fast: RooflineCosts, tp: int) -> None:
    """dense.csv: each kernel's point no slower than SLOWEST x the roofline's whole layer there;
    a layer's kernels summed no faster than its projections on the ideal device.
    per_sequence.csv: lm_head as its GEMM, the sampler as its read of the logits."""
    tables, c = costs.tables, ref.t
    judge = TableJudge(Path(tables.path) / f"tp{tp}" / "dense.csv", ref.hw.name)
    for name, f in (tables.dense or {}).items():
        for m, t in zip(f.xs, f.ys):
            judge(f"{name} at {m:g} tokens", t, 0.0, ref._dense_layer(c, int(m)))
    # (a partial bundle's roofline stand-ins for the kernels it lacks have no points)
    for m in sorted({x for f in costs._layer for x in getattr(f, "xs", ())}):
        layer = sum(f(m) for f in costs._layer)
        judge(f"one layer's kernels at {m:g} tokens", layer, _attention_side(fast, int(m)),
              ref._dense_layer(c, int(m)))
    judge.path = Path(tables.path) / f"tp{tp}" / "per_sequence.csv"
    vocab = _ceil(c.vocab_size, tp)
    for name, f in (tables.per_sequence or {}).items():
        for rows, t in zip(f.xs, f.ys):
            n = int(rows)
            if name == "lm_head":
                judge(f"lm_head at {rows:g} sequences", t, fast.gemm(n, c.hidden_size, vocab),
                      ref.gemm(n, c.hidden_size, vocab))
            else:
                judge(f"{name} at {rows:g} sequences", t,
                      fast.streaming(4 * n * c.vocab_size),
                      ref.streaming(4 * n * c.vocab_size) + ref.gemm(n, c.hidden_size, vocab))


def _attention(tables, ref: RooflineCosts, fast: RooflineCosts, tp: int) -> None:
    """attention.csv: each shot as one layer's attention over its (query, key) pairs and the
    KV it reads: a prefill chunk of pc tokens after kp, and nd decodes after kd each."""
    c = ref.t
    if tables.attention is None:   # a partial bundle (meta.yaml not_measured): the roofline's
        return
    judge = TableJudge(Path(tables.path) / f"tp{tp}" / "attention.csv", ref.hw.name)
    for (pc, nd), rows in tables.attention.slices.items():
        for kp, (kds, ts) in rows.items():
            for kd, t in zip(kds, ts):
                pairs = pc * kp + pc * (pc + 1) / 2 + nd * (kd + 1)
                kv = int((kp + pc if pc else 0) + nd * (kd + 1))
                reqs = (1 if pc else 0) + int(nd)
                tokens = int(pc + nd)
                judge(f"prefill_chunk {pc:g}, kv_prefill {kp:g}, n_decode {nd:g}, kv_decode "
                      f"{kd:g}", t, fast._attention(c, tokens, reqs, pairs, kv, 1),
                      ref._attention(c, tokens, reqs, pairs, kv, 1))


def _moe(moe, ref: RooflineCosts, gpu: str) -> None:
    """moe.csv: each point no faster than the ideal device reads its activated experts' weights
    and runs their FLOPs, no slower than SLOWEST x the roofline's block at its EP degree."""
    c = ref.t
    judge = TableJudge(moe.table.path, gpu)
    moe_tp = moe.plan.moe_tp
    inter = c.moe_intermediate_size // moe_tp
    per = 3 * c.hidden_size * inter * c.expert_weight_bytes   # one expert's weights
    for ep, grid in moe.table.grids.items():
        for tok, (xs, ys) in zip(grid.tokens, grid.rows):
            block = ref.moe_block(c, int(tok), int(tok), ep, moe_tp)
            for a, t in zip(xs, ys):
                flops = 2.0 * tok * c.num_experts_per_tok * 3 * c.hidden_size * inter / ep
                least = max(flops / PEAK_FLOPS, a * per / PEAK_BW) * 1e6
                judge(f"ep {ep}, {tok:g} tokens, {a:g} activated experts", t, least, block)


def _mtp(mtp: dict, ref: RooflineCosts, fast: RooflineCosts, bundle: Path, tp: int) -> None:
    """mtp.csv: each kernel's point no slower than SLOWEST x the roofline's MTP wrapper there
    (its eh_proj and the kernels around it); eh_proj no faster than its GEMM on the ideal
    device."""
    c = ref.t
    h = c.hidden_size
    judge = TableJudge(mtp_path(bundle, tp), ref.hw.name)
    for name, f in mtp.items():
        for rows, t in zip(f.xs, f.ys):
            n = int(rows)
            wrapper = ref.gemm(n, 2 * h, h) + ref.streaming(BF16 * 5 * n * h, MTP_EXTRA_KERNELS)
            judge(f"{name} at {rows:g} sequences", t,
                  fast.gemm(n, 2 * h, h) if name == "mtp_eh_proj" else 0.0, wrapper)
