"""Measure the real vLLM (CPU build) serving the trained pair, driven by the real `vllm bench serve`.

    make vllm                                   # vLLM 0.32.0's CPU build in .vllm (once)
    python bench/vllm/measure.py --out out/vllm-cpu          # 22 min on 2 cores (4 repeats)
    python bench/vllm/measure.py --out out/q --quick         # a few minutes: the pipeline only

What it does, in order (docs/vllm.md has the why of each choice):

1. Datasets: the pair's 48 held-out prompts (judged) and 48 prompts cut from the corpus's
   training files (calibration), as `--dataset-name custom` files; every prompt must round-trip
   through the pair's tokenizer to its token ids.
2. Servers: one `vllm serve` per (mode, k), all started up front and left running, so that runs
   of different modes can interleave without restarts (an idle server uses no CPU once its
   queues go idle). Each server's engine core and API server run on CPU 0 (`taskset`), its
   worker's OpenMP thread on CPU 1 (`VLLM_CPU_OMP_THREADS_BIND`); the benchmark client on
   CPU 0. Async servers set SG_VLLM_CPU_ASYNC=1 (bench/vllm/cpu_async_patch.py: vLLM's CPU
   platform otherwise turns --async-scheduling off), a configuration vLLM does not support.
3. Token capture: every prompt once per server, streaming with `return_token_ids`, so that each
   request's tokens per chunk (per engine step: 1 + accepted drafts) are vLLM's own.
4. Runs: in each repeat, every (k, concurrency) group (rotating) runs one sync calibration run
   (k in --calibrate-ks only) and its modes back to back on the judged prompts, the mode order
   alternating; `/metrics` is scraped around every run.
5. Profiles: one short run per (mode, k, concurrency) of the calibration ks (sync; and async for
   the figure) with the torch profiler (Python tracer off, vLLM's custom scopes on).

Everything lands in OUT/ (bench results, scrapes, tokens, traces, process CPU times, the log
and plan.json); bench/vllm/build_folder.py turns it into traces/measured/vllm-cpu/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stepgap.calibrate.gpu import Log  # noqa: E402
from stepgap.common.vllm_bench import BURSTY_MAX, bursty_share  # noqa: E402

CLI = ROOT / "bench" / "vllm" / "vllm_cli.py"
PAIR = ROOT / "checkpoints" / "pystdlib"
BASE_PORT = 18100
MAX_MODEL_LEN = 256
MAX_NUM_SEQS = 8


# ---------------------------------------------------------------------------------------------
# Datasets


def write_dataset(requests, path: Path) -> dict:
    """A `--dataset-name custom` file of `requests` (calibrate/pair.py), and what it holds."""
    from stepgap.calibrate.pair import write_custom_dataset
    write_custom_dataset(requests, path, PAIR)
    return {"prompts": len(requests), "round_trip_exact": len(requests)}


# ---------------------------------------------------------------------------------------------
# Servers


def pinned(cpu) -> list[str]:
    """The prefix that runs a command on one CPU (nothing for None: anywhere)."""
    return [] if cpu is None else ["taskset", "-c", str(cpu)]


class Server:
    """One `vllm serve` of the pair, at one mode and k."""

    def __init__(self, venv: Path, mode: str, k: int, port: int, out: Path, cpus: dict):
        self.mode, self.k, self.port = mode, k, port
        self.name = f"{mode}-k{k}"
        self.trace_dir = out / "traces" / self.name
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(venv / "bin" / "python"), str(CLI), "serve", str(PAIR / "target"),
               "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
               "--no-enable-prefix-caching", "--max-num-seqs", str(MAX_NUM_SEQS),
               "--kv-cache-memory-bytes", "256M",
               "--async-scheduling" if mode == "async" else "--no-async-scheduling",
               "--profiler-config", json.dumps({"profiler": "torch",
                                                "torch_profiler_dir": str(self.trace_dir),
                                                "torch_profiler_with_stack": False})]
        if k:
            cmd += ["--speculative-config", json.dumps({
                "method": "eagle3", "model": str(PAIR / "eagle3"),
                "num_speculative_tokens": k})]
        self.hook_dir = out / "hooks" / self.name
        env = dict(os.environ, VLLM_CUSTOM_SCOPES_FOR_PROFILING="1",
                   SG_VLLM_TRACE=str(self.hook_dir),
                   VLLM_CPU_OMP_THREADS_BIND=str(cpus["worker"]), OMP_WAIT_POLICY="PASSIVE",
                   SG_VLLM_CPU_ASYNC="1" if mode == "async" else "0")
        self.log_path = out / "logs" / f"server-{self.name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([*pinned(cpus["host"]), *cmd], env=env,
                                     stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=ROOT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = 600) -> float:
        t0 = time.monotonic()
        while not self.healthy():
            if self.proc.poll() is not None:
                raise SystemExit(f"server {self.name} exited ({self.proc.returncode}); see "
                                 f"{self.log_path}")
            if time.monotonic() - t0 > timeout_s:
                raise SystemExit(f"server {self.name} not ready after {timeout_s:.0f} s")
            time.sleep(1)
        return time.monotonic() - t0

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def pids(self) -> dict:
        """The server's processes by role (API server, engine core, worker), from /proc."""
        out = {"api_server": self.proc.pid}
        for pid in descendants(self.proc.pid):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if "EngineCor" in name:
                out["engine_core"] = pid
            elif "Worker" in name:
                out["worker"] = pid
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# Runs


def bench(venv: Path, server: Server, dataset: Path, conc: int, out: Path, name: str,
          cpus: dict, num_prompts: int, profile: bool = False) -> dict:
    """One `vllm bench serve` run; its result file, with the /metrics scrapes around it and
    the CPU time each server process spent during it."""
    pids = server.pids()
    before = server.scrape()
    cpu0 = {role: cpu_seconds(pid) for role, pid in pids.items()}
    rt = ["chrt", "-f", "1"] if cpus.get("client_rt") else []
    cmd = [*rt, *pinned(cpus["client"]), str(venv / "bin" / "python"), str(CLI), "bench",
           "serve", "--backend", "openai", "--base-url", server.url, "--endpoint",
           "/v1/completions", "--dataset-name", "custom", "--dataset-path", str(dataset),
           "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle",
           "--num-prompts", str(num_prompts), "--max-concurrency", str(conc),
           "--request-rate", "inf", "--temperature", "0", "--ignore-eos", "--save-result",
           "--save-detailed", "--result-dir", str(out / "results"), "--result-filename",
           f"{name}.json", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99", "--disable-tqdm", "--metadata",
           f"mode={server.mode}", f"num_speculative_tokens={server.k}"]
    if profile:
        cmd.append("--profile")
    t0, epoch0 = time.monotonic(), time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if done.returncode:
        raise SystemExit(f"bench {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    cpu = {role: round(cpu_seconds(pid) - cpu0[role], 2) for role, pid in pids.items()}
    after = server.scrape()
    (out / "metrics").mkdir(exist_ok=True)
    (out / "metrics" / f"{name}.before.txt").write_text(before)
    (out / "metrics" / f"{name}.after.txt").write_text(after)
    res = json.loads((out / "results" / f"{name}.json").read_text())
    return {"name": name, "wall_s": round(wall, 2), "cpu_s": cpu,
            "bursty_share": round(bursty_share(res), 3),
            "window_s": [round(epoch0, 3), round(time.time(), 3)],
            "load_avg_1m": round(os.getloadavg()[0], 2), "mean_tpot_ms": res["mean_tpot_ms"],
            "mean_itl_ms": res["mean_itl_ms"], "completed": res["completed"]}


def capture_tokens(server: Server, dataset: Path, out: Path, conc: int = 4) -> Path:
    """Each prompt once, streamed with return_token_ids: vLLM's tokens of every chunk."""
    from concurrent.futures import ThreadPoolExecutor

    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]

    def one(row):
        body = {"model": model, "prompt": row["prompt"], "max_tokens": row["output_tokens"],
                "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
        req = urllib.request.Request(server.url + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        chunks = []
        with urllib.request.urlopen(req, timeout=300) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ch = json.loads(line[6:])["choices"]
                if ch and ch[0].get("token_ids"):
                    chunks.append(ch[0]["token_ids"])
        return {"request_id": row["request_id"], "chunks": chunks}

    with ThreadPoolExecutor(conc) as pool:
        requests = list(pool.map(one, rows))
    path = out / "tokens" / f"{server.name}-{dataset.stem}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"server": server.name, "concurrency": conc,
                                "requests": requests}))
    return path


def plan_units(ks, concs, modes, calibrate_ks, repeats):
    """(kind, mode, k, conc, rep) in run order: groups rotate; each group's calibration run
    (sync, calibration prompts) first, then its modes back to back, order alternating."""
    groups = [(k, c) for k in ks for c in concs]
    orders = list(itertools.permutations(modes))
    units = []
    for rep in range(repeats):
        shift = rep % len(groups)
        for k, c in groups[shift:] + groups[:shift]:
            if k in calibrate_ks:
                units.append(("calibration", "sync", k, c, rep))
            units += [("judged", m, k, c, rep) for m in orders[rep % len(orders)]]
    return units


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/vllm-cpu")
    ap.add_argument("--venv", default=str(ROOT / ".vllm"))
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--ks", default="0,2,4")
    ap.add_argument("--calibrate-ks", default="0,2")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--profile-prompts", type=int, default=8)
    ap.add_argument("--quick", action="store_true",
                    help="k 2 only, 8 prompts, 1 repeat: checks the pipeline in minutes")
    ap.add_argument("--host-cpu", type=int, default=0)
    ap.add_argument("--worker-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=None, help="default: the host CPU")
    ap.add_argument("--no-client-rt", dest="client_rt", action="store_false",
                    help="run the bench client at normal priority (by default SCHED_FIFO 1: "
                         "on this VM a client at normal priority is woken late, and reads a "
                         "whole response in one burst; docs/vllm.md)")
    ap.add_argument("--retries", type=int, default=2,
                    help="reruns of a run whose client read the stream in bursts")
    args = ap.parse_args(argv)
    if args.quick:
        args.ks, args.calibrate_ks, args.repeats, args.num_prompts = "2", "2", 1, 8
        args.profile_prompts = 2
    venv, out = Path(args.venv), Path(args.out)
    if not (venv / "bin" / "python").is_file():
        raise SystemExit(f"{venv}: no vLLM venv there; run `make vllm` first")
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "log.txt", "a")
    cpus = {"host": args.host_cpu, "worker": args.worker_cpu,
            "client": args.host_cpu if args.client_cpu is None else args.client_cpu,
            "client_rt": args.client_rt}
    modes = [m for m in args.modes.split(",") if m]
    ks = [int(x) for x in args.ks.split(",")]
    calibrate_ks = [int(x) for x in args.calibrate_ks.split(",") if x]
    concs = [int(x) for x in args.concurrency.split(",")]

    from stepgap.calibrate.pair import calibration_trace, load_heldout
    data = out / "data"
    data.mkdir(exist_ok=True)
    judged, calib = data / "heldout.jsonl", data / "calibration.jsonl"
    info = {"judged": write_dataset(load_heldout(PAIR), judged),
            "calibration": write_dataset(calibration_trace(PAIR, 48), calib)}
    log(f"datasets: {info}")

    servers = {}
    try:
        for i, (mode, k) in enumerate(itertools.product(modes, ks)):
            servers[(mode, k)] = Server(venv, mode, k, BASE_PORT + i, out, cpus)
        for s in servers.values():
            log(f"server {s.name} ready in {s.wait_ready():.0f} s (pids {s.pids()})")
        for s in servers.values():   # warm-up, then vLLM's own tokens of every chunk
            bench(venv, s, judged, 4, out, f"warmup-{s.name}", cpus, 8)
            for ds in (judged, calib):
                capture_tokens(s, ds, out)
        log("warm-up and token capture done")
        runs = []
        units = plan_units(ks, concs, modes, calibrate_ks, args.repeats)
        for n, (kind, mode, k, c, rep) in enumerate(units):
            name = f"{kind}-{mode}-k{k}-c{c}-r{rep}"
            for attempt in range(args.retries + 1):
                r = bench(venv, servers[(mode, k)], judged if kind == "judged" else calib, c,
                          out, name, cpus, args.num_prompts)
                if r["bursty_share"] <= BURSTY_MAX:
                    break
                log(f"{name}: {r['bursty_share']:.0%} of ITLs under 50 us (the client read "
                    f"in bursts), attempt {attempt + 1}")
            r["attempts"] = attempt + 1
            r.update(kind=kind, mode=mode, k=k, conc=c, rep=rep)
            runs.append(r)
            log(f"{n + 1}/{len(units)} {name}: TPOT {r['mean_tpot_ms']:.3f} ms, ITL "
                f"{r['mean_itl_ms']:.3f} ms, {r['wall_s']:.1f} s, cpu {r['cpu_s']}, load "
                f"{r['load_avg_1m']}")
        profiles = []
        for (mode, k), s in servers.items():
            if k not in calibrate_ks:
                continue
            for c in concs:
                name = f"profile-{mode}-k{k}-c{c}"
                before = set(s.trace_dir.iterdir())
                r = bench(venv, s, calib, c, out, name, cpus, args.profile_prompts,
                          profile=True)
                time.sleep(2)
                r.update(mode=mode, k=k, conc=c,
                         traces=sorted(str(p.relative_to(out)) for p in
                                       set(s.trace_dir.iterdir()) - before))
                profiles.append(r)
                log(f"{name}: traces {r['traces']}")
        plan = {"vllm": "0.32.0 (CPU build)", "modes": modes, "ks": ks,
                "calibrate_ks": calibrate_ks, "concurrency": concs, "repeats": args.repeats,
                "num_prompts": args.num_prompts, "cpus": cpus, "datasets": info,
                "max_model_len": MAX_MODEL_LEN, "max_num_seqs": MAX_NUM_SEQS,
                "runs": runs, "profiles": profiles,
                "servers": {s.name: {"port": s.port, "async_patch": s.mode == "async"}
                            for s in servers.values()}}
        (out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
        log(f"done: {out}/plan.json")
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
