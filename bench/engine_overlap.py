"""Measured overlap on the CPU: sync vs async vs zero-bubble with the `process` executor.

The worker runs in its own process (one torch thread), so the engine process's work (schedule,
update_from_output, the client) can run while the worker computes. The model is a tiny Llama and
head sized so that the device time per step (the worker's compute) is about the CPU time per step.
Per mode it reports mean and P99 TPOT, mean and P99 ITL, and the median and P90 step gap. On the
CPU the device is the worker itself, so the overlapped modes hide the engine's work but not the
worker's own prepare_inputs: that is the remaining gap.

The engine process is pinned to CPU 0 and the worker to CPU 1 (`--no-pin` to leave them free),
as a serving machine gives each its own core. Unpinned, on a machine busy with other work, the
two share a core: a message wakes the other process, which preempts the sender, and the overlap
vanishes. Usage:

    python bench/engine_overlap.py [--k 0] [--concurrency 4] [--num-prompts 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepgap.common.formats import MODES  # noqa: E402
from stepgap.engine.args import EngineArgs  # noqa: E402
from stepgap.engine.loop import run_trace  # noqa: E402
from stepgap.engine.tiny import TINY_TARGET  # noqa: E402
from stepgap.training.tiny import make_tiny  # noqa: E402
from stepgap.common.workloads import mtbench_like  # noqa: E402

# Two layers of width 64: a decode step's compute is then a few hundred microseconds, about what
# the engine process spends per step on scheduling, updating and messages.
BENCH_TARGET = replace(TINY_TARGET, name="overlap-bench", num_layers=1)


def step_costs(spans) -> dict[str, float]:
    """Median per-step µs of the device lane and of the engine's CPU ops."""
    device, engine = defaultdict(float), defaultdict(float)
    for s in spans:
        if s.lane == "device":
            device[s.step] += s.end_us - s.start_us
        elif s.lane == "cpu.engine":
            engine[s.step] += s.end_us - s.start_us
    return {"device_us": statistics.median(device.values()),
            "engine_us": statistics.median(engine.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin the engine to CPU 0 and the worker to CPU 1")
    args = ap.parse_args()
    pin = not args.no_pin and len(os.sched_getaffinity(0)) >= 2
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="stepgap-overlap-"))
    paths = make_tiny(tmp, train_steps=args.train_steps, target_cfg=BENCH_TARGET)
    reqs = mtbench_like(args.num_prompts, args.output_len)
    ea = EngineArgs(model=paths["target"], draft=paths["eagle3-yuhuili"], k=args.k,
                    executor="process", pin=pin, dtype="float32", num_gpu_blocks_override=2048,
                    max_model_len=1024, max_num_seqs=args.concurrency)
    rows = {}
    setup = ea.create_engine_config()
    with setup.make_executor() as ex:   # the process executor pins engine and worker itself
        for rep in range(args.repeats):
            for mode in MODES:  # interleaved, so that load from other jobs hits every mode
                cfg = setup.engine_config(mode)
                out = run_trace(ex, reqs, cfg, vocab_size=BENCH_TARGET.vocab_size,
                                max_concurrency=args.concurrency)
                rec = out.result
                r, gaps = rec.metrics, rec.step_gaps
                rows.setdefault(mode, []).append({
                    "tpot": r["mean_tpot_ms"], "p99_tpot": r["p99_tpot_ms"],
                    "itl": r["mean_itl_ms"], "p99_itl": r["p99_itl_ms"],
                    "gap50": gaps["median_us"], "gap90": gaps["p90_us"],
                    "al": (rec.spec_decode or {}).get("acceptance_length", 1.0),
                    **step_costs(out.spans)})
    print(f"process executor, k={args.k}, max-concurrency {args.concurrency}, "
          f"{args.num_prompts} mtbench-like prompts, output {args.output_len}; medians of "
          f"{args.repeats} runs; {os.cpu_count()} CPUs, engine and worker "
          f"{'pinned to one CPU each' if pin else 'not pinned'}; load average before/after "
          f"{load0:.2f}/{os.getloadavg()[0]:.2f}")
    print(f"{'mode':<12} {'TPOT':>7} {'P99 TPOT':>9} {'ITL':>7} {'P99 ITL':>8} "
          f"{'gap p50':>8} {'gap p90':>8} {'device/step':>12} {'engine/step':>12} {'AL':>5}")
    for mode in MODES:
        m = {key: statistics.median(r[key] for r in rows[mode]) for key in rows[mode][0]}
        print(f"{mode:<12} {m['tpot']:>7.2f} {m['p99_tpot']:>9.2f} {m['itl']:>7.2f} "
              f"{m['p99_itl']:>8.2f} {m['gap50']:>8.0f} {m['gap90']:>8.0f} "
              f"{m['device_us']:>12.0f} {m['engine_us']:>12.0f} {m['al']:>5.2f}")
    print("(TPOT and ITL in ms; step gaps and per-step costs in µs)")


if __name__ == "__main__":
    main()
