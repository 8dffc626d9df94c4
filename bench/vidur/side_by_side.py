"""stepgap next to Vidur on one trace: simulated requests/s, steps/s and wall time of each.

    make vidur VIDUR_PROFILES=DIR               # Vidur 0.0.26 in .vidur/venv, its profile cache
    python bench/vidur/side_by_side.py          # 10,000 requests, 3 rounds: about 2 min here
    python bench/vidur/side_by_side.py --vidur-venv V --vidur-cache C --repeat 3
    python bench/vidur/side_by_side.py --baseline ../main   # and another checkout, same rounds

The trace: stepgap's ShareGPT-like workload (seed 0), every request arriving at t = 0, written
once to OUT/trace.csv in Vidur's trace_replay columns (Date, Time, PromptTokenCount,
CompletionTokenCount); both simulators read that file. The setup: Llama-3(.1)-8B on one H100,
at most 64 requests in a batch and 4096 tokens in a step, vLLM's scheduler (Vidur's `vllm`
replica scheduler; stepgap's V1 scheduler, which chunks and mixes prefills). Vidur decodes
one token per request per step; stepgap runs twice, the same (k = 0, sync) and with EAGLE-3
at k = 4, async (the issue's concurrency-64 scenario, here capped by max_num_seqs).

Each round runs the three once, each in its own process, in alternating order; each process
reports its phases (import, setup, loop and the loop's CPU time, output) and the bench times
the whole process's wall. The table gives the medians over the rounds, and the ratios pair each round's runs.
One warm-up round runs first, untimed, on the first 100 requests (on a fresh cache it is
where Vidur trains its predictors: 18 min on a 2-core VM, once).

Vidur itself: it is installed from the package index into its own venv (--vidur-venv; created with
--python, CPython 3.11, the only one its wheels are built for), never imported here. It reads its
operator profiles at run time from a dataset cache (--vidur-cache), which this script lays out from
the profile tables under --vidur-profiles (bench/vidur/profiles.py says what they are and where they
come from; attention is synthetic) and runs with HF_HUB_OFFLINE=1: nothing is downloaded at run
time. docs/explanation/speed.md, "Side by side with Vidur", has the measured table and what it
means.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import profiles  # noqa: E402

VIDUR = "vidur==0.0.26"
DATE = "2023-08-21"          # Vidur keeps the trace rows of this date only
MAX_BATCH, MAX_TOKENS = 64, 4096
P = "--random_forrest_execution_time_predictor_config_"


def vidur_args(trace: Path, cache: Path, out: Path) -> list[str]:
    """`python -m vidur.main` options: the trace as it is (every scale factor 1), the
    scheduler limits above, the offline datasets, no trace or plot outputs."""
    return [
        "--seed", "42",
        "--replica_config_model_name", profiles.MODEL, "--replica_config_device", profiles.DEVICE,
        "--replica_config_network_device", profiles.NETWORK,
        "--replica_config_tensor_parallel_size", "1", "--replica_config_num_pipeline_stages", "1",
        "--cluster_config_num_replicas", "1", "--global_scheduler_config_type", "round_robin",
        "--replica_scheduler_config_type", "vllm",
        "--vllm_scheduler_config_batch_size_cap", str(MAX_BATCH),
        "--vllm_scheduler_config_max_tokens_in_batch", str(MAX_TOKENS),
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_date", DATE,
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--trace_request_generator_config_max_tokens", "4096",
        "--execution_time_predictor_config_type", "random_forrest",
        P + "model_profiling_dataset", profiles.COMPUTE_DATASET,
        P + "network_profiling_dataset", profiles.NETWORK_DATASET,
        P + "cache_dir", str(cache),
        # the prediction grid must cover every request and step (its default is 2 M tokens)
        P + "prediction_max_tokens_per_request", "4096",
        P + "prediction_max_prefill_chunk_size", "4096",
        P + "prediction_max_batch_size", "128",
        "--no-metrics_config_enable_chrome_trace", "--no-metrics_config_write_json_trace",
        "--no-metrics_config_store_plots", "--no-metrics_config_save_table_to_wandb",
        "--metrics_config_output_dir", str(out),
    ]


OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "WANDB_DISABLED": "true"}


# -- setup -----------------------------------------------------------------------------------

def fail(msg: str) -> None:
    print(f"vidur side by side: {msg}", file=sys.stderr)
    raise SystemExit(2)


def ensure_vidur(venv: Path, python: str) -> Path:
    """Vidur's venv, made from the package index if it has no vidur yet."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import vidur"],
                                      capture_output=True).returncode == 0:
        return py
    try:
        version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        fail(f"--python {python}: not found; {VIDUR} needs CPython 3.11 (its wheels are "
             "built for it only)")
    if version != "(3, 11)":
        fail(f"--python {python} is Python {version}; {VIDUR} ships wheels for CPython 3.11 "
             "only: give --python /path/to/python3.11")
    print(f"installing {VIDUR} into {venv} from the package index (about 100 packages, "
          "1.3 GB; 35 s here)", flush=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", VIDUR], check=True)
    return py


def ensure_cache(cache: Path, profile_dir: Path | None) -> None:
    """Vidur's offline dataset cache: kept if laid out already, else built from the tables."""
    if profiles.cache_ready(cache):
        changed = profiles.cache_differences(cache)
        if changed:
            print(f"note: {cache} holds other {', '.join(changed)} than the tables "
                  "docs/explanation/speed.md's numbers were measured with; Vidur's predictor "
                  "cache does not "
                  "see file contents, so give such data a cache folder of its own",
                  file=sys.stderr)
        return
    if profile_dir is None:
        fail(f"{cache} has no Vidur profile datasets yet. Give --vidur-profiles DIR with "
             f"{', '.join(rel for rel, _ in profiles.REAL.values())} under DIR.\n"
             + profiles.HOW_TO_GET)
    missing = profiles.missing_inputs(profile_dir)
    if missing:
        fail("missing Vidur profile tables:\n  " + "\n  ".join(missing) + "\n"
             + profiles.HOW_TO_GET)
    profiles.build_cache(cache, profile_dir)
    print(f"laid out Vidur's profile datasets in {cache} (attention: synthetic unless "
          f"{profile_dir} has one)", flush=True)


# -- the trace -------------------------------------------------------------------------------

def write_trace(path: Path, num_prompts: int) -> None:
    sys.path.insert(0, str(ROOT))
    from stepgap.common.workloads import sharegpt_like
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for r in sharegpt_like(num_prompts, seed=0):
            w.writerow([DATE, f"{r.arrival_s:.6f}", r.prompt_len, r.output_len])


def read_trace(path: Path):
    from stepgap.common.formats import TraceRequest
    with open(path, newline="") as f:
        return [TraceRequest(f"r{i}", float(row["Time"]), int(row["PromptTokenCount"]),
                             int(row["CompletionTokenCount"]))
                for i, row in enumerate(csv.DictReader(f))]


# -- one run of each, in its own process -------------------------------------------------------

def stepgap_child(trace: Path, k: int, mode: str, root: Path) -> None:
    """Runs in a child process: one run of the trace by the stepgap checkout at `root`, its
    phases as one JSON line."""
    t0 = time.perf_counter()
    sys.path.insert(0, str(root))
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import Run
    t_import = time.perf_counter()
    reqs = read_trace(trace)
    cfg = SimConfig(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=k,
                    mode=mode, acceptance="mtbench", max_num_seqs=MAX_BATCH,
                    max_num_batched_tokens=MAX_TOKENS)
    sim = Run(cfg, reqs)
    t_setup = time.perf_counter()
    marks = {}
    result = sim.result   # the loop ends where the metrics begin: time the two apart

    def timed_result(duration_s):
        marks["loop"], marks["loop_cpu"] = time.perf_counter(), time.process_time()
        return result(duration_s)

    sim.result = timed_result
    c_loop = time.process_time()
    res, _ = sim.run()
    t_end = time.perf_counter()
    print("STEPGAP_STATS " + json.dumps({
        "import_s": t_import - t0, "setup_s": t_setup - t_import,
        "loop_s": marks["loop"] - t_setup, "loop_cpu_s": marks["loop_cpu"] - c_loop,
        "output_s": t_end - marks["loop"], "batches": sim.num_steps,
        "simulated_s": res.metrics.duration, "requests": res.metrics.completed,
        "mean_ttft_ms": res.metrics.mean_ttft_ms, "mean_tpot_ms": res.metrics.mean_tpot_ms}),
        flush=True)


def timed(cmd: list[str], env: dict | None, tag: str, cwd: Path) -> dict:
    """Run one simulator process: its own phases, plus its wall and CPU seconds as a whole."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode:
        fail(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}):\n{err[-3000:]}")
    line = next((x for x in out.splitlines() if x.startswith(tag + " ")), None)
    if line is None:
        fail(f"{' '.join(cmd[:3])} ... printed no {tag} line:\n{out[-2000:]}\n{err[-2000:]}")
    stats = json.loads(line[len(tag) + 1:])
    stats["wall_s"] = wall
    return stats


def runners(args, vidur_py: Path, trace: Path, out: Path) -> dict:
    env = {**os.environ, **OFFLINE}
    vidur_out = out / "vidur-output"
    me = [sys.executable, str(Path(__file__).resolve())]

    def stepgap(root: Path, k: int, mode: str):
        return lambda t: timed([*me, "--stepgap-child", str(t), str(k), mode, str(root)],
                               None, "STEPGAP_STATS", out)

    run = {"vidur": lambda t: timed([str(vidur_py), str(HERE / "driver.py"),
                                     *vidur_args(t, args.vidur_cache.resolve(), vidur_out)],
                                    env, "VIDUR_STATS", out),
           "stepgap k=0 sync": stepgap(ROOT, 0, "sync"),
           "stepgap k=4 async": stepgap(ROOT, 4, "async")}
    if args.baseline:   # another checkout in the same rounds: a before/after that holds
        run["baseline k=0 sync"] = stepgap(args.baseline.resolve(), 0, "sync")
        run["baseline k=4 async"] = stepgap(args.baseline.resolve(), 4, "async")
    return run


# -- the table ---------------------------------------------------------------------------------

RATES = ("req/s (process)", "req/s (loop CPU)", "steps/s (loop CPU)")


def rates(s: dict) -> dict:
    """Requests per second of the whole process's wall time (what a user waits), and requests
    and steps per CPU second of the event loop alone (steadier on a shared machine)."""
    n = s["requests"]
    return dict(zip(RATES, (n / s["wall_s"], n / s["loop_cpu_s"],
                            s["batches"] / s["loop_cpu_s"])))


def table(rounds: list[dict]) -> str:
    names = list(rounds[0])
    med = statistics.median
    lines = [f"{'':<20}{'requests':>9}{'steps':>8}{'process s':>10}{'loop s':>8}"
             f"{'loop CPU s':>11}{RATES[0]:>17}{RATES[1]:>18}{RATES[2]:>20}"
             f"{'sim. s':>8}{'TPOT ms':>9}"]
    for name in names:
        runs = [r[name] for r in rounds]
        rr = [rates(s) for s in runs]
        lines.append(
            f"{name:<20}{runs[0]['requests']:>9,}{runs[0]['batches']:>8,}"
            f"{med([s['wall_s'] for s in runs]):>10.2f}{med([s['loop_s'] for s in runs]):>8.2f}"
            f"{med([s['loop_cpu_s'] for s in runs]):>11.2f}"
            f"{med([x[RATES[0]] for x in rr]):>17,.0f}{med([x[RATES[1]] for x in rr]):>18,.0f}"
            f"{med([x[RATES[2]] for x in rr]):>20,.0f}"
            f"{runs[0]['simulated_s']:>8.1f}{runs[0]['mean_tpot_ms']:>9.2f}")
    lines += ["", f"{'ratio to vidur: median of the rounds (range)':<46}"
                  f"{RATES[0]:>24}{RATES[1]:>24}{RATES[2]:>24}"]
    for name in names[1:]:
        cols = []
        for key in RATES:
            xs = [rates(r[name])[key] / rates(r["vidur"])[key] for r in rounds]
            cols.append(f"{med(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})")
        lines.append(f"{name:<46}" + "".join(f"{c:>24}" for c in cols))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "vidur-side-by-side")
    ap.add_argument("--vidur-venv", type=Path, default=ROOT / ".vidur" / "venv",
                    help="Vidur's own venv (made here if it has no vidur; default .vidur/venv)")
    ap.add_argument("--python", default="python3.11",
                    help="the Python 3.11 to make Vidur's venv with (default python3.11)")
    ap.add_argument("--vidur-cache", type=Path, default=ROOT / ".vidur" / "cache",
                    help="Vidur's cache: profile datasets and trained predictors "
                         "(default .vidur/cache)")
    ap.add_argument("--vidur-profiles", type=Path,
                    help="the real profile tables, to lay the cache out from (profiles.py)")
    ap.add_argument("--setup-only", action="store_true",
                    help="make the venv and the profile cache, run nothing")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                    help="also run another stepgap checkout (e.g. `git worktree add` of main) "
                         "in the same rounds, as rows `baseline ...`")
    ap.add_argument("--stepgap-child", nargs=4, metavar=("TRACE", "K", "MODE", "ROOT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.stepgap_child:
        trace, k, mode, root = args.stepgap_child
        stepgap_child(Path(trace), int(k), mode, Path(root))
        return 0
    ensure_cache(args.vidur_cache, args.vidur_profiles)   # first: it needs no install
    vidur_py = ensure_vidur(args.vidur_venv, args.python)
    if args.setup_only:
        print(f"Vidur ready: {vidur_py}, profile datasets in {args.vidur_cache}")
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    trace, warm = out / "trace.csv", out / "trace-warmup.csv"
    write_trace(trace, args.num_prompts)
    write_trace(warm, min(100, args.num_prompts))
    run = runners(args, vidur_py, trace, out)
    print(f"warm-up round on {warm.name} (Vidur trains its predictors here on a fresh cache)",
          flush=True)
    for name, f in run.items():
        f(warm)
    rounds = []
    for i in range(args.repeat):
        order = list(run) if i % 2 == 0 else list(run)[::-1]
        rounds.append({name: run[name](trace) for name in order})
        rounds[-1] = {name: rounds[-1][name] for name in run}
        print(f"round {i + 1}/{args.repeat}: " + ", ".join(
            f"{n} {s['wall_s']:.2f} s" for n, s in rounds[-1].items()), flush=True)
    for name, s in rounds[0].items():
        if s["requests"] != args.num_prompts:
            fail(f"{name} simulated {s['requests']} requests, not {args.num_prompts}")
    text = table(rounds)
    print()
    print(text)
    (out / "side_by_side.json").write_text(json.dumps({"rounds": rounds}, indent=1))
    (out / "side_by_side.txt").write_text(text + "\n")
    print(f"\nraw figures: {out / 'side_by_side.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
