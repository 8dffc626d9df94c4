"""Peers' real GPU runs, judged (docs/explanation/design.md §9): a vLLM run on a GPU, re-simulated
from the same GPU's measured operator tables, and held to fixed bounds like the committed CPU
folders.

A peer folder (`traces/peers/<peer>/`) keeps the peer's files as they publish them, under
their own paths, with their licence, and a `peers.json` naming the source (repository,
commit) and each run: its folder (`vllm/requests.jsonl`, `meta.json`, `timeseries.csv`), the
tables it is priced from, the catalog GPU and the model. `judge_run` simulates a run with the
settings its meta.json records (common/peer_run.py), from its tables (`--device-profile`) or
from the roofline alone, and takes the errors of PEER_BOUNDS' metrics, signed, (simulated -
measured) / measured. A bound may be missed only where the folder's known_misses.toml says so
(calibrate/judge.py's rules).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json_object, read_text
from stepgap.common.peer_run import find_dataset, load_timeseries, peer_settings
from stepgap.common.run_result import peer_result
from stepgap.sim.device_choice import NO_TABLES
from stepgap.sim.config import SimConfig
from stepgap.sim.hardware import is_gpu_file
from stepgap.sim.loop import simulate

MANIFEST = "peers.json"
# Fixed targets, not fitted to the runs (docs/explanation/history.md says when they were set):
# |simulated - measured| / measured.
PEER_BOUNDS = (("mean_tpot_ms", "mean TPOT", 0.01), ("p99_tpot_ms", "P99 TPOT", 0.03),
               ("mean_ttft_ms", "mean TTFT", 0.03), ("p99_ttft_ms", "P99 TTFT", 0.05),
               ("mean_e2el_ms", "mean E2EL", 0.02), ("running_peak", "running peak", 0.05))
PEER_METRICS = tuple(key for key, _, _ in PEER_BOUNDS)
PERCENTILES = (50, 90, 99)
TICK_S = 1.0


@dataclass(frozen=True, slots=True)
class PeerRun:
    name: str
    run: Path        # the run's folder: vllm/{requests.jsonl, meta.json, timeseries.csv}
    tables: Path     # the perf bundle's variant folder (--device-profile)
    gpu: str         # the catalog entry, or a GPU file (a hardware.yaml: --gpu FILE.yaml)
    model: str

    @property
    def requests(self) -> Path:
        return self.run / "vllm" / "requests.jsonl"

    @property
    def summary(self) -> Path:   # the peer simulator's own prediction of the run
        return self.run / "validation" / "summary.txt"


def load_peers(folder) -> tuple[dict, list[PeerRun]]:
    """A peer folder's source and runs, every path checked."""
    folder = Path(folder)
    path = folder / MANIFEST
    doc = read_json_object(path, "a peer folder's manifest")
    runs = []
    for n, r in enumerate(doc.get("runs") or []):
        src = where(path, field=f"runs[{n}]")
        try:
            gpu = str(r["gpu"])   # a catalog entry, or a GPU file in the folder
            run = PeerRun(str(r["name"]), folder / r["run"], folder / r["tables"],
                          str(folder / gpu) if is_gpu_file(gpu) else gpu, str(r["model"]))
        except (KeyError, TypeError):
            raise UserError(f"{src}: expected name, run, tables, gpu and model") from None
        if not run.requests.is_file():
            raise UserError(f"{src}.run: {run.requests} not found")
        runs.append(run)
    if not runs:
        raise UserError(f"{path}: no runs")
    return doc.get("source") or {}, runs


def peer_config(run: PeerRun, tables: bool = True, **overrides) -> tuple[SimConfig, list[str]]:
    """The simulator's configuration of a peer run: its meta.json's settings, its trace (with
    the token ids of the dataset it replayed, where found), its GPU and, unless `tables` is
    False, its operator tables."""
    from stepgap.common.model_presets import load_model_config
    settings, notes = peer_settings(run.requests.with_name("meta.json"),
                                    load_model_config(run.model).max_position_embeddings)
    cfg = SimConfig(**{"gpu": run.gpu, "model": run.model, "workload": str(run.requests),
                       "device_profile": str(run.tables) if tables else NO_TABLES,
                       "metric_percentiles": PERCENTILES, "timeseries_interval_s": TICK_S,
                       "detailed": False, **settings, **overrides})
    if find_dataset(run.requests) is None:
        notes.append("no dataset found: prefix caching sees no prompt token ids")
    return cfg, notes


def errors(measured: dict, simulated: dict) -> dict[str, float]:
    """(simulated - measured) / measured of each PEER_METRICS value given (NaN where either
    side lacks it)."""
    out = {}
    for key in PEER_METRICS:
        a, b = measured.get(key), simulated.get(key)
        out[key] = (b - a) / a if a and b is not None else math.nan
    return out


def judge_run(run: PeerRun, tables: bool = True, **overrides) -> dict:
    """Simulate a peer run and hold it against the measurement: {"measured", "simulated" (both
    RunResults), "running_peak": {"measured" (None without timeseries.csv), "simulated"},
    "errors", "series": {"measured", "simulated"}, "notes", "config"}."""
    cfg, notes = peer_config(run, tables, **overrides)
    res, _ = simulate(cfg)
    sim = res
    meas = peer_result(run.requests, PERCENTILES)
    meas.source = str(run.requests)
    series = {"simulated": res.timeseries}
    peak = {"measured": None, "simulated": max(series["simulated"]["running"])}
    ts = run.requests.with_name("timeseries.csv")
    if ts.is_file():
        series["measured"] = load_timeseries(ts)
        peak["measured"] = max(series["measured"]["running"])
    errs = errors({**meas.metrics.to_dict(), "running_peak": peak["measured"]},
                  {**sim.metrics.to_dict(), "running_peak": peak["simulated"]})
    return {"measured": meas, "simulated": sim, "running_peak": peak, "errors": errs,
            "series": series, "notes": notes + sim.notes, "config": cfg}


def peer_failures(name: str, errs: dict[str, float], misses: dict) -> list[str]:
    """Every bound the run breaks beyond its known misses, one line each, by the measured
    folders' rules (calibrate/judge.py miss_failures: a known miss cannot drift)."""
    from stepgap.calibrate.judge import miss_failures
    out = []
    for key, label, bound in PEER_BOUNDS:
        e = errs[key]
        if math.isnan(e):
            out.append(f"{name}: {label} is not a number (nothing to compare)")
            continue
        out += miss_failures(name, label, e, bound, misses.get((name, key)), abs(e) <= bound)
    return out


# -------------------------------------------------------------------------------------------
# The peer simulator's own prediction, as it published it


SUMMARY_ROWS = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2el"}
SUMMARY_STATS = {"Mean": "mean", "Median": "median", "P90": "p90", "P95": "p95", "P99": "p99"}


def peer_prediction(run: PeerRun) -> dict:
    """LLMServingSim's prediction of the run, from its validation/summary.txt (ms):
    {metric key: value}, e.g. mean_ttft_ms; {} where the file is absent."""
    if not run.summary.is_file():
        return {}
    out = {}
    for n, line in enumerate(read_text(run.summary).splitlines(), start=1):
        parts = line.split()
        if len(parts) == 5 and parts[0] in SUMMARY_ROWS and parts[1] in SUMMARY_STATS:
            try:
                out[f"{SUMMARY_STATS[parts[1]]}_{SUMMARY_ROWS[parts[0]]}_ms"] = float(parts[3])
            except ValueError:
                raise UserError(f"{where(run.summary, n)}: expected numbers, got {line!r}") \
                    from None
    return out

