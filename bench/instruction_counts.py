"""The work of start-up and of the simulator counted in instructions (valgrind's callgrind), this
checkout against another: counts the machine's drift does not move, where wall and CPU times on
a shared VM drift by more than a change (docs/reports/2026-12-07-architecture.md).

- `help`, `seed`: `python -m stepgap --help` and `simulate --preset seed-l20`, as a user types
  them, the whole process;
- `shareN`: the sharegpt-h100 preset's run at N requests (bench/advise_speed.py --child-share N),
  the whole process; the difference of two sizes is the simulation of their difference in
  requests, imports and set-up cancelled.

Both checkouts are compiled first (`python -m compileall`, as `make install` does), and run with
PYTHONHASHSEED=0. One count takes about 50 times the command's own time.

Usage:
    git worktree add /tmp/base aabf849
    python bench/instruction_counts.py --baseline /tmp/base --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from advise_speed import PACKAGES, ROOT, shim

SIZES = (300, 1300)


def count(argv: list[str], path: Path) -> int:
    """Instructions of one process (callgrind's `Collected`), stepgap from `path` (run from
    `path`'s parent: `python -m` puts the working folder first on the path, before
    PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(path), "PYTHONHASHSEED": "0"}
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                        sys.executable, *argv], env=env, cwd=path.parent, capture_output=True,
                       text=True)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode or m is None:
        raise SystemExit(f"{' '.join(argv)} failed:\n{r.stderr[-2000:]}")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, metavar="CHECKOUT")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="instructions-"))
    for root in (ROOT, args.baseline.resolve()):
        subprocess.run([sys.executable, "-m", "compileall", "-q", "stepgap", *PACKAGES],
                       cwd=root, check=True, stdout=subprocess.DEVNULL)
    trees = {"this": shim(ROOT, tmp / "this"), "base": shim(args.baseline.resolve(), tmp / "base")}
    what = {"help": ["-m", "stepgap", "--help"],
            "seed": ["-m", "stepgap", "simulate", "--preset", "seed-l20", "--quiet",
                     "--result-json", str(tmp / "seed.json")],
            **{f"share{n}": [str(Path(__file__).with_name("advise_speed.py")), "--child-share",
                             str(n)] for n in SIZES}}
    rows = {(who, key): [] for who in trees for key in what}
    for r in range(args.rounds):
        for who in (("base", "this") if r % 2 == 0 else ("this", "base")):
            for key, argv in what.items():
                rows[who, key].append(count(argv, trees[who]))
                print(f"round {r + 1}: {who} {key}: {rows[who, key][-1]:,}", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    for who in trees:
        med[who, "run"] = med[who, f"share{SIZES[1]}"] - med[who, f"share{SIZES[0]}"]
    print(f"\nmedians of {args.rounds} rounds, this / baseline:")
    for key in (*what, "run"):
        label = f"the {SIZES[1] - SIZES[0]} requests between" if key == "run" else key
        print(f"  {label}: {med['base', key]:,.0f} -> {med['this', key]:,.0f} "
              f"({med['this', key] / med['base', key]:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
