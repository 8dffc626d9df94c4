"""Issue 53's architecture counts, measured on the source (no run): how far the product code
still reads run results as nested dicts, branches on the speculation method's name, and how long
sim/'s modules are.

    python bench/architecture_counts.py            # the counts
    python bench/architecture_counts.py --list     # and every place counted

Product code is sim/, common/, engine/, calibrate/, training/ and stepgap/'s own files (its
links to those folders are not counted twice); tests/ and bench/ are not.

- result-key subscripts: `x["KEY"]` (or `x.get("KEY")`, or an f-string key such as
  f"mean_{m}_ms") where KEY is one of the run result's own keys (RESULT_KEYS: vllm bench serve's
  metrics, `step_gaps`, `spec_decode`, `config` and `config["resolved"]`, and their keys). Keys
  that other dicts use as often (`mode`, `k`, `device`, `draft`, `target`, `count`, `backend`,
  `num_prompts`, ...) are left out, so this undercounts rather than overcounts. The modules that
  write the layout and read it back (FORMAT) are not counted.
- method comparisons: a comparison (`==`, `!=`, `in`, `not in`) with a speculation method's name
  as a string constant (SPEC_NAMES), alone or in a tuple, list or set, outside the seam module
  (SEAM).
- "1 + k": the verify width spelled out (`1 + k`, `k + 1`, `1 + cfg.k`, `1 + s.num_spec`...)
  outside the seam.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("sim", "common", "engine", "calibrate", "training", "stepgap")
SEAM = {"common/speculation.py"}
# where the run result's dict layout is written and read back (vLLM's files too): the one place
# that may subscript its keys
FORMAT = {"common/formats.py", "common/run_result.py", "common/vllm_bench.py"}

METRICS = {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99", "p90", "p50", "p95")
           for m in ("ttft", "tpot", "itl", "e2el")}
RESULT_KEYS = METRICS | {
    # vllm bench serve's own
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput", "input_lens",
    "output_lens", "ttfts", "itls", "request_ids", "chunk_tokens",
    # stepgap's
    "config", "resolved", "step_gaps", "spec_decode", "timeseries",
    "values_us", "mean_us", "median_us", "p90_us", "p99_us", "max_us",
    "acceptance_length", "acceptance_rate", "acceptance_rate_per_pos", "num_accepted_tokens",
    "num_draft_tokens", "num_drafts",
    "acceptance_profile", "acceptance_rates", "acceptance_spread", "cpu_costs_us",
    "device_costs", "num_kv_blocks", "num_preemptions", "num_steps", "prefix_cache", "notes",
    "hardware", "jitter", "drafter", "data_parallel",
}
SPEC_NAMES = {"eagle", "eagle3", "mtp", "draft_model", "ngram", "ngram_gpu", "suffix", "medusa"}
VERIFY = re.compile(r"\b1 \+ (?:\w+\.)*(?:k|num_spec|num_speculative_tokens)\b"
                    r"|\b(?:\w+\.)*(?:k|num_spec|num_speculative_tokens) \+ 1\b")


def product_files() -> list[Path]:
    files = []
    for top in PRODUCT:
        d = ROOT / top
        if top == "stepgap":   # its own modules; the rest are links to the layers
            files += [p for p in d.glob("*.py") if not p.is_symlink()]
        else:
            files += sorted(d.rglob("*.py"))
    return files


def key_of(node: ast.AST) -> str | None:
    """The string key a subscript or .get() reads, where it is one (an f-string's text parts
    joined with `{}` for the holes)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        return text
    return None


def is_result_key(key: str) -> bool:
    if key in RESULT_KEYS:
        return True
    if "{}" in key:   # f"mean_{m}_ms", f"{stat}_tpot_ms"
        pat = re.compile("^" + re.escape(key).replace(r"\{\}", r"\w+") + "$")
        return any(pat.match(k) for k in METRICS)
    return False


def names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in names(e)]
    return []


def scan(path: Path) -> tuple[list, list, list]:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    subs, methods = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = key_of(node.slice)
            if key is not None and is_result_key(key):
                subs.append((node.lineno, key))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and node.args:
            key = key_of(node.args[0])
            if key is not None and is_result_key(key):
                subs.append((node.lineno, key))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(set(names(o)) & SPEC_NAMES for o in operands):
                methods.append((node.lineno, ast.unparse(node)[:80]))
    verify = [(i, line.strip()[:80]) for i, line in enumerate(text.splitlines(), 1)
              if VERIFY.search(line) and not line.lstrip().startswith("#")]
    return subs, methods, verify


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print every place counted")
    args = ap.parse_args(argv)
    totals = {"result-key subscripts": [], "method comparisons outside the seam": [],
              "'1 + k' outside the seam": []}
    for path in product_files():
        rel = path.relative_to(ROOT).as_posix()
        subs, methods, verify = scan(path)
        if rel not in FORMAT:
            totals["result-key subscripts"] += [(rel, *s) for s in subs]
        if rel not in SEAM:
            totals["method comparisons outside the seam"] += [(rel, *m) for m in methods]
            totals["'1 + k' outside the seam"] += [(rel, *v) for v in verify]
    for name, found in totals.items():
        files = sorted({f for f, *_ in found})
        print(f"{name}: {len(found)} in {len(files)} files")
        if args.list:
            for f, line, what in found:
                print(f"    {f}:{line}  {what}")
    big = [(len(p.read_text().splitlines()), p.relative_to(ROOT).as_posix())
           for p in sorted((ROOT / "sim").glob("*.py"))]
    over = [(n, p) for n, p in big if n > 500]
    print(f"sim/ modules over 500 lines: {len(over)}"
          + "".join(f"\n    {p}: {n}" for n, p in sorted(over, reverse=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
