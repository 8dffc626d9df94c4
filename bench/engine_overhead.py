"""The engine's CPU overhead per step on this machine: schedule + prepare_inputs + update.

Runs the tiny model (make-tiny) through the sync inline engine at batch 1 and 16, with and
without speculation, and reports the median host time of the three per-step CPU ops, in
microseconds, over decode steps at full batch. These are the costs the simulator's CPU model
(`a + b·num_reqs + c·num_tokens`) is fitted to. Usage:

    python bench/engine_overhead.py [--output-len 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from stepgap.engine.args import EngineArgs  # noqa: E402
from stepgap.engine.loop import run_trace  # noqa: E402
from stepgap.training.tiny import make_tiny  # noqa: E402
from stepgap.common.formats import TraceRequest  # noqa: E402

OPS = ("schedule", "prepare_inputs", "update_from_output")


def per_step_costs(spans, batch: int) -> dict[str, float]:
    """Median µs of each CPU op over the steps that ran `batch` requests."""
    full = {s.step for s in spans if s.op == "prepare_inputs" and s.args.get("reqs") == batch}
    by_op = defaultdict(list)
    for s in spans:
        if s.op in OPS and s.step in full:
            by_op[s.op].append(s.end_us - s.start_us)
    return {op: statistics.median(by_op[op]) for op in OPS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the tiny model gains nothing from more; busy cores lose a lot
    tmp = Path(tempfile.mkdtemp(prefix="stepgap-overhead-"))
    paths = make_tiny(tmp, train_steps=0)
    ea = EngineArgs(model=paths["target"], draft=paths["eagle3-yuhuili"], dtype="float32",
                    num_gpu_blocks_override=1024, max_model_len=512, max_num_seqs=16, max_k=4)
    setup = ea.create_engine_config()
    ex = setup.make_executor()
    print(f"{'batch':>5} {'k':>2} {'schedule':>9} {'prepare':>9} {'update':>9} {'total':>9}"
          "   (µs)")
    for batch in (1, 16):
        for k in (0, 4):
            reqs = [TraceRequest(f"r{i}", 0.0, 64, args.output_len) for i in range(batch)]
            cfg = setup.engine_config("sync", k)
            runs = []
            for _ in range(args.repeats):
                out = run_trace(ex, reqs, cfg, vocab_size=512)
                runs.append(per_step_costs(out.spans, batch))
            med = {op: statistics.median(r[op] for r in runs) for op in OPS}
            total = sum(med.values())
            print(f"{batch:>5} {k:>2} {med['schedule']:>9.1f} {med['prepare_inputs']:>9.1f} "
                  f"{med['update_from_output']:>9.1f} {total:>9.1f}")


if __name__ == "__main__":
    main()
