"""Run a benchmark or a command and keep what it printed as a dated report in docs/reports/.

    python bench/report.py NAME [--title TEXT] -- COMMAND [ARG ...]

runs COMMAND (a bench script is run with this Python: `bench/x.py ...`; anything else as it is,
`stepgap advise ...` with the checkout's stepgap), and writes docs/reports/DATE-NAME.md: the
title, the command as given, the date, the commit and whether the tree had changes, the machine
(its CPUs and load average), the wall time and what the command printed, whole. Run again, it
refreshes the day's report; the README and the docs link a report, they do not paste it.

Examples:
    python bench/report.py advise-h100 --title "advise: Llama-3.1-8B + EAGLE-3 on one H100" -- \\
        stepgap advise --model llama-3.1-8b --gpu h100 --async-scheduling --speculative-config \\
        '{"method": "eagle3", "model": "llama-3.1-8b-eagle3", "num_speculative_tokens": 3}' \\
        --max-concurrency 1 2 4 8 16 32
    python bench/report.py seed-calibration -- bench/seed_calibration.py
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "docs" / "reports"


def command_line(argv: list[str]) -> list[str]:
    """What runs: a .py file with this Python, `stepgap` as this checkout's, the rest as is."""
    if argv[0].endswith(".py"):
        return [sys.executable, *argv]
    if argv[0] == "stepgap":
        return [sys.executable, "-m", "stepgap", *argv[1:]]
    return argv


def git(*args: str) -> str:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def report(name: str, title: str, argv: list[str], output: str, seconds: float,
           status: int, day: datetime.date) -> str:
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") \
        else ""
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return "\n".join([
        f"# Report: {title}", "",
        f"Written by `python bench/report.py {name} -- {shlex.join(argv)}` on {day.isoformat()}, "
        f"at commit {git('rev-parse', '--short', 'HEAD')}{dirty}; {os.cpu_count()} CPUs, load "
        f"average {load} when it ended; {seconds:.1f} s of wall time"
        + (f"; exit status {status}" if status else "") + ".", "",
        "```", f"$ {shlex.join(argv)}", output.rstrip(), "```", ""])


def main(argv: list[str]) -> int:
    if not argv:   # `make bench` runs every script bare: this one has nothing of its own
        print("bench/report.py: nothing to run (usage: the module's docstring)")
        return 0
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", help="the report's name: docs/reports/DATE-NAME.md")
    ap.add_argument("--title", help="its title (default: the name)")
    args = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", args.name):
        print("report: give NAME (lower case, digits, -) and a command after --", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    r = subprocess.run(command_line(command), cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    day = datetime.date.today()
    out = REPORTS / f"{day.isoformat()}-{args.name}.md"
    out.write_text(report(args.name, args.title or args.name, command, r.stdout + r.stderr,
                          seconds, r.returncode, day))
    print(f"report: {out.relative_to(ROOT)}", file=sys.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
