"""`stepgap profile`: measure what every step costs on this machine, for the simulator.

Two sources, one JSON profile (the format is `sim/profile.py`'s; calibrate/fit.py fits it):

1. A microbenchmark grid of the device ops, run through the worker's own execute/collect on
   crafted steps: target forward over token counts x batch sizes x context lengths, with the
   draft's first and one-token passes, rejection sampling and the D2H copy that every step runs.
2. Calibration runs of the engine (the `process` executor, pinned) on a calibration trace cut
   from the corpus's *training* files, never from the judged held-out prompts. Their timelines
   give the device ops in situ and every CPU term the simulator uses (`sim/costs.py` CpuCosts):
   schedule, update_from_output, prepare_inputs and launch as a + b·reqs + c·tokens, the IPC
   latency of a step's message, and the worker's result latency and turnaround.

Device op fits come from the calibration runs (the engine's real steps, with the other process
running, which is what is being predicted), steadied by the grid: its points join the fit at
the in-situ level, so that shapes the calibration runs rarely take (two or three requests, long
prefills next to decodes) follow the grid's slopes (`fit_shaped`). How far the grid alone sits
from the in-situ times is kept in the profile's `checks` (docs/validation.md has the numbers).

How a step is cut into terms, from its spans (DESIGN.md §2 lanes and ops):

    engine:  ...update N-1 | loop | schedule N |                                 | update N ...
    worker:                               | prepare N | launch N .............| turnaround |
    device:                                           | head | op | op | ... op |

- `launch` (on the CPU) = prepare_inputs' end to the first device op: packing and copying the
  inputs, the attention metadata;
- a device op's cost runs from the end of the previous device op of its step (the Python
  between two ops belongs to issuing the next), the first op's from its own start;
- `ipc_us` = from update N-1's end to prepare N's start, less schedule N (sync runs): the
  message's trip plus the engine loop's own turn, which has no op of its own;
- `result_latency` = the last device op's end to update N's start, when the engine was waiting;
- `worker_turnaround` = the last device op's end to prepare N+1's start, when N+1's message was
  already waiting (async runs): collecting and sending N's result, receiving N+1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from calibrate.validate import add_grid_args, plan_from_args
from common.options import positive_int

EPILOG = """\
examples:
  stepgap profile --out out/profile.json                 # the trained pair, k 0,2,4
  stepgap profile --ks 2 --concurrency 1 --calibration-prompts 8 --out /tmp/p.json
  stepgap simulate --profile out/profile.json --device cpu --executor process ...

The calibration trace is cut from the corpus's training files (docs/validation.md); the
held-out prompts that `stepgap validate` judges on are never used here. A run takes about
1-3 minutes on 2 cores. Keep the machine otherwise idle: this measures time.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "profile", help="measure device op and CPU costs on this machine, for the simulator",
        description="Measure the engine's device op costs (a microbenchmark grid and in-situ "
                    "calibration runs) and its CPU costs (fitted from the calibration runs' "
                    "timelines) on this machine, and write them as a profile JSON for "
                    "`stepgap simulate --profile`.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_args(p, "to calibrate on")
    g = p.add_argument_group("calibration")
    g.add_argument("--calibration-trace", default=None, metavar="FILE",
                   help="trace to calibrate on (default: cut from the corpus's training files)")
    g.add_argument("--calibration-prompts", type=positive_int, default=16, metavar="N",
                   help="calibration prompts (default 16)")
    g.add_argument("--calibration-slice", type=positive_int, default=16, metavar="N",
                   help="prompts per calibration run (default 16)")
    g.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="calibration runs of every cell (default 1)")
    g.add_argument("--no-grid", action="store_true", help="skip the microbenchmark grid")
    g.add_argument("--out", default="out/profile.json", metavar="PATH",
                   help="where to write the profile (default out/profile.json)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    from calibrate.harness import run_plan
    from common.fileio import check_writable, write_text
    check_writable(args.out, "--out")
    plan = plan_from_args(args, judged=False)
    out = run_plan(plan, progress=not args.quiet)
    path = Path(args.out)
    write_text(path, json.dumps(out.profile, indent=1) + "\n")
    print(f"profile: {path} ({len(out.profile['device_ops'])} device op fits, CPU terms "
          f"{', '.join(k for k in out.profile['cpu'])}); {out.wall_s:.0f} s", file=sys.stderr)
    return 0
