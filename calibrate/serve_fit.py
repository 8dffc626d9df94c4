"""The HTTP path's costs, for the simulator's `served` topology (docs/explanation/serve.md).

`stepgap serve` puts the engine behind an API server that shares the engine core's CPU. On top
of an engine profile (`stepgap profile`, in-process runs), this fits what serving adds, from
served runs' own timelines (`stepgap serve --timeline`) and the client's results
(`vllm bench serve --save-result`):

- the engine core's terms as served: `schedule`, `update_from_output` (which now sends each
  step's chunks to the front end), `result_latency` and `ipc_us` (its wake-ups, on a CPU it
  shares with the front end and the client);
- the front end's `add_request` (parse, check, tokenize, hand over; per prompt token) and
  `process_outputs`: one step's chunks detokenized, handed out and each written to its client
  (its `process_outputs` span and that step's `stream` spans, per request and token);
- `client_latency_us`: what lies between the client and the front end, both ways (the client's
  mean TTFT less the front end's own, median over the runs).

The simulator serialises the front end's ops with the engine core's on one core (`host`), as
the bench pins them (bench/serve_vllm_bench.py).
"""

from __future__ import annotations

import copy
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from stepgap.calibrate.fit import fit_cpu
from stepgap.calibrate.samples import cpu_samples
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json_object
from stepgap.common.formats import load_timeline
from stepgap.common.run_result import Metrics, RunResult
from stepgap.common.options import add_command
from stepgap.sim.profile import CpuFit, Profile, save_profile

ENGINE_TERMS = ("schedule", "update_from_output", "result_latency", "ipc_us")
FRONTEND_TERMS = ("add_request", "process_outputs")
TERMS = ENGINE_TERMS + FRONTEND_TERMS


def run_level(spans, k: int, profile: Profile) -> float:
    """How long the run's device ops took against the profile's prediction of the same steps
    (1.1: 10 % slower): the machine's level during the run (calibrate/fit.py)."""
    from stepgap.calibrate.fit import add_device, device_vs_profile
    from stepgap.calibrate.samples import device_points
    acc: dict = {}
    add_device(acc, device_points(spans, k))
    d = device_vs_profile(acc, profile, k)
    return 1.0 if d is None else 1.0 + d


def fit_served(base: Profile, runs: list[dict]) -> Profile:
    """The `served` profile: `base` (a `stepgap profile` profile) with the HTTP path's costs
    fitted on `runs`, each {"timeline": spans, "k", "mode", "client_ttft_ms",
    "server_ttft_ms"}. Each run's times are taken back to the profile's level first (a run
    whose device ops took 10 % longer than the profile says had a slow machine, and so its CPU
    ops), as `stepgap simulate --speed` takes them forth."""
    if not runs:
        raise UserError("no served run to fit the HTTP path on")
    pooled, by_k = defaultdict(list), defaultdict(lambda: defaultdict(list))
    levels = []
    for r in runs:
        level = run_level(r["timeline"], r["k"], base)
        levels.append(round(level, 4))
        for term, rows in cpu_samples(r["timeline"], r.get("mode") or "sync", "served").items():
            if term not in TERMS:
                continue
            rows = [(n, t, us / level) for n, t, us in rows]
            pooled[term] += rows
            by_k[str(r["k"])][term] += rows
    cpu, quality, missing = fit_cpu(pooled, only_determined=True, trip=statistics.median)
    for term in TERMS:
        if term not in cpu:
            need = "a sync run's" if term in ("ipc_us", "result_latency") else "their"
            raise UserError(f"the served runs' timelines have too few samples of {term} to "
                            f"fit it (it needs {need} steps, recorded with `stepgap serve "
                            "--timeline`)")
    latency = round(max(0.0, 1e3 * statistics.median(
        (r["client_ttft_ms"] - r["server_ttft_ms"]) / lv for r, lv in zip(runs, levels))), 1)
    def served(c: CpuFit | None, own: dict) -> CpuFit:
        return (c or CpuFit({})).with_terms(
            {**{t: own.get(t, cpu[t]) for t in TERMS}, "client_latency_us": latency})

    pooled_fit = served(base.cpu, {})
    by_k_fit = {k: served(c, fit_cpu(by_k[str(k)], only_determined=True,
                                     trip=statistics.median)[0] if str(k) in by_k else {})
                for k, c in base.cpu_by_k.items()}
    about = copy.deepcopy(base.about)
    about["topology"] = {**about.get("topology", {}), "engine": "served"}
    notes = {**copy.deepcopy(base.notes),
             "served_fit": {"runs": len(runs), "ks": sorted({r["k"] for r in runs}),
                            "levels": levels, "quality": {t: quality[t] for t in TERMS},
                            "client_latency_us": latency, "undetermined": missing,
                            "why": "calibrate/serve_fit.py; docs/explanation/serve.md"}}
    return replace(base, cpu=pooled_fit, cpu_by_k=by_k_fit, about=about, notes=notes,
                   path=None)


def load_served_run(server_result: Path) -> dict:
    """One served run, from three files named alike: RUN.server.json (`stepgap serve
    --result-json`), RUN.server.jsonl (its --timeline) and RUN.vllm.json (the client's
    `vllm bench serve --save-result`), as bench/serve_vllm_bench.py names them."""
    server_result = Path(server_result)
    if not server_result.name.endswith(".server.json"):
        raise UserError(f"{server_result}: expected RUN.server.json (a served run's result, "
                        "beside RUN.server.jsonl and RUN.vllm.json)")
    stem = server_result.with_name(server_result.name[:-len(".server.json")])
    timeline, client_path = Path(f"{stem}.server.jsonl"), Path(f"{stem}.vllm.json")
    server = RunResult.load(server_result)   # its mean_ttft_ms a number (check_result)
    client = read_json_object(client_path, "a `vllm bench serve --save-result` file")
    client_ttft = Metrics.from_dict(client).mean_ttft_ms
    if not isinstance(client_ttft, (int, float)):
        raise UserError(f"{where(client_path, field='mean_ttft_ms')}: expected a number")
    k = server.config.get("k")
    if not isinstance(k, int):
        raise UserError(f"{where(server_result, field='config.k')}: expected the run's k")
    return {"timeline": load_timeline(timeline), "k": k, "mode": server.config.get("mode"),
            "name": stem.name, "client_ttft_ms": client_ttft,
            "server_ttft_ms": server.metrics.mean_ttft_ms}


# ---------------------------------------------------------------------------------------------
# The command

DESCRIPTION = """\
Fit what serving adds to the engine's own costs, for the simulator's `served` topology: the
front end's add_request and per-step output work (detokenize, hand out, write each chunk), the
engine core's ops and wake-ups as they are on the CPU it shares with the front end, and the
client's latency. ENGINE_PROFILE is `stepgap profile`'s (in-process runs); the runs are
`stepgap serve` runs driven by `vllm bench serve`, ideally sync, on other prompts than the
ones you will predict."""

EPILOG = """\
the workflow (docs/explanation/serve.md):
  stepgap profile --out engine.json
  stepgap serve MODEL --executor process ... --timeline runs/a.server.jsonl \\
      --result-json runs/a.server.json &
  taskset -a -pc 0 $!          # the front end onto the engine core's CPU, as the model has it
  vllm bench serve --backend vllm --base-url http://127.0.0.1:8000 ... --profile \\
      --save-result --result-dir runs --result-filename a.vllm.json
  stepgap calibrate-served engine.json runs/ --out served.json
  stepgap simulate --profile served.json --model MODEL ... --async-scheduling

Each run is three files named alike: RUN.server.json and RUN.server.jsonl (what the server
writes at each POST /stop_profile, i.e. at the end of each `vllm bench serve --profile` run:
move them to another RUN name before the next run) and RUN.vllm.json (the client's result).
Folders are searched for *.server.json. Each run's times are taken to the engine profile's
level first (its device ops against the profile's); `stepgap simulate --speed X` predicts at
another level.
"""


def register(sub) -> None:
    p = add_command(sub, "calibrate-served", help="fit the HTTP path of `stepgap serve` runs on "
                    "top of an engine profile", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("profile", metavar="ENGINE_PROFILE.json",
                   help="the engine's own costs (`stepgap profile`)")
    p.add_argument("runs", nargs="+", metavar="RUN.server.json|DIR",
                   help="served runs: their RUN.server.json, or folders holding them")
    p.add_argument("--out", required=True, metavar="PROFILE.json",
                   help="the `served` profile, for `stepgap simulate --profile`")
    p.set_defaults(func=cmd_calibrate_served)


def cmd_calibrate_served(args) -> int:
    from stepgap.common.fileio import check_writable
    check_writable(args.out, "--out")
    paths = []
    for p in map(Path, args.runs):
        found = sorted(p.glob("*.server.json")) if p.is_dir() else [p]
        if not found:
            raise UserError(f"{p}: no *.server.json in it")
        paths += found
    base = Profile.from_dict(read_json_object(args.profile, "an engine profile (`stepgap "
                                              "profile`)"), args.profile)
    profile = fit_served(base, [load_served_run(p) for p in paths])
    save_profile(args.out, profile)
    fit = profile.notes["served_fit"]
    print(f"profile: {args.out}: the HTTP path fitted on {fit['runs']} served runs (k "
          f"{fit['ks']}); client_latency_us {fit['client_latency_us']}")
    print(f"  the runs' levels (device ops against the engine profile): {fit['levels']}")
    for term, q in fit["quality"].items():
        print(f"  {term}: " + ", ".join(f"{k} {v}" for k, v in q.items()))
    for m in fit["undetermined"]:
        print(f"  undetermined: {m}", file=sys.stderr)
    return 0
