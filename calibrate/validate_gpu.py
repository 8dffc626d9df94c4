"""`stepgap validate-gpu`: the engine at Llama-3.1-8B scale on one CUDA GPU, held to the simulator.

The GPU twin of `stepgap validate`, on the same harness (calibrate/harness.py) and into the same
measured folder (calibrate/measured.py), in one command and a fixed time budget:

    stepgap validate-gpu --out out/h200            # on a GPU: 3-5 minutes
    stepgap validate-gpu --device cpu --out out/c  # the same plan, tiny, on a CPU (the tests)

1. The machine: GPU, driver, torch, nvidia-smi; the measured copy bandwidth and bf16 GEMM
   throughput (env.json).
2. A self-check: the tiny pair (built in memory) in float64 on the device, eager and with CUDA
   graphs, in all modes, greedy and with replayed acceptance, against the same runs on the CPU;
   the tokens must be equal.
3. The plan: a random-weight Llama-3.1-8B target in bf16 with a random EAGLE-3 head of the
   matching shape (taps 2, 16, 29; draft vocabulary 32000), drafts accepted synthetically by the
   MT-bench profile (the simulator's own acceptance model; the models still run), through the
   inline executor with CUDA graphs; sync, async and zero-bubble x k 0, 2, 4 x max-concurrency
   1, 8, 32 on MT-bench-like prompts; calibration runs of its own on other prompts (another
   seed) and a microbenchmark grid, so that the comparison is a prediction. On the CPU: the tiny
   pair and short requests.

The folder (manifest.json, profile.json, runs/, timelines/, report.md, figures, env.json,
log.txt) is what traces/measured/<gpu>/ commits; `--tar` packs it into one file to bring back.
Cells that would overrun --budget-s are skipped and listed. Needs torch and numpy only.
"""

from __future__ import annotations

import io
import json
import platform
import subprocess
import tarfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

from stepgap.calibrate.validate import MAX_CALIBRATION_PROMPTS, MAX_REPEATS
from stepgap.common.errors import UserError
from stepgap.common.fileio import check_writable, write_bytes, write_json
from stepgap.common.formats import MODES
from stepgap.common.options import (add_command, add_option, at_most, positive_float,
                                    positive_int)

GPU_CONCURRENCY = "1,8,32"


class Log:
    """Timestamped lines (seconds since start) to stdout and to `path` (`mode` "a": appended)."""

    def __init__(self, path: Path, mode: str = "w"):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = path.open(mode)
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


# -- environment and microbenchmarks ----------------------------------------------------------


def environment(device) -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "platform": platform.platform(), "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2 ** 30, 1),
                   sm_count=p.multi_processor_count, cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
        for args, key in ((["nvidia-smi"], "nvidia_smi"),
                          (["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                            "clocks.max.sm,clocks.max.mem,power.limit,pstate",
                            "--format=csv"], "nvidia_smi_query")):
            try:
                env[key] = subprocess.run(args, capture_output=True, text=True,
                                          timeout=20).stdout
            except (OSError, subprocess.SubprocessError) as e:
                env[key] = f"unavailable: {e}"
    return env


def _time_it(device, fn, iters: int) -> float:
    """Seconds per call of fn, after a warm-up call."""
    import torch
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1000 / iters
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def microbench(device) -> dict:
    import torch
    cuda = device.type == "cuda"
    nbytes = 2 ** 30 if cuda else 2 ** 26
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    copy_s = _time_it(device, lambda: y.copy_(x), 20 if cuda else 3)
    n = 8192 if cuda else 512
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    mm_s = _time_it(device, lambda: a @ b, 20 if cuda else 3)
    return {"copy_bytes": nbytes, "copy_GBps_read_plus_write": 2 * nbytes / copy_s / 1e9,
            "gemm_n": n, "gemm_dtype": str(dtype).split(".")[-1],
            "gemm_TFLOPs": 2 * n ** 3 / mm_s / 1e12}


# -- self-check ---------------------------------------------------------------------------------


def selfcheck(device, log) -> dict:
    """The tiny pair in float64 on the device, against the CPU: eager and CUDA-graph paths, all
    modes, greedy (lossless) and replayed acceptance (so that drafts are accepted too)."""
    from stepgap.common.formats import TraceRequest
    from stepgap.engine.args import EngineArgs
    from stepgap.engine.loop import run_trace
    from stepgap.engine.sampler import SamplingConfig
    from stepgap.engine.tiny import TINY_TARGET
    reqs = [TraceRequest(f"c{i}", 0.0, 5 + 11 * i, 12 + 3 * i) for i in range(6)]
    replayed = [TraceRequest(r.request_id, 0.0, r.prompt_len, r.output_len,
                             accepted=[(i + j) % 4 for j in range(r.output_len)])
                for i, r in enumerate(reqs)]

    base = EngineArgs(model="tiny", draft="tiny-eagle3", dtype="float64",
                      num_gpu_blocks_override=256, max_model_len=256, max_num_seqs=4, max_k=3)

    def worker(dev: str, graphs: bool):
        return base.with_(device=dev, cuda_graphs=graphs,
                          emulate_graphs=graphs and dev == "cpu").make_executor()

    def tokens(ex, mode, k, replay=False):
        cfg = base.with_(sampling=SamplingConfig(replay=replay)).engine_config(mode, k)
        out = run_trace(ex, replayed if replay else reqs, cfg,
                        vocab_size=TINY_TARGET.vocab_size)
        assert out.num_free_blocks == out.num_blocks, "KV blocks leaked"
        return out.output_token_ids, any((s.args or {}).get("graph") for s in out.spans)

    cpu = worker("cpu", False)
    reference = {False: tokens(cpu, "sync", 0)[0], True: tokens(cpu, "sync", 3, True)[0]}
    eager = worker(device.type, False)
    graphs = worker(device.type, True)  # on the CPU: the graphs' padded path, emulated
    cells = []
    for name, ex, mode, k, replay in (
            ("eager", eager, "sync", 0, False), ("eager", eager, "sync", 3, False),
            ("graphs", graphs, "sync", 3, False), ("graphs", graphs, "async", 3, False),
            ("graphs", graphs, "zero-bubble", 3, False),
            ("graphs", graphs, "zero-bubble", 0, False),
            ("eager", eager, "zero-bubble", 3, True), ("graphs", graphs, "sync", 3, True),
            ("graphs", graphs, "async", 3, True), ("graphs", graphs, "zero-bubble", 3, True)):
        cell = {"path": name, "mode": mode, "k": k, "replayed_acceptance": replay}
        try:
            got, replays = tokens(ex, mode, k, replay)
            cell.update(equal=got == reference[replay], graph_replays=replays)
        except Exception:
            cell.update(equal=False, error=traceback.format_exc())
        cells.append(cell)
        log(f"self-check {name:6} {mode:11} k={k}{' replay' if replay else '':7}: "
            f"{'equal' if cell['equal'] else 'DIFFERENT OR FAILED'}")
    return {"all_equal": all(c["equal"] for c in cells), "cells": cells}


# -- the plan ----------------------------------------------------------------------------------


def gpu_plan(args, cuda: bool):
    """The plan: full-size random models on a GPU, the tiny pair on a CPU."""
    from stepgap.calibrate.fit import GridShape
    from stepgap.calibrate.harness import Plan
    from stepgap.calibrate.validate import grid_lists
    from stepgap.common.acceptance import PROFILES
    from stepgap.common.workloads import mtbench_like
    from stepgap.engine.args import EngineArgs
    from stepgap.engine.sampler import SamplingConfig
    output_len = args.output_len or (128 if cuda else 8)
    modes, ks, concs = grid_lists(args)
    n = args.prompts or (32 if cuda else 4)
    judged = mtbench_like(n, output_len, seed=0)
    calibration = [replace(r, request_id=f"calib-{i:03d}")
                   for i, r in enumerate(mtbench_like(n, output_len, seed=1))]
    model, draft = ("llama-3.1-8b", "llama-3.1-8b-eagle3") if cuda else ("tiny", "tiny-eagle3")
    engine = EngineArgs(model=model, draft=draft, executor="inline", device=args.device,
                        cuda_graphs=cuda and not args.no_cuda_graphs,
                        sampling=SamplingConfig(synthetic=PROFILES["mtbench"]))
    grid = GridShape(reqs=(1, 8, 32), contexts=(128, 512), queries=(64,), repeats=3) if cuda \
        else GridShape(reqs=(1, 2), contexts=(64,), queries=(16,), repeats=1)
    slices = {c: min(n, max(8, 2 * c)) if cuda else min(n, 2 * c) for c in concs}
    return Plan(engine, modes, ks, concs, judged,
                calibration, None, args.repeats, max(slices.values()), max(slices.values()),
                grid, judged_name=f"{n} MT-bench-like prompts (seed 0), output {output_len}",
                calibration_name=f"{n} MT-bench-like prompts (seed 1), output {output_len}",
                device_name="gpu" if cuda else "cpu", slice_by_conc=slices,
                budget_s=args.budget_s)


# -- the command --------------------------------------------------------------------------------


def register(sub) -> None:
    p = add_command(
        sub, "validate-gpu", help="the engine at Llama-3.1-8B scale on a CUDA GPU, against the "
                             "simulator (stepgap validate's GPU twin)",
        description=__doc__.split("\n\n")[1], epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default out/gpu-validate, or out/cpu-validate on a CPU)")
    add_option(p, "device", help="default: cuda if torch sees one, else cpu")
    p.add_argument("--budget-s", type=positive_float, default=330.0,
                   help="wall-clock budget of the plan; judged runs past it are skipped")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--ks", default="0,2,4")
    p.add_argument("--concurrency", default=GPU_CONCURRENCY)
    p.add_argument("--repeats", type=at_most(positive_int, MAX_REPEATS), default=1,
                   help=f"judged runs per cell (default 1, at most {MAX_REPEATS})")
    p.add_argument("--prompts", type=at_most(positive_int, MAX_CALIBRATION_PROMPTS), default=None,
                   help="prompts in the judged and in the calibration trace (default 32; 4 on "
                        "a CPU); a run takes min(prompts, max(8, 2 x concurrency))")
    add_option(p, "output_len", help="output tokens per request (default 128 on cuda, 8 on cpu)")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--skip-selfcheck", action="store_true")
    p.add_argument("--tar", action="store_true", help="also pack the folder into DIR.tar.gz")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_validate_gpu)


def cmd_validate_gpu(args) -> int:
    import torch

    from stepgap.calibrate.harness import run_plan
    from stepgap.calibrate.measured import write_measured
    from stepgap.calibrate.report import write_report
    from stepgap.calibrate.validate import command_line, grid_lists
    grid_lists(args)   # a grid that is a typo fails before the folder and its log are made
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device here; use --device cpu for the tiny plan")
    out = Path(args.out or ("out/gpu-validate" if cuda else "out/cpu-validate"))
    check_writable(out, "--out", folder=True)
    if args.tar:
        check_writable(f"{out}.tar.gz", "--tar")
    log = Log(out / "log.txt")
    device = torch.device(args.device)
    if not cuda:
        torch.set_num_threads(1)  # the tiny model gains nothing from more threads
    env = environment(device)
    log(f"device {env.get('gpu', 'cpu')}, torch {torch.__version__}")
    env["microbench"] = microbench(device)
    mb = env["microbench"]
    log(f"copy {mb['copy_GBps_read_plus_write']:.0f} GB/s (read+write), GEMM "
        f"{mb['gemm_TFLOPs']:.1f} TFLOP/s ({mb['gemm_dtype']} {mb['gemm_n']}^3)")
    if not args.skip_selfcheck:
        try:
            env["selfcheck"] = selfcheck(device, log)
        except Exception:  # measure anyway; the failure is in env.json and the log
            env["selfcheck"] = {"all_equal": False, "error": traceback.format_exc()}
            log(f"self-check crashed:\n{env['selfcheck']['error']}")
        log(f"self-check: {'PASSED' if env['selfcheck']['all_equal'] else 'FAILED'}")
    plan = gpu_plan(args, cuda)
    log(f"plan: {plan.engine.model} + {plan.engine.draft}, {len(plan.modes)} modes x k "
        f"{plan.ks} x concurrency {plan.concs}, {plan.repeats} repeat(s)")
    m = run_plan(plan, progress=not args.quiet, log=log)
    env["skipped"] = m.skipped
    env["total_s"] = round(time.monotonic() - log.t0, 1)
    write_json(out / "env.json", json.loads(json.dumps(env, default=str)))
    gpu = env.get("gpu", "cpu")
    write_measured(plan, m, out, command_line("validate-gpu"),
                   extra={"title": f"Llama-3.1-8B + EAGLE-3 (random weights) on {gpu}" if cuda
                          else "The tiny pair on the CPU (inline)",
                          "microbench": mb, "selfcheck_passed":
                          env.get("selfcheck", {}).get("all_equal")})
    write_report(out, command_line("validate-gpu"), args.quiet)
    log(f"done in {env['total_s']:.0f}s; wrote {out}/")
    if args.tar:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(out, arcname=out.name)
        write_bytes(f"{out}.tar.gz", buf.getvalue())
        log(f"packed {out}.tar.gz")
    return 0
