"""One Vidur run, timed by phase: run by Vidur's own venv, with `python -m vidur.main`'s options.

It does what vidur.main does (config from the command line, seeds, Simulator, run) and prints
one line, `VIDUR_STATS {json}`: seconds to import Vidur, to build the simulator (trace and
cached predictors), of the event loop alone and of writing the metrics; the requests and
batches (model iterations; one replica, one pipeline stage) it simulated; the simulated end
time; and the mean TTFT and TPOT of its request_metrics.csv, for a sanity check. Not part of
stepgap: bench/vidur/side_by_side.py runs it.
"""

import csv
import json
import os
import sys
import time

t0 = time.perf_counter()
from vidur.config import SimulationConfig  # noqa: E402
from vidur.entities.batch import Batch  # noqa: E402
from vidur.simulator import Simulator  # noqa: E402
from vidur.utils.random import set_seeds  # noqa: E402


def mean_of(path: str, column: str) -> float | None:
    with open(path, newline="") as f:
        values = [float(r[column]) for r in csv.DictReader(f) if r.get(column)]
    return sum(values) / len(values) if values else None


def main() -> int:
    t_import = time.perf_counter()
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    sim = Simulator(config)
    t_setup = time.perf_counter()
    marks = {}
    write = sim._write_output   # the loop ends where the output begins: time the two apart

    def timed_write():
        marks["loop"], marks["loop_cpu"] = time.perf_counter(), time.process_time()
        write()

    sim._write_output = timed_write
    c_loop = time.process_time()
    sim.run()
    t_end = time.perf_counter()
    out_dir = config.metrics_config.output_dir
    metrics = os.path.join(out_dir, "request_metrics.csv")
    have = os.path.isfile(metrics)
    print("VIDUR_STATS " + json.dumps({
        "import_s": t_import - t0, "setup_s": t_setup - t_import,
        "loop_s": marks["loop"] - t_setup, "loop_cpu_s": marks["loop_cpu"] - c_loop,
        "output_s": t_end - marks["loop"],
        "batches": Batch._id + 1,
        "simulated_s": sim._time,
        "requests": sum(1 for _ in open(metrics)) - 1 if have else None,
        "mean_ttft_ms": 1e3 * mean_of(metrics, "prefill_e2e_time") if have else None,
        "mean_tpot_ms": 1e3 * mean_of(metrics, "decode_time_execution_plus_preemption_normalized")
        if have else None,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
