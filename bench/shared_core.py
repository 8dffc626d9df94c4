"""The engine on a shared machine: `stepgap run` alone, and beside one busy process.

    python bench/shared_core.py [--repeats 3] [--executor inline] [--model DIR] [-- options]

Runs the trained pair (16 held-out prompts, k=3, async; the inline executor unless told) with
no other load, then beside `python -c "while True: pass"` pinned to the first CPU and unpinned,
and prints per run: the benchmark's duration (the result's `duration`), the wall time of the
whole command, the engine's CPU time (user + system, its process and children), the busy
process's CPU time, what every other process on the machine used meanwhile (/proc/stat's busy
time less those two) and the hypervisor's steal time, so that a run disturbed by a third party
shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stepgap.common.cpu_load import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "checkpoints" / "pystdlib"
TICK = os.sysconf("SC_CLK_TCK")


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds every process of this machine has used, seconds the hypervisor gave its
    CPUs to others: steal), from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / TICK, f[7] / TICK




def run_once(argv: list[str], hog: str | None) -> dict:
    """One `stepgap run`, beside a busy process (`hog`: None, "pinned" to CPU 0, "free")."""
    out = Path(tempfile.mkdtemp(prefix="shared-core-")) / "r.json"
    pre = ["taskset", "-c", "0"] if hog == "pinned" else []
    spinner = subprocess.Popen(pre + [sys.executable, "-c", "while True: pass"]) if hog else None
    time.sleep(0.5 if hog else 0.0)
    try:
        spin0 = cpu_seconds(spinner.pid) if spinner else 0.0
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        (busy0, steal0), t0 = busy_seconds(), time.perf_counter()
        subprocess.run([sys.executable, "-m", "stepgap", "run", *argv, "--quiet",
                        "--result-json", str(out)], check=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        busy, steal = (b - a for a, b in zip((busy0, steal0), busy_seconds()))
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        spin = cpu_seconds(spinner.pid) - spin0 if spinner else 0.0
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()
    engine = (ru.ru_utime - ru0.ru_utime) + (ru.ru_stime - ru0.ru_stime)
    res = json.loads(out.read_text())
    return {"hog": hog or "none", "duration_s": res["duration"], "wall_s": wall,
            "engine_cpu_s": engine, "hog_cpu_s": spin,
            "others_cpu_s": max(0.0, busy - engine - spin), "steal_s": steal,
            "mean_tpot_ms": res["mean_tpot_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--executor", default="inline")
    ap.add_argument("--model", help="a Llama folder with random weights instead of the pair "
                                    "(k=0, 8 MT-bench-like prompts of 32 tokens out)")
    ap.add_argument("extra", nargs="*", help="more `stepgap run` options (after --)")
    args = ap.parse_args()
    model = ["--model", str(PAIR / "target"), "--draft", str(PAIR / "eagle3"), "-k", "3",
             "--trace", str(PAIR / "heldout.jsonl"), "--num-prompts", "16"] if not args.model \
        else ["--model", args.model, "--random-weights", "--num-prompts", "8", "--output-len",
              "32", "--max-concurrency", "4"]
    argv = [*model, "--mode", "async", "--executor", args.executor, *args.extra]
    print(f"{'beside':<8}{'duration s':>11}{'wall s':>8}{'engine CPU s':>13}{'busy CPU s':>11}"
          f"{'others CPU s':>13}{'steal s':>8}{'TPOT ms':>9}")
    for _ in range(args.repeats):
        for hog in (None, "pinned", "free"):
            r = run_once(argv, hog)
            print(f"{r['hog']:<8}{r['duration_s']:>11.2f}{r['wall_s']:>8.2f}"
                  f"{r['engine_cpu_s']:>13.2f}{r['hog_cpu_s']:>11.2f}{r['others_cpu_s']:>13.2f}"
                  f"{r['steal_s']:>8.2f}{r['mean_tpot_ms']:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
