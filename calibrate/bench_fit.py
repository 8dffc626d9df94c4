"""`stepgap calibrate` on a GPU run's `vllm bench serve --save-result` files alone: no traces.

A user who ran vLLM on their GPU has bench files (with or without `--save-detailed`) and knows
what the run had: the model, the drafter, k, the GPU, the concurrency. From them this fits, on
the simulator's roofline of that GPU (or its measured tables), the three things a bench file
determines:

- the acceptance: the runs' own per-position rates where the file has them (vLLM writes
  `spec_decode_per_position_acceptance_rates`), else the published profile shifted on the logit
  scale until the simulated TPOT / ITL (the tokens per step) is the measured one;
- the host's CPU costs, as one factor on stepgap's defaults (sim/cpu_costs.py), and the
  roofline's device level, one factor on its times: with runs at two or more (k, concurrency)
  cells, both, by least squares on the log of each run's mean ITL; with one cell, one equation:
  the CPU factor at the catalog's level, and what the run leaves open, the split between host
  and device along its mean ITL within the ranges of sim/bands.py, kept as the profile's band.

The profile it writes (sim/profile.py: CPU costs, `roofline_level`, `about.acceptance`, the GPU
and topology it was measured on, `notes.bands`) is taken by `simulate`, `sweep` and `advise`
with `--profile`; it runs that GPU and that acceptance unless told otherwise. calibrate/vllm_fit.py
fits per op from timelines (traces or hook spans): the path for a CPU server or a profiled run.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.run_record import RunRecord

NOISE = 0.01   # a GPU bench's mean ITL from run to run, unless repeats of a cell measure it
MAX_ITER = 30
# The prompts a bench file without per-request lists is simulated with (its workload is the
# command line's, drawn again): the fit simulates each run dozens of times. At concurrency 1,
# k=4 on l20, calibrate took 10.2 s on a run of 80 prompts and 64.0 s on one of 500 (about
# 0.13 s a prompt, on this 2-core VM while another job ran), and ran past 200 s on 1,000,000.
MAX_FIT_PROMPTS = 250
REACH = 0.10   # how far a fit at its bounds may miss a run's mean ITL before it is refused


@dataclass
class BenchRun:
    path: Path
    doc: dict
    k: int
    conc: int | None
    mode: str
    requests: list          # the trace it served (TraceRequest)
    rates: tuple | None     # its own per-position acceptance, where the file has it

    @property
    def cell(self) -> tuple:
        return (self.k, self.conc, self.mode, self.doc.get("request_rate", "inf"))

    @property
    def itl(self) -> float:
        return self.doc["mean_itl_ms"]


# ---------------------------------------------------------------------------------------------
# The command


BENCH_EPILOG = """\

a GPU run's bench files alone (no traces): give --gpu (or --device-profile) and what the run had
  vllm serve meta-llama/Llama-3.1-8B-Instruct --no-async-scheduling --speculative-config \\
      '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 4}'
  vllm bench serve ... --max-concurrency 1 --save-result --result-filename sync-k4-c1.json
  stepgap calibrate sync-k4-c1.json --gpu l20 --model llama-3.1-8b --draft llama-3.1-8b-eagle3 \\
      -k 4 --max-concurrency 1 --no-enable-prefix-caching --max-model-len 2048 --out l20.json
  stepgap simulate --profile l20.json --model llama-3.1-8b --draft llama-3.1-8b-eagle3 -k 4 \\
      --max-concurrency 1 --async-scheduling          # predict the async run
  stepgap advise --profile l20.json --model llama-3.1-8b --max-concurrency 1 4 16
It fits the acceptance (the file's rates, else the published profile's level), the host's CPU
costs (one factor on stepgap's defaults) and the roofline's level. One cell (one k, one
concurrency) pins the sum of host and device time: what it leaves open is kept as the profile's
band, and bench files at another k or concurrency narrow it. A bench file whose model, k or
concurrency disagrees with the command line is refused, naming both.
"""


def extend(c) -> None:
    """The bench-file options of `stepgap calibrate` (calibrate/vllm_fit.py registers the
    command): with --gpu or --device-profile, calibrate takes bench files alone."""
    from stepgap.common.acceptance import PROFILES
    from stepgap.common.options import add_option, speculative_config_arg
    from stepgap.sim.hardware import CATALOG
    g = c.add_argument_group("a GPU run's bench files alone (no traces)")
    g.add_argument("--gpu", help=f"the GPU the runs were made on: {', '.join(CATALOG)}; "
                                 "calibrate then fits the roofline of it to the bench files")
    g.add_argument("--device-profile", metavar="DIR",
                   help="the GPU's measured operator tables instead of its roofline (give --gpu "
                        "too, for its memory)")
    add_option(g, "k", help="the runs' k (default: the bench files' own, where they say it)")
    g.add_argument("--speculative-config", type=speculative_config_arg, metavar="JSON",
                   help="the runs' speculative config, as vllm serve took it")
    add_option(g, "max_concurrency", help="the runs' --max-concurrency (default: the bench "
                                          "files')")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="the runs' scheduling (default: sync, unless a file's --metadata "
                        "mode=... says)")
    g.add_argument("--trace", "--dataset-path", dest="trace", metavar="NAME|FILE",
                   help="the workload of runs without --save-detailed (default mtbench: the "
                        "prompts of `--dataset-name hf --dataset-path philschmid/mt-bench`)")
    add_option(g, "output_len", help="their output length (default: the workload's)")
    add_option(g, "enable_prefix_caching", help="the server's prefix caching (default on, as "
                                                "vLLM)")
    g.add_argument("--acceptance", metavar="PROFILE",
                   help=f"the acceptance profile to fit the level of, where the files have no "
                        f"rates: {', '.join(PROFILES)} (default: the model's published one)")
    g.add_argument("--noise", type=float, default=NOISE, metavar="FRAC",
                   help=f"a run's mean ITL from run to run (default {NOISE:g}; repeats of a "
                        "cell measure it)")
    c.epilog = (c.epilog or "") + BENCH_EPILOG
    traces = c.get_default("func")
    c.set_defaults(func=lambda args: cmd_bench(args) if args.gpu or args.device_profile
                   else traces(args))


def cmd_bench(args) -> int:
    from stepgap.common.fileio import check_not_walked, check_writable
    from stepgap.sim.config import SimConfig, resolve
    from stepgap.sim.profile import save_profile
    check_writable(args.out, "--out")
    check_not_walked("--out", args.out, args.measured)
    base = setup_of(args)
    runs = load_bench_runs(args.measured, args, base)   # first: what the files disagree with
    for k in sorted({r.k for r in runs}):   # an unknown GPU or model: one line, before the fit
        resolve(SimConfig(**settings(base, k)))
    profile = fit_bench(runs, base, args.noise)
    save_profile(args.out, profile)
    print(report(profile, args.out))
    for m in profile.undetermined or ():
        print(f"  undetermined: {m}", file=sys.stderr)
    return 0


def setup_of(args) -> dict:
    """The SimConfig settings the runs had, from the command line."""
    from stepgap.common.options import speculative_from_args
    method, draft, k = speculative_from_args(args)
    base = {"gpu": args.gpu or "h100", "model": args.model, "method": method or "eagle3",
            "jitter": False}
    for key, v in (("draft", draft), ("device_profile", args.device_profile),
                   ("max_num_seqs", args.max_num_seqs), ("max_model_len", args.max_model_len),
                   ("block_size", args.block_size), ("output_len", args.output_len),
                   ("enable_prefix_caching", args.enable_prefix_caching),
                   ("acceptance", args.acceptance), ("workload", args.trace)):
        if v is not None:
            base[key] = v
    if not (math.isfinite(args.noise) and 0 < args.noise < 0.5):
        raise UserError(f"--noise: expected a fraction in (0, 0.5), got {args.noise}")
    base["_k"], base["_conc"], base["_mode"] = k, args.max_concurrency, (
        None if args.async_scheduling is None else "async" if args.async_scheduling else "sync")
    return base


def settings(base: dict, k: int, **extra) -> dict:
    return {**{key: v for key, v in base.items() if not key.startswith("_")}, "k": k, **extra}


# ---------------------------------------------------------------------------------------------
# The runs, checked against what the command line says they had


def model_name(text: str) -> str:
    """A model's name to compare a bench file's model_id with --model: the preset a preset
    name or Hugging Face id stands for, as every command resolves it (`preset_of`: an id and
    its preset are one model); else the last path part, lower case, without the
    -Instruct/-Chat/-hf suffixes and a meta- prefix."""
    from stepgap.common.model_presets import preset_of
    preset = preset_of(str(text))
    if preset is not None:
        return preset
    name = Path(str(text).rstrip("/")).name.lower()
    name = re.sub(r"-(instruct|chat|hf|base)$", "", name)
    return name.removeprefix("meta-")


def load_bench_runs(paths, args, base: dict) -> list[BenchRun]:
    """Every bench file among `paths`, checked against the command line (model, k,
    concurrency, mode): a disagreement is refused, naming both values."""
    from stepgap.common.fileio import input_files
    from stepgap.common.vllm_bench import (DETAIL_KEYS, bench_k, bench_requests, is_bursty,
                                           read_bench)
    from stepgap.common.workloads import apply_request_rate
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import build_workload

    runs, skipped = [], []
    files = input_files(paths, "*.json", "bench file")
    check_bench_count(len(files), paths)
    for path, _ in files:
        doc = read_bench(path)
        if model_name(doc["model_id"]) != model_name(base["model"]):
            raise UserError(f"{where(path, field='model_id')}: {doc['model_id']!r}, but --model "
                            f"is {base['model']!r}: calibrate fits the runs of the model given")
        rates = doc.get("spec_decode_per_position_acceptance_rates")
        file_k = bench_k(doc) if doc.get("num_speculative_tokens") is not None or rates \
            else None   # (bench_k reads a file without either as k = 0)
        k = base["_k"]
        if k is not None and file_k is not None and k != file_k:
            raise UserError(f"{where(path, field='num_speculative_tokens')}: {file_k}, but "
                            f"--num-speculative-tokens is {k}: give the runs of one k per "
                            "command, or leave -k out")
        k = file_k if k is None else k
        if k is None:
            raise UserError(f"{path}: its k is not in the file (no num_speculative_tokens, "
                            "no per-position acceptance): give --num-speculative-tokens")
        conc = doc.get("max_concurrency")
        if base["_conc"] is not None and conc is not None and conc != base["_conc"]:
            raise UserError(f"{where(path, field='max_concurrency')}: {conc}, but "
                            f"--max-concurrency is {base['_conc']}: give the runs of one "
                            "concurrency, or leave --max-concurrency out")
        conc = conc if conc is not None else base["_conc"]
        mode = doc.get("mode") or base["_mode"] or "sync"
        if base["_mode"] is not None and doc.get("mode") and doc["mode"] != base["_mode"]:
            raise UserError(f"{where(path, field='mode')}: {doc['mode']!r}, but the command "
                            f"line says {base['_mode']} scheduling")
        if doc.get("mean_itl_ms") is None or not doc["mean_itl_ms"] > 0:
            raise UserError(f"{where(path, field='mean_itl_ms')}: missing or 0; calibrate fits "
                            "the runs' mean ITL")
        if not doc["mean_tpot_ms"] > 0:
            raise UserError(f"{where(path, field='mean_tpot_ms')}: 0; calibrate fits the runs' "
                            "tokens per step as their mean ITL over their mean TPOT")
        if is_bursty(doc):
            skipped.append(f"{path}: its client read the stream in bursts: left out")
            continue
        rate = doc.get("request_rate", "inf")
        rate = None if rate == "inf" else float(rate)
        if all(key in doc for key in DETAIL_KEYS):
            reqs = apply_request_rate(bench_requests(doc, path), rate,
                                      doc.get("burstiness") or 1.0, 0)
        else:   # no per-request lists: the workload the command line names, as many prompts
            n = min(doc["num_prompts"], MAX_FIT_PROMPTS)
            if n < doc["num_prompts"]:
                skipped.append(f"{path}: no per-request lists (--save-detailed), so its "
                               f"workload is the command line's: simulated with {n:,} of its "
                               f"{doc['num_prompts']:,} prompts, each fit step a simulation")
            cfg = SimConfig(**settings(base, k, num_prompts=n, request_rate=rate,
                                       max_concurrency=conc))
            reqs = build_workload(cfg)
        if all(q.output_len <= 1 for q in reqs):   # (its mean ITL > 0: two tokens or more)
            why = f"--output-len {base['output_len']}" if "output_len" in base and not \
                all(key in doc for key in DETAIL_KEYS) else "its output_lens"
            raise UserError(f"{where(path, field='mean_itl_ms')}: {doc['mean_itl_ms']:g} ms "
                            f"between tokens, but {why} ends every request at its first token; "
                            "give the runs' output length")
        runs.append(BenchRun(path, doc, k, conc, mode, reqs, tuple(rates) if rates else None))
    check_distinct_runs((r.path, r.doc) for r in runs)
    for line in skipped:
        print(f"  note: {line}", file=sys.stderr)
    if not runs:
        raise UserError("no `vllm bench serve --save-result` file to fit among the inputs")
    return runs


# What a run measured, as its bench file records it: two files alike in all of these are one run
# given twice, however they are labelled (a copy whose max_concurrency says 8 made calibrate fit
# "CPU x 0.000" and a split band of zero width, with exit 0).
MEASURED = ("date", "duration", "completed", "total_input_tokens", "total_output_tokens",
            "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_itl_ms", "p99_tpot_ms")


def check_distinct_runs(docs) -> None:
    """Refuse a run given twice: (path, bench document) pairs, two of whose measurements are
    the same (MEASURED), naming both files and the labels they differ in."""
    seen: dict = {}
    for path, doc in docs:
        key = repr([doc.get(k) for k in MEASURED])
        if key in seen:
            first, other = seen[key]
            labels = [k for k in ("max_concurrency", "num_speculative_tokens", "request_rate",
                                  "mode", "burstiness") if doc.get(k) != other.get(k)]
            said = f"; it says {', '.join(f'{k} {doc.get(k)!r}' for k in labels)}, " \
                f"{first.name} {', '.join(repr(other.get(k)) for k in labels)}" if labels else ""
            raise UserError(f"{path}: the same run as {first} (its date, duration, requests and "
                            f"latencies alike{said}): give each run once")
        seen[key] = (path, doc)


def check_bench_count(n: int, paths) -> None:
    """At most MAX_BENCH_FILES bench files, refused before any is read or simulated."""
    from stepgap.common.limits import MAX_BENCH_FILES
    if n > MAX_BENCH_FILES:
        where_ = paths[0] if len(paths) == 1 else f"{len(paths)} inputs"
        raise UserError(f"{where_}: {n:,} bench files (.json), past the {MAX_BENCH_FILES} one "
                        "calibrate fits at once (each is simulated at every step of the fit); "
                        "give the runs of the cells you predict")


# ---------------------------------------------------------------------------------------------
# The fit


class Fitter:
    """The runs simulated at a CPU factor `s` (x stepgap's defaults), a device level `e` (x the
    roofline) and an acceptance (rates, spread)."""

    def __init__(self, runs: list[BenchRun], base: dict):
        self.runs, self.base = runs, base
        self.rates, self.spread = None, 0.0
        self.sims = 0
        # (run, acceptance) -> its steps: the fit moves s and e alone, how long things take,
        # so each run's later simulations replay its first one (sim/loop.py `Recording`)
        self.steps: dict = {}

    def results(self, s: float, e: float) -> list[RunRecord]:
        from stepgap.common.limits import MAX_SCALE, MIN_SPEED
        from stepgap.sim.config import SimConfig
        from stepgap.sim.loop import Recording, simulate
        if not (MIN_SPEED <= e <= MAX_SCALE and 0 <= s / e <= MAX_SCALE):   # (not --speed's)
            names = ", ".join(str(r.path) for r in self.runs[:3])
            raise UserError(f"{names}: the fit ran to CPU x {s:.3g} and device x {e:.3g} of the "
                            "defaults, past what a run may take, so the runs contradict each "
                            "other or the setup; check each file's k, concurrency and numbers "
                            "against the run, and --gpu")
        out = []
        for i, r in enumerate(self.runs):
            extra = {"acceptance_rates": self.rates, "acceptance_spread": self.spread} \
                if self.rates is not None and r.k else {}
            cfg = SimConfig(**settings(self.base, r.k, mode=r.mode, max_concurrency=r.conc,
                                       cpu_scale=s / e, speed=e, **extra))
            steps = self.steps.setdefault((i, repr(extra)), Recording())
            out.append(RunRecord.of(simulate(cfg, r.requests, recording=steps)[0]))
            self.sims += 1
        return out

    def itl_error(self, s: float, e: float) -> list[float]:
        """log(simulated / measured mean ITL) of every run."""
        return [math.log(res.metrics["mean_itl_ms"] / r.itl)
                for r, res in zip(self.runs, self.results(s, e))]


def solve(f, x0: float, x1: float, lo: float, hi: float, tol: float = 1e-4) -> float:
    """x in [lo, hi] with f(x) = 0, f increasing: the secant method, kept in the bracket."""
    f0, f1 = f(x0), f(x1)
    a, b = lo, hi
    for _ in range(MAX_ITER):
        if abs(f1) < tol or b - a < 1e-6 * max(1.0, abs(b)):
            return x1
        if f1 > 0:
            b = min(b, x1)
        else:
            a = max(a, x1)
        x2 = x1 - f1 * (x1 - x0) / (f1 - f0) if f1 != f0 else (a + b) / 2
        if not a < x2 < b:
            x2 = (a + b) / 2
        x0, f0, x1, f1 = x1, f1, x2, f(x2)
    return x1


def check_reachable(fit: Fitter, s: float, e: float, shift: float) -> None:
    """A fit that ran into its bounds (no CPU at all, 50 x the defaults, the acceptance shifted
    by 4 on the logit scale) and still misses a run's mean ITL by more than REACH: that run is
    not of the setup the command line gives (another GPU, model or k), or its numbers are
    wrong. One line naming the file, rather than a profile of nonsense."""
    bounds = [what for hit, what in (
        (s <= 1e-3, "no host CPU at all"), (s >= 50.0 - 1e-6, "50 x the default CPU costs"),
        (abs(shift) >= 4.0 - 1e-6, f"the acceptance shifted by {shift:+g} on the logit scale"))
        if hit]
    if not bounds:
        return
    for r, x in zip(fit.runs, fit.results(s, e)):
        sim = x.metrics["mean_itl_ms"]
        if abs(math.log(sim / r.itl)) > math.log(1 + REACH):
            raise UserError(
                f"{where(r.path, field='mean_itl_ms')}: {r.itl:g} ms (mean TPOT "
                f"{r.doc['mean_tpot_ms']:g}), which this setup does not reach: at "
                f"{' and '.join(bounds)} it simulates {sim:.4g} ms; check --gpu, --model and "
                "-k against the run, and the file's numbers")


def fit_bench(runs: list[BenchRun], base: dict, noise: float):
    """The profile of the runs (module docstring)."""
    from stepgap.sim.bands import CPU_HIGH, CPU_LOW, CPU_SEED, DEVICE_HIGH, DEVICE_LOW, shifted
    from stepgap.sim.config import SimConfig, acceptance_profile, resolve

    fit = Fitter(runs, base)
    k_max = max(r.k for r in runs)
    cfg = SimConfig(**settings(base, k_max))
    r0 = resolve(cfg)
    prof, _ = acceptance_profile(cfg, r0.target)
    measured = [r for r in runs if r.rates]
    undetermined, how = [], {}
    s, e, shift = CPU_SEED, 1.0, 0.0
    cells = sorted({r.cell for r in runs}, key=str)
    noise = repeats_noise(runs) or noise
    for _ in range(2):   # the acceptance and the level, each at the other's fit, twice
        if k_max and measured:
            deepest = max(measured, key=lambda r: len(r.rates))
            fit.rates, fit.spread = deepest.rates, 0.0   # vLLM's aggregates, as they are
            how["acceptance"] = f"measured: {deepest.path.name}'s per-position rates"
        elif k_max:
            def tokens_per_step(d):   # simulated over measured (TPOT / ITL), log
                fit.rates, fit.spread = shifted(prof, d, max(k_max, len(prof.rates))), prof.spread
                res = fit.results(s, e)
                return statistics.fmean(
                    math.log((x.metrics["mean_itl_ms"] / x.metrics["mean_tpot_ms"])
                             / (r.itl / r.doc["mean_tpot_ms"]))
                    for r, x in zip(runs, res) if r.k)
            shift = solve(tokens_per_step, shift, shift + 0.1, -4.0, 4.0, 2e-4)
            tokens_per_step(shift)
            how["acceptance"] = (f"{prof.name} ({prof.source}) shifted by {shift:+.3f} on the "
                                 "logit scale: the simulated TPOT / ITL is the runs'")
        if len(cells) >= 2:
            s, e = fit_two(fit, s, e)
        else:
            s = solve(lambda x: statistics.fmean(fit.itl_error(x, e)), s, s * 1.1, 0.0, 50.0)
    check_reachable(fit, s, e, shift)
    if len(cells) >= 2:
        split, why = split_two(fit, s, e, noise, (CPU_LOW, CPU_HIGH), (DEVICE_LOW, DEVICE_HIGH))
        how["level"] = (f"CPU x {s:.3f} and device x {e:.4f}: least squares on the log mean "
                        f"ITL of {len(runs)} runs in {len(cells)} cells")
    else:
        split, why = split_one(fit, s, e, noise, (CPU_LOW, CPU_HIGH), (DEVICE_LOW, DEVICE_HIGH))
        how["level"] = (f"CPU x {s:.3f} at the catalog's device level: one cell (k, "
                        "concurrency) pins the sum of host and device time, not the split")
        undetermined.append("the split of the mean ITL between the host's CPU and the device: "
                            "one cell; a run at another k or concurrency determines it "
                            f"(kept as the band: {why})")
    if split["low"] == split["high"]:   # no band at all: runs that contradict each other
        names = ", ".join(str(r.path) for r in runs[:3]) + (f" and {len(runs) - 3} more"
                                                            if len(runs) > 3 else "")
        raise UserError(f"{names}: the fit (CPU x {s:.3g}, device x {e:.3g}) leaves the split "
                        "between host CPU and device no width at all, so the runs contradict "
                        "each other or the setup; check each file's k, concurrency and numbers "
                        "against the run, and --gpu")
    return make_profile(runs, base, fit, s, e, prof, shift, how, split, undetermined, noise,
                        r0.hw.name)


def repeats_noise(runs: list[BenchRun]) -> float | None:
    """The largest relative spread of mean ITL among repeats of one cell, if any."""
    by = {}
    for r in runs:
        by.setdefault(r.cell, []).append(r.itl)
    spreads = [(max(v) - min(v)) / 2 / statistics.fmean(v) for v in by.values() if len(v) > 1]
    return max(spreads) if spreads and max(spreads) > 0 else None


def _jacobian(fit: Fitter, x, r):
    """d(the runs' mean ITL errors) / d(log s, log e) at x, where they are r: forward
    differences of 0.02."""
    import numpy as np
    h = 0.02
    return np.column_stack([(np.array(fit.itl_error(*np.exp(x + h * d))) - r) / h
                            for d in np.eye(2)])


def fit_two(fit: Fitter, s: float, e: float) -> tuple[float, float]:
    """(s, e) minimising the squared log errors of the runs' mean ITL (Gauss-Newton)."""
    import numpy as np
    x = np.log([s, e])
    for _ in range(12):
        r = np.array(fit.itl_error(*np.exp(x)))
        jac = _jacobian(fit, x, r)
        step, *_ = np.linalg.lstsq(jac, -r, rcond=None)
        x = x + np.clip(step, -0.7, 0.7)
        if np.max(np.abs(step)) < 1e-4:
            break
    s, e = map(float, np.exp(x))
    return s, e


def split_two(fit: Fitter, s: float, e: float, noise: float, cpu: tuple, device: tuple
              ) -> tuple[dict, str]:
    """The band of a determined split: 95 % of the runs' noise, propagated through the fit
    along its direction of most CPU change, as far as the ranges of sim/bands.py allow."""
    import numpy as np
    x = np.log([s, e])
    jac = _jacobian(fit, x, np.array(fit.itl_error(s, e)))
    cov = noise ** 2 * np.linalg.pinv(jac.T @ jac)
    d = 1.96 * cov[:, 0] / math.sqrt(max(cov[0, 0], 1e-30))
    box = np.log([cpu, device])   # [[cpu lo, hi], [device lo, hi]]
    ends = {}
    for name, sign in (("low", -1.0), ("high", 1.0)):
        t = 1.0   # how far along the direction the ranges let the end go
        for i in range(2):
            step = sign * d[i]
            if step > 0 and x[i] + step > box[i][1]:
                t = min(t, max(0.0, (box[i][1] - x[i]) / step))
            elif step < 0 and x[i] + step < box[i][0]:
                t = min(t, max(0.0, (box[i][0] - x[i]) / step))
        f = np.exp(sign * t * d)
        ends[name] = {"cpu": float(f[0]), "device": float(f[1])}
    why = (f"95 % of a {100 * noise:.1f} % noise on each run's mean ITL, through the fit, "
           "within the ranges of sim/bands.py")
    return {**ends, "source": why}, why


def split_one(fit: Fitter, s: float, e: float, noise: float, cpu: tuple, device: tuple
              ) -> tuple[dict, str]:
    """What one cell leaves open: the CPU factor from the lowest to the highest that the
    ranges of sim/bands.py allow with some device level reproducing the measured mean ITL
    (within the noise); each end with the device level on the measured ITL."""
    def itl(x, y):
        return statistics.fmean(fit.itl_error(x, y))
    # the most CPU: the fastest device within its range, the ITL at the top of its noise
    s_hi = min(cpu[1], solve(lambda x: itl(x, device[0]) - noise, s, s * 1.1, 0.0, 50.0))
    s_lo = max(cpu[0], solve(lambda x: itl(x, device[1]) + noise, s, s * 0.9, 0.0, 50.0))
    ends = {}
    for name, x in (("low", s_lo), ("high", s_hi)):
        y = solve(lambda v: itl(x, v), e, e * 1.02, device[0] * 0.5, device[1] * 2)
        ends[name] = {"cpu": x / s, "device": y / e}
    why = (f"CPU x {s_lo:.2f} to {s_hi:.2f} with the device's level at {e * ends['low']['device']:.3f}"
           f" to {e * ends['high']['device']:.3f}: the ranges of sim/bands.py that keep the "
           f"measured mean ITL within {100 * noise:.1f} %")
    return {**ends, "source": why}, why


def make_profile(runs, base, fit: Fitter, s, e, prof, shift, how, split, undetermined, noise,
                 gpu: str):
    from stepgap.sim.cpu_costs import CpuCosts
    from stepgap.sim.profile import CpuFit, Profile
    residuals = []
    for r, res in zip(runs, fit.results(s, e)):
        residuals.append({"run": r.path.name, "k": r.k, "conc": r.conc, "mode": r.mode,
                          **{m: round((res.metrics[m] - r.doc[m]) / r.doc[m], 4)
                             for m in ("mean_tpot_ms", "mean_itl_ms", "p99_tpot_ms",
                                       "mean_ttft_ms") if r.doc.get(m)}})
    acc = None
    if fit.rates is not None:
        acc = {"rates": [round(x, 6) for x in fit.rates], "spread": fit.spread,
               "k": max(r.k for r in runs), "source": how["acceptance"]}
    about = {"device": "cuda", "gpu": gpu,
             "model": {"target": base["model"], "draft": base.get("draft"),
                       "method": base["method"]},
             "topology": {"engine": "stepgap", "executor": "inline", "device": "cuda"},
             **({"acceptance": acc} if acc else {}),
             **({"device_profile": base["device_profile"]} if base.get("device_profile") else {}),
             "calibration": {
                 "what": f"fitted on {len(runs)} vLLM bench file(s) of {gpu} runs (no traces): "
                         "the acceptance, one CPU factor, the roofline's level",
                 "runs": [r.path.name for r in runs],
                 "cells": [{"k": r.k, "max_concurrency": r.conc, "mode": r.mode} for r in runs],
                 "cpu_scale": round(s, 4), "roofline_level": round(e, 5),
                 "acceptance_shift": round(shift, 4), "noise": noise,
                 "how": how, "simulations": fit.sims},
             "scheduler": {key: base[key] for key in ("max_num_seqs", "max_model_len",
                                                      "block_size", "enable_prefix_caching")
                           if key in base}}
    costs = CpuCosts().scaled(s).to_dict()
    return Profile([], CpuFit({k: v for k, v in costs.items() if v is not None}), {}, None,
                   undetermined, about, {"bands": {"split": split}, "residuals": residuals},
                   roofline_level=round(e, 5))


def report(profile, out) -> str:
    cal = profile.about["calibration"]
    split = profile.notes["bands"]["split"]
    lines = [f"profile: {out}: {cal['what']}",
             f"  acceptance: {cal['how']['acceptance']}" if "acceptance" in cal["how"] else
             "  acceptance: none (k = 0)",
             f"  level: {cal['how']['level']}",
             f"  band: CPU x {split['low']['cpu']:.3f} .. {split['high']['cpu']:.3f} of the fit, "
             f"device x {split['low']['device']:.4f} .. {split['high']['device']:.4f} "
             f"({split['source']})"]
    for r in profile.notes["residuals"]:
        lines.append(f"  {r['run']}: " + ", ".join(
            f"{m} {100 * v:+.1f} %" for m, v in r.items() if m.endswith("_ms")))
    return "\n".join(lines)
