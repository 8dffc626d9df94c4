"""Real vLLM runs on two GPUs, predicted from the same GPUs' measured operator tables (issue 22).

    python bench/peer_gpu.py                          # judge traces/peers/llmservingsim, print
    python bench/peer_gpu.py --write                  # ... and rewrite its report and figures
    python bench/peer_gpu.py --build traces/peers/llmservingsim \\
        --from ../shared/gpu-peers/llmservingsim --dataset WORKLOAD.jsonl   # (re)build it

The folder holds LLMServingSim's files as it publishes them (MIT; its LICENSE and the source
commit in peers.json): each run's `vllm/` (requests.jsonl, meta.json, timeseries.csv), its own
prediction (validation/summary.txt, outputs/sim.csv.gz), the GPU's perf bundle (meta.yaml and
tp1/ tables), and the dataset the runs replayed (workloads/, gzipped; its sha256 is the runs'
dataset_hash). Each run is simulated twice, from its tables and from the roofline alone, with
the settings its meta.json records, and set beside the measurement and LLMServingSim's own
prediction; then the same run with each modelling choice taken away in turn (the ablation).
The whole table takes well under a minute on one core.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import hashlib
import json
import math
import shutil
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.calibrate.judge import load_known_misses  # noqa: E402
from stepgap.calibrate.peers import (PEER_BOUNDS, PERCENTILES, judge_run, load_peers,  # noqa
                                     peer_failures, peer_prediction)
from stepgap.common.fileio import write_json, write_text  # noqa: E402

FOLDER = ROOT / "traces" / "peers" / "llmservingsim"
COMMIT = "5daddb21a545658d5150b535712d0494584b5278"
RUNS = (("rtx4090-llama-3.1-8b", "RTX4090", "rtx4090"),
        ("rtxpro6000-llama-3.1-8b", "RTXPRO6000", "rtxpro6000"))
STATS = ("mean", "median", "p90", "p99")
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))
# Each modelling choice taken away in turn (the ablation): SimConfig overrides, or a patch.
ABLATION = (("as judged", {}, None),
            ("no prefix caching", {"enable_prefix_caching": False}, None),
            ("prefix caching without the dataset's token ids (requests.jsonl alone)", {},
             ("stepgap.common.peer_run.find_dataset", lambda path: None)),
            ("no skew correction (decodes at their mean history only)", {},
             ("stepgap.sim.tables.SkewFit.alpha", lambda self, *a: 0.0)),
            ("admit by first chunk (no reserve_full_isl)", {"scheduler_reserve_full_isl": False},
             None))


# -------------------------------------------------------------------------------------------
# Building the folder from the peer's files


def build(dest: Path, src: Path, dataset: Path) -> None:
    """Copy what the judge reads, unchanged, under the peer's own paths."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "LICENSE", dest / "LICENSE")
    runs = []
    for name, gpu, entry in RUNS:
        run = Path("bench/examples") / gpu / "Llama-3.1-8B"
        tables = Path("profiler/perf") / gpu / "meta-llama/Llama-3.1-8B/bf16"
        for rel in ("vllm/requests.jsonl", "vllm/meta.json", "vllm/timeseries.csv",
                    "validation/summary.txt", "config.json"):
            (dest / run / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / run / rel, dest / run / rel)
        (dest / run / "outputs").mkdir(exist_ok=True)
        with open(src / run / "outputs/sim.csv", "rb") as f:
            (dest / run / "outputs/sim.csv.gz").write_bytes(gzip.compress(f.read(), mtime=0))
        for rel in ("meta.yaml", "tp1/dense.csv", "tp1/attention.csv", "tp1/per_sequence.csv"):
            (dest / tables / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / tables / rel, dest / tables / rel)
        runs.append({"name": name, "run": str(run), "tables": str(tables), "gpu": entry,
                     "model": "llama-3.1-8b"})
    meta = json.loads((src / runs[0]["run"] / "vllm/meta.json").read_text())
    data = dataset.read_bytes()
    if hashlib.sha256(data).hexdigest() != meta["dataset_hash"]:
        raise SystemExit(f"{dataset}: not the dataset the runs replayed (sha256 differs from "
                         "meta.json's dataset_hash)")
    (dest / meta["dataset_path"]).parent.mkdir(parents=True, exist_ok=True)
    (dest / (meta["dataset_path"] + ".gz")).write_bytes(gzip.compress(data, mtime=0))
    write_json(dest / "peers.json", {
        "source": {"repository": "github.com/casys-kaist/LLMServingSim", "commit": COMMIT,
                   "licence": "MIT (LICENSE, which travels with these files)",
                   "copied": "unchanged, under their own paths; outputs/sim.csv and the "
                             "dataset gzipped; the perf bundles' tp1 tables only",
                   "dataset": f"{meta['dataset_path']} at that commit (sha256 "
                              f"{meta['dataset_hash']}, the runs' dataset_hash)"},
        "runs": runs})
    print(f"built {dest}")


# -------------------------------------------------------------------------------------------
# Judging


def peer_itl(run) -> dict:
    """LLMServingSim's simulated ITL (outputs/sim.csv[.gz], ns) as the run-result keys."""
    path = run.run / "outputs" / "sim.csv.gz"
    if not path.is_file():
        return {}
    gaps = []
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            gaps += json.loads(row["ITL"])
    v = np.asarray(gaps, float) / 1e6
    return {"mean_itl_ms": float(v.mean()), "median_itl_ms": float(np.median(v)),
            **{f"p{p}_itl_ms": float(np.percentile(v, p)) for p in PERCENTILES}}


def pct(sim, meas) -> str:
    if sim is None or meas is None or (isinstance(meas, float) and math.isnan(meas)) \
            or (isinstance(sim, float) and math.isnan(sim)) or not meas:
        return "-"
    return f"{100 * (sim - meas) / meas:+.1f} %"


def num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.2f}"


def table(run, judged: dict, roof: dict, peer: dict) -> list[str]:
    m, s, r = judged["measured"], judged["simulated"], roof["simulated"]
    rows = ["| metric (ms) | vLLM measured | stepgap, tables | error | stepgap, roofline | "
            "error | LLMServingSim | error |", "|---|---|---|---|---|---|---|---|"]
    for key, label in METRICS:
        for stat in STATS:
            k = f"{stat}_{key}_ms"
            name = {"mean": "mean", "median": "P50", "p90": "P90", "p99": "P99"}[stat]
            rows.append(f"| {name} {label} | {num(m.get(k))} | {num(s.get(k))} | "
                        f"{pct(s.get(k), m.get(k))} | {num(r.get(k))} | "
                        f"{pct(r.get(k), m.get(k))} | {num(peer.get(k))} | "
                        f"{pct(peer.get(k), m.get(k))} |")
    rows.append(f"| running requests, peak | {num(m.get('running_peak'))} | "
                f"{num(s.get('running_peak'))} | {pct(s.get('running_peak'), m.get('running_peak'))}"
                f" | {num(r.get('running_peak'))} | "
                f"{pct(r.get('running_peak'), m.get('running_peak'))} | - | - |")
    return rows


def series_figure(results: list[tuple], path: Path) -> None:
    """Running and waiting requests over time, measured against simulated, one panel a run."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 3.6 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), 1, squeeze=False)[:, 0]
    for ax, (run, judged, roof) in zip(axes, results):
        meas, sim = judged["series"].get("measured"), judged["series"]["simulated"]
        rs = roof["series"]["simulated"]
        for key, color in (("running", "tab:blue"), ("waiting", "tab:orange")):
            if meas:
                ax.plot(meas["t"], meas[key], color=color, lw=2.2, alpha=0.45,
                        label=f"{key}, vLLM measured")
            ax.plot(sim["t"], sim[key], color=color, lw=1.0, label=f"{key}, stepgap (tables)")
            ax.plot(rs["t"], rs[key], color=color, lw=0.8, ls=":",
                    label=f"{key}, stepgap (roofline)")
        ax.set_title(f"{run.name}: vLLM 0.19.0, 300 ShareGPT requests at ~10/s", fontsize=10)
        ax.set_xlabel("time since the first request (s)")
        ax.set_ylabel("requests")
        ax.legend(fontsize=7, ncols=3, loc="upper right")
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=FOLDER)
    ap.add_argument("--write", action="store_true", help="rewrite the folder's report.md and "
                                                         "series.png")
    ap.add_argument("--build", type=Path, metavar="DEST", help="build a peer folder at DEST")
    ap.add_argument("--from", dest="src", type=Path, metavar="DIR",
                    help="the peer's files (../shared/gpu-peers/llmservingsim)")
    ap.add_argument("--dataset", type=Path, metavar="FILE",
                    help="the dataset the runs replayed (LLMServingSim's "
                         "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl)")
    args = ap.parse_args(argv)
    if args.build:
        if not (args.src and args.dataset):
            ap.error("--build needs --from and --dataset")
        build(args.build, args.src, args.dataset)
        args.folder = args.build
    t0 = time.process_time()
    source, runs = load_peers(args.folder)
    misses = load_known_misses(args.folder, metrics=tuple(k for k, _, _ in PEER_BOUNDS))
    lines, results, fails = [], [], []
    for run in runs:
        judged, roof = judge_run(run), judge_run(run, tables=False)
        peer = {**peer_prediction(run), **peer_itl(run)}
        results.append((run, judged, roof))
        fails += peer_failures(run.name, judged["errors"], misses)
        lines += [f"## {run.name}", "", *table(run, judged, roof, peer), ""]
        lines += ["Settings and what is not modelled:", ""]
        lines += [f"- {n}" for n in dict.fromkeys(judged["notes"])]
        dc = judged["simulated"]["config"]["resolved"].get("device_costs", {})
        lines += [f"- {op}: {src}" for op, src in dc.items() if op != "profile"]
        pc = judged["simulated"]["config"]["resolved"].get("prefix_cache")
        if pc:
            lines.append(f"- prefix cache (simulated, tokens): {pc['hits']:,} of "
                         f"{pc['queries']:,} prompt tokens hit; after a preemption "
                         f"{pc['preempted_hits']:,} of {pc['preempted_queries']:,}")
        lines += ["", "Ablation (each choice taken away in turn; errors of the tables' "
                      "prediction):", "",
                  "| | " + " | ".join(label for _, label, _ in PEER_BOUNDS) + " |",
                  "|---|" + "---|" * len(PEER_BOUNDS)]
        for label, over, patch in ABLATION:
            if not (over or patch):
                e = judged["errors"]
            else:
                with mock.patch(*patch) if patch else contextlib.nullcontext():
                    e = judge_run(run, **over)["errors"]
            lines.append(f"| {label} | " + " | ".join(f"{100 * e[k]:+.1f} %"
                                                     for k, _, _ in PEER_BOUNDS) + " |")
        lines.append("")
    cpu = time.process_time() - t0
    head = ["# Peer GPU runs: real vLLM 0.19.0 against stepgap, from the GPUs' own operator "
            "tables", "",
            f"- source: {source.get('repository')} at {source.get('commit', '?')[:7]}, "
            f"{source.get('licence')}",
            "- measured: vLLM 0.19.0, Llama-3.1-8B bf16, TP 1, 300 ShareGPT requests at about "
            "10/s, async scheduling, chunked prefill (2048), prefix caching, CUDA graphs; "
            "TTFT = first token - queued, TPOT = (last - first) / (output - 1), E2EL = last "
            "token - queued (vLLM's RequestStateStats); ITL is not recorded",
            "- simulated: `stepgap simulate --trace RUN/vllm/requests.jsonl --device-profile "
            "TABLES --gpu GPU` (settings from the run's meta.json); roofline: the same without "
            "--device-profile",
            "- LLMServingSim: its own prediction as it published it (validation/summary.txt; "
            "ITL from outputs/sim.csv)",
            f"- made by: `python bench/peer_gpu.py --write` ({cpu:.0f} s of CPU on this VM)",
            "",
            "Bounds (errors signed, simulated - measured): " + ", ".join(
                f"{label} within ±{100 * b:g} %" for _, label, b in PEER_BOUNDS) + ".", "",
            f"**Bounds broken beyond the known misses: {len(fails)}**" +
            ("".join(f"\n- {f}" for f in fails) if fails else ""), "",
            "![running and waiting requests, measured and simulated](series.png)", ""]
    text = "\n".join(head + lines)
    print(text)
    if args.write:
        write_text(args.folder / "report.md", text + "\n")
        series_figure(results, args.folder / "series.png")
        print(f"wrote {args.folder}/report.md and series.png")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
