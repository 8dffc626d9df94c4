"""Cut the test fixtures of tests/test_vllm_ingest.py out of real vLLM output.

    python bench/vllm/fixtures.py SRC [--shared ../shared/vllm-cpu] [--out tests/data/vllm]

SRC is a folder of bench/vllm/measure.py. What it writes, each a few steps or lines of the real
thing, unchanged otherwise:

- worker.pt.trace.json.gz: the worker's torch-profiler trace of a profiled sync k=2,
  concurrency-1 run (SRC's, else the shared one), every event of STEPS consecutive steps (and
  the trace's metadata events); api_server.pt.trace.json.gz, the API server's trace as it is;
- hooks/*.jsonl: bench/vllm/stepgap_hooks.py's spans of the three processes of one sync k=2
  server, over STEPS steps of a judged concurrency-4 run;
- bench.before.txt / bench.after.txt: the /metrics scrapes around one sync k=2 run (the
  lines of its spec-decode and token counters);
- bench.json: that run's `vllm bench serve --save-result --save-detailed` file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
from pathlib import Path

STEP = re.compile(r"^execute_(?:\d+_)?context_\d+\(\d+\)_generation_[1-9]\d*\(")
STEPS = 8
KEEP = re.compile(r"vllm:(spec_decode|generation_tokens|prompt_tokens)")


def trim_trace(src: Path, dest: Path, first: int = 10, steps: int = STEPS) -> tuple[float, float]:
    """Every event of `steps` decode steps from the `first`th; returns their window (epoch us)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    ev = doc["traceEvents"]
    marks = sorted((e for e in ev if e.get("ph") == "X" and STEP.match(str(e.get("name", "")))),
                   key=lambda e: e["ts"])
    t0, t1 = marks[first]["ts"], marks[first + steps]["ts"]
    doc["traceEvents"] = [e for e in ev if e.get("ph") != "X" or t0 <= e.get("ts", -1) < t1]
    dest.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    base = float(doc.get("baseTimeNanoseconds") or 0) / 1e3
    return t0 + base, t1 + base


def trim_hooks(files: list[Path], window: tuple[float, float], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        keep = [line for line in f.read_text().splitlines()
                if line and window[0] <= json.loads(line)["start_us"] < window[1]]
        (dest / f.name).write_text("\n".join(keep) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("--out", default="tests/data/vllm")
    args = ap.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    plan = json.loads((src / "plan.json").read_text())

    prof = next(p for p in plan["profiles"] if (p["mode"], p["k"], p["conc"]) == ("sync", 2, 1))
    traces = [src / t for t in prof["traces"] if t.endswith(".gz")]
    worker = next(t for t in traces if t.name.startswith("rank0."))
    trim_trace(worker, out / "worker.pt.trace.json.gz")
    for t in traces:
        if t is not worker:
            shutil.copy(t, out / "api_server.pt.trace.json.gz")

    run = next(r for r in plan["runs"] if (r["kind"], r["mode"], r["k"], r["conc"])
               == ("judged", "sync", 2, 4))
    t0, t1 = run["window_s"]
    files = sorted((src / "hooks" / "sync-k2").glob("*.jsonl"))
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines() if x]
    marks = sorted(d["start_us"] for d in lines if d["lane"] == "cpu.worker"
                   and STEP.match(str((d.get("args") or {}).get("vllm", "")))
                   and t0 * 1e6 <= d["start_us"] <= t1 * 1e6)
    trim_hooks(files, (marks[20], marks[20 + STEPS]), out / "hooks")

    for side in ("before", "after"):   # the spec-decode and token counters' lines
        text = (src / "metrics" / f"{run['name']}.{side}.txt").read_text().splitlines()
        keep = [x for x in text if KEEP.search(x)]
        (out / f"bench.{side}.txt").write_text("\n".join(keep) + "\n")
    shutil.copy(src / "results" / f"{run['name']}.json", out / "bench.json")
    print(f"fixtures: {out} ({sum(f.stat().st_size for f in out.rglob('*') if f.is_file())} "
          "bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
