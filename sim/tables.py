"""Measured operator tables as device costs (docs/explanation/design.md §9): a GPU's own kernel
times, read as a peer published them, priced for each step's real mix of prefill chunks, decodes and
verifies.

The tables are LLMServingSim's perf bundle (`profiler/perf/<GPU>/<model>/<variant>/`): a
`meta.yaml` (how and under which vLLM they were measured, the model's per-rank shapes) and one
`tp<N>/` folder per tensor-parallel degree with

- `dense.csv` (layer, tokens, time_us): one decoder layer's kernels by the step's token count
  (embedding, layernorm, qkv_proj, rotary_emb, o_proj, gate_up_proj, act_fn, down_proj,
  final_layernorm);
- `attention.csv` (prefill_chunk, kv_prefill, n_decode, kv_decode, time_us): one layer's
  attention kernel for one prefill chunk of `prefill_chunk` tokens after `kv_prefill` tokens of
  history, beside `n_decode` one-token decodes of `kv_decode` history each;
- `per_sequence.csv` (layer, sequences, time_us): lm_head and the sampler by rows;
- for a MoE model, `moe.csv` and `mtp.csv` (sim/moe_tables.py).

Times are CUDA kernel time per module (vLLM's layerwise profiler, `enforce_eager`), so a step
is the sum of its kernels, run back to back as a CUDA graph runs them.

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

Interpolation: 1-D tables linear between grid points, the first point's time below the grid,
and above it in proportion to the count (t(x_max)·x / x_max: at the grid's top the GEMMs are
compute-bound, and two neighbours 16 tokens apart give a noisy slope). Attention: linear on each
axis, nested (history within a row, then decodes within a chunk size, then chunk size), each
axis over the points measured there, and above an axis's top linearly from its top two
points. A request whose context exceeds the tables' KV grid is refused before the run.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

from stepgap.common.errors import UserError, shown, where
from stepgap.common.fileio import csv_rows, mark_input, parsed_once, read_yaml
from stepgap.common.limits import MAX_SKEW_ALPHA, MAX_TABLE_COUNT, MAX_TP, is_finite, is_int
from stepgap.common.speculation import METHODS
from stepgap.sim.drafter_costs import DrafterCosts
from stepgap.sim.hardware import MeasuredLink, axis_interp

DENSE_LAYERS = ("embedding", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj",
                "act_fn", "down_proj", "final_layernorm")
MLP_LAYERS = ("gate_up_proj", "act_fn", "down_proj")
# The kernels of one decoder layer (attention apart), in the order a family's layer runs them,
# as LLMServingSim's architecture catalogs (profiler/models/<family>.yaml) name them: Qwen3
# adds its per-head q/k RMSNorm (`qk_norm`) after qkv_proj; a Qwen3-MoE layer is Qwen3's up to
# its MLP, which is the MoE block, priced from the bundle's moe.csv (sim/moe_tables.py).
FAMILY_LAYERS = {
    "llama": ("layernorm", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj",
              "act_fn", "down_proj"),
    "qwen3": ("layernorm", "layernorm", "qkv_proj", "qk_norm", "rotary_emb", "o_proj",
              "gate_up_proj", "act_fn", "down_proj"),
    "qwen3_moe": ("layernorm", "layernorm", "qkv_proj", "qk_norm", "rotary_emb", "o_proj"),
}
# LLMServingSim's architectures that are a stepgap family under another name: DeepSeek-V3.2 is
# V3's layers (MLA, the MoE block, the MTP module) with a sparse-attention indexer beside MLA.
FAMILY_OF = {"deepseek_v32": "deepseek_v3"}
VOCAB_PADDING = 64   # vLLM pads a vocabulary-parallel embedding to a multiple of 64, then splits
PER_SEQUENCE = ("lm_head", "sampler")
# What a bundle converted from another peer's measurements may lack (meta.yaml `not_measured`,
# stepgap's own key): each such kernel is priced by the roofline, and the run's sources say so.
# A bundle without the key is held to every table, as LLMServingSim writes them.
MAY_LACK = (*DENSE_LAYERS, "qk_norm", *PER_SEQUENCE, "attention")
ATTENTION_COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
MAX_TIME_US = 1e9   # one kernel of 1000 s is a unit error (ns or ms written as us)


# -------------------------------------------------------------------------------------------
# Interpolation


@dataclass(frozen=True, slots=True)
class Table1D:
    """Times by one count, linear between points (the rules in the module docstring)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * x / xs[-1]
        j = bisect.bisect_right(xs, x)
        x0, x1 = xs[j - 1], xs[j]
        return ys[j - 1] + (ys[j] - ys[j - 1]) * (x - x0) / (x1 - x0)


class AttentionTable:
    """One layer's attention time over (prefill chunk, its history, decodes, their history),
    on whatever points were measured: each (chunk, decodes) slice holds rows by history of
    the chunk, each row its own decode histories."""

    def __init__(self, rows: list[tuple[float, float, float, float, float]]):
        slices: dict[tuple[float, float], dict[float, dict[float, float]]] = {}
        for pc, kp, nd, kd, t in rows:
            slices.setdefault((pc, nd), {}).setdefault(kp, {})[kd] = t
        self.slices = {key: {kp: (sorted(r), [r[kd] for kd in sorted(r)])
                             for kp, r in by_kp.items()} for key, by_kp in slices.items()}
        self.kps = {key: sorted(by_kp) for key, by_kp in self.slices.items()}
        self.nds: dict[float, list[float]] = {}
        for pc, nd in self.slices:
            self.nds.setdefault(pc, []).append(nd)
        for v in self.nds.values():
            v.sort()
        self.pcs = sorted(self.nds)
        self.floor = min(t for *_, t in rows)
        self.max_kv = max(max(kp, kd) for _, kp, _, kd, _ in rows)

    def _row(self, key, kp: float, kd: float) -> float:
        kds, ts = self.slices[key][kp]
        return axis_interp(kds, lambda x: ts[kds.index(x)], kd)

    def _slice(self, pc: float, nd: float, kp: float, kd: float) -> float:
        key = (pc, nd)
        return axis_interp(self.kps[key], lambda x: self._row(key, x, kd), kp)

    def __call__(self, pc: float, kp: float, nd: float, kd: float) -> float:
        """Microseconds of one layer's attention kernel for this mix."""
        def at_pc(p: float) -> float:
            return axis_interp(self.nds[p], lambda n: self._slice(p, n, kp, kd), nd)
        pcs = self.pcs if nd else [p for p in self.pcs if 0.0 in self.nds[p]]
        return max(0.0, axis_interp(pcs, at_pc, pc))


@dataclass(frozen=True, slots=True)
class SkewFit:
    """A bundle's measured cost of unequal decode histories: t = t_mean + alpha (t_max -
    t_mean), alpha by bucket (`bucket_axes` bins, a bin (lo, hi] by its label), else the pooled
    `alpha_default`."""

    alpha_default: float
    axes: dict
    alphas: dict

    @staticmethod
    def label(bins, labels, v: float) -> str:
        for i in range(len(labels)):
            if v <= bins[i + 1]:
                return labels[i]
        return labels[-1]

    def alpha(self, pc: float, n: int, rate: float, kv_big: float, kp: float) -> float:
        if not self.alphas:
            return self.alpha_default
        a = self.axes
        key = "|".join((f"pc={int(pc)}", self.label(a["n_bins"], a["n_labels"], n),
                        self.label(a["skew_rate_bins"], a["skew_rate_labels"], rate),
                        self.label(a["kv_big_bins"], a["kv_big_labels"], kv_big),
                        self.label(a["kp_bins"], a["kp_labels"], kp)))
        return self.alphas.get(key, self.alpha_default)


AXES = ("n", "skew_rate", "kv_big", "kp")
SKEW_COLUMNS = ("pc", "n_label", "skew_rate_label", "kv_big_label", "kp_label", "alpha")


def _yaml_number(v, path: Path, field: str, lo: float, hi: float) -> float:
    """A number of meta.yaml from lo to hi; a string that reads as one is named as YAML's
    reading (PyYAML takes 1e9 and 1.0e9 for strings: a float needs a point and a signed
    exponent)."""
    if is_finite(v) and lo <= v <= hi:
        return float(v)
    what = "a number" if math.isinf(hi) else f"a number from {lo:g} to {hi:g}"
    hint = ""
    if isinstance(v, str):
        try:
            float(v)
            hint = (f" (YAML reads {v} as a string: a number needs a point and a sign in its "
                    "exponent, 1.0e+9)")
        except ValueError:
            pass
    raise UserError(f"{where(path, field=field)}: expected {what}, got {shown(v)}{hint}")


def _bins(axes: dict, a: str, path: Path) -> tuple[list[float], list[str]]:
    """One bucket axis: its bins, numbers rising, one more than its labels, which are names."""
    field = "skew_fit.bucket_axes"
    bins, labels = axes.get(f"{a}_bins"), axes.get(f"{a}_labels")
    if not (isinstance(bins, list) and isinstance(labels, list)
            and len(bins) == len(labels) + 1):
        raise UserError(f"{where(path, field=field)}: {a}_bins must be a list one longer than "
                        f"{a}_labels")
    nums = [_yaml_number(b, path, f"{field}.{a}_bins[{i}]", -math.inf, math.inf)
            for i, b in enumerate(bins)]
    if any(y <= x for x, y in zip(nums, nums[1:])):
        raise UserError(f"{where(path, field=f'{field}.{a}_bins')}: expected bin edges that "
                        f"rise, got {shown(bins)}")
    if not all(isinstance(label, str) for label in labels):
        raise UserError(f"{where(path, field=f'{field}.{a}_labels')}: expected a list of names "
                        f"(the {a}_label values of skew_fit.csv), got {shown(labels)}")
    return nums, labels


def _per_tp(block, tp: int):
    """skew_fit's per_tp entry for this TP (YAML keys it by an integer or a string), if any."""
    per_tp = block.get("per_tp") if isinstance(block, dict) else None
    return per_tp.get(tp, per_tp.get(str(tp))) if isinstance(per_tp, dict) else None


def _skew(meta: dict, root: Path, tp: int, meta_path: Path) -> SkewFit | None:
    """The bundle's skew fit at this TP, or None where it measured none. Every field read is
    checked (naming it): the alphas finite and within MAX_SKEW_ALPHA either way, the bins
    rising numbers, the labels names."""
    block = meta.get("skew_fit")
    if block is None:
        return None

    def bad(field: str, expected: str, v) -> UserError:
        return UserError(f"{where(meta_path, field='skew_fit' + field)}: expected {expected}, "
                         f"got {shown(v)}")
    if not isinstance(block, dict):
        raise bad("", "a mapping (enabled, bucket_axes, per_tp)", block)
    if not isinstance(block.get("enabled", False), bool):
        raise bad(".enabled", "true or false", block["enabled"])
    per_tp = block.get("per_tp")
    if per_tp is not None and not isinstance(per_tp, dict):
        raise bad(".per_tp", "a mapping of tensor-parallel size to its fit", per_tp)
    if not block.get("enabled") or not per_tp:
        return None
    entry = _per_tp(block, tp)
    if entry is None:
        return None
    at = f".per_tp.{tp}"
    if not isinstance(entry, dict):
        raise bad(at, "a mapping (alpha_default, bucket_table)", entry)
    alpha = _yaml_number(entry.get("alpha_default"), meta_path,
                         f"skew_fit{at}.alpha_default", -MAX_SKEW_ALPHA, MAX_SKEW_ALPHA)
    axes = entry.get("bucket_axes") or block.get("bucket_axes") or {}
    name = entry.get("bucket_table")
    if name is not None and not isinstance(name, str):
        raise bad(f"{at}.bucket_table", "a file name", name)
    table = root / (name or f"tp{tp}/skew_fit.csv")
    if not table.is_file():   # the pooled alpha alone (a bundle copied without its buckets)
        return SkewFit(alpha, {}, {})
    if not isinstance(axes, dict):
        raise bad(".bucket_axes", "a mapping of bins and labels", axes)
    checked = {}
    for a in AXES:
        checked[f"{a}_bins"], checked[f"{a}_labels"] = _bins(axes, a, meta_path)
    alphas = {}
    for n, row in _read_csv(table, SKEW_COLUMNS):
        key = "|".join((f"pc={int(_number(table, n, row, 'pc', integer=True))}",
                        row["n_label"], row["skew_rate_label"], row["kv_big_label"],
                        row["kp_label"]))
        try:
            x = float(row["alpha"])
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and abs(x) <= MAX_SKEW_ALPHA):
            raise UserError(f"{where(table, n, 'alpha')}: expected a number from "
                            f"{-MAX_SKEW_ALPHA:g} to {MAX_SKEW_ALPHA:g}, got {row['alpha']!r}")
        alphas[key] = x
    return SkewFit(alpha, checked, alphas)


# -------------------------------------------------------------------------------------------
# The bundle


@dataclass(frozen=True, slots=True)
class BundleMeta:
    """What a bundle's meta.yaml says of the model it measured: its family (`architecture`,
    read through FAMILY_OF), its Hugging Face id, its per-rank shapes (hf_overrides) at the TP
    degree they were written for (the largest measured), and the tp<N>/ folders it has."""

    path: str
    model: str
    family: str
    architecture: str      # as meta.yaml spells it
    shapes: dict
    shapes_tp: int
    tp_folders: tuple[int, ...]
    meta: dict


@dataclass(slots=True)
class OpTables:
    """One GPU's tables for one model, dtype and tensor-parallel degree."""

    path: str
    gpu: str               # the driver's device name, as measured
    hardware: str          # the bundle's label (its folder name)
    model: str             # the Hugging Face id the tables were measured for
    tp: int
    shapes: dict           # per-rank shapes at `shapes_tp` (meta.yaml's hf_overrides)
    shapes_tp: int
    dense: dict[str, Table1D]
    per_sequence: dict[str, Table1D]
    attention: AttentionTable | None   # None: not measured (the roofline's)
    skew: SkewFit | None = None
    meta: dict = field(default_factory=dict)
    family: str = "llama"  # meta.yaml's architecture: which kernels make a layer
    not_measured: tuple[str, ...] = ()   # kernels of a layer it lacks (meta.yaml), by design

    @property
    def max_tokens(self) -> float:
        return min(t.xs[-1] for t in self.dense.values())

    def describe(self) -> str:
        m = self.meta
        if m.get("source"):   # a bundle converted from another peer's measurements
            return f"{self.hardware} ({self.gpu}), {self.model}, tp{self.tp}; {m['source']}"
        return (f"{self.hardware} ({self.gpu}), {self.model}, tp{self.tp}; vLLM "
                f"{m.get('vllm_version', '?')}, CUDA {m.get('cuda_version', '?')}, measured "
                f"{'eager' if (m.get('engine_effective') or {}).get('enforce_eager') else '?'}")


def _read_csv(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(line, row) of a CSV whose header holds `columns`; errors name the file and line."""
    if not path.is_file():
        raise UserError(f"{path}: table not found (a perf bundle's tp<N>/ holds dense.csv, "
                        "attention.csv and per_sequence.csv)")
    rows = list(csv_rows(path))
    if not rows:
        raise UserError(f"{path}: empty table (expected a header: {','.join(columns)})")
    header = [h.strip() for h in rows[0][1]]
    missing = [c for c in columns if c not in header]
    if missing:
        raise UserError(f"{where(path, 1)}: header lacks {', '.join(missing)} (expected "
                        f"{','.join(columns)})")
    out = []
    for n, row in rows[1:]:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise UserError(f"{where(path, n)}: {len(row)} fields, the header has "
                            f"{len(header)}")
        out.append((n, dict(zip(header, (c.strip() for c in row)))))
    if not out:
        raise UserError(f"{path}: the table holds no rows")
    return out


def _number(path: Path, n: int, row: dict, key: str, integer: bool = False) -> float:
    v = row[key]
    try:
        x = float(v)
    except ValueError:
        raise UserError(f"{where(path, n, key)}: expected a number, got {v!r}") from None
    # (a kernel of 0 us is no measurement: an all-zero moe.csv divided by zero)
    if not math.isfinite(x) or x < 0 or (key == "time_us" and not 0 < x <= MAX_TIME_US) \
            or (integer and (not x.is_integer() or x > MAX_TABLE_COUNT)):
        what = f"a whole count from 0 to {MAX_TABLE_COUNT}" if integer else \
            f"microseconds above 0, at most {MAX_TIME_US:g}" if key == "time_us" else \
            "a number >= 0"
        raise UserError(f"{where(path, n, key)}: expected {what}, got {v!r}")
    return x


def _tables_1d(path: Path, key: str, names: tuple[str, ...], who: str) -> dict[str, Table1D]:
    points: dict[str, dict[float, float]] = {}
    for n, row in _read_csv(path, ("layer", key, "time_us")):
        x = _number(path, n, row, key, integer=True)
        if x < 1:
            raise UserError(f"{where(path, n, key)}: expected a count >= 1, got {row[key]!r}")
        pts = points.setdefault(row["layer"], {})
        if x in pts:
            raise UserError(f"{where(path, n, key)}: {row['layer']} at {key} {x:g} twice")
        pts[x] = _number(path, n, row, "time_us")
    missing = [name for name in names if name not in points]
    if missing:
        raise UserError(f"{path}: no rows for {', '.join(missing)} ({who} needs "
                        f"{', '.join(names)})")
    return {name: Table1D(tuple(sorted(p)), tuple(p[x] for x in sorted(p)))
            for name, p in points.items()}


def _attention(path: Path) -> AttentionTable:
    rows, seen = [], {}
    for n, row in _read_csv(path, ATTENTION_COLUMNS):
        pc, kp, nd, kd = (_number(path, n, row, c, integer=True) for c in ATTENTION_COLUMNS[:4])
        if not pc and not nd:
            raise UserError(f"{where(path, n)}: a shot with no prefill chunk and no decodes")
        if (pc, kp, nd, kd) in seen:
            raise UserError(f"{where(path, n)}: the same shot as line {seen[(pc, kp, nd, kd)]}")
        seen[(pc, kp, nd, kd)] = n
        rows.append((pc, kp, nd, kd, _number(path, n, row, "time_us")))
    if not any(pc == 0 for pc, *_ in rows) or not any(nd == 0 for _, _, nd, *_ in rows):
        raise UserError(f"{path}: needs pure-decode (prefill_chunk 0) and pure-prefill "
                        "(n_decode 0) shots")
    return AttentionTable(rows)


def find_bundle(path) -> Path:
    """The variant folder (meta.yaml beside tp<N>/) of a path given as that folder, one of its
    tp<N> folders, or its meta.yaml."""
    p = Path(path)
    if p.is_file() and p.name == "meta.yaml":
        p = p.parent
    if p.is_dir() and p.name.startswith("tp") and (p.parent / "meta.yaml").is_file():
        p = p.parent
    if not p.is_dir():
        raise UserError(f"--device-profile {path}: no such folder (give a perf bundle's "
                        "variant folder: meta.yaml and tp<N>/)")
    if not (p / "meta.yaml").is_file():
        raise UserError(f"--device-profile {path}: no meta.yaml there (a perf bundle's variant "
                        "folder holds meta.yaml and tp<N>/, for example "
                        "profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16)")
    return p


# The per-rank shapes stepgap reads from meta.yaml's engine_effective.hf_overrides.
SHAPE_KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "head_dim", "hidden_size")
NAME_KEYS = ("gpu", "hardware", "model", "variant", "architecture", "vllm_version",
             "cuda_version", "source")


def read_meta(root: Path) -> dict:
    """A bundle's meta.yaml, every field stepgap reads of the type it must be, or one line
    naming the field: names scalars; `engine_effective` and its `hf_overrides` mappings, the
    shapes integers >= 1; `tp_degrees` a list of sizes from 1 to MAX_TP (a string, a mapping
    or `[a, 1]` is refused, not read as something else). The skew fit is checked where it is
    read (`_skew`)."""
    path = root / "meta.yaml"
    return parsed_once(("meta.yaml",), [path], lambda: _checked_meta(path))


def _checked_meta(path: Path) -> dict:
    meta = read_yaml(path, "LLMServingSim's meta.yaml")

    def bad(field: str, expected: str, v) -> UserError:
        return UserError(f"{where(path, field=field)}: expected {expected}, got {shown(v)}")
    for key in NAME_KEYS:
        v = meta.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int, float))):
            raise bad(key, "a name", v)
    eff = meta.get("engine_effective")
    if eff is not None and not isinstance(eff, dict):
        raise bad("engine_effective", "a mapping of the engine's settings", eff)
    shapes = (eff or {}).get("hf_overrides")
    if shapes is not None and not isinstance(shapes, dict):
        raise bad("engine_effective.hf_overrides", "a mapping of the model's per-rank shapes",
                  shapes)
    for key in SHAPE_KEYS:
        v = (shapes or {}).get(key)
        if v is not None and not (is_int(v) and v >= 1):
            raise bad(f"engine_effective.hf_overrides.{key}", "an integer >= 1", v)
    degrees = meta.get("tp_degrees")
    if degrees is not None and not (isinstance(degrees, list) and degrees and all(
            is_int(d) and 1 <= d <= MAX_TP for d in degrees)):
        raise bad("tp_degrees", f"a list of tensor-parallel sizes from 1 to {MAX_TP}", degrees)
    gaps = meta.get("not_measured")
    if gaps is not None and not (isinstance(gaps, list) and all(g in MAY_LACK for g in gaps)):
        raise bad("not_measured", f"a list of kernels among {', '.join(MAY_LACK)}", gaps)
    return meta


# LLMServingSim's variant folders are named by the weights' dtype, short, and `-kv<dtype>` for a
# KV cache of another (bf16, bf16-kvfp8, fp8, fp8-kvfp8: its ProfileArgs.effective_variant).
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp8": "fp8"}


def find_variant(path, fp8_weights: bool, fp8_kv: bool, weights: str, why: str) -> Path:
    """The bundle's variant folder for fp8 weights or not and an fp8 KV cache or not: the one
    given when its variant (meta.yaml's, else its folder's name) is that, else its sibling of
    that name (`weights`: the weights' dtype when not fp8); none there is one line naming what
    is. A bundle that names no fp8 is taken for the weights' own dtype."""
    root = find_bundle(path)
    meta = read_meta(root)
    have = str(meta.get("variant") or root.name)
    weight, _, kv = have.partition("-kv")
    if (weight == "fp8", kv.startswith("fp8")) == (fp8_weights, fp8_kv):
        return root
    want = ("fp8" if fp8_weights else weight if weight != "fp8" else
            SHORT_DTYPES.get(weights, weights)) + ("-kvfp8" if fp8_kv else "")
    if (root.parent / want / "meta.yaml").is_file():
        return root.parent / want
    there = sorted(d.name for d in root.parent.iterdir() if (d / "meta.yaml").is_file())
    raise UserError(f"--device-profile {path}: measured as variant {have}; {why} needs the "
                    f"bundle's {want} variant, not there (it has {', '.join(there)}): measure "
                    "that variant, or drop --device-profile for the roofline")


def bundle_meta(root: Path) -> BundleMeta:
    """What a bundle's meta.yaml says of the model it measured (`root`: its variant folder)."""
    meta = read_meta(root)   # (every field read, of its type)
    have = tuple(sorted(int(d.name[2:]) for d in root.iterdir()
                        if d.is_dir() and d.name.startswith("tp") and d.name[2:].isdigit()))
    shapes = (meta.get("engine_effective") or {}).get("hf_overrides") or {}
    arch = str(meta.get("architecture") or "llama")
    degrees = meta.get("tp_degrees") or have
    return BundleMeta(str(root), str(meta.get("model", "?")), FAMILY_OF.get(arch, arch), arch,
                      shapes, max(degrees) if degrees else 1, have, meta)


def load_tables(path, tp: int = 1) -> OpTables:
    """Read a perf bundle's tables at one tensor-parallel degree (parsed once a process while
    the bundle's files are the same: every cell of a grid reads them)."""
    root = find_bundle(path)
    for parent in root.parents:   # the GPU's hardware.yaml, read or not: no output over it
        mark_input(parent / "hardware.yaml")
        if parent.name == "perf":
            break
    return parsed_once(("tables", tp), _bundle_files(root, tp), lambda: _load_tables(root, tp))


def _bundle_files(root: Path, tp: int) -> list[Path]:
    """The files `load_tables` reads at this TP (what its parse is keyed by): meta.yaml, the
    tp<N>/ folder's tables, and a skew table meta.yaml names elsewhere."""
    files = [root / "meta.yaml"]
    files += sorted(p for p in (root / f"tp{tp}").glob("*.csv") if p.is_file())
    entry = _per_tp(read_meta(root).get("skew_fit"), tp)
    name = entry.get("bucket_table") if isinstance(entry, dict) else None
    if isinstance(name, str) and (root / name).is_file() and root / name not in files:
        files.append(root / name)
    return files


def _load_tables(root: Path, tp: int) -> OpTables:
    meta_path = root / "meta.yaml"
    bm = bundle_meta(root)
    meta, have = bm.meta, bm.tp_folders
    if tp not in have:
        listed = meta.get("tp_degrees")
        said = f"; meta.yaml's tp_degrees lists {listed}, but the folder is missing" \
            if isinstance(listed, list) and tp in listed else ""
        raise UserError(f"{root / f'tp{tp}'}: no such folder (tables here at tensor-parallel "
                        f"size {', '.join(map(str, have)) or 'none'}{said}); "
                        f"--tensor-parallel-size {tp} needs tables measured at {tp}")
    folder = root / f"tp{tp}"
    family = bm.family
    if family not in FAMILY_LAYERS:
        raise UserError(f"{where(meta_path, field='architecture')}: {bm.architecture!r}: "
                        f"stepgap prices the layers of {', '.join(FAMILY_LAYERS)} from tables "
                        "(of another MoE family, moe.csv and mtp.csv alone); drop "
                        "--device-profile to price it from the roofline")
    lack = tuple(meta.get("not_measured") or ())
    dense = ("embedding", *dict.fromkeys(FAMILY_LAYERS[family]), "final_layernorm")
    seq = tuple(n for n in PER_SEQUENCE if n not in lack)
    return OpTables(
        str(root), str(meta.get("gpu", "?")), str(meta.get("hardware", root.parts[-4]
                                                         if len(root.parts) > 3 else "?")),
        bm.model, tp, bm.shapes, bm.shapes_tp,
        _tables_1d(folder / "dense.csv", "tokens", tuple(n for n in dense if n not in lack),
                   f"a {family} layer"),
        _tables_1d(folder / "per_sequence.csv", "sequences", seq, "the head") if seq else {},
        None if "attention" in lack else _attention(folder / "attention.csv"),
        _skew(meta, root, tp, meta_path), meta, family,
        tuple(n for n in (*dense, *PER_SEQUENCE, "attention") if n in lack))


# Where the measured tables this repository commits live (traces/peers/<source>/, each with its
# licence and source commit); an installed wheel has none, and then no GPU is priced from them.
PEERS = Path(__file__).resolve().parents[1] / "traces" / "peers"


def repo_relative(path) -> str:
    """A path as results show it: from the repository's root where it lies in it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(PEERS.parent.parent))
    except ValueError:
        return str(path)


@functools.cache
def committed_bundles(gpu: str) -> tuple[Path, ...]:
    """The perf bundles committed under traces/peers/ that were measured on catalog GPU `gpu`
    (meta.yaml's `gpu`, the device as CUDA names it, is that entry's): variant folders, those
    that measured more of a step first (fewer `not_measured`), then by path."""
    from stepgap.sim.hardware import catalog_entry
    found = []
    for meta in sorted(PEERS.glob("*/**/profiler/perf/*/*/*/*/meta.yaml")):
        m = read_meta(meta.parent)
        if catalog_entry(str(m.get("gpu") or "")) == gpu:
            found.append((len(m.get("not_measured") or ()), str(meta.parent), meta.parent))
    return tuple(p for *_, p in sorted(found))


# The GEMMs of a layer, which stream its weights: a committed bundle prices a model by default
# only where it timed all of them (one that times fewer is fit data of the GPU's roofline, and
# prices a run that names it with --device-profile).
LAYER_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def committed_bundle(gpu: str, target, tp: int, fp8_weights: bool, fp8_kv: bool) -> Path | None:
    """The committed bundle (committed_bundles) that prices `target` on `gpu` at this TP: it
    timed every GEMM of a layer (LAYER_GEMMS), the model's family and per-rank shapes
    (shape_mismatch), a tp<N>/ folder, and weights and KV cache of the bundle's precision (a
    bundle that names no fp8 is taken for bf16 or fp16); None where none does."""
    for root in committed_bundles(gpu):
        meta = read_meta(root)
        if set(LAYER_GEMMS) & set(meta.get("not_measured") or ()):
            continue
        weight, _, kv = str(meta.get("variant") or root.name).partition("-kv")
        if (weight == "fp8", kv.startswith("fp8")) != (fp8_weights, fp8_kv):
            continue
        bm = bundle_meta(root)
        if tp in bm.tp_folders and shape_mismatch(bm, target, target.hidden_size) is None:
            return root
    return None


def per_rank(c, tp: int) -> dict[str, int]:
    """A model's shapes on one of tp ranks, as vLLM shards them (and as the profiler's
    hf_overrides write them): heads, MLP and the padded vocabulary split; KV heads split, one
    per rank at least (replicated past their number)."""
    vocab = -(-c.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    return {"num_attention_heads": c.num_heads // tp,
            "num_key_value_heads": max(1, c.num_kv_heads // tp),
            "intermediate_size": c.intermediate_size // tp, "vocab_size": vocab // tp,
            "head_dim": c.head_dim, "hidden_size": c.hidden_size}


def shape_mismatch(tables: OpTables | BundleMeta, c, hidden: int,
                   family: bool = True) -> str | None:
    """None where a model (or a drafter's decoder layer) has the shapes the tables were
    measured at, else which do not match, field by field: its family against meta.yaml's
    `architecture` (not for an EAGLE head, whose one layer is priced kernel by kernel), its
    width against the target's `hidden`, and its shapes per rank at the tables' TP degree
    against meta.yaml's hf_overrides (heads, KV heads, MLP width, vocabulary; head_dim and
    hidden_size where the overrides give them: Qwen3's head_dim is not hidden / heads, so each
    field is taken as it is). A MoE bundle's expert counts in hf_overrides are the profiler's
    own (it shrinks the experts to one rank's share to measure moe.csv), so they are not
    compared. `tables`: the tables, or a bundle's meta.yaml alone (sim/moe_tables.py)."""
    r, s, out = tables.shapes_tp, tables.shapes, []
    kind = getattr(c, "model_type", "llama")
    if family and kind != tables.family:
        out.append(f"architecture is {tables.family!r}, --model is a {kind!r} model")
    if c.hidden_size != hidden:
        out.append(f"hidden_size {c.hidden_size}, not the target's {hidden}")
    mine = per_rank(c, r)
    for key, want in mine.items():
        have = s.get(key)
        if key in ("head_dim", "hidden_size") and have is None:
            continue   # the profiler overrides only what sharding changes
        if have != want:
            total = f" ({have * r} in all)" if isinstance(have, int) and r > 1 \
                and key not in ("head_dim", "hidden_size") else ""
            out.append(f"engine_effective.hf_overrides.{key} is {have!r} per rank at TP {r}"
                       f"{total}, --model {c.name} has {want}")
    return "; ".join(out) or None


def refuse_another_model(tables: OpTables | BundleMeta, target) -> None:
    """One line naming each field where the tables were measured for another model; and where
    meta.yaml's `model` is one stepgap knows (a preset, or its Hugging Face id), that model's
    shapes against the target's (a MoE bundle's expert counts are the profiler's own, so its
    shapes alone let a bundle that names another model through)."""
    why = shape_mismatch(tables, target, target.hidden_size)
    if why is not None:
        raise UserError(f"{Path(tables.path) / 'meta.yaml'}: tables of {tables.model}, not "
                        f"of --model {target.name}: {why}")
    from stepgap.common.model_presets import load_model_config, preset_of
    named = preset_of(str(tables.model))
    if named is None or named == target.name:
        return
    other = load_model_config(named)
    differ = [f"{k} {getattr(other, k)} vs {getattr(target, k)}" for k in MODEL_SHAPE
              if getattr(other, k) != getattr(target, k)]
    if differ:
        raise UserError(f"{where(Path(tables.path) / 'meta.yaml', field='model')}: "
                        f"{tables.model!r} ({named}), not --model {target.name}: "
                        f"{', '.join(differ)}")


MODEL_SHAPE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size",
               "num_experts")


# -------------------------------------------------------------------------------------------
# As DeviceCosts


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


class TableCosts:
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
