"""`stepgap profile`: measure what every step costs on this machine, for the simulator.

It runs a microbenchmark grid of the device ops and calibration runs of the engine on prompts
cut from the corpus's training files (calibrate/harness.py), and writes the profile that
calibrate/fit.py fits from them (the format is `sim/profile.py`'s; fit.py's docstring says how a
step is cut into terms).
"""

from __future__ import annotations

import sys
from pathlib import Path

from stepgap.calibrate.validate import (MAX_REPEATS, add_calibration_args, add_grid_args,
                                       plan_from_args)
from stepgap.common.options import add_command, at_most, positive_int

DESCRIPTION = (
    "Measure the engine's device op costs (a microbenchmark grid and in-situ calibration runs) "
    "and its CPU costs (fitted from the calibration runs' timelines) on this machine, and write "
    "them as a profile JSON for `stepgap simulate --profile`.")

EPILOG = """\
examples:
  stepgap profile --out out/profile.json                 # the trained pair, k 0,2,4
  stepgap profile --ks 2 --concurrency 1 --calibration-prompts 8 --out /tmp/p.json
  stepgap simulate --profile out/profile.json --device cpu --executor process ...

The calibration trace is cut from the corpus's training files (docs/explanation/validation.md); the
held-out prompts that `stepgap validate` judges on are never used here. A run takes about
1-3 minutes on 2 cores. Keep the machine otherwise idle: this measures time.
"""


def register(sub) -> None:
    p = add_command(sub, "profile", description=DESCRIPTION, epilog=EPILOG,
                    help="measure device op and CPU costs on this machine, for the simulator")
    add_grid_args(p, "to calibrate on")
    g = p.add_argument_group("calibration")
    add_calibration_args(g, 16, 16)
    g.add_argument("--repeats", type=at_most(positive_int, MAX_REPEATS), default=1, metavar="R",
                   help=f"calibration runs of every cell (default 1, at most {MAX_REPEATS})")
    g.add_argument("--no-grid", action="store_true", help="skip the microbenchmark grid")
    g.add_argument("--out", default="out/profile.json", metavar="PATH",
                   help="where to write the profile (default out/profile.json)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    from stepgap.calibrate.harness import run_plan
    from stepgap.common.fileio import check_writable
    from stepgap.sim.profile import save_profile
    check_writable(args.out, "--out")
    plan = plan_from_args(args, judged=False)
    out = run_plan(plan, progress=not args.quiet)
    path = Path(args.out)
    save_profile(path, out.profile)
    print(f"profile: {path} ({len(out.profile.fits)} device op fits, CPU terms "
          f"{', '.join(k for k in out.profile.cpu.terms)}); {out.wall_s:.0f} s", file=sys.stderr)
    return 0
