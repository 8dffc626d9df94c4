"""The full-scale measurement on one CUDA GPU, in one command and a fixed time budget.

    python bench/gpu_measure.py                 # on a GPU: writes out/gpu-measure (3-5 minutes)
    python bench/gpu_measure.py --device cpu    # the same sweep, tiny, on a CPU: out/cpu-measure

The device defaults to cuda when torch sees one, else cpu.

On a GPU it builds a random-weight Llama-3.1-8B target in bf16 directly on the device and a
random-weight EAGLE-3 head of the matching shape (taps 2, 16, 29; draft vocabulary 32000),
accepts drafts synthetically with the MT-bench profile of DESIGN.md §6 (the models still run), and
sweeps mode x k x max-concurrency (sync, async, zero-bubble x 0, 2, 4 x 1, 8, 32) over MT-bench-
like prompts with 128 output tokens, through the inline executor with CUDA graphs. On the CPU it
runs the same sweep with the tiny model of `make-tiny` and short requests.

Everything goes to one folder, in six small files:
  env.json            GPU, driver, torch, nvidia-smi; measured copy bandwidth and bf16 GEMM
                      TFLOP/s; the self-check; build and capture times
  results.jsonl       one run result per cell (vllm bench serve keys, step gaps, acceptance)
  timelines.jsonl.gz  the spans of each cell (steps 10..310), with a "cell" field
  profile.json        device op times by (op, draft pass, tokens, requests, KV blocks, graph),
                      and CPU op times by (op, requests): what the simulator calibrates from
  summary.txt         the table of the sweep
  log.txt             the progress printed while it ran

Before the sweep, a self-check runs the tiny pair (built in memory, no files) on the device in
float64, eager and with CUDA graphs, in all modes, greedy and with replayed acceptance, against
the same runs on the CPU; the tokens must be equal. Cells that would overrun --budget-s are
skipped and listed. Needs torch and numpy only (no safetensors, no transformers).
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.loop import EngineConfig, run_trace  # noqa: E402
from engine.executor import InlineExecutor  # noqa: E402
from engine.sampler import MTBENCH_ACCEPTANCE, SamplingConfig  # noqa: E402
from engine.tiny import TINY_TARGET  # noqa: E402
from engine.worker import WorkerSpec  # noqa: E402
from common.formats import TraceRequest  # noqa: E402
from common.scheduler import cdiv  # noqa: E402
from common.workloads import mtbench_like  # noqa: E402

MODES = ("sync", "async", "zero-bubble")
TIMELINE_STEPS = (10, 310)


class Log:
    def __init__(self, path: Path):
        self.f = path.open("w")
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


# -- environment and microbenchmarks ----------------------------------------------------------


def environment(device: torch.device) -> dict:
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


def microbench(device: torch.device) -> dict:
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
    del x, y, a, b
    return {"copy_bytes": nbytes, "copy_GBps_read_plus_write": 2 * nbytes / copy_s / 1e9,
            "gemm_n": n, "gemm_dtype": str(dtype).split(".")[-1],
            "gemm_TFLOPs": 2 * n ** 3 / mm_s / 1e12}


# -- self-check ---------------------------------------------------------------------------------


def selfcheck(device: torch.device, log) -> dict:
    """The tiny pair in float64 on the device, against the CPU: eager and CUDA-graph paths, all
    modes, greedy (lossless) and replayed acceptance (so that drafts are accepted too)."""
    reqs = [TraceRequest(f"c{i}", 0.0, 5 + 11 * i, 12 + 3 * i) for i in range(6)]
    replayed = [TraceRequest(r.request_id, 0.0, r.prompt_len, r.output_len,
                             accepted=[(i + j) % 4 for j in range(r.output_len)])
                for i, r in enumerate(reqs)]

    def worker(dev: str, graphs: bool):
        return InlineExecutor(WorkerSpec("tiny", "tiny-eagle3", dev, "float64", 256,
                                         max_model_len=256, max_num_seqs=4, max_k=3,
                                         cuda_graphs=graphs,
                                         emulate_graphs=graphs and dev == "cpu"))

    def tokens(ex, mode, k, replay=False):
        cfg = EngineConfig(mode, k, 256, 4, 8192, 256, SamplingConfig(replay=replay))
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


# -- the sweep --------------------------------------------------------------------------------


def trim_spans(spans, cell: str) -> list[dict]:
    lo, hi = TIMELINE_STEPS
    return [{**s.to_dict(), "cell": cell} for s in spans if lo <= s.step < hi]


def add_profile(profile: dict, spans) -> None:
    for s in spans:
        a = s.args or {}
        if s.lane == "device":
            key = (s.op, a.get("i"), a.get("tokens"), a.get("reqs"), a.get("blocks"),
                   a.get("graph"))
        else:
            key = (s.op, a.get("reqs"), a.get("tokens"), None, None, None)
        profile[(s.lane, *key)].append(s.end_us - s.start_us)


def profile_json(profile: dict) -> dict:
    rows = []
    for (lane, op, i, tokens, reqs, blocks, graph), d in sorted(
            profile.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        d = sorted(d)
        rows.append({"lane": lane, "op": op, "i": i, "tokens": tokens, "reqs": reqs,
                     "blocks": blocks, "graph": graph, "count": len(d),
                     "median_us": statistics.median(d), "p10_us": d[len(d) // 10],
                     "p90_us": d[(9 * len(d)) // 10]})
    return {"unit": "us", "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", default=None,
                    help="output folder (default out/gpu-measure, or out/cpu-measure on a CPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="wall-clock budget for everything; cells past it are skipped")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--ks", default="0,2,4")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--output-len", type=int, default=None,
                    help="output tokens per request (default 128 on cuda, 8 on cpu)")
    ap.add_argument("--max-prompts", type=int, default=32,
                    help="requests per cell: min(max-prompts, max(8, 2 x concurrency))")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--skip-selfcheck", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_measure: no CUDA device here; use --device cpu for the tiny sweep",
              file=sys.stderr)
        return 2
    t_start = time.monotonic()
    out = Path(args.out or ("out/gpu-measure" if args.device == "cuda" else "out/cpu-measure"))
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "log.txt")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # the tiny model gains nothing from more threads
    modes = [m for m in args.modes.split(",") if m]
    ks, concs = parse_ints(args.ks), parse_ints(args.concurrency)
    output_len = args.output_len or (128 if cuda else 8)

    env = environment(device)
    log(f"device {env.get('gpu', 'cpu')}, torch {torch.__version__}")
    env["microbench"] = microbench(device)
    log(f"copy {env['microbench']['copy_GBps_read_plus_write']:.0f} GB/s (read+write), "
        f"GEMM {env['microbench']['gemm_TFLOPs']:.1f} TFLOP/s "
        f"({env['microbench']['gemm_dtype']} {env['microbench']['gemm_n']}^3)")
    if not args.skip_selfcheck:
        try:
            env["selfcheck"] = selfcheck(device, log)
        except Exception:  # measure anyway; the failure is in env.json and the log
            env["selfcheck"] = {"all_equal": False, "error": traceback.format_exc()}
            log(f"self-check crashed:\n{env['selfcheck']['error']}")
        log(f"self-check: {'PASSED' if env['selfcheck']['all_equal'] else 'FAILED'}")

    traces = {c: mtbench_like(min(args.max_prompts, max(8, 2 * c)), output_len) for c in concs}
    longest = max(r.prompt_len + r.output_len for t in traces.values() for r in t)
    max_k, max_conc = max(ks), max(concs)
    max_model_len = longest + 16
    num_blocks = max_conc * cdiv(max_model_len + max_k, 16) + 16
    t = time.monotonic()
    if cuda:
        target, draft, vocab = "llama-3.1-8b", "llama-3.1-8b-eagle3", 128256
    else:
        target, draft, vocab = "tiny", "tiny-eagle3", TINY_TARGET.vocab_size
    spec = WorkerSpec(target, draft if max_k else None, args.device, None, num_blocks,
                      max_model_len, max_conc, max(max_k, 1), cuda and not args.no_cuda_graphs)
    ex = InlineExecutor(spec)
    if cuda:
        torch.cuda.synchronize(device)
    env["build_s"] = time.monotonic() - t
    env["worker"] = ex.info()
    env["sweep"] = {"modes": modes, "ks": ks, "concurrency": concs, "output_len": output_len,
                    "num_prompts": {str(c): len(t) for c, t in traces.items()},
                    "max_model_len": max_model_len, "num_blocks": num_blocks,
                    "acceptance": list(MTBENCH_ACCEPTANCE), "budget_s": args.budget_s}
    log(f"built {target} + {draft} in {env['build_s']:.1f}s; {num_blocks} KV blocks; "
        f"max_model_len {max_model_len}")

    results, spans_out, skipped = [], [], []
    profile = defaultdict(list)
    capture_s = {}
    cell_s = []
    for k in ks:
        sampling = SamplingConfig(synthetic=MTBENCH_ACCEPTANCE[:k] if k else None, seed=0)
        t = time.monotonic()
        warm = [TraceRequest(f"w{i}", 0.0, 32 + i, 16) for i in range(4)]
        try:  # warm-up: graph capture for this k, kernels, the allocator
            run_trace(ex, warm, EngineConfig("zero-bubble", k, num_blocks, max_conc, 8192,
                                             max_model_len, sampling), vocab_size=vocab)
        except Exception:
            log(f"k={k}: warm-up FAILED\n{traceback.format_exc()}")
        capture_s[k] = time.monotonic() - t
        log(f"k={k}: warm-up and graph capture {capture_s[k]:.1f}s")
        for conc in concs:
            for mode in modes:
                cell = f"{mode}/k{k}/c{conc}"
                elapsed = time.monotonic() - t_start
                expect = statistics.median(cell_s) if cell_s else 0.0
                if elapsed + expect > args.budget_s - 15:
                    skipped.append(cell)
                    log(f"{cell}: skipped (budget)")
                    continue
                t = time.monotonic()
                cfg = EngineConfig(mode, k, num_blocks, max_conc, 8192, max_model_len, sampling)
                try:
                    run = run_trace(ex, traces[conc], cfg, vocab_size=vocab,
                                    max_concurrency=conc, detailed=True,
                                    config={"cell": cell, "mode": mode, "k": k,
                                            "max_concurrency": conc, **ex.info(),
                                            "cuda_graphs": spec.cuda_graphs and cuda,
                                            "executor": "inline",
                                            "synthetic_acceptance": list(sampling.synthetic or [])})
                except Exception:
                    log(f"{cell}: FAILED\n{traceback.format_exc()}")
                    results.append({"config": {"cell": cell}, "error": traceback.format_exc()})
                    continue
                cell_s.append(time.monotonic() - t)
                res = run.result
                res.pop("output_token_ids", None)
                results.append(res)
                spans_out += trim_spans(run.spans, cell)
                add_profile(profile, run.spans)
                gaps = res["step_gaps"]
                log(f"{cell:22} TPOT {res['mean_tpot_ms']:7.2f} ms  P99 {res['p99_tpot_ms']:7.2f}"
                    f"  ITL {res['mean_itl_ms']:7.2f}  gap p50 {gaps.get('median_us', 0):7.0f} us"
                    f"  p90 {gaps.get('p90_us', 0):7.0f}  ({cell_s[-1]:.1f}s)")
    env["capture_s"] = {str(k): v for k, v in capture_s.items()}
    env["graph_error"] = ex.worker.graph_error
    env["skipped"] = skipped
    env["total_s"] = time.monotonic() - t_start

    with (out / "results.jsonl").open("w") as f:
        for r in results:
            f.write(json.dumps(r, default=str) + "\n")
    with gzip.open(out / "timelines.jsonl.gz", "wt") as f:
        for s in spans_out:
            f.write(json.dumps(s) + "\n")
    (out / "profile.json").write_text(json.dumps(profile_json(profile)) + "\n")
    (out / "env.json").write_text(json.dumps(env, indent=1, default=str) + "\n")
    (out / "summary.txt").write_text(summary(results, env))
    log(f"done in {env['total_s']:.0f}s; wrote {out}/ (results.jsonl, timelines.jsonl.gz, "
        "profile.json, env.json, summary.txt, log.txt)")
    return 0


def summary(results: list[dict], env: dict) -> str:
    passed = env.get("selfcheck", {}).get("all_equal")
    lines = [f"stepgap gpu_measure on {env.get('gpu', 'cpu')} (torch {env['torch']}); "
             f"self-check {'passed' if passed else 'n/a or FAILED'}",
             f"{'cell':22} {'TPOT':>7} {'P99TPOT':>8} {'ITL':>7} {'P99ITL':>7} {'gap50':>7} "
             f"{'gap90':>7} {'AL':>5} {'steps':>6}  (ms; gaps in us)"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['config']['cell']:22} FAILED")
            continue
        g = r["step_gaps"]
        al = r.get("spec_decode", {}).get("acceptance_length", 1.0)
        lines.append(f"{r['config']['cell']:22} {r['mean_tpot_ms']:7.2f} {r['p99_tpot_ms']:8.2f} "
                     f"{r['mean_itl_ms']:7.2f} {r['p99_itl_ms']:7.2f} "
                     f"{g.get('median_us', 0):7.0f} {g.get('p90_us', 0):7.0f} {al:5.2f} "
                     f"{g.get('count', 0) + 1:6}")
    if env.get("skipped"):
        lines.append("skipped (budget): " + ", ".join(env["skipped"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
