"""The real vLLM's prefix-cache hits on the shared-prefix trace, beside stepgap's.

    make vllm
    python bench/vllm/prefix_hits.py --out traces/measured/prefix-cpu/vllm_prefix_hits.json

Starts one `vllm serve` of the trained pair (vLLM 0.32.0's CPU build, sync, no speculation,
prefix caching on, --block-size 32: its CPU attention takes no smaller), sends the shared-prefix trace
(calibrate/pair.py shared_prefix_trace: real held-out text, six prefixes of 64 tokens, the
shortest held-out prompt's length, each shared by seven prompts) one request at a time as token
ids, and reads the hit and query
counters of its /metrics (vllm:prefix_cache_hits, vllm:prefix_cache_queries) before and after.
Then runs stepgap's engine (`stepgap run`) and simulator (`stepgap simulate`) on the same trace,
one request at a time, and writes the three counts side by side. The counts depend on the order
of admission only (the cache never fills here), so they must be equal, not close.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.vllm.measure import PAIR, Server  # noqa: E402
from stepgap.calibrate.pair import shared_prefix_trace  # noqa: E402
from stepgap.common.fileio import write_json  # noqa: E402
from stepgap.common.formats import save_trace  # noqa: E402
from stepgap.common.run_result import RunResult  # noqa: E402

BLOCK_SIZE = 32   # the CPU attention backend takes multiples of 32 only
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def counters(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        for name in COUNTERS:
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def send(server: Server, reqs) -> None:
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    for r in reqs:
        body = {"model": model, "prompt": r.prompt_token_ids, "max_tokens": r.output_len,
                "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(server.url + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()


def stepgap_counts(cmd: list[str], path: Path) -> dict:
    subprocess.run([sys.executable, "-m", "stepgap", *cmd, "--result-json", str(path),
                    "--quiet"], check=True, cwd=ROOT)
    pc = RunResult.load(path).prefix_cache
    return {"queries": pc["queries"], "hits": pc["hits"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--venv", type=Path, default=ROOT / ".vllm")
    args = ap.parse_args(argv)
    reqs = shared_prefix_trace(PAIR)
    work = Path(tempfile.mkdtemp(prefix="stepgap-prefix-"))
    trace = work / "shared.jsonl"
    save_trace(trace, reqs)
    cpus = {"host": 0, "worker": 1, "client": 0, "client_rt": False}
    server = Server(args.venv, "sync", 0, 18190, work, cpus,
                    extra=["--enable-prefix-caching", "--block-size", str(BLOCK_SIZE)])
    try:
        server.wait_ready()
        before = counters(server.scrape())
        send(server, reqs)
        after = counters(server.scrape())
    finally:
        server.stop()
    vllm = {"queries": int(after[COUNTERS[0]] - before.get(COUNTERS[0], 0)),
            "hits": int(after[COUNTERS[1]] - before.get(COUNTERS[1], 0))}
    common = ["--trace", str(trace), "--max-concurrency", "1", "--mode", "sync",
              "--block-size", str(BLOCK_SIZE), "--max-model-len", "256",
              "--enable-prefix-caching"]
    engine = stepgap_counts(["run", "--model", str(PAIR / "target"), "--device", "cpu",
                             *common], work / "engine.json")
    sim = stepgap_counts(["simulate", "--model", str(PAIR / "target"), "--gpu", "cpu",
                          "--device", "cpu", *common], work / "sim.json")
    doc = {"trace": "calibrate/pair.py shared_prefix_trace(checkpoints/pystdlib): "
                    f"{len(reqs)} prompts", "block_size": BLOCK_SIZE,
           "order": "one request at a time, in trace order",
           "vllm": {"version": "0.32.0 (CPU build)", **vllm}, "engine": engine,
           "simulator": sim}
    write_json(args.out, doc)
    print(json.dumps(doc, indent=1))
    return 0 if vllm == engine == sim else 1


if __name__ == "__main__":
    raise SystemExit(main())
