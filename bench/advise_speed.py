"""How fast `stepgap advise` answers the default question, and the simulator against another
checkout on the same work: a benchmark for one quiet machine, not a test.

Each measurement runs in a fresh child process, importing stepgap from the checkout it times
(a folder of links, so that a checkout that is not installed is timed as it is); the rounds
alternate the checkouts, so that the machine's drift falls on both:

- `advise`: the default question, as a user types it (Llama-3.1-8B + EAGLE-3 on one H100,
  k 0-8, sync, async and zero-bubble, concurrency 1, 2, 4, 8, 16 and 32, with bands, --jobs 2):
  the wall time of `python -m stepgap advise ...`, imports included, and the CPU time of it
  and its processes, in each checkout (a baseline before ca876d4 has no advise: it fails);
- `cells`: every simulation that answer runs, simulated by each checkout in turn over two
  processes (the sweep machinery's local runner): wall time and the children's CPU time; their
  ratio is the simulator's speed on this question;
- `sharegpt-h100`: the preset's 10,000 ShareGPT-like requests at concurrency 64 (k 4, async,
  H100): CPU time of Run.run, each checkout;
- `startup`: `python -m stepgap --help` and `stepgap simulate --preset seed-l20` as a user
  types them: wall and CPU time of the whole process, each checkout.

Over the whole benchmark it also says what every other process of the machine used meanwhile
(/proc/stat's busy time less this benchmark's own processes'), and the hypervisor's steal: a
measurement is only worth its quiet.

Usage (the baseline: main before the replay of recorded steps, 4a6030b):
    mkdir -p /tmp/base && git archive 4a6030b | tar -x -C /tmp/base
    python bench/advise_speed.py --baseline /tmp/base --rounds 3
    python bench/advise_speed.py --rounds 1            # this checkout alone
    python bench/advise_speed.py --baseline /tmp/base --rounds 5 --parts startup,share
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "sim", "engine", "training", "calibrate")
QUESTION = ["advise", "--model", "llama-3.1-8b", "--gpu", "h100", "--speculative-config",
            '{"method": "eagle3", "model": "llama-3.1-8b-eagle3", "num_speculative_tokens": 3}',
            "--max-concurrency", "1", "2", "4", "8", "16", "32", "--jobs", "2", "--quiet"]


def shim(root: Path, into: Path) -> Path:
    """A folder whose `stepgap` package is the checkout at `root` (links to its folders), put
    first on PYTHONPATH: the checkout's code whatever the venv installed."""
    pkg = into / "stepgap"
    pkg.mkdir(parents=True)
    for f in (root / "stepgap").glob("*.py"):
        if f.name == "__init__.py":   # a copy without the one-checkout guard (stepgap/
            # __init__.py): loading a checkout this venv did not install is the point here
            text = f.read_text().replace("\none_checkout()\n", "\n")
            (pkg / f.name).write_text(text)
        else:
            (pkg / f.name).symlink_to(f)
    for name in PACKAGES:
        (pkg / name).symlink_to(root / name)
    return into


def child(path: Path, *args: str) -> dict:
    """Run this script as a child with stepgap from `path` (a shim); its last JSON line."""
    env = {**os.environ, "PYTHONPATH": str(path)}
    r = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                       text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"child {args[0]} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- the children ------------------------------------------------------------------------------


def child_advise(out: str) -> None:
    """The default question through the command line, in this process; its wall time and the
    settings of every simulation it ran (written to `out`)."""
    import resource

    t0 = time.perf_counter()
    from stepgap.cli import main
    from stepgap.sim import advise as mod
    captured = {}
    real = mod.advise

    def keep(*a, **kw):   # the same call, its cells kept for the `cells` measurement
        captured["advice"] = real(*a, **kw)
        return captured["advice"]
    mod.advise = keep
    rc = main(QUESTION)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(json.dumps(captured["advice"].cells))
    print(json.dumps({"rc": rc, "wall_s": wall, "sims": captured["advice"].sims,
                      "cpu_s": ru.ru_utime + ru.ru_stime + me.ru_utime + me.ru_stime}))


def child_cells(path: str) -> None:
    """Simulate every cell of `path` over two processes."""
    import resource

    from stepgap.sim.sweep_runners import run_local
    cells = json.loads(Path(path).read_text())
    t0 = time.perf_counter()
    n = sum(1 for _ in run_local(cells, 2))
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"cells": n, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime}))


def child_share(num_prompts: str | None = None) -> None:
    """The sharegpt-h100 preset's run (at `num_prompts` requests where given): the CPU time of
    Run.run."""
    from stepgap.sim import loop
    from stepgap.sim.config import SimConfig
    from stepgap.sim.presets import get_preset
    settings = dict(get_preset("sharegpt-h100").settings)
    if num_prompts:
        settings["num_prompts"] = int(num_prompts)
    cfg = SimConfig(**settings)
    run = getattr(loop, "Run", None) or loop.Sim   # (a checkout before 53's split: Sim)
    sim = run(cfg, loop.build_workload(cfg))
    c0 = time.process_time()
    sim.run()
    steps = sim.num_steps
    print(json.dumps({"steps": steps, "cpu_s": time.process_time() - c0}))


# -- the parent --------------------------------------------------------------------------------


def startup(path: Path, out: Path) -> dict:
    """Each start-up command once, as a user types it, with stepgap from `path`: wall and CPU
    seconds of its process."""
    import resource
    env = {**os.environ, "PYTHONPATH": str(path)}
    row = {}
    for name, argv in (("help", ["--help"]),
                       ("seed", ["simulate", "--preset", "seed-l20", "--quiet",
                                 "--result-json", str(out / "seed.json")])):
        ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        # (not from ROOT: `python -m` puts the working folder first on the path, before
        # PYTHONPATH, and would import this checkout's stepgap whatever `path` says)
        subprocess.run([sys.executable, "-m", "stepgap", *argv], env=env, cwd=out, check=True,
                       stdout=subprocess.DEVNULL)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        row[f"{name}_wall_s"] = time.perf_counter() - t0
        row[f"{name}_cpu_s"] = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
    return row


def own_cpu_s() -> float:
    import resource
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("--child-"):
        which, rest = sys.argv[1], sys.argv[2:]
        {"--child-advise": child_advise, "--child-cells": child_cells,
         "--child-share": child_share}[which](*rest)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                    help="another checkout (e.g. git archive f9c02e3), timed in the same rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", default="advise,share,startup",
                    help="what to time, of advise (with its cells), share, startup (default all)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    from shared_core import busy_seconds
    (busy0, steal0), own0, t_start = busy_seconds(), own_cpu_s(), time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="advise-speed-"))
    this = shim(ROOT, tmp / "this")
    base = shim(args.baseline.resolve(), tmp / "base") if args.baseline else None
    cells = tmp / "cells.json"
    rows = {k: [] for k in ("advise", "advise_base", "cells", "cells_base", "share",
                            "share_base", "startup", "startup_base")}
    for r in range(args.rounds):
        order = [("this", this), ("base", base)] if r % 2 == 0 else [("base", base),
                                                                   ("this", this)]
        for who, path in order:
            if path is None:
                continue
            suffix = "" if who == "this" else "_base"
            if "advise" in parts:
                a = child(path, "--child-advise",
                          str(cells if who == "this" else tmp / "base.json"))
                rows["advise" + suffix].append(a)
                print(f"round {r + 1}: {who}: advise {a['wall_s']:.2f} s wall ({a['sims']} "
                      f"simulations, {a['cpu_s']:.1f} s CPU)", flush=True)
                c = child(path, "--child-cells", str(cells))
                rows["cells" + suffix].append(c)
                print(f"round {r + 1}: {who}: the question's {c['cells']} cells "
                      f"{c['wall_s']:.2f} s wall, {c['cpu_s']:.1f} s CPU", flush=True)
            if "share" in parts:
                s = child(path, "--child-share")
                rows["share" + suffix].append(s)
                print(f"round {r + 1}: {who}: sharegpt-h100 {s['cpu_s']:.2f} s CPU "
                      f"({s['steps']} steps)", flush=True)
            if "startup" in parts:
                u = startup(path, tmp)
                rows["startup" + suffix].append(u)
                print(f"round {r + 1}: {who}: --help {u['help_wall_s']:.2f} s wall "
                      f"({u['help_cpu_s']:.2f} s CPU), simulate --preset seed-l20 "
                      f"{u['seed_wall_s']:.2f} s wall ({u['seed_cpu_s']:.2f} s CPU)", flush=True)
    med = lambda key, f: statistics.median(x[f] for x in rows[key])  # noqa: E731
    (busy1, steal1), own1 = busy_seconds(), own_cpu_s()
    other = (busy1 - busy0) - (own1 - own0)
    print(f"\nmedians of {args.rounds} rounds; over its {time.perf_counter() - t_start:.0f} s "
          f"the benchmark's processes used {own1 - own0:.1f} s CPU, every other process "
          f"{other:.1f} s, steal {steal1 - steal0:.1f} s:")
    if "advise" in parts:
        print(f"  advise, the default question: {med('advise', 'wall_s'):.2f} s wall")
        print(f"  its cells, this checkout: {med('cells', 'wall_s'):.2f} s wall, "
              f"{med('cells', 'cpu_s'):.1f} s CPU")
    if "share" in parts:
        print(f"  sharegpt-h100, this checkout: {med('share', 'cpu_s'):.2f} s CPU")
    if "startup" in parts:
        print(f"  --help, this checkout: {med('startup', 'help_wall_s'):.2f} s wall; "
              f"simulate --preset seed-l20: {med('startup', 'seed_wall_s'):.2f} s wall")
    if base is not None:
        for key, f in (("advise", "wall_s"), ("advise", "cpu_s"), ("cells", "wall_s"),
                       ("cells", "cpu_s"), ("share", "cpu_s"), ("startup", "help_wall_s"),
                       ("startup", "help_cpu_s"), ("startup", "seed_wall_s"),
                       ("startup", "seed_cpu_s")):
            if not rows[key]:
                continue
            ratios = [b[f] / t[f] for t, b in zip(rows[key], rows[key + "_base"])]
            print(f"  {key} {f}: baseline / this = {statistics.median(ratios):.2f}x "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
