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

How a step is priced from them: sim/table_costs.py; their interpolation: sim/table_interp.py;
which model a bundle's tables are of, and the bundles committed for a catalog GPU:
sim/bundle_match.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from stepgap.common.errors import UserError, shown, where
from stepgap.common.fileio import csv_rows, mark_input, parsed_once, read_yaml
from stepgap.common.limits import MAX_SKEW_ALPHA, MAX_TABLE_COUNT, MAX_TP, is_finite, is_int
from stepgap.sim.table_interp import AttentionTable, SkewFit, Table1D

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
