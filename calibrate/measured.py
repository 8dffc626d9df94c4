"""The measured folder: the one format in which a real engine's runs are kept and judged.

`traces/measured/<device>/` (written by `stepgap validate`, `stepgap validate-gpu`, and for vLLM
by `stepgap calibrate`'s measurement scripts) holds:

    manifest.json           what ran where: machine, load, commit, commands, traces, the cells,
                            and the simulator's settings for them (`sim`)
    profile.json            the calibration (sim/profile.py), fitted on *other* runs
    known_misses.toml       written by hand, never by a command: the bounds a cell may miss,
                            each with its signed error, a cap and the reason (calibrate/judge.py)
    models/*/config.json    the target's and the head's shapes (for the roofline's fallback)
    runs/<cell>.json.gz     each cell's judged runs, detailed: per-request chunks and the
                            engine's accepted count of every decode step
    timelines/, calibration.jsonl, calibration_steps.json.gz   what the report draws
    judged.jsonl            the judged trace as it ran, token ids and all: the prefix cache's
                            hashes are the simulator's too

calibrate/judge.py re-simulates and judges a folder; calibrate/report.py writes its report.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from stepgap.common.cpu_load import summary as cpu_summary
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import read_json, read_json_object, write_json
from stepgap.common.formats import (TraceRequest, check_result, load_trace, save_timeline,
                                    save_trace)
from stepgap.common.run_result import RunResult
from stepgap.calibrate.fit import device_vs_profile
from stepgap.calibrate.harness import Measured, Plan, cell_name, machine_info
from stepgap.sim.profile import save_profile

FORMAT = "stepgap-measured/1"
JUDGED_FILE = "judged.jsonl"   # the judged trace, as run (older folders have none)
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class MeasuredCell:
    mode: str
    k: int
    conc: int | None
    runs: list[RunResult]                 # the measured results of its repeats
    info: dict = field(default_factory=dict)   # diagnostics recorded when it ran

    @property
    def name(self) -> str:
        return cell_name(self.mode, self.k, self.conc)


@dataclass
class Setup:
    """How the simulator runs a folder's cells: SimConfig settings shared by every cell."""

    folder: Path
    settings: dict
    manifest: dict
    prompts: dict = field(default_factory=dict)   # request id -> its prompt's token ids
    prefix_hits: bool = False   # some judged run found prompt tokens in the prefix cache


# -------------------------------------------------------------------------------------------
# Reading


def load_measured(folder) -> tuple[Setup, list[MeasuredCell]]:
    from stepgap.common.run_spec import settings_of
    folder = Path(folder)
    man = read_manifest(folder)
    settings = settings_of(dict(man["sim"]))
    for key in ("model", "draft", "profile"):   # paths are relative to the folder
        if isinstance(settings.get(key), str) and not Path(settings[key]).is_absolute() \
                and (folder / settings[key]).exists():
            settings[key] = str(folder / settings[key])
    cells = [MeasuredCell(c["mode"], c["k"], c.get("max_concurrency"),
                          load_runs(folder / c["runs"]), c.get("info") or {})
             for c in man["cells"]]
    hits = any((r.prefix_cache or {}).get("hits", 0) > 0 for c in cells for r in c.runs)
    return Setup(folder, settings, man, judged_prompts(folder), hits), cells


def judged_prompts(folder: Path) -> dict[str, list[int]]:
    """The judged trace's token ids by request id (JUDGED_FILE; {} in a folder without one, or
    whose prompts were lengths only)."""
    path = folder / JUDGED_FILE
    if not path.is_file():
        return {}
    return {r.request_id: r.prompt_token_ids for r in load_trace(path)
            if r.prompt_token_ids is not None}


def read_manifest(folder: Path) -> dict:
    """A measured folder's manifest.json, its shape checked (errors name the folder)."""
    path = folder / "manifest.json"
    if not path.is_file():
        raise UserError(f"{folder}: no manifest.json there (a measured folder of `stepgap "
                        "validate`, `stepgap validate-gpu` or `stepgap calibrate`)")
    man = read_json_object(path, "a measured folder's manifest")
    if man.get("format") != FORMAT:
        raise UserError(f"{where(path, field='format')}: expected {FORMAT!r}, got "
                        f"{man.get('format')!r}")
    if not isinstance(man.get("sim"), dict):
        raise UserError(f"{where(path, field='sim')}: expected the simulator's settings")
    cells = man.get("cells")
    if not isinstance(cells, list) or not cells:
        raise UserError(f"{where(path, field='cells')}: expected a list of cells")
    for n, c in enumerate(cells):
        if not isinstance(c, dict) or not isinstance(c.get("runs"), str) \
                or not isinstance(c.get("k"), int) or c.get("mode") is None:
            raise UserError(f"{where(path, field=f'cells[{n}]')}: expected {{mode, k, "
                            "max_concurrency, runs}")
        if c.get("info") is not None and not isinstance(c["info"], dict):
            raise UserError(f"{where(path, field=f'cells[{n}].info')}: expected an object")
    return man


def load_runs(path: Path) -> list[RunResult]:
    """A cell's runs: a gzip-compressed JSON list of run results."""
    if not path.is_file():
        raise UserError(f"{path}: not found (a cell's runs)")
    runs = read_json(path)
    if not isinstance(runs, list):
        raise UserError(f"{path}: expected a list of run results")
    return [RunResult.from_dict(check_result(r, f"{path} (run {n})"), f"{path} (run {n})")
            for n, r in enumerate(runs)]


def requests_of(result: RunResult, prompts: dict | None = None) -> list[TraceRequest]:
    """A judged run's trace, rebuilt from its detailed result, with the engine's accepted counts
    (all requests arrive at 0, as the held-out trace) and, from `prompts` (Setup.prompts), each
    prompt's token ids where the folder has them."""
    got = result.requests
    for key, have in (("request_ids", got and got.ids), ("input_lens", got),
                      ("output_lens", got and got.output_lens)):
        if not have:
            raise UserError(f"a measured result lacks {key!r}: it must be saved with --detailed")
    prompts = prompts or {}
    accepted = got.accepted or [None] * len(got.ids)
    out = []
    for rid, plen, olen, acc in zip(got.ids, got.input_lens, got.output_lens, accepted):
        ids = prompts.get(str(rid))
        if ids is not None and len(ids) != plen:
            raise UserError(f"{JUDGED_FILE}: request {rid!r} has {len(ids)} prompt tokens, but "
                            f"its run prefilled {plen}")
        out.append(TraceRequest(str(rid), 0.0, plen, olen, ids, accepted=acc))
    return out



# -------------------------------------------------------------------------------------------
# Writing


def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                             capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, timeout=10).stdout
        return (rev or "unknown") + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_measured(plan: Plan, m: Measured, out: Path, command: str,
                   extra: dict | None = None) -> None:
    """The measured half of the folder: profile, models, traces, runs, timelines, manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("runs", "timelines", "simulated"):
        shutil.rmtree(out / sub, ignore_errors=True)
    save_profile(out / "profile.json", m.profile)
    ea = plan.engine
    target = ea.target_config()
    configs = {"target": target.to_hf_dict()}
    if ea.draft and max(plan.ks):
        configs["eagle3"] = ea.draft_config(target).to_hf_dict()
    for name, cfg in configs.items():
        write_json(out / "models" / name / "config.json", cfg)
    if plan.calibration is not None:
        save_trace(out / "calibration.jsonl", plan.calibration)
    if plan.judged is not None:   # its prompts' token ids: what the prefix cache hashes
        save_trace(out / JUDGED_FILE, plan.judged)
    if m.calibration_steps:   # what the noise model was fitted on (calibrate/fit.py)
        save_runs(out / "calibration_steps.json.gz", m.calibration_steps)
    cells = []
    for mode in plan.modes:
        for k in plan.ks:
            for conc in plan.concs:
                name = cell_name(mode, k, conc)
                runs = m.runs.get(name, [])
                f = f"runs/{name}.json.gz"
                save_runs(out / f, [trim(r) for r in runs])
                info = {"device_vs_profile": device_vs_profile(m.device.get(name, {}),
                                                               m.profile, k)}
                cells.append({"mode": mode, "k": k, "max_concurrency": conc, "runs": f,
                              "num_runs": len(runs), "info": info})
                if name in m.timelines:
                    save_timeline(out / "timelines" / f"{name}.measured.jsonl",
                                  m.timelines[name])
    lim = plan.limits()
    configs = [r.config for rs in m.runs.values() for r in rs]
    manifest = {
        "format": FORMAT, "device": plan.device_name, "machine": machine_info(),
        "worker": m.worker, "commit": git_commit(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": command,
        "wall_s": round(m.wall_s, 1),
        "load_avg_1m": {"min": min(m.loads), "max": max(m.loads),
                        "mean": round(sum(m.loads) / len(m.loads), 2)},
        "other_cpu": cpu_summary([c["other_cpu"] for c in configs if c.get("other_cpu")]),
        "traces": {"judged": plan.judged_name, "judged_prompts": len(plan.judged or []),
                   "calibration": plan.calibration_name or "(the profile's)",
                   "calibration_runs": m.calibration_runs},
        "repeats": plan.repeats, "slice": plan.slice,
        "calibration_slice": plan.calibration_slice,
        "sim": {"gpu": sim_hardware(plan), "model": "models/target",
                "draft": "models/eagle3" if "eagle3" in configs else "eagle3",
                "executor": ea.executor, "device": ea.device, "profile": "profile.json",
                "block_size": ea.block_size, "max_num_seqs": lim["max_num_seqs"],
                "max_model_len": lim["max_model_len"],
                "num_gpu_blocks_override": lim["num_blocks"]},
        "timeline": {"cells": sorted(m.timelines), "steps": list(m.timeline_steps or (0, 0))},
        "cells": cells, **(extra or {}),
    }
    write_json(out / "manifest.json", manifest)


def sim_hardware(plan: Plan) -> str:
    """The catalog entry the simulator's roofline falls back to for this machine."""
    if plan.engine.device == "cpu":
        return "cpu"
    from stepgap.sim.hardware import CATALOG, catalog_entry
    gpu = machine_info().get("gpu", "")
    return catalog_entry(gpu) or next((h for h in sorted(CATALOG, key=len, reverse=True)
                                       if h != "cpu" and h in gpu.lower()), "h100")


def save_runs(path: Path, results: list[dict]) -> None:
    """A cell's runs, one gzip-compressed JSON list (no timestamp: same runs, same bytes)."""
    write_json(path, results)


def trim(res: RunResult) -> dict:
    """A judged result as committed: every per-request list the simulator and the comparison
    need; times rounded to the microsecond (they are measured to about that)."""
    lists, gaps = res.requests, res.step_gaps
    lists = replace(lists, ttfts=[round(x, 6) for x in lists.ttfts],
                    itls=[[round(x, 6) for x in xs] for xs in lists.itls])
    if gaps.values_us is not None:
        gaps = replace(gaps, values_us=[round(x, 1) for x in gaps.values_us])
    return replace(res, requests=lists, step_gaps=gaps).to_dict()
