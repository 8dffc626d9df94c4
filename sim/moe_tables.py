"""A MoE block and an MTP drafter's wrapper from measured tables: LLMServingSim's `moe.csv` and
`mtp.csv`, beside the dense, attention and per-sequence tables of a perf bundle's `tp<N>/`
folder (sim/tables.py; the format: LLMServingSim's docs/docs/profiler/output-bundle.md).

- `moe.csv` (ep, tokens, activated_experts, time_us): one whole MoE block (router, routed
  experts, shared experts) on one rank of an expert-parallel group of `ep` GPUs, for `tokens`
  input rows and `activated_experts` distinct experts touched on that rank. One grid per EP
  degree; a file without the `ep` column is EP 1. At each token count the profiler measured
  the activated counts a rank can reach there (powers of two up to min(tokens * top-k / ep,
  experts / ep)), so the rows of a grid differ in length.
- `mtp.csv` (layer, sequences, time_us): an MTP module's own kernels around its decoder layer
  (`mtp_embed`, `mtp_enorm_hnorm`, `mtp_eh_proj`, `mtp_glue`, `mtp_shared_head`) by the rows it
  runs over. The decoder layer itself is a target layer (the bundle's attention and MoE), and
  the logits the target's lm_head (per_sequence.csv).

How a MoE block is looked up (`MoeGrid`; tests/test_moe.py checks each rule on hand-made
tables):

- the grid of the run's EP degree, or the nearest measured one (ties: the lower degree, more
  experts per rank), with a note;
- at each measured token count, linear in the activated experts between the counts measured
  there, and held at the row's first or last point outside them (a rank cannot touch fewer
  than its share of one token's experts, nor more than it holds);
- then linear in tokens between the two measured token counts around the step's; below the
  first, that row;
- past the grid's last token count the tables do not cover the point: the caller prices it
  with the roofline's growth from there (sim/expert_parallel.py `MoeCosts`), and counts it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.fileio import parsed_once
from stepgap.sim.bundle_match import refuse_another_model
from stepgap.sim.table_interp import Table1D
from stepgap.sim.tables import FAMILY_LAYERS, _number, _read_csv, _tables_1d, bundle_meta

MOE_COLUMNS = ("tokens", "activated_experts", "time_us")
MTP_LAYERS = ("mtp_embed", "mtp_enorm_hnorm", "mtp_eh_proj", "mtp_glue", "mtp_shared_head")


@dataclass(frozen=True, slots=True)
class MoeGrid:
    """One EP degree's times: by token count, each its own activated-expert points."""

    tokens: tuple[float, ...]
    rows: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]   # (activated, times) each

    def _row(self, j: int, activated: float) -> float:
        xs, ys = self.rows[j]
        if activated <= xs[0]:
            return ys[0]
        if activated >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, activated)
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (activated - x0) / (x1 - x0)

    def __call__(self, tokens: float, activated: float) -> float | None:
        """Microseconds of one block, or None past the grid's last token count."""
        ts = self.tokens
        if tokens > ts[-1]:
            return None
        if tokens <= ts[0]:
            return self._row(0, activated)
        j = bisect.bisect_left(ts, tokens)
        if ts[j] == tokens:
            return self._row(j, activated)
        y0, y1 = self._row(j - 1, activated), self._row(j, activated)
        return y0 + (y1 - y0) * (tokens - ts[j - 1]) / (ts[j] - ts[j - 1])

    @property
    def max_tokens(self) -> float:
        return self.tokens[-1]


@dataclass(frozen=True, slots=True)
class MoeTable:
    """A bundle's moe.csv: one grid per EP degree."""

    path: str
    grids: dict[int, MoeGrid]

    def degree(self, ep: int) -> int:
        """The grid a run at `ep` reads: its own, else the nearest measured (ties: the lower)."""
        if ep in self.grids:
            return ep
        return min(self.grids, key=lambda d: (abs(d - ep), d))


def load_moe_table(path) -> MoeTable:
    """Read a moe.csv (once a process while its bytes are the same); every error names the
    file, the line and the field."""
    path = Path(path)
    return parsed_once(("moe.csv",), [path], lambda: _load_moe_table(path))


def _load_moe_table(path: Path) -> MoeTable:
    points: dict[int, dict[float, dict[float, float]]] = {}
    for n, row in _read_csv(path, MOE_COLUMNS):
        ep = _number(path, n, row, "ep", integer=True) if "ep" in row else 1.0
        tokens = _number(path, n, row, "tokens", integer=True)
        active = _number(path, n, row, "activated_experts", integer=True)
        for key, v in (("ep", ep), ("tokens", tokens), ("activated_experts", active)):
            if v < 1:
                raise UserError(f"{where(path, n, key)}: expected a count >= 1, got {row[key]!r}")
        shot = points.setdefault(int(ep), {}).setdefault(tokens, {})
        if active in shot:
            raise UserError(f"{where(path, n)}: ep {ep:g}, {tokens:g} tokens and "
                            f"{active:g} activated experts twice")
        shot[active] = _number(path, n, row, "time_us")
    grids = {}
    for ep, by_tokens in points.items():
        ts = tuple(sorted(by_tokens))
        grids[ep] = MoeGrid(ts, tuple((tuple(sorted(by_tokens[t])),
                                       tuple(by_tokens[t][a] for a in sorted(by_tokens[t])))
                                      for t in ts))
    return MoeTable(str(path), dict(sorted(grids.items())))


def load_mtp_table(path) -> dict[str, Table1D]:
    """Read an mtp.csv: the MTP module's kernels by rows (its eh_proj at least); once a
    process while its bytes are the same."""
    path = Path(path)
    tables = parsed_once(("mtp.csv",), [path],
                         lambda: _tables_1d(path, "sequences", (), "an MTP module"))
    if "mtp_eh_proj" not in tables:
        raise UserError(f"{path}: no rows for mtp_eh_proj (an MTP module's table holds "
                        f"{', '.join(MTP_LAYERS)})")
    return tables


def mtp_wrapper(tables: dict[str, Table1D], rows: int) -> float:
    """An MTP pass's own kernels over `rows` tokens: every layer mtp.csv measured (the
    embedding, its two norms, eh_proj, the glue around it and the shared head's norm)."""
    return sum(tables[name](rows) for name in MTP_LAYERS if name in tables)


def moe_parts(root: Path, tp: int, moe_tp: int, mtp: bool) -> tuple[MoeTable | None,
                                                                    dict | None]:
    """A bundle's MoE table for a run whose experts are split `moe_tp` ways by width (1 with
    expert parallelism: its EP grids are measured at TP 1, in tp1/), and the MTP module's
    kernels (when it drafts with MTP) of its TP degree, else TP 1's (its eh_proj is a plain
    Linear that vLLM does not shard, and its norms are replicated); None where absent.
    `root`: the bundle's variant folder (sim/tables.py find_variant)."""
    moe, mtp_file = root / f"tp{moe_tp}" / "moe.csv", mtp_path(root, tp)
    return (load_moe_table(moe) if moe.is_file() else None,
            load_mtp_table(mtp_file) if mtp and mtp_file.is_file() else None)


def mtp_path(root: Path, tp: int) -> Path:
    """The mtp.csv a run at TP `tp` reads: its TP degree's, else TP 1's (`moe_parts`)."""
    own = root / f"tp{tp}" / "mtp.csv"
    return own if own.is_file() else root / "tp1" / "mtp.csv"


def moe_only(root: Path, tp: int, target) -> str | None:
    """Why a MoE target takes only a bundle's MoE and MTP tables (the rest of each step from
    the roofline), or None where the dense, attention and per-sequence tables price the rest:
    the bundle has no dense tables at this TP, or its family's layers are not among those
    stepgap reads from tables (DeepSeek's MLA)."""
    if not target.is_moe:
        return None
    family = bundle_meta(root).family
    if family not in FAMILY_LAYERS:
        return f"stepgap does not read {family}'s dense and attention kernels from tables"
    if not (root / f"tp{tp}" / "dense.csv").is_file():
        return f"no tp{tp}/dense.csv"
    return None


def check_moe_bundle(root: Path, target) -> str:
    """A bundle whose MoE and MTP tables alone are read: refused where it has no moe.csv in
    tp1/, or where its family or per-rank shapes (meta.yaml's architecture and hf_overrides)
    are not the target's, field by field (sim/tables.py `shape_mismatch`); else what it was
    measured on, for the result."""
    bm = bundle_meta(root)
    if not (root / "tp1" / "moe.csv").is_file():
        raise UserError(f"--device-profile {root}: no tp1/moe.csv (a MoE model's perf bundle "
                        "measures its MoE block at TP 1) and no dense tables stepgap reads")
    refuse_another_model(bm, target)
    m = bm.meta
    return (f"{m.get('hardware', '?')} ({m.get('gpu', '?')}), {bm.model} "
            f"{m.get('variant', '')}; vLLM {m.get('vllm_version', '?')}")
