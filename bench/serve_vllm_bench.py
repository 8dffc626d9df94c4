"""The real `vllm bench serve` against `stepgap serve`, next to the engine's in-process run.

For each mode (sync, async) and k (0, 4), one `stepgap serve` of the trained pair
(checkpoints/pystdlib: the process executor, engine core and worker pinned to a CPU each, float32,
greedy; its front end moved onto the engine core's CPU) is driven by vLLM's own benchmark client,
unchanged, on that CPU too at SCHED_FIFO 1 (as bench/vllm/measure.py runs it against vLLM):

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
in-process runs must accept the same drafts (greedy: the same tokens). All four servers stay up
and the runs interleave (bench/vllm/measure.py's plan: each (k, concurrency) group's sync
calibration run on 48 prompts of the corpus's training files, then its modes back to back).

Then: the difference the HTTP path makes to TTFT, TPOT and ITL (medians over repeats), and the
simulator's prediction of both runs, with the engine's accepted counts replayed: the in-process
run on a profile of this machine measured first (`stepgap profile`, on training prompts), the
served run on that profile with the HTTP path fitted on the sync calibration runs
(calibrate/serve_fit.py, `stepgap calibrate-served`: the simulator's `served` topology).

    python bench/serve_vllm_bench.py [--vllm-venv .vllm] [--repeats 3] [--out out/serve-bench]
    python bench/serve_vllm_bench.py --out out/serve-bench --analyse-only   # fit, simulate again

`--vllm-venv` is a virtual environment with vLLM's CPU build (`make vllm` builds `.vllm`;
docs/explanation/serve.md says how); `--vllm-cli` the script that runs its CLI
(bench/vllm/vllm_cli.py by default). Run it on a quiet machine: it checks the load average first.
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
from typing import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.calibrate.harness import limits  # noqa: E402
from stepgap.calibrate.judge import BOUNDS as JUDGE_BOUNDS  # noqa: E402
from stepgap.common.fileio import write_json  # noqa: E402
from stepgap.common.formats import load_trace, save_result  # noqa: E402
from stepgap.common.run_result import RunResult  # noqa: E402

PAIR = ROOT / "checkpoints" / "pystdlib"
MODES = ("sync", "async")
KS = (0, 4)
CONCS = (1, 4)
METRICS = ("ttft", "tpot", "itl", "e2el")
LEVELED = ("mean_tpot_ms", "mean_itl_ms", "p99_tpot_ms", "mean_ttft_ms")
MAX_LOAD = 1.5
HOST_CPU = 0    # the engine core's CPU (engine/executor.py pins it to the first)
# percent: the bounds the in-process validation holds (calibrate/judge.py); TTFT has none
BOUNDS = {key: 100 * frac for key, _, frac in JUDGE_BOUNDS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_dataset(path: Path) -> list:
    """The held-out trace as `--dataset-name custom` lines (every prompt round-trips)."""
    from stepgap.calibrate.pair import write_custom_dataset
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
    # on the front end's CPU at SCHED_FIFO 1, as bench/vllm/measure.py runs it
    # (docs/explanation/vllm.md: a client short of CPU reads the stream in bursts and times itself,
    # not the server)
    cmd = ["chrt", "-f", "1", "taskset", "-c", str(HOST_CPU),
           str(Path(args.vllm_venv) / "bin" / "python"), str(args.vllm_cli), "bench", "serve",
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
    from stepgap.engine.args import EngineArgs
    from stepgap.engine.loop import run_trace
    ea = EngineArgs(model=str(PAIR / "target"), draft=str(PAIR / "eagle3") if k else None, k=k,
                    mode=mode, executor="process", dtype="float32",
                    num_gpu_blocks_override=lim["num_blocks"], max_num_seqs=lim["max_num_seqs"],
                    max_num_batched_tokens=lim["max_num_batched_tokens"],
                    max_model_len=lim["max_model_len"])
    setup = ea.create_engine_config()
    cfg = setup.engine_config()
    with setup.make_executor() as ex:
        warm = replace(reqs[0], request_id="warmup", output_len=8)
        run_trace(ex, [warm], cfg, vocab_size=4096)
        return run_trace(ex, reqs, cfg, vocab_size=4096, max_concurrency=conc, detailed=True,
                         config={"mode": mode, "k": k, "executor": "process",
                                 "max_concurrency": conc, "pinned": ex.pinned},
                         percentiles=(50, 99))


def simulate(reqs, accepted: dict, lim: dict, mode: str, k: int, conc: int,
             profile: Path, speed: float = 1.0) -> dict:
    """The simulator on the trace, the engine's accepted counts replayed; the topology is the
    profile's (stepgap's for the engine profile, `served` for the fitted one)."""
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate as run
    cfg = SimConfig(mode=mode, k=k, gpu="cpu", model=str(PAIR / "target"),
                    draft=str(PAIR / "eagle3"), executor="process", device="cpu", replay=True,
                    profile=str(profile), max_num_seqs=lim["max_num_seqs"],
                    max_num_batched_tokens=lim["max_num_batched_tokens"],
                    max_model_len=lim["max_model_len"],
                    num_gpu_blocks_override=lim["num_blocks"], max_concurrency=conc,
                    speed=speed)
    result, _ = run(cfg, [replace(r, accepted=list(accepted.get(r.request_id, [])))
                          for r in reqs])
    return result


def med(runs: list[Mapping], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def check_served(res: dict, reqs, name: str) -> None:
    want = sum(r.output_len for r in reqs)
    if res["completed"] != len(reqs) or res.get("failed") or \
            res["total_output_tokens"] != want:
        raise SystemExit(f"{name}: {res['completed']} of {len(reqs)} completed, "
                         f"{res['total_output_tokens']} of {want} tokens")


def pin_frontend(server: Server) -> None:
    """The front end (every thread) onto CPU 0, the engine core's: the simulator's `host`."""
    subprocess.run(["taskset", "-a", "-pc", str(HOST_CPU), str(server.proc.pid)], check=True,
                   capture_output=True)


def measure(args, out: Path, modes, ks, lim: dict, datasets: dict, traces: dict) -> None:
    """Every run, its files into `out`, and plan.json (what ran, in order)."""
    from bench.vllm.measure import plan_units
    from stepgap.calibrate.fit import add_device
    from stepgap.calibrate.samples import device_points
    t0 = time.monotonic()
    reqs = traces["judged"]
    units = plan_units(ks, CONCS, modes, ks if "sync" in modes else (), args.repeats)
    done, loads, servers = [], [], {}
    # Every server up at once, so that the modes of a (k, concurrency) group run back to back
    # and the repeats interleave, as bench/vllm/measure.py runs vLLM's.
    try:
        for mode in modes:
            for k in ks:
                servers[mode, k] = Server(engine_flags(lim, mode, k), out, f"{mode}-k{k}")
                pin_frontend(servers[mode, k])
        for n, (kind, mode, k, conc, rep) in enumerate(units, 1):
            server = servers[mode, k]
            run = f"{kind[:5]}-{mode}-k{k}-c{conc}-r{rep}"
            loads.append(os.getloadavg()[0])
            served = vllm_bench(args, server, datasets[kind], conc, out, run)
            check_served(served, traces[kind], run)
            os.replace(server.result, out / f"{run}.server.json")
            os.replace(server.timeline, out / f"{run}.server.jsonl")
            line = f"[{n}/{len(units)}] {run}: TPOT served {served['mean_tpot_ms']:.3f}"
            if kind == "judged":
                inproc = in_process(reqs, lim, mode, k, conc)
                save_result(out / f"{run}.inproc.json", inproc.result)
                write_json(out / f"{run}.accepted.json", inproc.accepted, indent=None)
                acc: dict = {}   # its device ops, summed: the machine's level during it
                add_device(acc, device_points(inproc.spans, k))
                write_json(out / f"{run}.inproc.device.json", acc, indent=None)
                rec = inproc.result
                if k and served["spec_decode_num_drafts"] != rec.spec_decode["num_drafts"]:
                    raise SystemExit(f"{run}: served and in-process acceptance differ")
                line += (f" in-process {rec.metrics['mean_tpot_ms']:.3f} ms; TTFT "
                         f"{served['mean_ttft_ms']:.2f} / {rec.metrics['mean_ttft_ms']:.2f}")
            print(line + " ms", flush=True)
            done.append({"run": run, "kind": kind, "mode": mode, "k": k, "conc": conc,
                         "rep": rep})
    finally:
        for server in servers.values():
            server.stop()
    write_json(out / "plan.json", {
        "repeats": args.repeats, "runs": done, "load_avg": loads,
        "wall_s": round(time.monotonic() - t0, 1)})


def analyse(out: Path, profile: Path, reqs, lim: dict) -> tuple[list, dict]:
    """The HTTP path fitted on the calibration runs (served-profile.json), and each judged
    cell: medians of its runs, the simulations at the profile's level, and each run simulated
    at its own level (its device ops against the profile's: the machine's drift between runs,
    which neither topology models) with the error of each, median over the runs."""
    from stepgap.calibrate.fit import device_vs_profile
    from stepgap.calibrate.serve_fit import fit_served, load_served_run, run_level
    from stepgap.common.formats import load_timeline
    from stepgap.sim.profile import load_profile, save_profile
    plan = json.loads((out / "plan.json").read_text())
    base = load_profile(profile)
    calib = [load_served_run(out / f"{u['run']}.server.json")
             for u in plan["runs"] if u["kind"] == "calibration"]
    served = fit_served(base, calib)
    served_profile = out / "served-profile.json"
    save_profile(served_profile, served)
    cells: dict = {}
    for u in plan["runs"]:
        if u["kind"] != "judged":
            continue
        run, k = u["run"], u["k"]
        c = cells.setdefault((u["mode"], k, u["conc"]), {
            "served": [], "server": [], "inproc": [], "errors": [],
            "accepted": json.loads((out / f"{run}.accepted.json").read_text())})
        # each run's metrics (RunRecord): the client's vLLM file, the in-process run, the server
        got = {"served": RunResult.load(out / f"{run}.vllm.json").metrics,
               "inproc": RunResult.load(out / f"{run}.inproc.json").metrics}
        c["server"].append(RunResult.load(out / f"{run}.server.json").metrics)
        level = {"served": run_level(load_timeline(out / f"{run}.server.jsonl"), k, base),
                 "inproc": 1.0 + (device_vs_profile(json.loads(
                     (out / f"{run}.inproc.device.json").read_text()), base, k) or 0.0)}
        err = {"levels": level}
        # in process; served; the served run without a model of the HTTP path
        for key, side, prof in (("inproc", "inproc", profile),
                                ("served", "served", served_profile),
                                ("unmodelled", "served", profile)):
            sim = simulate(reqs, c["accepted"], lim, u["mode"], k, u["conc"], prof,
                           speed=level[side])
            err[key] = {m: sim[m] / got[side][m] - 1 for m in LEVELED}
        c["inproc"].append(got["inproc"])
        c["served"].append(got["served"])
        c["errors"].append(err)
    rows = []
    for (mode, k, conc), c in sorted(cells.items()):
        name = f"{mode}-k{k}-c{conc}"
        sim0 = simulate(reqs, c["accepted"], lim, mode, k, conc, profile)
        sim_s = simulate(reqs, c["accepted"], lim, mode, k, conc, served_profile)
        save_result(out / f"{name}.sim.json", sim0)
        save_result(out / f"{name}.sim-served.json", sim_s)
        row = {"cell": name, "runs": len(c["served"]),
               "levels": {side: [round(e["levels"][side], 3) for e in c["errors"]]
                          for side in ("inproc", "served")},
               "leveled_error": {key: {m: statistics.median(e[key][m] for e in c["errors"])
                                       for m in LEVELED}
                                 for key in ("inproc", "served", "unmodelled")}}
        for m in METRICS:
            for key in (f"mean_{m}_ms", f"p99_{m}_ms"):
                row[key] = {"served": med(c["served"], key), "inproc": med(c["inproc"], key),
                            "server": med(c["server"], key), "sim": sim0[key],
                            "sim_served": sim_s[key]}
        rows.append(row)
    return rows, served.notes["served_fit"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-venv", default=str(ROOT / ".vllm"),
                    help="virtual environment with vLLM's CPU build (default .vllm)")
    ap.add_argument("--vllm-cli", default=str(ROOT / "bench" / "vllm" / "vllm_cli.py"),
                    help="the script that runs vLLM's CLI (default bench/vllm/vllm_cli.py)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "out" / "serve-bench"))
    ap.add_argument("--profile", default=None, metavar="PROFILE.json",
                    help="the engine's costs (default: measure them first with `stepgap "
                         "profile`, on the corpus's training prompts, never the judged ones; "
                         "this VM's speed drifts by tens of percent over hours)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--ks", default=",".join(map(str, KS)))
    ap.add_argument("--analyse-only", action="store_true",
                    help="fit and simulate again from the runs already in --out (no vLLM "
                         "needed)")
    args = ap.parse_args()
    for p in (Path(args.vllm_venv) / "bin" / "python", Path(args.vllm_cli)):
        # `make bench` runs every bench: say why this one did nothing
        if not p.exists() and not args.analyse_only:
            print(f"serve_vllm_bench: skipped: {p} is not there (`make vllm`, or --vllm-venv "
                  "and --vllm-cli)")
            return
    load = os.getloadavg()[0]
    if load > MAX_LOAD and not args.analyse_only:
        print(f"serve_vllm_bench: warning: load average {load:.2f} > {MAX_LOAD}; the timings "
              "will be noisy (the summary records the load before each run)", file=sys.stderr)
    from stepgap.calibrate.pair import calibration_trace, write_custom_dataset
    modes, ks = args.modes.split(","), [int(k) for k in args.ks.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = Path(args.profile) if args.profile else out / "profile.json"
    if not args.profile and not args.analyse_only:
        subprocess.run([sys.executable, "-m", "stepgap", "profile", "--modes", args.modes,
                        "--ks", args.ks, "--out", str(profile), "--quiet"], cwd=ROOT,
                       check=True)
    datasets = {"judged": out / "heldout_text.jsonl", "calibration": out / "calib_text.jsonl"}
    traces = {"judged": write_dataset(datasets["judged"]),
              "calibration": calibration_trace(PAIR, 48)}
    write_custom_dataset(traces["calibration"], datasets["calibration"], PAIR)
    lim = limits(traces["judged"] + traces["calibration"], max(KS), max(CONCS))
    reqs = traces["judged"]
    if not args.analyse_only:
        measure(args, out, modes, ks, lim, datasets, traces)
    rows, fit = analyse(out, profile, reqs, lim)
    first = f"judge-{modes[0]}-k{ks[0]}-c{CONCS[0]}-r0"
    cmp = subprocess.run([sys.executable, "-m", "stepgap", "compare",
                          str(out / f"{first}.inproc.json"), str(out / f"{first}.vllm.json")],
                         cwd=ROOT, capture_output=True, text=True)
    (out / f"compare-{first}.txt").write_text(cmp.stdout + cmp.stderr)
    if cmp.returncode:
        raise SystemExit(f"stepgap compare failed:\n{cmp.stderr}")
    plan = json.loads((out / "plan.json").read_text())
    summary = {"repeats": plan["repeats"], "load_avg": plan["load_avg"],
               "profile": str(profile), "served_profile": str(out / "served-profile.json"),
               "served_fit": fit, "wall_s": plan["wall_s"], "rows": rows}
    write_json(out / "summary.json", summary)
    plot_errors(summary, out / "errors.png")
    print(report(summary))


def plot_errors(summary: dict, path: Path) -> None:
    """The simulator's error per cell, each run at its own level (median over the runs): in
    process, served, and served without a model of the HTTP path."""
    import numpy as np
    from matplotlib.figure import Figure
    rows = summary["rows"]
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    x = np.arange(len(rows))
    bars = (("inproc", "in process (stepgap topology)"), ("served", "served (served topology)"),
            ("unmodelled", "served, simulated without the HTTP path"))
    for ax, (metric, title) in zip(axes, (("mean_tpot_ms", "mean TPOT"),
                                          ("mean_ttft_ms", "mean TTFT"))):
        for j, (key, label) in enumerate(bars):
            err = [100 * r["leveled_error"][key][metric] for r in rows]
            ax.bar(x + (j - 1) * 0.27, err, 0.27, label=label)
        if metric in BOUNDS:
            ax.axhspan(-BOUNDS[metric], BOUNDS[metric], color="0.9", zorder=0)
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(x, [r["cell"] for r in rows], rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{title}: simulated vs measured, each run at its own level", fontsize=10)
    axes[0].set_ylabel("error, % (grey: the ±5 % bound)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3,
               fontsize=8)
    fig.savefig(path, dpi=110)


def report(summary: dict) -> str:
    def pct(a, b):
        return 100 * (a - b) / b

    def flag(e: float, metric: str = "mean_tpot_ms") -> str:
        bound = BOUNDS.get(metric)
        return f"{e:+.1f} %" + ("" if bound is None or abs(e) <= bound else " !")

    def err(r, key, sim, meas):
        return f"{r[key][sim]:.3f} / {r[key][meas]:.3f} ({flag(pct(r[key][sim], r[key][meas]))})"

    fit = summary["served_fit"]
    lines = [f"the HTTP path fitted on {fit['runs']} sync calibration runs (k in "
             f"{fit['ks']}, levels {min(fit['levels'])}-{max(fit['levels'])}): "
             f"client_latency_us {fit['client_latency_us']}; "
             + ", ".join(f"{t} mean {q['mean_us']} us" for t, q in fit["quality"].items()
                         if "mean_us" in q),
             "", "| cell | mean TTFT ms in-process / server-side / served (Δ) | mean TPOT ms "
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
    lines += ["", "each run simulated at its own level, error median over the runs ('!': "
              "outside the in-process bound: ±5 % on means, ±10 % on P99 TPOT; unmodelled: the served run simulated without the HTTP "
              "path, the stepgap topology on the engine profile)", "",
              "| cell | levels in-process / served | mean TPOT in-process / served / served "
              "unmodelled | mean ITL (same) | P99 TPOT (same) | mean TTFT (same) |",
              "|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        e, lv = r["leveled_error"], r["levels"]
        lines.append(f"| {r['cell']} | {statistics.median(lv['inproc']):.3f} / "
                     f"{statistics.median(lv['served']):.3f} | " + " | ".join(
                         " / ".join(flag(100 * e[key][m], m)
                                    for key in ("inproc", "served", "unmodelled"))
                         for m in LEVELED) + " |")
    lines += ["", "at the profile's level, medians: simulated / measured", "",
              "| cell | mean TPOT: sim / in-process | served sim / served | "
              "mean ITL: sim / in-process | served sim / served |", "|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(" | ".join([
            f"| {r['cell']}",
            *(err(r, f"mean_{m}_ms", s, meas) for m in ("tpot", "itl")
              for s, meas in (("sim", "inproc"), ("sim_served", "served")))]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
