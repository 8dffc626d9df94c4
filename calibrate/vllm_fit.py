"""`stepgap calibrate`: fit the simulator to a user's own vLLM runs, to predict the rest.

From measured vLLM runs of one setup (`vllm bench serve --save-result --save-detailed` files;
where given, the timelines of the same runs: torch-profiler traces or bench/vllm/stepgap_hooks
span files; and `/metrics` scrapes around them) it fits, for the simulator's vLLM topology
(sim/loop.py, docs/explanation/vllm.md):

- the device ops (target_forward, rejection_sample, each draft_forward pass, d2h) as linear
  fits over the step's tokens and requests, per speculation depth k (calibrate/fit.py's form);
- the CPU terms: schedule and update_from_output (engine core), prepare_inputs and launch
  (worker), the worker's RPC turnaround between execute_model and sample_tokens (`rpc_mid`),
  the engine core's take_draft_token_ids round trip (`rpc_drafts`), the result's latency, the
  IPC trip, and the API server's `add_request` and `process_outputs`;
- the client's latency (the HTTP path, from the API server's chunk to the client: the TTFT left
  over once the rest is simulated), and the level of the device costs against the runs' own
  mean ITL (1 when the timelines come from the same runs without the profiler);
- the acceptance the runs saw (per k), and the machine's noise.

It refuses to fit what the data do not determine: a coefficient whose feature does not vary
(every run at one concurrency: no per-request slope) is left at 0 and named, with what would
determine it; a term with no samples is left out and named. The profile it writes says what
was fitted, on which runs, and the residual of every run re-simulated.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from stepgap.calibrate.fit import MIN_POINTS, fit_cpu, fit_determined, fit_jitter, step_series
from stepgap.calibrate.samples import cpu_samples, device_points, steps_of
from stepgap.common.acceptance import FILE_FORMAT
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_text
from stepgap.common.options import add_command
from stepgap.common.run_result import Metrics, RunResult
from stepgap.sim.profile import CpuFit, Fit, Profile, save_profile

# A device fit's columns (sim/profile.py FEATURES), as what is not determined names them.
DEVICE_FEATURES = ("fixed", "per token", "per request", "per padded KV slot")


# ---------------------------------------------------------------------------------------------
# Measured runs


@dataclass
class Run:
    name: str
    path: Path
    doc: dict                      # the bench file
    k: int
    mode: str | None               # None: not said (a bench file does not record the server's)
    conc: int | None
    window: tuple[float, float]    # epoch microseconds
    spans: list | None = None      # the run's timeline, where given
    profiled: bool = False          # the timeline is a torch-profiler trace (the profiler's
                                    # overhead in it), not hook spans of the run itself
    acceptance: dict | None = None  # from its scrapes, else its bench file
    notes: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> Metrics:
        """The bench file's numbers, by vLLM's names."""
        return Metrics.from_dict(self.doc)


def bench_window(doc: dict) -> tuple[float, float]:
    """The run's wall-clock window, epoch microseconds: the bench writes its finishing time
    (`date`, local, to the second) and its duration."""
    end = time.mktime(time.strptime(doc["date"], "%Y%m%d-%H%M%S")) + 1.0
    return (end - float(Metrics.from_dict(doc).duration) - 2.0) * 1e6, (end + 1.0) * 1e6


def classify(paths) -> dict[str, list]:
    """Inputs by kind: bench files, torch-profiler traces, hook span files (read: Sources),
    scrapes; folders are walked, and each file is taken once (one given twice, or inside a
    folder also given, is refused, naming both). In a folder, a JSON file that holds no bench
    file (by its keys) and a .jsonl whose first line is no stepgap_hooks span are skipped
    (`skipped`, with why); a .json that is not valid JSON is refused (a broken bench file, for
    all calibrate can tell), as is a bench file with a bad field (`load_runs`) and whatever is
    named on the command line and is not what its name says."""
    from stepgap.calibrate.vllm import HOOK_LINE, read_hooks
    from stepgap.common.fileio import input_files, read_bytes, read_json
    from stepgap.common.vllm_bench import BENCH_KEYS, is_bench
    out = defaultdict(list)
    files = input_files(paths)
    from stepgap.calibrate.bench_fit import check_bench_count   # before any file is read
    check_bench_count(sum(1 for f, _ in files if f.name.endswith(".json")
                          and not f.name.endswith(".pt.trace.json")), paths)
    for f, walked in files:
        n = f.name
        if n.endswith((".pt.trace.json", ".pt.trace.json.gz")):
            out["traces"].append(f)
        elif n.endswith(".jsonl"):
            data = read_bytes(f)
            if walked and not HOOK_LINE.match(data[:256]):
                out["skipped"].append(f"{f}: skipped, not a stepgap_hooks span file (its first "
                                      "line is no span)")
                continue
            out["hooks"].append(read_hooks(f, data))
        elif n.endswith(".txt") and (".before." in n or ".after." in n or "metrics" in n):
            out["scrapes"].append(f)
        elif n.endswith(".json"):
            # in a folder, JSON that is no bench file (by its keys) is skipped with a note; a
            # bench file with a bad field is refused, as one named explicitly is
            if walked:
                try:
                    doc = read_json(f)
                except UserError as e:
                    raise UserError(f"{e}; calibrate reads each .json of a folder as a `vllm "
                                    "bench serve` file, or skips one that is valid JSON of "
                                    "other keys: mend it or move it") from None
                if not is_bench(doc):
                    out["skipped"].append(f"{f}: skipped, not a `vllm bench serve` file (it "
                                          f"lacks one of {', '.join(BENCH_KEYS)})")
                    continue
            out["bench"].append(f)
    return out


def load_runs(paths) -> tuple[list[Run], list[str]]:
    """The measured runs among `paths`, and what among the inputs no run took: each bench file
    with its scrapes (NAME.before.txt, NAME.after.txt) and its timeline (the traces whose steps
    fall in its window, else the hook spans inside it). Every bench file must come from the
    same model and client settings."""
    from stepgap.calibrate.bench_fit import check_distinct_runs
    from stepgap.calibrate.vllm import acceptance_from_scrapes, read_source, vllm_timeline
    from stepgap.common.vllm_bench import bench_k, read_bench
    kinds = classify(paths)
    if not kinds["bench"]:
        skipped = kinds["skipped"][:3] + ([f"{len(kinds['skipped']) - 3} more skipped"]
                                          if kinds["skipped"][3:] else [])
        said = f" ({'; '.join(skipped)})" if skipped else ""
        raise UserError(f"no `vllm bench serve --save-result` file among the inputs{said}: "
                        "calibrate fits the simulator to measured runs (see `stepgap calibrate "
                        "--help`)")
    runs = []
    for path in kinds["bench"]:
        doc = read_bench(path)
        runs.append(Run(path.stem, path, doc, bench_k(doc), doc.get("mode"),
                        doc.get("max_concurrency"), bench_window(doc)))
    first = runs[0]
    for r in runs[1:]:
        for key in ("model_id", "tokenizer_id", "backend", "burstiness", "request_rate"):
            if r.doc.get(key) != first.doc.get(key):
                raise UserError(f"{where(r.path, field=key)}: {r.doc.get(key)!r}, but "
                                f"{first.path} has {first.doc.get(key)!r}: calibrate fits one "
                                "setup; give the runs of one model and client")
    check_distinct_runs((r.path, r.doc) for r in runs)
    scrapes = {p.name: p for p in kinds["scrapes"]}
    for r in runs:
        before, after = scrapes.get(f"{r.name}.before.txt"), scrapes.get(f"{r.name}.after.txt")
        if after is not None and r.k:
            r.acceptance = acceptance_from_scrapes(read_text(after), read_text(before)
                                                   if before else None, after, before)
        elif r.k:
            r.acceptance = bench_acceptance(r.doc, r.path)
    traces = [read_source(p) for p in kinds["traces"]]
    used = set()
    matched = match_traces(runs, traces)
    for r in runs:
        mine = [t for t in traces if t.path in matched.get(r.name, ())]
        used.update(t.path for t in mine)
        if not (mine or kinds["hooks"]):
            continue
        # NOTE: a trace matched by what it prefilled is the run's whole timeline (`vllm bench
        # serve --profile` profiles that run alone), and the bench writes its `date` seconds
        # after the trace's last step: its window is the trace's own, not the bench's clock.
        window = (min(t.events[0]["ts"] for t in mine),
                  max(t.events[-1]["ts"] for t in mine)) if mine else r.window
        try:
            r.spans = vllm_timeline(mine + kinds["hooks"], window)
            r.profiled = bool(mine)
        except UserError as e:
            r.notes.append(f"no timeline in its window ({e})")
    unused = [f"{t.path}: prefilled {prefill_tokens(t)} prompt tokens, the total of no run "
              "given (not the trace of a run given)"
              for t in traces if t.path not in used and t.role == "worker"]
    unused += kinds["skipped"]
    unused += [f"{p}: no bench file {p.name.split('.')[0]}.json for this scrape"
               for p in kinds["scrapes"] if not any(p.name.startswith(r.name + ".")
                                                    for r in runs)]
    return runs, unused


def bench_acceptance(doc: dict, path) -> dict | None:
    """The acceptance a run saw, from its bench file (vLLM 0.32 writes the spec-decode
    counters it scraped around the run: spec_decode_*), as acceptance_from_scrapes gives it;
    None where the file has none."""
    rates = doc.get("spec_decode_per_position_acceptance_rates")
    if not rates or not doc.get("spec_decode_num_drafts"):
        return None
    from stepgap.common.vllm_bench import spec_counts
    counts = spec_counts(doc)
    return {"format": FILE_FORMAT, "k": counts.pop("k"), "rates": rates, **counts,
            "source": f"{path}: spec_decode_per_position_acceptance_rates"}


def prefill_tokens(src) -> int:
    """The prompt tokens a worker's trace prefilled: the context tokens of every step it
    annotates (`execute_context_N(T)_generation_M(T)`)."""
    from stepgap.calibrate.vllm import STEP
    return sum(int(m.group(2)) for e in src.annotations[0] if (m := STEP.match(e["name"])))


def match_traces(runs: list[Run], traces) -> dict[str, list[Path]]:
    """Each run's worker traces, matched by what a trace holds, not by the bench's clock
    (`vllm bench serve --profile` writes its `date` after /stop_profile returns, seconds after
    the last step): a trace is a run's when it prefilled that run's prompt tokens
    (total_input_tokens); where several runs prefilled the same (the same prompts run again),
    the one whose finishing time follows the trace's last event soonest takes it. Where no run
    prefilled as many (prefix caching prefills less, a recomputed preemption more), the runs
    whose time window overlaps the trace's events may take it."""
    out: dict[str, list[Path]] = {}
    for t in traces:
        if t.role != "worker" or not t.events:
            continue
        tokens, end = prefill_tokens(t), t.events[-1]["ts"]
        mine = [r for r in runs if r.metrics.total_input_tokens == tokens] or \
            [r for r in runs if r.window[0] <= end and t.events[0]["ts"] <= r.window[1]]
        if not mine:
            continue
        after = [r for r in mine if r.window[1] >= end] or mine
        best = min(after, key=lambda r: abs(r.window[1] - end))
        out.setdefault(best.name, []).append(t.path)
    return out


def infer_mode(run: Run) -> str:
    """sync, unless the run's timeline shows the engine core scheduling a step before the
    worker has finished the one before it (async scheduling); a bench file does not record the
    server's mode."""
    if run.mode:
        return run.mode
    if run.spans:
        return "async" if ahead_share(run.spans) > 0.5 else "sync"
    return "sync"


def ahead_share(spans) -> float:
    """The share of schedules that start before the previous step's device work has ended."""
    dev_end = {}
    for s in spans:
        if s.lane == "device":
            dev_end[s.step] = max(dev_end.get(s.step, s.end_us), s.end_us)
    sched = [s for s in spans if s.op == "schedule" and s.step - 1 in dev_end]
    return sum(s.start_us < dev_end[s.step - 1] for s in sched) / len(sched) if sched else 0.0


# ---------------------------------------------------------------------------------------------
# The fit


def fit_device_ops(runs: list[Run]) -> tuple[list, list[str]]:
    """One fit per (op, draft pass, k) over the determined features."""
    groups = defaultdict(list)
    for r in runs:
        for p in device_points(r.spans, r.k):
            groups[(p["op"], p["i"], p["k"])].append(p)
    fits, missing = [], []
    for (op, i, k), ps in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(ps) < MIN_POINTS:
            continue
        what = f"{op}{'' if i is None else f' pass {i}'} at k={k}"
        coef, err, miss = fit_determined([p["x"] for p in ps], [p["us"] for p in ps],
                                         DEVICE_FEATURES, what)
        fits.append(Fit(op, i, k, tuple(coef), len(ps), err, "vLLM timelines"))
        missing += [m for m in miss if "per padded KV slot" not in m]
    return fits, missing


ASYNC_FEATURES = ("a (per step)", "b (per request)", "c (per draft token)")


def async_samples(run: Run, cpu: dict, fits: list) -> dict[str, list[tuple[int, int, float]]]:
    """What vLLM's async path cost beyond its sync path in one async run, step by step
    (term -> [(reqs, draft tokens, us)], sim/cpu_costs.py VLLM_ASYNC_TERMS): its schedule and
    prepare_inputs over the sync fits of the same ops at the same shape, and its sampler and
    output over their sync device fits (the output thread's time on the worker's core)."""
    from stepgap.sim.cpu_costs import OpCost
    out = defaultdict(list)
    steps = steps_of(run.spans)
    cost = {op: OpCost(*cpu[op]) for op in ("schedule", "prepare_inputs") if op in cpu}
    for n, st in steps.items():
        dev = st["device"]
        if not dev:
            continue
        a = dev[0].args or {}
        reqs, tokens = a.get("reqs", 0), a.get("tokens", 0)
        drafts = a.get("decode", 0) * run.k
        sched, prep = st["engine"].get("schedule"), st["worker"].get("prepare_inputs")
        if sched is not None and "schedule" in cost:
            out["async_schedule"].append(
                (reqs, drafts, sched.end_us - sched.start_us - cost["schedule"](reqs, tokens)))
        if prep is not None and "prepare_inputs" in cost:
            out["async_prepare"].append(
                (reqs, drafts, prep.end_us - prep.start_us - cost["prepare_inputs"](reqs, tokens)))
    nearest = {}
    for f in fits:
        if f.op in ("rejection_sample", "d2h"):
            best = nearest.get(f.op)
            if best is None or abs((f.k or 0) - run.k) < abs((best.k or 0) - run.k):
                nearest[f.op] = f
    if len(nearest) == 2:
        per_step = defaultdict(lambda: [0, 0, 0.0])
        for pt in device_points(run.spans, run.k):
            if pt["op"] in nearest:
                st = steps[pt["step"]]["device"][0].args or {}
                row = per_step[pt["step"]]
                row[0], row[1] = st.get("reqs", 0), st.get("decode", 0) * run.k
                row[2] += pt["us"] - nearest[pt["op"]](pt["x"])
        out["async_output"] = [tuple(r) for r in per_step.values()]
    return out


def fit_async(runs: list[Run], cpu_by_k: dict, fits: list
              ) -> tuple[dict, dict, list[str], dict]:
    """The async terms from the async runs' timelines (at most the one async calibration
    cell): CpuCosts fields, their quality, what the runs left undetermined, and which run
    determined which term. Each term a + b·reqs + c·draft tokens, non-negative; a coefficient
    whose feature the runs do not vary (one k, one concurrency: draft tokens are k x requests)
    is left at 0 and named, its share carried by the others."""
    samples = defaultdict(list)
    for r in runs:
        near = min(cpu_by_k, key=lambda k: (abs(k - r.k), -k))   # the sync costs at its k
        for term, rows in async_samples(r, cpu_by_k[near], fits).items():
            samples[term] += rows
    costs, quality, missing = {}, {}, []
    for term, rows in samples.items():
        if len(rows) < MIN_POINTS:
            missing.append(f"{term}: {len(rows)} samples (needs {MIN_POINTS})")
            continue
        xs, ys = [[1.0, r, d] for r, d, _ in rows], [us for _, _, us in rows]
        coef, err, miss = fit_determined(xs, ys, ASYNC_FEATURES, term)
        costs[term] = [round(max(c, 0.0), 4) for c in coef]
        quality[term] = {"n": len(rows), "median_rel_err": round(err, 4),
                         "mean_us": round(statistics.fmean(ys), 2)}
        missing += miss
    source = {"runs": [r.name for r in runs], "terms": sorted(costs),
              "cells": sorted({f"async-k{r.k}-c{r.conc}" for r in runs})}
    return costs, quality, missing, source


def estimate_async(cpu_by_k: dict, fits: list) -> dict[int, dict]:
    """The async terms (sim/cpu_costs.py VLLM_ASYNC_TERMS) for a user with sync runs only, per
    calibrated k, from the sync runs' own fits and vLLM 0.32's code (docs/explanation/vllm.md, "What
    vLLM's async path costs"); each [a, b per request, c per draft token]:

    - `async_prepare`: GPUModelRunner._prepare_input_ids without drafts takes its common-case
      path (one slice copy) and costs about nothing; with drafts it builds two sets of index
      tensors from per-request Python lists (the sampled tokens' and the drafts' flattened
      positions, each with its source positions) and scatters both. Each set is the work the
      sync path's spec-decode metadata already is (the k's prepare_inputs over k = 0's), so
      the estimate is twice that difference, per step and per request.
    - `async_output`: the output thread (AsyncGPUModelRunnerOutput.get_output) copies and
      converts the sampled tokens once more, on the worker's core and GIL: the sync d2h fit of
      the nearest k (per step, and per request at 1 + k tokens each).
    - `async_schedule`: with drafts the AsyncScheduler keeps per-request placeholders for the
      tokens and drafts in flight, the bookkeeping update_from_output does per request: the
      k's update_from_output fit; without drafts nothing.

    Empty when the sync runs have no k = 0 (the difference needs one) or no d2h fit."""
    d2h = [f for f in fits if f.op == "d2h"]
    if 0 not in cpu_by_k or "prepare_inputs" not in cpu_by_k[0] or not d2h:
        return {}
    base = cpu_by_k[0]["prepare_inputs"]
    out = {}
    for k, c in cpu_by_k.items():
        near = min(d2h, key=lambda f: (abs((f.k or 0) - k), -(f.k or 0)))
        one, per_token, per_req = near.coef[:3]   # the features: 1, tokens, reqs, padded
        terms = {"async_output": [round(one, 4), round(per_req + per_token * (1 + k), 4), 0.0],
                 "async_prepare": [0.0, 0.0, 0.0], "async_schedule": [0.0, 0.0, 0.0]}
        if k and "prepare_inputs" in c:
            terms["async_prepare"] = [round(2 * max(x - y, 0.0), 4) for x, y in
                                      zip(c["prepare_inputs"][:2], base[:2])] + [0.0]
        if k and "update_from_output" in c:
            terms["async_schedule"] = [*c["update_from_output"][:2], 0.0]
        out[k] = terms
    return out


def calibrate_runs(runs: list[Run], meta: dict | None = None, unused: list[str] = ()
                   ) -> Profile:
    """The profile fitted on `runs`: the sync runs' device ops and CPU terms, and, where an
    async run is among them, what vLLM's async path costs beyond its sync path (fit_async);
    with its residuals. `unused`: what among the inputs no run took (`load_runs`), said where
    no sync run has a timeline."""
    sync = [r for r in runs if infer_mode(r) == "sync"]
    asyncs = [r for r in runs if r not in sync and r.spans]
    skipped = [r.name for r in runs if r not in sync and r not in asyncs]
    timed = [r for r in sync if r.spans]
    if not timed:   # why, naming the file: a trace that failed, or that matched no run
        why = [f"{r.path}: {n}" for r in sync for n in r.notes] + list(unused)
        said = f" ({why[0]}{f'; and {len(why) - 1} more' if len(why) > 1 else ''})" \
            if why else ""
        raise UserError(f"no timeline for any sync run{said}: give the runs' torch-profiler "
                        "traces (a profiled run per setup) or bench/vllm/stepgap_hooks span "
                        "files; a bench file alone does not determine the per-op costs")
    fits, missing = fit_device_ops(timed)
    jitter = fit_jitter([step_series(device_points(r.spans, r.k), {(f.op, f.i, f.k): f
                                                                     for f in fits})
                         for r in timed])
    samples, by_k = defaultdict(list), defaultdict(lambda: defaultdict(list))
    for r in timed:
        for term, rows in cpu_samples(r.spans, topology="vllm").items():
            samples[term] += rows
            by_k[r.k][term] += rows
    cpu, quality, miss = fit_cpu(samples, only_determined=True, trip=statistics.median)
    missing += miss
    cpu_by_k = {k: fit_cpu(s, only_determined=True, trip=statistics.median)[0]
                for k, s in sorted(by_k.items())}
    # Not observable in sync runs: the async worker's turnaround (it answers one RPC and takes
    # the next, already queued) is the same operation as the mid-step RPC turnaround (the
    # simulator halves both in async: sim/loop.py, docs/explanation/vllm.md).
    for c in (cpu, *cpu_by_k.values()):
        if "rpc_mid" in c:
            c["worker_turnaround"] = list(c["rpc_mid"])
    for term, why in (("schedule", "the engine core's hook spans; vLLM's profiler does not "
                       "trace the engine core, so the default stands"),
                      ("update_from_output", "the engine core's hook spans; the default stands"),
                      ("rpc_drafts", "a sync run with drafts (k > 0)"),
                      ("process_outputs", "the API server's hook spans"),
                      ("rpc_mid", "the worker's timeline")):
        if term not in cpu:
            missing.append(f"{term}: no samples (needs {why})")
    estimated = estimate_async(cpu_by_k, fits)
    async_source = {"runs": [], "terms": [], "cells": [], "from": {
        str(k): "estimated from the sync runs (estimate_async)" for k in estimated}}
    for k, costs in estimated.items():
        cpu_by_k[k].update(costs)
    if estimated:
        cpu.update(estimated[max(estimated)])
    if asyncs:
        costs, q, miss, async_source = fit_async(asyncs, cpu_by_k, fits)
        # the async runs have drafts or not: what they fit serves the ks like theirs, the
        # others keep the estimate (vLLM's async path without drafts is another code path)
        drafted = any(r.k for r in asyncs)
        same = [k for k in cpu_by_k if bool(k) == drafted]
        async_source["from"] = {str(k): "fitted on the async calibration runs (fit_async)"
                                if k in same else "estimated from the sync runs (estimate_async)"
                                if k in estimated else "none (the sync costs alone)"
                                for k in cpu_by_k}
        missing += miss
        for c in (cpu, *(cpu_by_k[k] for k in same)):
            c.update(costs)
        quality.update(q)
    about = {"device": "cpu", **(meta or {}),
             "topology": {"engine": "vllm", "executor": "process", "device": "cpu"},
             "calibration": {"runs": [r.name for r in sync], "with_timelines":
                             [r.name for r in timed], "left out": skipped,
                             "ks": sorted({r.k for r in sync}),
                             "concurrency": sorted({r.conc or 0 for r in sync}),
                             "async_terms": async_source}}
    acceptance = {str(r.k): r.acceptance for r in sync if r.acceptance}
    profile = Profile([f.rounded() for f in fits], CpuFit(cpu, quality),
                      {k: CpuFit(c) for k, c in cpu_by_k.items()}, jitter,
                      sorted(set(missing)), about, {"acceptance_by_k": acceptance})
    return fit_levels(profile, sync)


def resimulate_run(profile: Profile, run: Run, **settings) -> RunResult:
    """One measured run re-simulated with the profile (its own accepted counts where known)."""
    from stepgap.common.vllm_bench import bench_requests
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate
    reqs = bench_requests(run.doc, run.path)
    cfg = SimConfig(mode=infer_mode(run), k=run.k, gpu="cpu", device="cpu", executor="process",
                    topology="vllm", model=settings.pop("model"),
                    draft=settings.pop("draft", "eagle3"), max_concurrency=run.conc,
                    acceptance_rates=tuple(run.acceptance["rates"]) if run.acceptance else None,
                    jitter=False, **settings)
    return simulate(cfg, reqs, profile=profile)[0]


# The CPU terms a worker's torch-profiler trace times: the profiler's overhead inflates them as
# it does the device ops, so one level scales both.
TRACED_TERMS = ("prepare_inputs", "launch", "rpc_mid", "worker_turnaround")


def profiled_levels(runs: list[Run], simulated: list[float], has_api_server: bool
                    ) -> tuple[dict[int, float], float | None]:
    """The level of each k's profiled costs and, where the runs span concurrencies and no
    API-server timeline timed the per-request work, a per-request cost of each step: least
    squares of the runs' measured mean ITL over level[k] x simulated + per_request x requests in
    flight (min(concurrency, prompts)); the cost held >= 0."""
    import numpy as np
    ks = sorted({r.k for r in runs})
    flight = [min(r.conc or r.doc["num_prompts"], r.doc["num_prompts"]) for r in runs]
    x = [[s if r.k == k else 0.0 for k in ks] for r, s in zip(runs, simulated)]
    per_request = not has_api_server and len(set(flight)) > 1
    if per_request:
        x = [row + [n * 1e-3] for row, n in zip(x, flight)]   # us per request, in ms
    y = [r.metrics.mean_itl_ms for r in runs]
    coef = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)[0]
    if per_request and coef[-1] < 0:   # no cost per request: the levels alone
        return profiled_levels(runs, simulated, True)[0], 0.0
    levels = {k: float(c) for k, c in zip(ks, coef)}
    return levels, float(coef[-1]) if per_request else None


def apply_levels(profile: Profile, levels: dict[int, float], per_request: float | None) -> None:
    """Each k's fits and traced CPU terms (the nearest k's where it has none of its own) at its
    level; the per-request cost, where fitted, added to prepare_inputs' on every k."""
    from dataclasses import replace
    fitted = sorted({f.k for f in profile.fits if f.k is not None})
    fits = [f for f in profile.fits if f.k not in levels]
    for k, level in sorted(levels.items()):
        near = min(fitted, key=lambda x: (abs(x - k), -x)) if fitted else None
        for f in profile.fits:
            if f.k == near and (k or f.op != "draft_forward"):
                fits.append(replace(f.scaled(level), k=k) if near == k else replace(
                    f.scaled(level), k=k, source=f"{f.source} at k={near}, at the level of "
                                                 f"the k={k} runs"))
        cpu_near = min(profile.cpu_by_k, key=lambda x: (abs(x - k), -x)) \
            if profile.cpu_by_k else None
        if cpu_near is not None:
            base = profile.cpu_by_k[cpu_near]
            terms = {t: [round(c * level, 4) for c in v] if t in TRACED_TERMS else v
                     for t, v in base.terms.items()}
            profile.cpu_by_k[k] = CpuFit(terms, base.quality if cpu_near == k else None)
    profile.fits = sorted(fits, key=lambda f: (f.op, f.i is None, f.i or 0, f.k or 0))
    if per_request:
        for c in (profile.cpu, *profile.cpu_by_k.values()):
            if "prepare_inputs" in c.terms:
                a, b, t = c.terms["prepare_inputs"]
                c.terms["prepare_inputs"] = [a, round(b + per_request, 4), t]


def fit_levels(profile: Profile, runs: list[Run]) -> Profile:
    """The profile with the client's latency (TTFT left over) and, where the device costs come
    from profiled runs, their level against the unprofiled runs' mean ITL; and every run's
    residual. Needs the model's config (about["model"]["target"]). Runs whose client read the
    stream in bursts (bursty_share) time the client, not the engine: they are left out of both
    levels."""
    from stepgap.common.vllm_bench import is_bursty
    undetermined, notes = profile.undetermined, profile.notes
    model = (profile.about.get("model") or {}).get("target")
    if not model:
        undetermined.append("client_latency_us, level: no model config given (--model): the "
                            "runs could not be re-simulated")
        return profile
    steady = [r for r in runs if not is_bursty(r.doc)]
    scale = any(r.profiled for r in runs if r.spans)
    kw = {"model": model, "draft": (profile.about.get("model") or {}).get("draft") or "eagle3",
          **(profile.about.get("scheduler") or {})}
    ttft, itl = [], []
    for r in steady:
        res = resimulate_run(profile, r, **kw)
        ttft.append(r.metrics.mean_ttft_ms - res.metrics.mean_ttft_ms)
        itl.append(r.metrics.mean_itl_ms / res.metrics.mean_itl_ms)
    if not steady:
        undetermined.append("client_latency_us, level: no run with a steady client")
        notes["level"] = {"device_ops_scaled_by": 1.0, "why": "no run with a steady client"}
    elif scale:
        sims = [r.metrics.mean_itl_ms / x for r, x in zip(steady, itl)]
        levels, per_req = profiled_levels(steady, sims, "process_outputs" in profile.cpu.terms)
        apply_levels(profile, levels, per_req)
        notes["level"] = {
            "scaled_by_k": {str(k): round(v, 4) for k, v in sorted(levels.items())},
            "why": "the costs come from profiled runs (the profiler's overhead in every op it "
                   "records): the device fits and the worker's traced CPU terms of each k "
                   "scaled to its steady runs' mean ITL (least squares); a k without runs "
                   "takes the nearest k's"}
        if per_req is not None:   # what the timelines left undetermined, the runs determine
            undetermined[:] = [m for m in undetermined
                               if not m.startswith("prepare_inputs: b (per request)")]
            notes["level"]["per_request_us"] = round(per_req, 1)
            notes["level"]["per_request_why"] = (
                "what a step gained per request in flight, fitted from the steady runs' mean "
                "ITL at their concurrencies (a trace of one request at a time leaves it "
                "undetermined, and no API-server timeline times it), added to "
                "prepare_inputs' per-request cost: where in the step it is spent is not "
                "determined")
    else:
        notes["level"] = {"device_ops_scaled_by": 1.0,
                          "why": "the device costs come from the runs' own hook spans "
                                 "(no profiler in them)",
                          "measured_over_simulated_itl": [round(x, 4) for x in itl]}
    if steady:
        for c in (profile.cpu, *profile.cpu_by_k.values()):
            c.terms["client_latency_us"] = round(max(0.0, statistics.median(ttft) * 1e3), 1)
    notes["residuals"] = []
    for r in runs:
        res = resimulate_run(profile, r, **kw)
        notes["residuals"].append({
            "run": r.name, "k": r.k, "conc": r.conc,
            **({"profiled": True} if r.profiled else {}),
            **({"merged_chunks": True} if r not in steady else {}),
            **{m: round((res.metrics.get(m) - r.metrics.get(m)) / r.metrics.get(m), 4)
               for m in ("mean_tpot_ms", "mean_itl_ms", "mean_ttft_ms", "mean_e2el_ms",
                         "p99_tpot_ms")}})
    return profile


def errors(residual: dict, metrics: tuple) -> str:
    """A residual's errors of the mean of `metrics`, as printed: "mean TPOT +1.2 %, ..."."""
    return ", ".join(f"mean {m.upper()} {100 * residual[f'mean_{m}_ms']:+.1f} %"
                     for m in metrics)


# ---------------------------------------------------------------------------------------------
# The commands


CALIBRATE_EPILOG = """\
the workflow: profile a short vLLM sync run, bench two concurrencies, calibrate, predict.
  vllm serve MODEL --no-async-scheduling --profiler-config '{...}' ...     (as in ingest)
  vllm bench serve ... --max-concurrency 1 --save-result --save-detailed --profile
  vllm bench serve ... --max-concurrency 4 --save-result --save-detailed --profile
  stepgap calibrate runs/ prof/ --model MODEL --draft HEAD --out profile.json
  stepgap simulate --profile profile.json --model MODEL --draft HEAD -k 4 --async-scheduling \\
      --trace runs/RESULT.json ...     # another k, concurrency or mode of the same setup

Inputs (files or folders, sorted by their content): `vllm bench serve --save-result
--save-detailed` files (the runs: their TTFT, ITL and per-request lengths); the runs' timelines,
torch-profiler traces (*.pt.trace.json.gz, each matched to the run that prefilled its prompt
tokens) or bench/vllm/stepgap_hooks span files (*.jsonl, cut by each run's window); and /metrics
scrapes named RUN.before.txt / RUN.after.txt (the acceptance each run saw). Each file is read
once; in a folder, valid JSON that is no bench file and a .jsonl that is no span file are
skipped with a note, and a .json that does not parse is an error. Only sync runs are
fitted (a run's mode comes from a `--metadata mode=...` of the bench, else from its timeline).
A run at one concurrency cannot tell a per-request cost from a fixed one: what the inputs leave
undetermined is printed and kept in the profile's `undetermined`.
"""


def register(sub) -> None:
    """`stepgap calibrate`: the options of a simulated setup and its workload, as `simulate`
    takes them (common/run_spec.py, spelled as vLLM spells them); bench_fit.extend adds the
    options of calibrating on bench files alone."""
    from stepgap.common.options import (add_engine_args, add_load_args, add_model_args,
                                        add_scheduler_args)
    c = add_command(sub, "calibrate", help="fit the simulator to your vLLM runs, to predict the "
                    "rest", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                    epilog=CALIBRATE_EPILOG)
    c.add_argument("measured", nargs="+", metavar="MEASURED")
    add_model_args(c, draft_help=" (the EAGLE-3 head's config: the runs are re-simulated with "
                                 "it)")
    add_engine_args(c)
    add_scheduler_args(c)
    add_load_args(c)
    c.add_argument("--out", required=True, metavar="PROFILE.json")
    c.set_defaults(func=cmd_calibrate)


# What calibrating on timelines reads from the command line: the rest of a run's settings and
# its workload come from its own files (its --save-detailed bench file).
TIMELINE_SETTINGS = ("model", "draft", "max_num_seqs", "max_model_len", "block_size")


def refuse_unread(args, used=TIMELINE_SETTINGS) -> None:
    """A setting given that the timeline path does not read is refused, naming it: nothing on
    the command line is dropped silently."""
    from stepgap.common.options import WORKLOAD_FLAGS, settings_from_args
    from stepgap.common.run_spec import RunSpec, flag
    given = [flag(n) for n in settings_from_args(args, RunSpec) if n not in used]
    given += [f for f, *_ in WORKLOAD_FLAGS if getattr(args, f.lstrip("-").replace("-", "_"),
                                                       None) is not None]
    given += [f for f, dest in (("--speculative-config", "speculative_config"),
                                ("--spec-model", "spec_model"), ("--spec-tokens", "spec_tokens"),
                                ("--trace", "trace"), ("--dataset-name", "dataset_name"),
                                ("--dataset-path", "dataset_path"),
                                ("--async-scheduling", "async_scheduling"),
                                ("--distributed-executor-backend",
                                 "distributed_executor_backend"),
                                ("--acceptance", "acceptance"), ("--topology", "topology"),
                                ("--noise", "noise"))
              if getattr(args, dest, None) is not None]
    if given:
        raise UserError(f"{given[0]}: calibrate on vLLM timelines reads each run's settings and "
                        "workload from its own files (its --save-detailed bench file, traces "
                        "and scrapes); this option is for bench files alone: give --gpu (the "
                        "GPU, or cpu) to fit on them")


def cmd_calibrate(args) -> int:
    from stepgap.common.fileio import check_not_walked, check_writable
    if args.model is None:
        raise UserError("--model: required (the target's config: the runs are re-simulated to "
                        "fit the client's latency and the device level)")
    refuse_unread(args)
    check_writable(args.out, "--out")
    check_not_walked("--out", args.out, args.measured)
    from stepgap.common.vllm_bench import merged_chunks
    runs, unused = load_runs(args.measured)
    for r in runs:   # first: what such a run cannot be held to
        merged = merged_chunks(r.doc, r.name)
        if merged:
            print(f"warning: {merged}; left out of the level fits", flush=True)
    meta = {"model": {"target": args.model, "draft": args.draft},
            "scheduler": {k: v for k, v in (("max_num_seqs", args.max_num_seqs),
                                             ("max_model_len", args.max_model_len),
                                             ("block_size", args.block_size))
                          if v is not None}}
    profile = calibrate_runs(runs, meta, unused)   # (a refusal says why, in its one line)
    for line in unused + [f"{r.name}: {n}" for r in runs for n in r.notes]:
        print(f"  note: {line}", file=sys.stderr)
    save_profile(args.out, profile)
    cal = profile.about["calibration"]
    print(f"profile: {args.out}: {len(profile.fits)} device op fits, CPU terms "
          f"{', '.join(sorted(profile.cpu.terms))}; fitted on {len(cal['runs'])} sync runs "
          f"(k {cal['ks']}, concurrency {cal['concurrency']})")
    for r in profile.notes.get("residuals", []):
        what = " (profiled: the profiler's overhead in it)" if r.get("profiled") else ""
        if r.get("merged_chunks"):   # its TPOT and ITL are the client's
            print(f"  {r['run']}: {errors(r, ('ttft', 'e2el'))} (merged chunks: no TPOT, no "
                  "ITL)")
            continue
        print(f"  {r['run']}: {errors(r, ('tpot', 'itl', 'ttft'))}" + what)
    for m in profile.undetermined:
        print(f"  undetermined: {m}", file=sys.stderr)
    return 0
