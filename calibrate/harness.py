"""The measurement harness: one plan of engine runs, interleaved, on any device.

A `Plan` names the engine (an `EngineArgs`: the trained pair on the CPU, or a full-size model on
a GPU), the grid (modes x k x max-concurrency), the judged trace, the calibration trace and the
repeats. `run_plan` runs it through one executor and returns what it measured (`Measured`):
the judged runs of every cell, and the profile fitted from the calibration runs and the
microbenchmark grid (calibrate/fit.py). `stepgap validate` (CPU), `stepgap validate-gpu` and
`stepgap profile` are all this one harness; calibrate/measured.py writes its output.

The machine's speed drifts (other tenants share its caches and memory: ±10 % over seconds on the
2-core VM this was built on, docs/explanation/validation.md), so the runs are interleaved: each
repeat runs every (k, concurrency) group as [a calibration run, then its modes back to back, in each
of their orders in turn], and the groups' order rotates between repeats. The calibration then sees
the same machine, on average, as the judged runs.
"""

from __future__ import annotations

import itertools
import os
import platform
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from stepgap.common.cpu_load import OtherCpu
from stepgap.common.errors import UserError
from stepgap.common.formats import MODES, TraceRequest
from stepgap.common.scheduler import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, cdiv
from stepgap.engine.args import EngineArgs
from stepgap.calibrate.fit import GridShape, add_device, build_profile, measure_grid
from stepgap.calibrate.samples import device_points
from stepgap.sim.profile import Profile

TIMELINE_HALF = 20            # steps kept either side of the timeline cells' first run's middle


def cell_name(mode: str, k: int, conc: int | None) -> str:
    return f"{mode}-k{k}-c{conc if conc is not None else 'inf'}"


@dataclass
class Plan:
    engine: EngineArgs                # the worker: models, device, dtype, executor, sampling
    modes: list[str]
    ks: list[int]
    concs: list[int]
    judged: list[TraceRequest] | None         # None: calibrate only (`stepgap profile`)
    calibration: list[TraceRequest] | None    # None: the profile is given
    profile: Profile | None = None    # given: no calibration runs, no grid
    repeats: int = 18                 # judged runs per cell
    slice: int = 8                    # judged prompts per run
    calibration_slice: int = 8        # calibration prompts per run
    grid: GridShape | None = field(default_factory=GridShape)   # None: no microbenchmarks
    timeline_group: tuple[int, int] | None = None   # (k, conc) whose timelines are kept
    judged_name: str = ""
    calibration_name: str = ""
    device_name: str = "cpu"          # the measured folder's name for the machine
    slice_by_conc: dict | None = None  # prompts per run by concurrency, where not `slice`
    budget_s: float | None = None     # judged runs that would end past it are skipped

    def __post_init__(self):
        bad = [m for m in self.modes if m not in MODES]
        if not self.modes or bad:
            raise UserError(f"--modes: expected some of {', '.join(MODES)}, got {self.modes}")
        for name in ("repeats", "slice", "calibration_slice"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, "
                                f"got {getattr(self, name)}")
        if self.judged and self.calibration and \
                {r.request_id for r in self.judged} & {r.request_id for r in self.calibration}:
            raise UserError("the calibration trace shares request ids with the judged trace; "
                            "calibration must use other prompts")
        if self.timeline_group is None:
            self.timeline_group = (max(self.ks), min(self.concs))

    def limits(self) -> dict:
        """Scheduler limits every cell shares (engine and simulator): KV for every request at
        once, so nothing is preempted; the client's concurrency is the binding cap."""
        reqs = (self.judged or []) + (self.calibration or [])
        k, bs = max(self.ks), self.engine.block_size
        lim = limits(reqs, k, max(self.concs), bs)
        if self.grid:   # the microbenchmark grid's longest contexts must fit too
            ctx = max(self.grid.contexts) + k + 1
            lim["max_model_len"] = max(lim["max_model_len"], ctx)
            lim["num_blocks"] = max(lim["num_blocks"], max(self.grid.reqs) * cdiv(ctx, bs))
        return lim

    def worker_args(self) -> EngineArgs:
        lim = self.limits()
        return replace(self.engine, num_gpu_blocks_override=lim["num_blocks"],
                       max_num_seqs=lim["max_num_seqs"], max_model_len=lim["max_model_len"],
                       max_num_batched_tokens=lim["max_num_batched_tokens"],
                       max_k=max(max(self.ks), 1),
                       draft=self.engine.draft if max(self.ks) else None)


def limits(requests: list[TraceRequest], k: int, max_concurrency: int | None,
           block_size: int = BLOCK_SIZE) -> dict:
    """Scheduler limits that fit a trace: both halves use the same."""
    longest = max(r.prompt_len + r.output_len for r in requests)
    return {"num_blocks": sum(cdiv(r.prompt_len + r.output_len + k + 1, block_size)
                              for r in requests),
            "max_num_seqs": max_concurrency or len(requests),
            "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_model_len": longest + k + 1}


@dataclass
class Measured:
    profile: Profile | None
    runs: dict = field(default_factory=lambda: defaultdict(list))      # cell -> results
    device: dict = field(default_factory=dict)    # cell -> (op, i) -> [sum us, sum features]
    timelines: dict = field(default_factory=dict)  # cell -> spans (first run, trimmed)
    timeline_steps: tuple[int, int] | None = None   # the steps kept
    loads: list = field(default_factory=list)
    wall_s: float = 0.0
    calibration_runs: int = 0
    calibration_steps: list = field(default_factory=list)   # per run: [t ms, measured, fitted]
    worker: dict = field(default_factory=dict)    # the executor's info()
    skipped: list = field(default_factory=list)   # judged units past the budget
    outputs: dict = field(default_factory=dict)   # cell -> its first run's output token ids


def chunk(items: list, size: int, i: int) -> list:
    """The i-th run's share of a trace: `size` consecutive requests, wrapping around."""
    size = min(size, len(items))
    start = i * size % len(items)
    return (items + items)[start:start + size]


def units_of(plan: Plan) -> list[tuple[str, str, int, int, int]]:
    """(kind, mode, k, conc, slice index) in run order.

    Validation: in each repeat every (k, conc) group runs one calibration run (the modes take
    turns) and then its modes back to back, each on the repeat's slice of the judged trace, in
    an order that cycles through all orders of the modes (each mode in each place and after each
    other mode equally often over six repeats), so that what the modes save over sync is
    measured under the same conditions, and the calibration runs meet the machine when and as
    often as the judged runs do. Groups rotate between repeats, so each cell's runs spread over
    the whole session. Profiling alone: every group, every mode, each repeat."""
    groups = [(k, c) for k in plan.ks for c in plan.concs]
    # With three rotations only, async ran after sync in two repeats of three and measured
    # 0.3-3 % slower than zero-bubble (the same code on the CPU) at k > 0, c = 1 in three
    # validations.
    orders = list(itertools.permutations(plan.modes))
    units = []
    for rep in range(plan.repeats):
        shift = rep % len(groups)
        for k, conc in groups[shift:] + groups[:shift]:
            g = groups.index((k, conc))
            if plan.calibration is not None:
                if plan.judged is None:
                    units += [("calibration", m, k, conc, rep) for m in plan.modes]
                else:
                    mode = plan.modes[(rep + g) % len(plan.modes)]
                    units.append(("calibration", mode, k, conc, rep))
            if plan.judged is not None:
                units += [("judged", m, k, conc, rep) for m in orders[rep % len(orders)]]
    return units


def run_plan(plan: Plan, progress: bool = True, log=None, desc: str | None = None) -> Measured:
    """Run every unit of the plan on the engine and fit the profile. `log`, when given, gets a
    line per judged run; `desc` names the progress bar."""
    from tqdm import tqdm

    from stepgap.engine.executor import pin_plan
    from stepgap.engine.loop import run_trace

    t0 = time.monotonic()
    ea = plan.worker_args()
    setup = ea.create_engine_config()
    spec = setup.worker_spec()
    vocab = setup.vocab_size
    units = units_of(plan)
    sizes = {"judged": plan.slice, "calibration": plan.calibration_slice}
    traces = {"judged": plan.judged, "calibration": plan.calibration}

    def reqs_of(kind, conc, i):
        size = (plan.slice_by_conc or {}).get(conc, sizes[kind])
        return chunk(traces[kind], size, i)

    total = sum(sum(r.output_len for r in reqs_of(u[0], u[3], u[4])) for u in units)
    grid_points = len(plan.grid.shapes(plan.ks)) if plan.grid else 0
    pins = pin_plan(ea.pin) if ea.executor == "process" else None
    out = Measured(profile=plan.profile)
    out.loads.append(os.getloadavg()[0])
    points = []
    with tqdm(total=total + grid_points, unit=" tok", disable=not progress, file=sys.stderr,
              mininterval=1.0, desc=desc or ("validate" if plan.judged else "profile")) as bar:
        if plan.grid:
            bar.set_postfix_str("microbenchmark grid")
            points = measure_grid(spec, plan.ks, min(pins[1]) if pins else None, plan.grid,
                                  progress=bar.update)
        calib_runs, calib_info = [], []
        with setup.make_executor() as ex:
            out.worker = ex.info()
            warm = plan.calibration or plan.judged
            run_trace(ex, warm[:2], setup.engine_config("sync", max(plan.ks)), vocab_size=vocab)
            took = []
            for kind, mode, k, conc, rep in units:
                name = cell_name(mode, k, conc)
                reqs = reqs_of(kind, conc, rep)
                if plan.budget_s and kind == "judged" and time.monotonic() - t0 + (
                        sorted(took)[len(took) // 2] if took else 0.0) > plan.budget_s:
                    out.skipped.append(f"{name} #{rep}")
                    bar.update(sum(r.output_len for r in reqs))
                    continue
                bar.set_postfix_str(f"{kind} {name} #{rep} load {os.getloadavg()[0]:.2f}")
                load0, t_unit, other = os.getloadavg()[0], time.monotonic(), OtherCpu()
                run = run_trace(ex, reqs, setup.engine_config(mode, k), vocab_size=vocab,
                                max_concurrency=conc, detailed=kind == "judged",
                                config={"executor": ea.executor,
                                        "pinned": out.worker.get("pinned", False),
                                        "device": ea.device,
                                        "dtype": ea.dtype_name,
                                        "trace": plan.judged_name if kind == "judged"
                                        else plan.calibration_name, "slice": rep,
                                        "max_concurrency": conc})
                out.loads.append(os.getloadavg()[0])
                # what every other process used meanwhile (the engine and its worker measured)
                run.result.config["other_cpu"] = other.stop({os.getpid(), *worker_pids(ex)})
                if kind == "calibration":
                    calib_runs.append((mode, k, run.spans))
                    calib_info.append({"mode": mode, "k": k, "conc": conc, "slice": rep,
                                       "at_s": round(time.monotonic() - t0, 1)})
                else:
                    keep_judged(out, plan, name, k, conc, run, load0)
                    took.append(time.monotonic() - t_unit)
                    if log is not None:
                        r, g = run.result.metrics, run.result.step_gaps
                        log(f"{name:22} TPOT {r.mean_tpot_ms:7.2f} ms  P99 "
                            f"{r.percentile('tpot', 99):7.2f}  ITL {r.mean_itl_ms:7.2f}  gap "
                            f"p50 {g.median_us or 0:7.0f} us  p90 {g.p90_us or 0:7.0f}  "
                            f"({took[-1]:.1f}s)")
                bar.update(sum(r.output_len for r in reqs))
    out.calibration_runs = len(calib_runs)
    if plan.profile is None:
        meta = {"device": plan.device_name, "machine": machine_info(),
                "model": {"target": ea.model, "draft": ea.draft, "dtype": ea.dtype_name},
                "topology": {"executor": ea.executor, "device": ea.device,
                             "pinned": pins is not None},
                "calibration": {"trace": plan.calibration_name,
                                "prompts": len(plan.calibration), "runs": len(calib_runs),
                                "modes": plan.modes, "ks": plan.ks, "concurrency": plan.concs,
                                "grid_points": len(points)},
                "scheduler": plan.limits()}
        out.profile, series = build_profile(calib_runs, points, meta)
        out.calibration_steps = [{**info, "steps": steps}
                                 for info, steps in zip(calib_info, series)]
    out.wall_s = time.monotonic() - t0
    return out


def worker_pids(ex) -> list[int]:
    """The executor's worker process, if it has one (the inline executor runs in ours)."""
    pid = getattr(ex, "pid", None)
    return [pid] if isinstance(pid, int) else []


def keep_judged(out: Measured, plan: Plan, name: str, k: int, conc: int, run, load0: float):
    """A judged run's result, its device points (for the drift diagnostic) and, for the
    timeline group's first run, the middle of its timeline."""
    res = run.result
    out.outputs.setdefault(name, res.requests.output_token_ids)
    res.requests.output_token_ids = None   # (kept once a cell, in the folder's outputs)
    res.config["load_avg_1m"] = [round(load0, 2), round(out.loads[-1], 2)]
    out.runs[name].append(res)
    add_device(out.device.setdefault(name, {}), device_points(run.spans, k))
    if name not in out.timelines and (k, conc) == plan.timeline_group:
        if out.timeline_steps is None:   # mid-run, the same for every mode
            mid = max(s.step for s in run.spans) // 2
            out.timeline_steps = (max(0, mid - TIMELINE_HALF), mid + TIMELINE_HALF)
        lo, hi = out.timeline_steps
        out.timelines[name] = [s for s in run.spans if lo <= s.step < hi]


def machine_info() -> dict:
    import torch
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "load_avg_1m": round(os.getloadavg()[0], 2)}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2 ** 30, 1),
                    cuda=torch.version.cuda)
    return info
