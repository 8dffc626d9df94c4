"""What each op of vLLM's step cost, per judged cell, from the runs' own hook timelines: the
evidence behind docs/explanation/vllm.md's async findings (a sync-calibrated simulator cannot see
them).

    python bench/vllm/ops.py out/vllm-cpu          # about a minute

For every judged cell (mode, k, concurrency) it prints the mean microseconds per step of the
worker's prepare_inputs, its waits, the device ops and the engine core's schedule, pooled over
the cell's runs, and, for async, each against the sync cell of the same k and concurrency.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_folder import run_of  # noqa: E402

OPS = (("cpu.engine", "schedule"), ("cpu.worker", "prepare_inputs"), ("cpu.worker", "wait"),
       ("device", "target_forward"), ("device", "rejection_sample"),
       ("device", "draft_forward"), ("device", "d2h"))


def per_step(runs: list) -> dict:
    """(lane, op) -> mean us per step over the runs' steps with device work."""
    total, steps = defaultdict(float), 0
    for run in runs:
        steps += len({s.step for s in run.spans if s.lane == "device"})
        for s in run.spans:
            total[(s.lane, s.op)] += s.end_us - s.start_us
    return {k: v / max(steps, 1) for k, v in total.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="bench/vllm/measure.py's output folder")
    args = ap.parse_args(argv)
    src = Path(args.src)
    plan = json.loads((src / "plan.json").read_text())
    cells = defaultdict(list)
    for r in plan["runs"]:
        if r["kind"] == "judged":
            cells[(r["mode"], r["k"], r["conc"])].append(run_of(src, r))
    means = {c: per_step(runs) for c, runs in cells.items()}
    print("| cell | " + " | ".join(op for _, op in OPS) + " |")
    print("|---|" + "---|" * len(OPS))
    for (mode, k, conc), m in sorted(means.items(), key=lambda kv: (kv[0][1], kv[0][2],
                                                                    kv[0][0] != "sync")):
        base = means.get(("sync", k, conc)) if mode != "sync" else None
        cols = []
        for key in OPS:
            us = m.get(key, 0.0)
            rel = f" ({us / base[key] - 1:+.0%})" if base and base.get(key) else ""
            cols.append(f"{us:.0f}{rel}")
        print(f"| {mode}-k{k}-c{conc} | " + " | ".join(cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
