"""`stepgap validate`: the engine and the simulator on the same traces, cell by cell.

For every cell of the grid (mode x k x max-concurrency) the engine runs the judged trace (the
trained pair's held-out prompts, real acceptance), and the simulator runs the same trace with
the engine's recorded accepted counts, the same scheduler limits and the engine's topology
(`executor=process`, `device=cpu`), on costs calibrated from *other* runs: a microbenchmark
grid of the device ops and calibration runs on prompts from the corpus's training files. One
profile serves every cell; it is never refit per cell. calibrate/harness.py runs the plan,
calibrate/measured.py writes the folder, calibrate/report.py judges it and writes the report.

Output folder: report.md (errors per cell, the savings, the known misses, the machine and
commands), tpot.png, timeline.png, profile.json, manifest.json, the judged runs (runs/), the
simulated results (simulated/), trimmed timelines (timelines/), the traces and the models'
config.json: what traces/measured/<device>/ commits and tests/test_fidelity.py re-judges.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from stepgap.common.errors import UserError
from stepgap.common.formats import MODES
from stepgap.common.options import MAX_K, add_command, add_option, at_most, positive_int

# Past these a plan is a typo, not a measurement: it would run for days (every repeat runs every
# cell) or cut prompts until the memory is gone. Checked as the options are parsed, before
# anything is built (other commands cap k the same way, common/options.py).
MAX_REPEATS = 1000
MAX_CALIBRATION_PROMPTS = 10_000   # about 3 s to cut from the corpus

DESCRIPTION = (
    "Calibrate the simulator on this machine (or take --profile), run the engine over a grid of "
    "modes x k x max-concurrency on the judged trace, re-simulate every run with the engine's "
    "accepted counts, and write a report of the errors (report.md, tpot.png, timeline.png).")

EPILOG = """\
grid:
  --modes, --ks and --concurrency give the grid's axes (default: the three modes x k 0,2,4 x
  max-concurrency 1,4: 18 cells). Every cell runs --repeats times (default 18), each run on the
  next --slice prompts of the judged trace (default 8, so the 48 held-out prompts three times
  over), and its runs are pooled as one benchmark. Runs of one (k, concurrency) run their modes
  back to back, in each of their six orders in turn, and the groups rotate, so that the
  machine's drift hits every cell alike.

examples:
  stepgap validate --out out/validate                   # the default grid, about 10-12 min
  stepgap validate --ks 2 --concurrency 1 --repeats 2 --slice 4 --out /tmp/v
  stepgap validate --profile traces/measured/cpu/profile.json --out /tmp/v   # no calibration
  stepgap validate --from-measured traces/measured/cpu --out /tmp/again      # re-simulate only

The judged trace (default: the pair's held-out prompts) and the calibration trace (default:
prompts cut from the corpus's training files) must differ. Keep the machine otherwise idle:
the report records the load average. A new folder's known misses go into its
known_misses.toml by hand (docs/explanation/validation.md). The method and the results:
docs/explanation/validation.md.
"""


def add_grid_args(p, what: str) -> None:
    from stepgap.calibrate.pair import PAIR
    g = p.add_argument_group("engine and grid")
    g.add_argument("--pair", default=str(PAIR), metavar="DIR",
                   help="folder with target/, eagle3/ and heldout.jsonl (default: the committed "
                        "trained pair checkpoints/pystdlib)")
    g.add_argument("--no-pin", dest="pin", action="store_false",
                   help="do not pin the engine to one CPU and the worker to another")
    g.add_argument("--modes", default=",".join(MODES), metavar="LIST",
                   help=f"scheduling modes {what} (default: all three)")
    g.add_argument("--ks", default="0,2,4", metavar="LIST",
                   help=f"speculation depths k {what} (default 0,2,4)")
    g.add_argument("--concurrency", default="1,4", metavar="LIST",
                   help=f"max-concurrency values {what} (default 1,4)")


def add_calibration_args(g, prompts: int, per_run: int, per_run_note: str = "") -> None:
    """The calibration runs' trace, prompts in all and prompts per run (profile, validate)."""
    g.add_argument("--calibration-trace", default=None, metavar="FILE",
                   help="calibration trace (default: cut from the corpus's training files)")
    g.add_argument("--calibration-prompts", type=at_most(positive_int, MAX_CALIBRATION_PROMPTS),
                   default=prompts, metavar="N", help=f"calibration prompts in all (default "
                                                      f"{prompts}, at most "
                                                      f"{MAX_CALIBRATION_PROMPTS})")
    g.add_argument("--calibration-slice", type=positive_int, default=per_run, metavar="N",
                   help=f"calibration prompts per run (default {per_run}){per_run_note}")


def int_list(text: str, name: str, lo: int = 0, hi: int | None = None) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{name}: expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < lo or hi is not None and v > hi for v in vals):
        span = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise UserError(f"{name}: expected integers {span}, got {text!r}")
    return sorted(set(vals), key=vals.index)


def grid_lists(args) -> tuple[list[str], list[int], list[int]]:
    """--modes, --ks (0 to MAX_K, as every k) and --concurrency, checked before any work."""
    return (mode_list(args.modes), int_list(args.ks, "--ks", 0, MAX_K),
            int_list(args.concurrency, "--concurrency", 1))


def mode_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise UserError(f"--modes: expected some of {', '.join(MODES)}, got {text!r}")
    return modes


def shown(path: Path) -> str:
    """A path as the report shows it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def pair_engine(pair, pin: bool = True):
    """The engine of the CPU validation: the pair, float32, the process executor."""
    from stepgap.calibrate.pair import pair_paths
    from stepgap.engine.args import EngineArgs
    paths = pair_paths(pair)
    return EngineArgs(model=paths["target"], draft=paths["eagle3"], executor="process",
                      pin=pin, device="cpu", dtype="float32")


def plan_from_args(args, judged: bool = True):
    """The CPU plan of `stepgap validate` and `stepgap profile`."""
    from stepgap.calibrate.harness import Plan
    from stepgap.calibrate.pair import calibration_trace, load_heldout, pair_paths
    from stepgap.common.formats import load_trace
    modes, ks, concs = grid_lists(args)
    pair_paths(args.pair)   # names what is missing
    profile = None
    if getattr(args, "profile", None):
        from stepgap.sim.profile import load_profile
        profile = load_profile(args.profile)   # names what is wrong with it, before any work
    calibration = cname = None
    if profile is None:
        n = args.calibration_prompts
        if n < 1:
            raise UserError(f"--calibration-prompts must be >= 1, got {n}")
        if args.calibration_trace:
            calibration, cname = load_trace(args.calibration_trace)[:n], args.calibration_trace
        else:
            calibration = calibration_trace(args.pair, n)
            cname = f"{n} prompts cut from the corpus's training files (seed 1)"
    trace, jname = None, ""
    if judged:
        if args.trace:
            trace, jname = load_trace(args.trace), shown(Path(args.trace))
        else:
            trace, jname = load_heldout(args.pair), shown(Path(args.pair) / "heldout.jsonl")
        if args.num_prompts:
            trace = trace[:args.num_prompts]
    from stepgap.calibrate.fit import GridShape
    grid = None if getattr(args, "no_grid", False) or profile is not None else GridShape()
    return Plan(pair_engine(args.pair, args.pin), modes, ks, concs,
                trace, calibration, profile, getattr(args, "repeats", 3),
                getattr(args, "slice", 8), getattr(args, "calibration_slice", 8), grid,
                judged_name=jname, calibration_name=cname or "", device_name="cpu")


def register(sub) -> None:
    p = add_command(sub, "validate", description=DESCRIPTION, epilog=EPILOG,
                    help="run the engine and the simulator on the same traces, cell by cell")
    add_grid_args(p, "of the grid")
    g = p.add_argument_group("traces and repeats")
    g.add_argument("--trace", default=None, metavar="FILE",
                   help="judged trace (default: the pair's heldout.jsonl)")
    add_option(g, "num_prompts", metavar="N",
               help="the first N requests of the judged trace (default: all, 48)")
    g.add_argument("--repeats", type=at_most(positive_int, MAX_REPEATS), default=18,
                   metavar="R", help="runs of every cell, interleaved and pooled (default 18, "
                                     f"at most {MAX_REPEATS})")
    g.add_argument("--slice", type=positive_int, default=8, metavar="N",
                   help="judged prompts per run: run r takes the r-th N of the trace, "
                        "wrapping (default 8)")
    add_calibration_args(g, 48, 8, "; every (k, concurrency) group runs one calibration run "
                                   "per repeat, before its judged runs")
    g.add_argument("--profile", default=None, metavar="PROFILE.json",
                   help="use this profile instead of calibrating (no grid, no calibration runs)")
    g.add_argument("--no-grid", action="store_true",
                   help="skip the microbenchmark grid (the calibration runs still run)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="out/validate", metavar="DIR",
                   help="report folder (default out/validate)")
    o.add_argument("--from-measured", default=None, metavar="DIR",
                   help="run no engine: re-simulate a measured folder (a report folder of this "
                        "command or of validate-gpu, traces/measured/<device>/) and write the "
                        "report into --out")
    o.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.set_defaults(func=cmd_validate)


def command_line(name: str) -> str:
    return f"stepgap {name} " + " ".join(sys.argv[2:]) if sys.argv[1:2] == [name] \
        else f"stepgap {name}"


def cmd_validate(args) -> int:
    from stepgap.calibrate.harness import run_plan
    from stepgap.calibrate.judge import MISSES_FILE, SYNC_ONLY_MISSES, load_known_misses
    from stepgap.calibrate.measured import load_measured, write_measured
    from stepgap.calibrate.report import write_report
    from stepgap.common.fileio import check_writable
    out = Path(args.out)
    command = command_line("validate")
    check_writable(out, "--out", folder=True)
    if args.from_measured:
        src = Path(args.from_measured)
        if not src.is_dir():
            raise UserError(f"--from-measured {src}: not a folder")
        load_measured(src)   # what is wrong with the folder is named there, before a copy
        for name in (MISSES_FILE, SYNC_ONLY_MISSES):   # and its known misses, as the user
            load_known_misses(src, name=name)           # wrote them (not the --out copy)
        if src.resolve() != out.resolve():
            copy_measured(src, out)
        write_report(out, command, args.quiet)
        return 0
    plan = plan_from_args(args, judged=True)
    if not args.quiet:
        print(f"stepgap validate: {len(plan.modes) * len(plan.ks) * len(plan.concs)} cells x "
              f"{plan.repeats} runs of {min(plan.slice, len(plan.judged))} prompts; calibration: "
              f"{plan.calibration_name or args.profile}; load average "
              f"{os.getloadavg()[0]:.2f}", file=sys.stderr)
    m = run_plan(plan, progress=not args.quiet)
    write_measured(plan, m, out, command,
                   extra={"title": "The trained pair on the CPU (process worker)"})
    write_report(out, command, args.quiet)
    return 0


def copy_measured(src: Path, out: Path) -> None:
    """Start a report folder from a measured one (its inputs only)."""
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in ("report.md", "tpot.png", "timeline.png", "simulated"):
            continue
        dst = out / item.name
        if item.is_dir():
            shutil.copytree(item, dst, dirs_exist_ok=True)
        else:
            shutil.copy(item, dst)
