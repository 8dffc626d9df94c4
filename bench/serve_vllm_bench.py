"""The real `vllm bench serve` against `stepgap serve`, next to the engine's in-process run.

For each mode (sync, async) and k (0, 4), one `stepgap serve` of the trained pair
(checkpoints/pystdlib: the process executor, engine core and worker pinned to a CPU each, float32,
greedy) is driven by vLLM's own benchmark client, unchanged:

    vllm bench serve --backend vllm --base-url http://127.0.0.1:PORT --endpoint /v1/completions
        --dataset-name custom --dataset-path heldout_text.jsonl --custom-output-len -1
        --skip-chat-template --disable-shuffle --num-prompts 48 --max-concurrency C
        --request-rate inf --temperature 0 --ignore-eos --profile --save-result --save-detailed

at max-concurrency 1 and 4. The 48 held-out prompts are the pair's own held-out trace as text
(every one re-encodes to exactly its token ids: checked here). `--profile` makes the server
record exactly the measured run (POST /start_profile ... /stop_profile), so its own run result
(the server's view: TTFT and ITL from the front end's arrival to the chunk's write) and timeline
are kept too. Right after each served run the same trace runs in process (engine/loop.py
`run_trace`, what `stepgap run` runs, with the same EngineArgs and one warm-up request, as the
benchmark's initial test request warms the server). Every request must complete; the served and
in-process runs must accept the same drafts (greedy: the same tokens).

Then: the difference the HTTP path makes to TTFT, TPOT and ITL (medians over repeats), and the
simulator's prediction of both runs, with the engine's accepted counts replayed, on a profile
of this machine measured first (`stepgap profile`, on other prompts): the in-process run with no output latency, the served one with
`--output-latency-ms L`, L being the measured TTFT difference at concurrency 1 (the path from a
step's output to the client plus the path of the client's next request to the scheduler, which
the simulator's one output latency stands for; docs/serve.md).

    python bench/serve_vllm_bench.py [--vllm-venv .vllm] [--repeats 2] [--out out/serve-bench]

`--vllm-venv` is a virtual environment with vLLM's CPU build (`make vllm` builds `.vllm`;
docs/serve.md says how); `--vllm-cli` the script that runs its CLI (bench/vllm/vllm_cli.py by
default). Run it on a quiet machine: it checks the load average first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibrate.harness import limits  # noqa: E402
from common.formats import load_result, load_trace, save_result  # noqa: E402

PAIR = ROOT / "checkpoints" / "pystdlib"
MODES = ("sync", "async")
KS = (0, 4)
CONCS = (1, 4)
METRICS = ("ttft", "tpot", "itl", "e2el")
MAX_LOAD = 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_dataset(path: Path) -> list:
    """The held-out trace as `--dataset-name custom` lines (every prompt round-trips)."""
    from calibrate.pair import write_custom_dataset
    reqs = load_trace(PAIR / "heldout.jsonl")
    write_custom_dataset(reqs, path, PAIR)
    return reqs


def engine_flags(lim: dict, mode: str, k: int) -> list[str]:
    flags = ["--model", str(PAIR / "target"), "--mode", mode, "--executor", "process",
             "--dtype", "float32", "--max-num-seqs", str(lim["max_num_seqs"]),
             "--max-model-len", str(lim["max_model_len"]),
             "--num-gpu-blocks-override", str(lim["num_blocks"]),
             "--max-num-batched-tokens", str(lim["max_num_batched_tokens"])]
    if k:
        flags += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(PAIR /
                  "eagle3"), "num_speculative_tokens": k})]
    return flags


class Server:
    def __init__(self, flags: list[str], out: Path, name: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.result, self.timeline = out / f"{name}.server.json", out / f"{name}.server.jsonl"
        self.log = open(out / f"{name}.server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepgap", "serve", *flags, "--port", str(self.port),
             "--served-model-name", "pystdlib", "--result-json", str(self.result),
             "--timeline", str(self.timeline)], cwd=ROOT, stdout=self.log,
            stderr=subprocess.STDOUT)
        import urllib.request
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"stepgap serve exited: see {self.log.name}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("stepgap serve did not start")
                time.sleep(0.3)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(20)
        self.log.close()


def vllm_bench(args, server: Server, dataset: Path, conc: int, out: Path, name: str) -> dict:
    cmd = [str(Path(args.vllm_venv) / "bin" / "python"), str(args.vllm_cli), "bench", "serve",
           "--backend", "vllm", "--base-url", server.url, "--endpoint", "/v1/completions",
           "--model", "pystdlib", "--tokenizer", str(PAIR / "target"),
           "--dataset-name", "custom", "--dataset-path", str(dataset),
           "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle",
           "--num-prompts", "48", "--max-concurrency", str(conc), "--request-rate", "inf",
           "--temperature", "0", "--ignore-eos", "--profile", "--save-result", "--save-detailed",
           "--result-dir", str(out), "--result-filename", f"{name}.vllm.json",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--disable-tqdm"]
    with open(out / f"{name}.vllm.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}).returncode
    if rc:
        raise SystemExit(f"vllm bench serve failed ({rc}): see {out / (name + '.vllm.log')}")
    return json.loads((out / f"{name}.vllm.json").read_text())


def in_process(reqs, lim: dict, mode: str, k: int, conc: int):
    """run_trace (what `stepgap run` runs) with the served engine's EngineArgs."""
    from engine.args import EngineArgs
    from engine.loop import run_trace
    ea = EngineArgs(model=str(PAIR / "target"), draft=str(PAIR / "eagle3") if k else None, k=k,
                    mode=mode, executor="process", dtype="float32",
                    num_gpu_blocks_override=lim["num_blocks"], max_num_seqs=lim["max_num_seqs"],
                    max_num_batched_tokens=lim["max_num_batched_tokens"],
                    max_model_len=lim["max_model_len"])
    cfg = ea.engine_config()
    with ea.make_executor() as ex:
        warm = replace(reqs[0], request_id="warmup", output_len=8)
        run_trace(ex, [warm], cfg, vocab_size=4096)
        return run_trace(ex, reqs, cfg, vocab_size=4096, max_concurrency=conc, detailed=True,
                         config={"mode": mode, "k": k, "executor": "process",
                                 "max_concurrency": conc, "pinned": ex.pinned},
                         percentiles=(50, 99))


def simulate(reqs, accepted: dict, lim: dict, mode: str, k: int, conc: int,
             output_latency_ms: float, profile: Path) -> dict:
    from sim.config import SimConfig
    from sim.loop import simulate as run
    cfg = SimConfig(mode=mode, k=k, gpu="cpu", model=str(PAIR / "target"),
                    draft=str(PAIR / "eagle3"), executor="process", device="cpu", replay=True,
                    profile=str(profile), max_num_seqs=lim["max_num_seqs"],
                    max_num_batched_tokens=lim["max_num_batched_tokens"],
                    max_model_len=lim["max_model_len"],
                    num_gpu_blocks_override=lim["num_blocks"], max_concurrency=conc,
                    output_latency_ms=output_latency_ms)
    result, _ = run(cfg, [replace(r, accepted=list(accepted.get(r.request_id, [])))
                          for r in reqs])
    return result


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def check_served(res: dict, reqs, name: str) -> None:
    want = sum(r.output_len for r in reqs)
    if res["completed"] != len(reqs) or res.get("failed") or \
            res["total_output_tokens"] != want:
        raise SystemExit(f"{name}: {res['completed']} of {len(reqs)} completed, "
                         f"{res['total_output_tokens']} of {want} tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-venv", default=str(ROOT / ".vllm"),
                    help="virtual environment with vLLM's CPU build (default .vllm)")
    ap.add_argument("--vllm-cli", default=str(ROOT / "bench" / "vllm" / "vllm_cli.py"),
                    help="the script that runs vLLM's CLI (default bench/vllm/vllm_cli.py)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "out" / "serve-bench"))
    ap.add_argument("--profile", default=None, metavar="PROFILE.json",
                    help="the simulator's costs (default: measure them first with `stepgap "
                         "profile`, on the corpus's training prompts, never the judged ones; "
                         "this VM's speed drifts by tens of percent over hours)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--ks", default=",".join(map(str, KS)))
    args = ap.parse_args()
    for p in (Path(args.vllm_venv) / "bin" / "python", Path(args.vllm_cli)):
        if not p.exists():   # `make bench` runs every bench: say why this one did nothing
            print(f"serve_vllm_bench: skipped: {p} is not there (`make vllm`, or --vllm-venv "
                  "and --vllm-cli)")
            return
    load = os.getloadavg()[0]
    if load > MAX_LOAD:
        print(f"serve_vllm_bench: warning: load average {load:.2f} > {MAX_LOAD}; the timings "
              "will be noisy (the summary records the load before each run)", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = Path(args.profile) if args.profile else out / "profile.json"
    if not args.profile:
        subprocess.run([sys.executable, "-m", "stepgap", "profile", "--modes", args.modes,
                        "--ks", args.ks, "--out", str(profile), "--quiet"], cwd=ROOT,
                       check=True)
    dataset = out / "heldout_text.jsonl"
    reqs = write_dataset(dataset)
    lim = limits(reqs, max(KS), max(CONCS))
    cells: dict = {}
    loads = []
    for mode in args.modes.split(","):
        for k in map(int, args.ks.split(",")):
            name = f"{mode}-k{k}"
            server = Server(engine_flags(lim, mode, k), out, name)
            try:
                for r in range(args.repeats):
                    for conc in CONCS:
                        cell = f"{name}-c{conc}"
                        run = f"{cell}-r{r}"
                        loads.append(os.getloadavg()[0])
                        served = vllm_bench(args, server, dataset, conc, out, run)
                        check_served(served, reqs, run)
                        os.replace(server.result, out / f"{run}.server.json")
                        os.replace(server.timeline, out / f"{run}.server.jsonl")
                        inproc = in_process(reqs, lim, mode, k, conc)
                        save_result(out / f"{run}.inproc.json", inproc.result)
                        if k and served["spec_decode_num_drafts"] != \
                                inproc.result["spec_decode"]["num_drafts"]:
                            raise SystemExit(f"{run}: served and in-process acceptance differ")
                        c = cells.setdefault(cell, {"served": [], "server": [], "inproc": [],
                                                    "accepted": inproc.accepted})
                        c["served"].append(served)
                        c["server"].append(load_result(out / f"{run}.server.json"))
                        c["inproc"].append(inproc.result)
                        print(f"{run}: TPOT served {served['mean_tpot_ms']:.3f} in-process "
                              f"{inproc.result['mean_tpot_ms']:.3f} ms; TTFT "
                              f"{served['mean_ttft_ms']:.2f} / "
                              f"{inproc.result['mean_ttft_ms']:.2f} ms", flush=True)
            finally:
                server.stop()
    # The HTTP path's output latency for the simulator: the TTFT it adds at concurrency 1.
    l_ms = statistics.median(med(c["served"], "mean_ttft_ms") - med(c["inproc"], "mean_ttft_ms")
                             for name, c in cells.items() if name.endswith("-c1"))
    rows = []
    for name, c in cells.items():
        mode, k, conc = name.split("-")
        k, conc = int(k[1:]), int(conc[1:])
        sim0 = simulate(reqs, c["accepted"], lim, mode, k, conc, 0.0, profile)
        sim_l = simulate(reqs, c["accepted"], lim, mode, k, conc, l_ms, profile)
        save_result(out / f"{name}.sim.json", sim0)
        save_result(out / f"{name}.sim-served.json", sim_l)
        row = {"cell": name}
        for m in METRICS:
            for key in (f"mean_{m}_ms", f"p99_{m}_ms"):
                row[key] = {"served": med(c["served"], key), "inproc": med(c["inproc"], key),
                            "server": med(c["server"], key), "sim": sim0[key],
                            "sim_served": sim_l[key]}
        rows.append(row)
    first = next(iter(cells))
    cmp = subprocess.run([sys.executable, "-m", "stepgap", "compare",
                          str(out / f"{first}-r0.inproc.json"),
                          str(out / f"{first}-r0.vllm.json")], cwd=ROOT,
                         capture_output=True, text=True)
    (out / f"compare-{first}.txt").write_text(cmp.stdout + cmp.stderr)
    if cmp.returncode:
        raise SystemExit(f"stepgap compare failed:\n{cmp.stderr}")
    summary = {"output_latency_ms": l_ms, "repeats": args.repeats, "load_avg": loads,
               "profile": str(profile),
               "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(report(summary))


def report(summary: dict) -> str:
    def pct(a, b):
        return 100 * (a - b) / b
    lines = [f"output latency set in the simulator: {summary['output_latency_ms']:.2f} ms "
             "(served - in-process mean TTFT, median over the concurrency-1 cells)", "",
             "| cell | mean TTFT ms in-process / server-side / served (Δ) | mean TPOT ms "
             "in-process / served (Δ) | mean ITL ms in-process / served (Δ) | P99 ITL ms "
             "in-process / served |", "|---|---|---|---|---|"]
    for r in summary["rows"]:
        t, p, i, q = (r[k] for k in ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
                                     "p99_itl_ms"))
        lines.append(
            f"| {r['cell']} | {t['inproc']:.2f} / {t['server']:.2f} / {t['served']:.2f} "
            f"({t['served'] - t['inproc']:+.2f}) | {p['inproc']:.3f} / {p['served']:.3f} "
            f"({pct(p['served'], p['inproc']):+.1f} %) | {i['inproc']:.3f} / {i['served']:.3f} "
            f"({pct(i['served'], i['inproc']):+.1f} %) | {q['inproc']:.2f} / {q['served']:.2f} |")
    lines += ["", "| cell | mean TPOT: sim / in-process (err) | sim+L / served (err) | "
              "mean ITL: sim / in-process (err) | sim+L / served (err) |", "|---|---|---|---|---|"]
    for r in summary["rows"]:
        p, i = r["mean_tpot_ms"], r["mean_itl_ms"]
        lines.append(
            f"| {r['cell']} | {p['sim']:.3f} / {p['inproc']:.3f} ({pct(p['sim'], p['inproc']):+.1f}"
            f" %) | {p['sim_served']:.3f} / {p['served']:.3f} "
            f"({pct(p['sim_served'], p['served']):+.1f} %) | {i['sim']:.3f} / {i['inproc']:.3f} "
            f"({pct(i['sim'], i['inproc']):+.1f} %) | {i['sim_served']:.3f} / {i['served']:.3f} "
            f"({pct(i['sim_served'], i['served']):+.1f} %) |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
