"""Real vLLM runs on GPUs, predicted from the same GPUs' measured operator tables.

    python bench/peer_gpu.py                          # judge traces/peers/llmservingsim, print
    python bench/peer_gpu.py --write                  # ... and rewrite its report and figures
    python bench/peer_gpu.py --build traces/peers/llmservingsim \\
        --from ../shared/gpu-peers/llmservingsim --dataset WORKLOAD.jsonl \\
        --hardware 1b2cc02=HARDWARE.yaml --hardware e08dc38=HARDWARE.yaml   # (re)build it

The folder holds LLMServingSim's files as it publishes them (MIT; its LICENSE and the source
commits in peers.json): each run's `vllm/` (requests.jsonl, meta.json, timeseries.csv), its own
prediction (validation/summary.txt, outputs/sim.csv.gz), the GPU's perf bundle (meta.yaml and
the tp<N>/ tables the run needs), the datasets the runs replayed (workloads/, gzipped; each
one's sha256 is its runs' dataset_hash), and the RTX PRO 6000 pair's measured collectives
(its hardware.yaml at LLMServingSim's commits 1b2cc02, beside the tables, and e08dc38, under
at-e08dc38/; the search tool's read_file gives them, `--hardware COMMIT=FILE` copies them).
Each run is simulated from its tables and from the roofline alone, with the settings its
meta.json records, and set beside the measurement and LLMServingSim's own prediction; then
with each modelling choice taken away in turn (the ablation).
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
# name, GPU folder, run folder, model's bundle folder, preset, TP, --gpu (catalog or file)
RUNS = (("rtx4090-llama-3.1-8b", "RTX4090", "Llama-3.1-8B", "meta-llama/Llama-3.1-8B",
         "llama-3.1-8b", 1, "rtx4090"),
        ("rtxpro6000-llama-3.1-8b", "RTXPRO6000", "Llama-3.1-8B", "meta-llama/Llama-3.1-8B",
         "llama-3.1-8b", 1, "rtxpro6000"),
        # the collectives of the pair as measured 2026-09-08: what the run's own step times
        # show (bench/peer_tp.py; docs/explanation/measured-tables.md, "What TP 2 over PCIe costs")
        ("rtxpro6000-qwen3-32b-tp2", "RTXPRO6000", "Qwen3-32B", "Qwen/Qwen3-32B", "qwen3-32b", 2,
         "at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml"))
# LLMServingSim's measurements of the RTX PRO 6000 pair's collectives, by commit
HARDWARE = {"1b2cc02": "profiler/perf/RTXPRO6000/hardware.yaml",
            "e08dc38": "at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml"}
COMMITS = {"1b2cc02": "1b2cc02d67a2647c9f0d67bf07debf240aba82b5 (written 2026-10-02, measured "
                      "2026-09-26 with ACS and IOMMU off)",
           "e08dc38": "e08dc388d0e919df6ef92623f943e092e8ea20b3 (measured 2026-09-08)"}
# Runs priced a second way, beside the judged one: label, SimConfig overrides
VARIANTS = {"rtxpro6000-qwen3-32b-tp2": (
    ("tables, collectives of hardware.yaml at 1b2cc02 (measured 2026-09-26)",
     {"gpu": "rtxpro6000"}),)}
STATS = ("mean", "median", "p90", "p99")
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))
# Each modelling choice taken away in turn (the ablation): SimConfig overrides, or a patch.
ABLATION = (("as judged", {}, None),
            ("no prefix caching", {"enable_prefix_caching": False}, None),
            ("prefix caching without the dataset's token ids (requests.jsonl alone)", {},
             ("stepgap.common.peer_run.find_dataset", lambda path: None)),
            ("no skew correction (decodes at their mean history only)", {},
             ("stepgap.sim.table_interp.SkewFit.alpha", lambda self, *a: 0.0)),
            ("admit by first chunk (no reserve_full_isl)", {"scheduler_reserve_full_isl": False},
             None),
            ("NCCL for every all-reduce (no custom all-reduce; TP runs)", {},
             ("stepgap.sim.hardware.all_reduce_path", lambda *a: "nccl")))


# -------------------------------------------------------------------------------------------
# Building the folder from the peer's files


def build(dest: Path, src: Path, datasets: list[Path], hardware: dict[str, Path]) -> None:
    """Copy what the judge reads, unchanged, under the peer's own paths."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "LICENSE", dest / "LICENSE")
    runs, replayed = [], {}
    for name, gpu, folder, model, preset, tp, entry in RUNS:
        run = Path("bench/examples") / gpu / folder
        tables = Path("profiler/perf") / gpu / model / "bf16"
        for rel in ("vllm/requests.jsonl", "vllm/meta.json", "vllm/timeseries.csv",
                    "validation/summary.txt", "config.json"):
            (dest / run / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / run / rel, dest / run / rel)
        (dest / run / "outputs").mkdir(exist_ok=True)
        with open(src / run / "outputs/sim.csv", "rb") as f:
            (dest / run / "outputs/sim.csv.gz").write_bytes(gzip.compress(f.read(), mtime=0))
        for rel in ("meta.yaml", *(f"tp{tp}/{t}.csv" for t in ("dense", "attention",
                                                              "per_sequence", "skew_fit"))):
            if (src / tables / rel).is_file():
                (dest / tables / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src / tables / rel, dest / tables / rel)
        runs.append({"name": name, "run": str(run), "tables": str(tables), "gpu": entry,
                     "model": preset})
        meta = json.loads((src / run / "vllm/meta.json").read_text())
        replayed[meta["dataset_hash"]] = meta["dataset_path"]
    for digest, rel in replayed.items():   # each dataset, as LLMServingSim keeps it or given
        for cand in [src / (rel + ".gz"), src / rel, *datasets]:
            data = cand.read_bytes() if cand.is_file() else b""
            if cand.suffix == ".gz" and data:
                data = gzip.decompress(data)
            if data and hashlib.sha256(data).hexdigest() == digest:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                (dest / (rel + ".gz")).write_bytes(gzip.compress(data, mtime=0)
                                                   if cand.suffix != ".gz" else
                                                   cand.read_bytes())
                break
        else:
            raise SystemExit(f"{rel}: no dataset with the runs' dataset_hash {digest[:12]}... "
                             "under --from or in --dataset")
    for commit, rel in HARDWARE.items():
        if commit not in hardware:
            raise SystemExit(f"--hardware {commit}=FILE: LLMServingSim's "
                             f"profiler/perf/RTXPRO6000/hardware.yaml at {commit} (read_file)")
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(hardware[commit], dest / rel)
    write_json(dest / "peers.json", {
        "source": {"repository": "github.com/casys-kaist/LLMServingSim", "commit": COMMIT,
                   "licence": "MIT (LICENSE, which travels with these files)",
                   "copied": "unchanged, under their own paths; outputs/sim.csv and the "
                             "Llama dataset gzipped; the perf bundles' tables at the runs' TP "
                             "degrees only",
                   "datasets": [f"{rel} at that commit (sha256 {d}, its runs' dataset_hash)"
                                for d, rel in replayed.items()],
                   "hardware": {rel: f"profiler/perf/RTXPRO6000/hardware.yaml at {COMMITS[c]}"
                                for c, rel in HARDWARE.items()}},
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
    m, s, r = (judged["measured"].metrics, judged["simulated"].metrics,
               roof["simulated"].metrics)
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
    m, s, r = judged["running_peak"]["measured"], judged["running_peak"]["simulated"], \
        roof["running_peak"]["simulated"]
    rows.append(f"| running requests, peak | {num(m)} | {num(s)} | {pct(s, m)} | {num(r)} | "
                f"{pct(r, m)} | - | - |")
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
    ap.add_argument("--dataset", type=Path, metavar="FILE", action="append", default=[],
                    help="a dataset the runs replayed that --from lacks (LLMServingSim's "
                         "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl)")
    ap.add_argument("--hardware", action="append", default=[], metavar="COMMIT=FILE",
                    help="LLMServingSim's profiler/perf/RTXPRO6000/hardware.yaml at a commit "
                         f"({', '.join(HARDWARE)})")
    args = ap.parse_args(argv)
    if args.build:
        if not args.src:
            ap.error("--build needs --from")
        build(args.build, args.src, args.dataset,
              {c: Path(f) for c, _, f in (h.partition("=") for h in args.hardware)})
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
        for label, over in VARIANTS.get(run.name, ()):
            e = judge_run(run, **over)["errors"]
            lines += [f"The same, {label}: " + ", ".join(
                f"{name} {100 * e[k]:+.1f} %" for k, name, _ in PEER_BOUNDS) + ".", ""]
        lines += ["Settings and what is not modelled:", ""]
        lines += [f"- {n}" for n in dict.fromkeys(judged["notes"])]
        dc = judged["simulated"].resolved.get("device_costs", {})
        lines += [f"- {op}: {src}" for op, src in dc.items() if op != "profile"]
        pc = judged["simulated"].prefix_cache
        if pc:
            lines.append(f"- prefix cache (simulated, tokens): {pc['hits']:,} of "
                         f"{pc['queries']:,} prompt tokens hit; after a preemption "
                         f"{pc['preempted_hits']:,} of {pc['preempted_queries']:,}")
        lines += ["", "Ablation (each choice taken away in turn; errors of the tables' "
                      "prediction):", "",
                  "| | " + " | ".join(label for _, label, _ in PEER_BOUNDS) + " |",
                  "|---|" + "---|" * len(PEER_BOUNDS)]
        tp = judged["config"].tensor_parallel_size
        for label, over, patch in ABLATION:
            if ("TP runs" in label and tp == 1) or ("skew" in label and run.name.startswith(
                    "rtx4090")):
                continue   # nothing to take away: no all-reduces, no skew fit measured
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
            f"{source.get('licence')}; the RTX PRO 6000 pair's collectives: "
            + "; ".join(f"`{k}`, LLMServingSim's {v}"
                        for k, v in (source.get("hardware") or {}).items()),
            "- measured: vLLM 0.19.0, bf16, 300 ShareGPT requests at about 10/s, async "
            "scheduling, chunked prefill (2048), prefix caching, CUDA graphs: Llama-3.1-8B at TP "
            "1 on each GPU, Qwen3-32B at TP 2 on two RTX PRO 6000s over PCIe; TTFT = first "
            "token - queued, TPOT = (last - first) / (output - 1), E2EL = last token - queued "
            "(vLLM's RequestStateStats); ITL is not recorded",
            "- simulated: `stepgap simulate --model MODEL --gpu GPU --device-profile TABLES "
            "--trace RUN/vllm/requests.jsonl` (settings from the run's meta.json; GPU a catalog "
            "entry, or for the TP 2 run the pair's hardware.yaml of 2026-09-08, whose collectives "
            "the run's own step times show: bench/peer_tp.py); roofline: the same without "
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
    text = "\n".join(head + lines).replace(f"{ROOT}/", "")   # paths as the repository's
    print(text)
    if args.write:
        write_text(args.folder / "report.md", text + "\n")
        series_figure(results, args.folder / "series.png")
        print(f"wrote {args.folder}/report.md and series.png")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
