"""Turn a measurement of bench/vllm/measure.py into a measured folder, judged and reported.

    python bench/vllm/build_folder.py out/vllm-cpu traces/measured/vllm-cpu

- profile.json: `stepgap calibrate`'s fit (calibrate/vllm_fit.py) on the sync calibration runs
  (k in the plan's calibrate_ks, every concurrency; prompts cut from the corpus's training
  files), with their timelines from bench/vllm/stepgap_hooks spans cut to each run's window;
- runs/<cell>.json.gz: every judged run (the held-out prompts) as a run result, each request's
  chunks sized by vLLM's own tokens of every chunk (the token capture), so that the simulator
  replays vLLM's accepted count of every step;
- timelines/: the first judged run of each k=2, concurrency-1 cell from its hook spans (beside
  the same run re-simulated, in the report's timeline.png), and the profiled k=2,
  concurrency-1 runs, vLLM's torch-profiler traces ingested (calibrate/vllm.py);
- profiled.png: those profiled runs above the simulator's prediction of the very same runs
  (the README's figure);
- tokens.json.gz: vLLM's output token ids and chunks of every held-out prompt per k (the
  engine's test holds stepgap's engine to them);
- manifest.json (the measured format), then report.md and the figures (calibrate/report.py).
The known misses are written by hand into known_misses.toml, after reading the report.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stepgap.common.cpu_load import summary as cpu_summary  # noqa: E402
from stepgap.calibrate.measured import FORMAT as MEASURED, git_commit, requests_of, save_runs, trim  # noqa: E402,E501
from stepgap.calibrate.samples import device_points  # noqa: E402
from stepgap.calibrate.fit import add_device, device_vs_profile  # noqa: E402
from stepgap.calibrate.harness import cell_name, machine_info  # noqa: E402
from stepgap.calibrate.judge import SYNC_ONLY_PROFILE  # noqa: E402
from stepgap.calibrate.vllm import acceptance_from_scrapes, read_source, vllm_timeline  # noqa: E402
from stepgap.calibrate.vllm_fit import Run, calibrate_runs  # noqa: E402
from stepgap.common.fileio import write_json  # noqa: E402
from stepgap.common.formats import save_timeline, step_gaps  # noqa: E402
from stepgap.common.run_result import StepGaps, bench_result  # noqa: E402
from stepgap.common.vllm_bench import is_bursty, read_bench  # noqa: E402
from stepgap.sim.profile import save_profile  # noqa: E402

PAIR = ROOT / "checkpoints" / "pystdlib"
BLOCK_SIZE = 128   # vLLM's CPU default (vllm/platforms/cpu.py)
TIMELINE_STEPS = (40, 80)   # the steps of the judged runs' timelines kept


def chunks_of(src: Path, server: str, dataset: str) -> dict[str, list[int]]:
    """request id -> tokens per chunk, from the token capture of one server and dataset."""
    doc = json.loads((src / "tokens" / f"{server}-{dataset}.json").read_text())
    return {r["request_id"]: [len(c) for c in r["chunks"]] for r in doc["requests"]}


@functools.lru_cache(maxsize=None)
def hook_sources(folder: Path) -> tuple:
    """A server's hook span files, read once."""
    return tuple(read_source(f) for f in sorted(folder.glob("*.jsonl")))


def run_of(src: Path, r: dict, hooks: bool = True) -> Run:
    doc = read_bench(src / "results" / f"{r['name']}.json")
    m = src / "metrics"
    acc = acceptance_from_scrapes((m / f"{r['name']}.after.txt").read_text(),
                                  (m / f"{r['name']}.before.txt").read_text()) if r["k"] else None
    t0, t1 = r["window_s"]
    run = Run(r["name"], src / "results" / f"{r['name']}.json", doc, r["k"], r["mode"],
              r["conc"], (t0 * 1e6, t1 * 1e6), acceptance=acc)
    if hooks:
        # a measurement resumed later started its servers again: their files (one per process)
        # are the ones whose spans reach into the run's window
        sources = [h for h in hook_sources(src / "hooks" / f"{r['mode']}-k{r['k']}")
                   if h.events and h.events[0]["ts"] <= run.window[1]
                   and h.events[-1]["ts"] >= run.window[0]]
        run.spans = vllm_timeline(sources, run.window)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="bench/vllm/measure.py's output folder")
    ap.add_argument("out", help="the measured folder to write")
    args = ap.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    plan = json.loads((src / "plan.json").read_text())
    ids = [json.loads(line)["request_id"] for line in
           (src / "data" / "heldout.jsonl").read_text().splitlines()]
    for sub in ("runs", "timelines", "simulated", "models"):
        shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)

    # runs during which other processes used more than the limit, even after their reruns,
    # are left out (and named in the manifest)
    over = [r["name"] for r in plan["runs"] if r.get("over_limit")]
    plan_runs = [r for r in plan["runs"] if not r.get("over_limit")]
    # the calibration: sync runs (and the one async cell) on the calibration prompts, with
    # their hook timelines
    calib = [run_of(src, r) for r in plan_runs if r["kind"] == "calibration"]
    scheduler = {"max_num_seqs": plan["max_num_seqs"], "max_model_len": plan["max_model_len"],
                 "block_size": BLOCK_SIZE}
    meta = {"machine": machine_info(), "vllm": plan["vllm"], "cpus": plan["cpus"],
            "model": {"target": str(PAIR / "target"), "draft": str(PAIR / "eagle3")},
            "scheduler": scheduler}
    profile = calibrate_runs(calib, meta)
    # the same without the async calibration cell: what a user with sync runs only gets
    sync_only = calibrate_runs([r for r in calib if r.mode == "sync"], meta)
    for p, name in ((profile, "profile.json"), (sync_only, SYNC_ONLY_PROFILE)):
        p.about["model"] = {"target": "models/target", "draft": "models/eagle3"}
        save_profile(out / name, p)
    for name in ("target", "eagle3"):
        (out / "models" / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(PAIR / name / "config.json", out / "models" / name / "config.json")

    # the judged runs
    cells, runs, bursty, device = [], {}, [], {}
    fitted_ks = sorted({f.k for f in profile.fits})
    for r in plan_runs:
        if r["kind"] != "judged":
            continue
        doc = read_bench(src / "results" / f"{r['name']}.json")
        if is_bursty(doc):   # its client was starved: it timed the client
            bursty.append(r["name"])
            continue
        sizes = chunks_of(src, f"{r['mode']}-k{r['k']}", "heldout")
        chunk_tokens = [sizes[i] for i in ids]
        matched = sum(len(c) == len(itl) + 1 for c, itl in zip(chunk_tokens, doc["itls"]))
        res = bench_result(doc, src / "results" / f"{r['name']}.json", chunk_tokens, ids,
                           {"mode": r["mode"], "k": r["k"], "max_concurrency": r["conc"],
                            "max_num_seqs": plan["max_num_seqs"],
                            "max_model_len": plan["max_model_len"], "slice": r["rep"],
                            "enable_prefix_caching": False,   # --no-enable-prefix-caching
                            "chunks_as_captured": matched, "load_avg_1m": r["load_avg_1m"],
                            "cpu_s": r["cpu_s"]})
        # the run's step gaps, from its own hook timeline (a bench file has none)
        spans = run_of(src, r).spans
        res["step_gaps"] = StepGaps.of(step_gaps(spans), detailed=True).to_dict()
        name = cell_name(r["mode"], r["k"], r["conc"])
        runs.setdefault(name, []).append(trim(res))
        add_device(device.setdefault(name, {}), device_points(spans, r["k"]))
    for mode in plan["modes"]:
        for k in plan["ks"]:
            for conc in plan["concurrency"]:
                name = cell_name(mode, k, conc)
                if not runs.get(name):
                    continue
                f = f"runs/{name}.json.gz"
                save_runs(out / f, runs.get(name, []))
                cells.append({"mode": mode, "k": k, "max_concurrency": conc, "runs": f,
                              "num_runs": len(runs.get(name, [])),
                              "info": {"async_patch": mode == "async", "device_vs_profile":
                                       device_vs_profile(device[name], profile, min(
                                           fitted_ks, key=lambda f: abs(f - k)))}})

    # vLLM's tokens of every held-out prompt, per k (from the sync servers)
    tokens = {}
    for k in plan["ks"]:
        doc = json.loads((src / "tokens" / f"sync-k{k}-heldout.json").read_text())
        tokens[str(k)] = [{"request_id": r["request_id"], "chunks": r["chunks"]}
                          for r in doc["requests"]]
    with gzip.open(out / "tokens.json.gz", "wt") as f:
        json.dump(tokens, f, separators=(",", ":"))

    # the judged runs' own timelines (their hook spans: vLLM's scopes, engine core and API
    # server), k=2 concurrency 1, for the report's figure beside the same runs re-simulated
    timeline_cells = []
    for r in plan_runs:
        if (r["kind"], r["k"], r["conc"], r["rep"]) == ("judged", 2, 1, 0) \
                and r["name"] not in bursty:
            name = cell_name(r["mode"], r["k"], r["conc"])
            spans = run_of(src, r).spans
            save_timeline(out / "timelines" / f"{name}.measured.jsonl",
                          [s for s in spans if TIMELINE_STEPS[0] <= s.step < TIMELINE_STEPS[1]])
            timeline_cells.append(name)

    loads = [r["load_avg_1m"] for r in plan["runs"]]
    started = min(r["window_s"][0] for r in plan["runs"])
    other = [r["other_cpu"] for r in plan_runs if r.get("other_cpu")]
    other_cpu = cpu_summary(other, limit_core=plan.get("max_other_cpu"),
                            reruns=sum(len(r.get("reruns", [])) for r in plan["runs"]),
                            left_out_over_limit=over, quiet_machine=plan.get("quiet"))
    manifest = {
        "format": MEASURED, "device": "vllm-cpu",
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "wall_s": round(sum(r["wall_s"] for r in plan["runs"]), 1),
        "load_avg_1m": {"min": min(loads), "max": max(loads),
                        "mean": round(statistics.fmean(loads), 2)},
        "other_cpu": other_cpu,
        "title": "vLLM 0.32.0 (CPU build) serving the trained pair", "machine": machine_info(),
        "commit": git_commit(), "command": "python bench/vllm/measure.py && python "
                                           "bench/vllm/build_folder.py",
        "vllm": plan["vllm"], "cpus": plan["cpus"], "repeats": plan["repeats"],
        "slice": plan["num_prompts"],
        "note": "async rows ran vLLM's own async path on its CPU build with "
                "bench/vllm/cpu_async_patch.py: a configuration vLLM does not support",
        "traces": {"judged": "checkpoints/pystdlib/heldout.jsonl (48 prompts)",
                   "judged_prompts": len(ids),
                   "calibration": "48 prompts cut from the corpus's training files (seed 1)",
                   "calibration_runs": len(calib),
                   "left_out_bursty_client": bursty},
        "sim": {"gpu": "cpu", "model": "models/target", "draft": "models/eagle3",
                "executor": "process", "device": "cpu", "topology": "vllm",
                "profile": "profile.json", "block_size": BLOCK_SIZE,
                "max_num_seqs": plan["max_num_seqs"], "max_model_len": plan["max_model_len"]},
        "timeline": {"cells": sorted(timeline_cells), "steps": list(TIMELINE_STEPS)},
        "cells": cells}
    write_json(out / "manifest.json", manifest)
    from stepgap.calibrate.report import write_report
    write_report(out, "python bench/vllm/build_folder.py " + " ".join(sys.argv[1:]))
    profiled_figure(src, out, plan)
    return 0


def profiled_figure(src: Path, out: Path, plan: dict, k: int = 2, conc: int = 1) -> None:
    """profiled.png: each mode's profiled run at k, concurrency `conc` as vLLM's torch-profiler
    trace shows it (with the engine core's and API server's hook spans of the same run), above
    the simulator's prediction of that very run (its prompts, vLLM's chunks replayed)."""
    from stepgap.calibrate.judge import sim_config
    from stepgap.calibrate.measured import load_measured
    from stepgap.common import timeline_plots
    from stepgap.sim.loop import simulate
    setup, _ = load_measured(out)
    ids = [json.loads(line)["request_id"] for line in
           (src / "data" / "calibration.jsonl").read_text().splitlines()]
    panels = []
    if not any((p["k"], p["conc"]) == (k, conc) for p in plan.get("profiles", [])):
        print(f"profiled.png: no profiled run at k={k}, concurrency {conc} in this measurement; "
              "no figure", file=sys.stderr)
        return
    for p in plan["profiles"]:
        if (p["k"], p["conc"]) != (k, conc):
            continue
        path = src / "results" / f"{p['name']}.json"
        doc = read_bench(path)
        sizes = chunks_of(src, f"{p['mode']}-k{k}", "calibration")
        mine = ids[:len(doc["output_lens"])]   # the bench took the first prompts, in order
        run = (bench_result(doc, path, [sizes[i] for i in mine], mine,
                                        {"mode": p["mode"], "k": k, "max_concurrency": conc}))
        t0, t1 = p["window_s"]
        traces = [src / t for t in p["traces"] if t.endswith(".gz")]
        hooks = hook_sources(src / "hooks" / f"{p['mode']}-k{k}")
        measured = vllm_timeline([*traces, *hooks], (t0 * 1e6, t1 * 1e6))
        _, simulated = simulate(sim_config(setup, run, timeline=True, jitter=False),
                                requests_of(run))
        name = cell_name(p["mode"], k, conc)
        save_timeline(out / "timelines" / f"{name}.profiled.jsonl",
                      [s for s in measured if 10 <= s.step < 40])
        panels += [timeline_plots.Panel(f"{p['mode']}: vLLM's torch-profiler trace", "",
                                        measured),
                   timeline_plots.Panel(f"{p['mode']}: the simulator, the same run", "",
                                        simulated)]
    steps = (20, 23)
    fig = timeline_plots.timeline_figure(
        panels, steps=steps, title=f"vLLM 0.32.0 (CPU build), k={k}, concurrency {conc}: a "
        f"profiled run, steps {steps[0]}-{steps[1]}, and the simulator's prediction of it")
    timeline_plots.save(fig, out / "profiled.png")


if __name__ == "__main__":
    raise SystemExit(main())
