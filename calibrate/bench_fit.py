"""`stepgap calibrate` on `vllm bench serve --save-result` files alone (no traces), and the
next such run `stepgap advise` names.

A user who ran vLLM has bench files (with or without `--save-detailed`) and knows what the run
had: the model, the drafter, k, the GPU, the concurrency. calibrate takes simulate's options for
them (common/run_spec.py, with vLLM's defaults: --max-model-len the model's context), and reads
what each file holds of its run: its prompts (the per-request lengths of --save-detailed, else
the workload the command line or the file's --metadata names, drawn again, else the file's
token totals), its request rate, burstiness and concurrency; a command line that contradicts a
file is refused, naming both. From the runs it fits, on the simulator's roofline of that GPU
(or its measured tables):

- the acceptance: the runs' own per-position rates where the files have them (vLLM writes
  `spec_decode_per_position_acceptance_rates`), or the user's own (--acceptance FILE), else the
  published profile shifted on the logit scale until the simulated TPOT / ITL (the tokens per
  step) is the measured one;
- the host, as factors on stepgap's default CPU costs (sim/cpu_costs.py) and on the roofline's
  device times (`Host`), as many as the runs determine (`fitted`): one cell, the CPU factor at
  the catalog's device level, and what it leaves open (the split of host and device along its
  mean ITL, within the ranges of sim/bands.py) kept as the profile's band; two or more cells,
  the CPU and the device by least squares on the log of each run's mean ITL (Huber's, with a
  weak pull to the nominal host), each run's residual printed, a run far from the others named
  with its residual; three or more cells, the CPU's per-request part over two loads, the
  drafter's level over two depths. A factor outside its documented range is warned about.

The profile it writes (sim/profile.py: CPU costs, `roofline_level`, `draft_level`,
`about.acceptance`, the GPU and topology it was measured on, `notes.bands`, `notes.warnings`)
is taken by `simulate`, `sweep` and `advise` with `--profile`; it runs that GPU and that
acceptance unless told otherwise. calibrate/vllm_fit.py fits per op from timelines (traces or
hook spans): the path for a profiled run.

The last section is `stepgap advise`'s next run (`plan_next_run`), which the layer above hands
to advise (sim/ does not import calibrate/): it judges candidate runs by calibrating on them.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stepgap.common.errors import UserError, where

if TYPE_CHECKING:   # (read where they are used: `stepgap --help` need not load the result types)
    from stepgap.common.run_result import Metrics, RunResult

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
    def metrics(self) -> Metrics:
        """The file's numbers, by vLLM's names."""
        from stepgap.common.run_result import Metrics
        return Metrics.from_dict(self.doc)

    @property
    def itl(self) -> float:
        return self.metrics.mean_itl_ms


# ---------------------------------------------------------------------------------------------
# The command


BENCH_EPILOG = """\

bench files alone (no traces): give --gpu (or --device-profile) and what the runs had
  vllm serve meta-llama/Llama-3.1-8B-Instruct --no-async-scheduling --speculative-config \\
      '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 4}'
  vllm bench serve ... --dataset-name random --random-input-len 1024 --max-concurrency 1 \\
      --save-result --metadata mode=sync num_speculative_tokens=4 --result-filename sync-k4-c1.json
  stepgap calibrate sync-k4-c1.json --gpu h100 --model llama-3.1-8b --draft llama-3.1-8b-eagle3 \\
      --out h100.json
  stepgap advise --profile h100.json --model llama-3.1-8b --draft llama-3.1-8b-eagle3 \\
      --max-concurrency 1 4 16      # its answer, and the next run to make
  stepgap calibrate sync-k4-c1.json async-k4-c1.json --gpu h100 ... --out h100.json   # again
It reads what each file holds of its run (its prompts: --save-detailed's lengths, else the
workload named on the command line or in its --metadata, else its token totals; its prompt
count, request rate, burstiness, concurrency, k and mode) and refuses a command line that
contradicts it, naming both. It fits the acceptance (the files' rates, else the published
profile's level) and the host as the runs determine it: one cell (k, concurrency, mode), the
host's CPU at the catalog's device level, the split of the two kept as the profile's band; two
or more, the CPU and the device, by least squares with every run's residual printed; three or
more over two loads, the CPU's per-request part too; over two depths, the drafter's level. A
run far from the others, and a factor outside its documented range, are warned about.
"""


def extend(c) -> None:
    """The bench-file options of `stepgap calibrate` (calibrate/vllm_fit.py registers the
    command with simulate's options): with --gpu or --device-profile, calibrate takes bench
    files alone."""
    from stepgap.common.acceptance import PROFILES
    from stepgap.common.options import add_option
    from stepgap.sim.config import SimConfig
    from stepgap.sim.hardware import CATALOG
    d = SimConfig()
    g = c.add_argument_group("a run's bench files alone (no traces)")
    add_option(g, "gpu", d, help=f"the GPU the runs were made on: {', '.join(CATALOG)} (cpu: "
                                 "vLLM's CPU build, with --device cpu), or a YAML file; "
                                 "calibrate then fits its roofline to the bench files")
    add_option(g, "device_profile", d, help="the GPU's measured operator tables instead of its "
                                            "roofline (give --gpu too, for its memory)")
    add_option(g, "topology", d)
    add_option(g, "acceptance", d, help=f"where the files have no rates: the acceptance profile "
                                        f"to fit the level of ({', '.join(PROFILES)}; default: "
                                        "the model's published one), or the acceptance you "
                                        "measured (a file of `stepgap ingest vllm-metrics`, or "
                                        "a bench file with spec_decode_* counters)")
    g.add_argument("--noise", type=float, metavar="FRAC",
                   help=f"a run's mean ITL from run to run (default {NOISE:g}; repeats of a "
                        "cell measure it)")
    c.epilog = (c.epilog or "") + BENCH_EPILOG
    traces = c.get_default("func")
    c.set_defaults(func=lambda args: cmd_bench(args) if args.gpu or args.device_profile
                   else traces(args))


def cmd_bench(args) -> int:
    from stepgap.common.fileio import check_not_walked, check_writable
    from stepgap.common.options import note
    from stepgap.sim.config import SimConfig
    from stepgap.sim.plan import resolve
    from stepgap.sim.profile import save_profile
    check_writable(args.out, "--out")
    check_not_walked("--out", args.out, args.measured)
    base = setup_of(args)
    runs = load_bench_runs(args.measured, args, base)   # first: what the files disagree with
    for k in sorted({r.k for r in runs}):   # an unknown GPU or model: one line, before the fit
        resolve(SimConfig(**settings(base, k)))
    profile = fit_bench(runs, base, args.noise)
    for line in base["_notes"]:   # (after the fit: bad input ends in its one line)
        note(args, line)
    save_profile(args.out, profile)
    print(report(profile, args.out))
    for line in profile.notes.get("warnings", []):
        print(f"warning: {line}", file=sys.stderr)
    for m in profile.undetermined or ():
        print(f"  undetermined: {m}", file=sys.stderr)
    return 0


# The settings each bench file holds for its own run: given on the command line, they are held
# to every file (a file that says otherwise is refused), not set on the runs.
RUN_FACTS = ("k", "max_concurrency", "mode", "num_prompts", "request_rate", "burstiness",
             "output_len", "seed")


def setup_of(args) -> dict:
    """The SimConfig settings the runs had, from the command line (simulate's options), with
    vLLM's defaults where it says nothing: --max-model-len the model's context. What each bench
    file records of its own run (RUN_FACTS) is kept aside as `_NAME`, to be held to the files."""
    from stepgap.common.model_presets import load_model_config
    from stepgap.common.options import (drafter_without_k, executor_from_args, mode_from_args,
                                        settings_from_args, speculative_from_args,
                                        workload_spec)
    from stepgap.sim.config import SimConfig
    if args.model is None:
        raise UserError("--model: required (the runs' target, as `vllm serve MODEL`)")
    method, draft, k = speculative_from_args(args)
    args.mode, args.executor = mode_from_args(args), executor_from_args(args)
    given = settings_from_args(args, SimConfig)
    notes = []
    if k == 0:   # (no -k: each file's own k)
        notes.append(f"warning: {drafter_without_k(draft, k)}" if draft else None)
    notes = [n for n in notes if n]
    facts = {key: given.pop(key, None) for key in RUN_FACTS}
    facts["k"], facts["mode"] = k, args.mode
    for key in ("method", "draft", "k"):
        given.pop(key, None)
    base = {**given, "gpu": args.gpu or "h100", "method": method or "eagle3", "jitter": False}
    if draft is not None:
        base["draft"] = draft
    if "max_model_len" not in base:   # vLLM's default: the model's context
        base["max_model_len"] = load_model_config(args.model).max_position_embeddings
        notes.append(f"--max-model-len: the model's context, {base['max_model_len']:,} tokens, "
                     "as vLLM (give the server's if it set one)")
    if base["gpu"] == "cpu" and "device" not in base:
        base["device"] = "cpu"
    spec = workload_spec(args)
    if args.output_len is not None:   # (a dataset's output option sets it: workload_spec)
        facts["output_len"] = args.output_len
    if args.noise is None:
        args.noise = NOISE
    if not (math.isfinite(args.noise) and 0 < args.noise < 0.5):
        raise UserError(f"--noise: expected a fraction in (0, 0.5), got {args.noise}")
    base.update({f"_{key}": v for key, v in facts.items()})
    base["_workload"], base["_notes"] = spec, notes
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


def refuse(path, field: str, got, option: str, given, why: str) -> UserError:
    """A bench file that contradicts the command line: both values, named."""
    return UserError(f"{where(path, field=field)}: {got!r}, but {option} is {given!r}: {why}")


def load_bench_runs(paths, args, base: dict) -> list[BenchRun]:
    """Every bench file among `paths`, checked against the command line (model, k, the load,
    the workload): a disagreement is refused, naming both values."""
    from stepgap.common.fileio import input_files
    from stepgap.common.run_result import Metrics
    from stepgap.common.vllm_bench import bench_k, is_bursty, read_bench

    runs, skipped = [], []
    found = input_files(paths, "*.json", "bench file")
    check_bench_count(len(found), paths)
    files = [(path, read_bench(path)) for path, _ in found]
    # vLLM (0.32) writes its spec_decode_* counters into every bench file of a server that
    # speculates: where some files have them, one without them is of a server without drafts
    counted = next((p for p, d in files if d.get("spec_decode_num_drafts") is not None), None)
    for path, doc in files:
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
        if k is None and counted is not None and "spec_decode_num_drafts" not in doc:
            k = 0
            skipped.append(f"{path}: k = 0 (no num_speculative_tokens, and no spec_decode_* "
                           f"counters, which vLLM wrote into {counted.name}: a server without "
                           "drafts)")
        if k is None:
            raise UserError(f"{path}: its k is not in the file (no num_speculative_tokens, "
                            "no per-position acceptance): give --num-speculative-tokens")
        conc = doc.get("max_concurrency")
        if base["_max_concurrency"] is not None and conc is not None \
                and conc != base["_max_concurrency"]:
            raise refuse(path, "max_concurrency", conc, "--max-concurrency",
                         base["_max_concurrency"], "give the runs of one concurrency, or leave "
                         "--max-concurrency out")
        conc = conc if conc is not None else base["_max_concurrency"]
        mode = doc.get("mode") or base["_mode"] or "sync"
        if base["_mode"] is not None and doc.get("mode") and doc["mode"] != base["_mode"]:
            raise UserError(f"{where(path, field='mode')}: {doc['mode']!r}, but the command "
                            f"line says {base['_mode']} scheduling")
        check_load(path, doc, base)
        m = Metrics.from_dict(doc)
        if m.mean_itl_ms is None or not m.mean_itl_ms > 0:
            raise UserError(f"{where(path, field='mean_itl_ms')}: missing or 0; calibrate fits "
                            "the runs' mean ITL")
        if not m.mean_tpot_ms > 0:
            raise UserError(f"{where(path, field='mean_tpot_ms')}: 0; calibrate fits the runs' "
                            "tokens per step as their mean ITL over their mean TPOT")
        if is_bursty(doc):
            skipped.append(f"{path}: its client read the stream in bursts: left out")
            continue
        reqs, how = run_workload(path, doc, base, k, conc)
        if how:
            skipped.append(how)
        if all(q.output_len <= 1 for q in reqs):   # (its mean ITL > 0: two tokens or more)
            why = f"--output-len {base['_output_len']}" if base["_output_len"] is not None \
                else "its output lengths"
            raise UserError(f"{where(path, field='mean_itl_ms')}: {m.mean_itl_ms:g} ms "
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


def file_rate(doc: dict) -> float:
    rate = doc.get("request_rate", "inf")
    return math.inf if rate == "inf" else float(rate)


def check_load(path, doc: dict, base: dict) -> None:
    """The file's prompt count, request rate and burstiness against the command line's."""
    if base["_num_prompts"] is not None and doc["num_prompts"] != base["_num_prompts"]:
        raise refuse(path, "num_prompts", doc["num_prompts"], "--num-prompts",
                     base["_num_prompts"], "calibrate simulates the prompts the run sent")
    rate = base["_request_rate"]
    if rate is not None and file_rate(doc) != rate:
        raise refuse(path, "request_rate", doc.get("request_rate", "inf"), "--request-rate",
                     "inf" if rate == math.inf else rate, "calibrate sends them as the run did")
    burst = base["_burstiness"]
    if burst is not None and (doc.get("burstiness") or 1.0) != burst:
        raise refuse(path, "burstiness", doc.get("burstiness"), "--burstiness", burst,
                     "calibrate sends them as the run did")


TOKENS_TOL = 0.10   # a workload drawn again against the file's token totals (see run_workload)


def recorded_workload(path, doc: dict) -> tuple[str | None, int | None]:
    """The workload a bench file names (`--metadata dataset_name=... random_input_len=...`,
    vLLM's option names with underscores; vLLM itself writes none): (its spec, its output
    length), or (None, None)."""
    from stepgap.common.options import DATASET_FLAGS, WORKLOAD_FLAGS, dataset_spec
    name = doc.get("dataset_name")
    if name is None:
        return None, None
    if not isinstance(name, str) or not name:
        raise UserError(f"{where(path, field='dataset_name')}: expected a dataset's name, got "
                        f"{name!r}")
    prefix, params, out = DATASET_FLAGS.get(name), {}, None
    for flag, key, _ in WORKLOAD_FLAGS:
        field = flag.lstrip("-").replace("-", "_")
        if field not in doc or prefix is None or not flag.startswith(prefix):
            continue
        try:
            v = float(doc[field]) if key == "range_ratio" else int(str(doc[field]))
        except ValueError:
            raise UserError(f"{where(path, field=field)}: expected a number, got "
                            f"{doc[field]!r}") from None
        if key == "output_len":
            out = v
        else:
            params[key] = v
    try:
        return dataset_spec(name, doc.get("dataset_path"), params), out
    except UserError as e:
        raise UserError(f"{where(path, field='dataset_name')}: {e}") from None


def run_workload(path, doc: dict, base: dict, k: int, conc) -> tuple[list, str | None]:
    """The requests the run served, and a note on where they come from: its per-request
    lengths (--save-detailed); else the workload the command line or the file names, drawn
    again with as many prompts (at most MAX_FIT_PROMPTS); else every prompt and output at the
    file's mean lengths (total_input_tokens, total_output_tokens). A workload named is held to
    the file's token totals: a mean prompt or output more than TOKENS_TOL off is refused,
    naming both (another dataset's run, or lengths the command line does not say)."""
    from stepgap.common.formats import TraceRequest
    from stepgap.common.vllm_bench import DETAIL_KEYS, bench_requests
    from stepgap.common.workloads import apply_request_rate
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import build_workload

    given, recorded = base["_workload"], recorded_workload(path, doc)
    if given is not None and recorded[0] is not None and given != recorded[0]:
        raise refuse(path, "dataset_name", recorded[0], "the command line's workload", given,
                     "give the workload the run had")
    spec = given or recorded[0]
    out_len = base["_output_len"] if base["_output_len"] is not None else recorded[1]
    rate, burst = file_rate(doc), doc.get("burstiness") or 1.0
    seed = base["_seed"] or 0
    n, note = doc["num_prompts"], None
    if all(key in doc for key in DETAIL_KEYS):
        reqs = bench_requests(doc, path)
        if len(reqs) > MAX_FIT_PROMPTS:   # every step-th request: the spread of lengths kept
            step = math.ceil(len(reqs) / MAX_FIT_PROMPTS)
            note = (f"{path}: {len(reqs):,} requests: simulated with every {step:,}th, "
                    f"{len(reqs[::step]):,} of them (at most {MAX_FIT_PROMPTS:,} a run: each fit "
                    "step a simulation)")
            reqs = reqs[::step]
        if spec is not None or out_len is not None:
            cfg = SimConfig(**settings(base, k, workload=spec or "mtbench", num_prompts=n,
                                       output_len=out_len, seed=seed))
            drawn = build_workload(cfg)
            check_tokens(path, doc, drawn, describe(spec, out_len), spec is not None,
                         out_len is not None)
        return apply_request_rate(reqs, None if rate == math.inf else rate, burst, seed), note
    from stepgap.common.run_result import Metrics
    counts = Metrics.from_dict(doc)
    totals = counts.total_input_tokens and counts.total_output_tokens and counts.completed
    if spec is None and out_len is None and totals:
        done = counts.completed
        plen = max(1, round(counts.total_input_tokens / done))
        olen = max(1, round(counts.total_output_tokens / done))
        m = min(n, MAX_FIT_PROMPTS)
        reqs = [TraceRequest(f"req-{i}", 0.0, plen, olen) for i in range(m)]
        note = (f"{path}: no per-request lengths (--save-detailed) and no workload named: "
                f"each of its {m:,} prompts simulated at the file's mean, {plen:,} tokens "
                f"(total_input_tokens / completed), and {olen:,} output tokens; --dataset-name "
                "and its options give their spread")
        return apply_request_rate(reqs, None if rate == math.inf else rate, burst, seed), note
    m = min(n, MAX_FIT_PROMPTS)
    if spec is None:
        note = (f"{path}: no per-request lengths (--save-detailed), no token totals and no "
                "workload named: simulated with stepgap's default workload, mtbench (give "
                "--dataset-name and its options)")
    elif m < n:
        note = (f"{path}: no per-request lengths (--save-detailed), so its workload is "
                f"{spec}, drawn again: simulated with {m:,} of its {n:,} prompts, each fit "
                "step a simulation")
    cfg = SimConfig(**settings(base, k, workload=spec or "mtbench", num_prompts=m,
                               output_len=out_len, request_rate=None if rate == math.inf
                               else rate, burstiness=burst, seed=seed, max_concurrency=conc))
    reqs = build_workload(cfg)
    if totals:
        check_tokens(path, doc, reqs, describe(spec, out_len), spec is not None,
                     out_len is not None)
    return reqs, note


def describe(spec: str | None, out_len: int | None) -> str:
    parts = ([f"the workload {spec}"] if spec else []) + \
        ([f"--output-len {out_len}"] if out_len is not None else [])
    return " with ".join(parts)


def check_tokens(path, doc: dict, reqs: list, what: str, prompts: bool, outputs: bool) -> None:
    """The file's mean prompt and output (its token totals, or its per-request lists) against
    those of `reqs` (the workload the command line or the file names, drawn again)."""
    from stepgap.common.run_result import RunResult
    res = RunResult.from_dict(doc)
    m, lists = res.metrics, res.requests
    done = m.completed or 0
    if lists is not None:
        ok = [i for i, e in enumerate(doc.get("errors") or [""] * len(lists.input_lens))
              if not e]
        ins = sum(lists.input_lens[i] for i in ok)
        outs = sum(lists.output_lens[i] for i in ok)
        done = len(ok)
    else:
        ins, outs = m.total_input_tokens, m.total_output_tokens
    if not done or not reqs:
        return
    for key, total, mine, check in (
            ("total_input_tokens", ins, [r.prompt_len for r in reqs], prompts),
            ("total_output_tokens", outs, [r.output_len for r in reqs], outputs)):
        if not check or total is None:
            continue
        theirs, drawn = total / done, sum(mine) / len(mine)
        if abs(drawn / theirs - 1) > TOKENS_TOL:
            kind = "prompt" if key == "total_input_tokens" else "output"
            raise UserError(
                f"{where(path, field=key)}: {total:,} ({theirs:,.0f} tokens per {kind}), but "
                f"{what} gives {drawn:,.0f} per {kind}: give the workload the run had (or leave "
                "it out: calibrate then takes the file's)")


# ---------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True)
class Host:
    """What the fit moves: the host's CPU as factors on stepgap's default costs (sim/cpu_costs.py)
    and the device's level on the roofline's times. `cpu` scales every cost, or, where `per` is
    given, each op's fixed part and the latencies while `per` scales its parts per request and
    per token (a + b·reqs + c·tokens: the host's per-op structure); `draft`, where given, puts
    the drafter's passes at a level of their own on top of the device's."""

    cpu: float
    device: float = 1.0
    per: float | None = None
    draft: float | None = None

    @property
    def level(self) -> float:
        """One CPU factor for the whole host: the geometric mean of the two where split."""
        return self.cpu if self.per is None else math.sqrt(self.cpu * self.per)

    def costs(self):
        from stepgap.sim.cpu_costs import CPU_COSTS, LATENCIES, CpuCosts, OpCost
        d = CpuCosts()
        if self.per is None:
            return d.scaled(self.cpu)
        from dataclasses import replace
        ops = {op: OpCost(c.a * self.cpu, c.b * self.per, c.c * self.per)
               for op in CPU_COSTS if (c := getattr(d, op)) is not None}
        return replace(d, **ops, **{lat: getattr(d, lat) * self.cpu for lat in LATENCIES})

    def settings(self) -> dict:
        """SimConfig settings that run this host (the device's level as `device_scale`, the
        CPU's as `cpu_scale` or its costs; `speed`, which scales both, at 1); with a drafter's
        level, `profile` runs it instead."""
        from stepgap.sim.cpu_costs import CPU_COSTS, LATENCIES
        if self.draft is not None:
            return {}
        if self.per is None:
            return {"cpu_scale": self.cpu, "speed": 1.0, "device_scale": self.device}
        c = self.costs()
        return {"cpu_costs": {op: [o.a, o.b, o.c] for op in CPU_COSTS
                              if (o := getattr(c, op)) is not None},
                **{lat: getattr(c, lat) for lat in LATENCIES if lat != "client_latency_us"},
                "cpu_scale": 1.0, "speed": 1.0, "device_scale": self.device}

    def profile(self):
        """The host as a profile (a drafter's level needs one: sim/costs.py LevelCosts)."""
        from stepgap.sim.profile import CpuFit, Profile
        costs = {k: v for k, v in self.costs().to_dict().items() if v is not None}
        return Profile([], CpuFit(costs), {}, None, None, {}, {}, roofline_level=self.device,
                       draft_level=self.draft)

    def log(self, names: tuple):
        import numpy as np
        return np.log([getattr(self, n) or (self.cpu if n == "per" else 1.0) for n in names])

    @classmethod
    def of(cls, x, names: tuple) -> Host:
        import numpy as np
        v = dict(zip(names, map(float, np.exp(x))))
        return cls(v["cpu"], v.get("device", 1.0), v.get("per"), v.get("draft"))


# The fit's bounds, far outside any host's range, each factor's log
BOUNDS = {"cpu": (math.log(1e-3), math.log(50.0)), "per": (math.log(1e-3), math.log(50.0)),
          "device": (math.log(0.1), math.log(10.0)), "draft": (math.log(0.1), math.log(20.0))}
# One cell's CPU factor, solved alone, within the same bounds: a run the device alone explains
# (a fast host on a slow device) would otherwise solve to a CPU of ~0, and its band's ends, as
# factors of that, past any a profile may hold (advise's next run on an H100 did)
CPU_LIMITS = (math.exp(BOUNDS["cpu"][0]), math.exp(BOUNDS["cpu"][1]))


class Fitter:
    """The runs simulated on a `Host` and at an acceptance (rates, spread)."""

    def __init__(self, runs: list[BenchRun], base: dict):
        self.runs, self.base = runs, base
        self.rates, self.spread = None, 0.0
        self.sims = 0
        # (run, acceptance) -> its steps: the fit moves how long things take alone, so each
        # run's later simulations replay its first one (sim/steps.py `Recording`)
        self.steps: dict = {}

    def results(self, host: Host) -> list[RunResult]:
        """Each run simulated on `host`; repeats of a cell over the same prompts (and at the
        same acceptance) are one simulation."""
        from stepgap.common.limits import MAX_SCALE, MIN_SPEED
        from stepgap.sim.config import SimConfig
        from stepgap.sim.loop import Recording, simulate
        s, e = host.level * host.device, host.device
        if not (MIN_SPEED <= e <= MAX_SCALE and 0 <= s / e <= MAX_SCALE):   # (not --speed's)
            names = ", ".join(str(r.path) for r in self.runs[:3])
            raise UserError(f"{names}: the fit ran to CPU x {s / e:.3g} and device x {e:.3g} of "
                            "the defaults, past what a run may take, so the runs contradict each "
                            "other or the setup; check each file's k, concurrency and numbers "
                            "against the run, and --gpu")
        out, done = [], {}
        for i, r in enumerate(self.runs):
            extra = {"acceptance_rates": self.rates, "acceptance_spread": self.spread} \
                if self.rates is not None and r.k else {}
            key = (r.k, r.conc, r.mode, self.workload_id(i), repr(extra))
            if key not in done:
                cfg = SimConfig(**settings(self.base, r.k, mode=r.mode, max_concurrency=r.conc,
                                           **host.settings(), **extra))
                prof = host.profile() if host.draft is not None else None
                # (a recording keeps its device ops: another device level takes its own)
                steps = self.steps.setdefault(
                    key + ((host.device, host.draft) if prof else ()), Recording())
                done[key] = simulate(cfg, r.requests, recording=steps, profile=prof)[0]
                self.sims += 1
            out.append(done[key])
        return out

    def workload_id(self, i: int) -> int:
        """The first run's index whose requests are the same as run i's."""
        reqs = self.runs[i].requests
        return next(j for j, r in enumerate(self.runs) if r.requests == reqs)

    def itl_error(self, host: Host) -> list[float]:
        """log(simulated / measured mean ITL) of every run."""
        return [math.log(res.metrics.mean_itl_ms / r.itl)
                for r, res in zip(self.runs, self.results(host))]


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


def check_reachable(fit: Fitter, host: Host, shift: float) -> None:
    """One cell whose fit ran into its bounds (no CPU at all, 50 x the defaults, the acceptance
    shifted by 4 on the logit scale) and still misses its mean ITL by more than REACH: the run
    is not of the setup the command line gives (another GPU, model or k), or its numbers are
    wrong. One line naming the file, rather than a profile of nonsense. (Several cells are
    fitted by least squares, and a run far from the others is named with its residual.)"""
    s = host.cpu
    bounds = [what for hit, what in (
        (s <= 1e-3 * 1.001, "no host CPU at all"),
        (s >= 50.0 - 1e-6, "50 x the default CPU costs"),
        (abs(shift) >= 4.0 - 1e-6, f"the acceptance shifted by {shift:+g} on the logit scale"))
        if hit]
    if not bounds:
        return
    for r, x in zip(fit.runs, fit.results(host)):
        sim = x.metrics.mean_itl_ms
        if abs(math.log(sim / r.itl)) > math.log(1 + REACH):
            raise UserError(
                f"{where(r.path, field='mean_itl_ms')}: {r.itl:g} ms (mean TPOT "
                f"{r.metrics.mean_tpot_ms:g}), which this setup does not reach: at "
                f"{' and '.join(bounds)} it simulates {sim:.4g} ms; check --gpu, --model and "
                "-k against the run, and the file's numbers")


def in_flight(r: BenchRun) -> int:
    """The requests a run had in flight at most: its concurrency, at most its prompts."""
    n = len(r.requests)
    return min(r.conc or n, n)


def fitted(runs: list[BenchRun]) -> tuple:
    """The host's factors the runs determine (`Host`'s names): one cell, the CPU at the
    catalog's device level; two or more, the CPU and the device; three or more cells also what
    they vary, as far as there are cells: over two or more loads, the CPU's per-request part
    apart from its fixed one (a cost per request shows only where the requests in flight
    differ); over runs with and without drafts (or at two depths), the drafter's level apart
    from the target's."""
    cells = {r.cell for r in runs}
    if len(cells) < 2:
        return ("cpu",)
    names = ["cpu", "device"]
    if len(cells) >= 3 and len({in_flight(r) for r in runs}) >= 2:
        names.append("per")
    ks = {r.k for r in runs}
    if len(cells) > len(names) and len(ks) >= 2 and max(ks) > 0:
        names.append("draft")
    return tuple(names)


def host_ranges(base: dict) -> tuple[tuple, tuple]:
    """The documented ranges of the host's CPU factor and the device's level (sim/bands.py),
    which bound what one cell leaves open; they are GPU hosts' and the roofline's against GPUs,
    so a CPU device (vLLM's CPU build) takes the fit's own bounds."""
    from stepgap.sim.bands import CPU_HIGH, CPU_LOW, DEVICE_HIGH, DEVICE_LOW
    if base.get("gpu") == "cpu" or base.get("device") == "cpu":
        return (tuple(math.exp(x) for x in BOUNDS["cpu"]),
                tuple(math.exp(x) for x in BOUNDS["device"]))
    return (CPU_LOW, CPU_HIGH), (DEVICE_LOW, DEVICE_HIGH)


def fit_bench(runs: list[BenchRun], base: dict, noise: float):
    """The profile of the runs (module docstring)."""
    from stepgap.common.acceptance import PROFILES
    from stepgap.sim.bands import CPU_SEED, shifted
    from stepgap.sim.config import SimConfig
    from stepgap.sim.plan import acceptance_profile, resolve

    noise = repeats_noise(runs) or noise
    base = {**base, "_noise": noise}
    fit = Fitter(runs, base)
    k_max = max(r.k for r in runs)
    cfg = SimConfig(**settings(base, k_max))
    r0 = resolve(cfg)
    prof, _ = acceptance_profile(cfg, r0.target)
    measured = [r for r in runs if r.rates]
    undetermined, how = [], {}
    host, shift = Host(CPU_SEED), 0.0
    cells = sorted({r.cell for r in runs}, key=str)
    names = fitted(runs)
    for _ in range(2):   # the acceptance and the host, each at the other's fit, twice
        if k_max and measured:
            deepest = max(measured, key=lambda r: len(r.rates))
            fit.rates, fit.spread = deepest.rates, 0.0   # vLLM's aggregates, as they are
            how["acceptance"] = f"measured: {deepest.path.name}'s per-position rates"
        elif k_max and prof.name not in PROFILES:   # --acceptance FILE: the user's own
            fit.rates, fit.spread = prof.rates, prof.spread
            how["acceptance"] = f"measured: {prof.source}"
        elif k_max:
            def tokens_per_step(d):   # simulated over measured (TPOT / ITL), log
                fit.rates, fit.spread = shifted(prof, d, max(k_max, len(prof.rates))), prof.spread
                res = fit.results(host)
                return statistics.fmean(
                    math.log((x.metrics.mean_itl_ms / x.metrics.mean_tpot_ms)
                             / (r.itl / r.metrics.mean_tpot_ms))
                    for r, x in zip(runs, res) if r.k)
            shift = solve(tokens_per_step, shift, shift + 0.1, -4.0, 4.0, 2e-4)
            tokens_per_step(shift)
            how["acceptance"] = (f"{prof.name} ({prof.source}) shifted by {shift:+.3f} on the "
                                 "logit scale: the simulated TPOT / ITL is the runs'")
        if names == ("cpu",):
            s = solve(lambda x: statistics.fmean(fit.itl_error(Host(x))), host.cpu,
                      host.cpu * 1.1, *CPU_LIMITS)
            host = Host(s)
        else:
            host = least_squares(fit, host, names)
    cpu_range, device_range = host_ranges(base)
    if names == ("cpu",):
        check_reachable(fit, host, shift)
        split, why = split_one(fit, host, noise, cpu_range, device_range)
        how["level"] = (f"CPU x {host.cpu:.3f} at the catalog's device level: one cell (k, "
                        "concurrency) pins the sum of host and device time, not the split")
        undetermined.append("the split of the mean ITL between the host's CPU and the device: "
                            "one cell; a run at another k or concurrency determines it "
                            f"(kept as the band: {why})")
    else:
        split, why = split_fitted(fit, host, names, noise, cpu_range, device_range)
        parts = [f"CPU x {host.cpu:.3f}" + (" fixed" if host.per is not None else "")]
        if host.per is not None:
            parts.append(f"x {host.per:.3f} per request and token")
        parts.append(f"device x {host.device:.4f}")
        if host.draft is not None:
            parts.append(f"the drafter's passes x {host.draft:.3f} more")
        how["level"] = (f"{', '.join(parts)}: least squares on the log mean ITL of {len(runs)} "
                        f"runs in {len(cells)} cells")
        if "per" not in names and len(cells) >= 3:
            undetermined.append("the host's cost per request apart from its fixed cost: every "
                                "run had as many requests in flight; runs at another "
                                "concurrency determine it")
        if "draft" in names and len({r.k for r in runs} - {0}) < 2:
            undetermined.append("how the drafter's cost grows with k: one depth with drafts, "
                                "whose level takes all that drafting adds as passes (a fixed "
                                "cost of each drafted step is not told apart), so deeper k "
                                "extrapolate every pass alike; runs at a second depth with "
                                "drafts check it")
    if split["low"] == split["high"]:   # no band at all: runs that contradict each other
        names_ = ", ".join(str(r.path) for r in runs[:3]) + (f" and {len(runs) - 3} more"
                                                             if len(runs) > 3 else "")
        raise UserError(f"{names_}: the fit (CPU x {host.level:.3g}, device x {host.device:.3g}) "
                        "leaves the split between host CPU and device no width at all, so the "
                        "runs contradict each other or the setup; check each file's k, "
                        "concurrency and numbers against the run, and --gpu")
    warnings = fit_warnings(fit, host, len(names), noise, base, cpu_range, device_range)
    return make_profile(runs, base, fit, host, prof, shift, how, split, undetermined, noise,
                        r0.hw.name, warnings)


def repeats_noise(runs: list[BenchRun]) -> float | None:
    """The largest relative spread of mean ITL among repeats of one cell, if any."""
    by = {}
    for r in runs:
        by.setdefault(r.cell, []).append(r.itl)
    spreads = [(max(v) - min(v)) / 2 / statistics.fmean(v) for v in by.values() if len(v) > 1]
    return max(spreads) if spreads and max(spreads) > 0 else None


def _bounds(names: tuple):
    import numpy as np
    return (np.array([BOUNDS[n][0] for n in names]), np.array([BOUNDS[n][1] for n in names]))


def _jacobian(fit: Fitter, x, r, names: tuple):
    """d(the runs' mean ITL errors) / d(the log of the host's factors) at x, where they are r:
    forward differences of 0.02 (backward at an upper bound)."""
    import numpy as np
    h, (_, hi) = 0.02, _bounds(names)
    cols = []
    for d in np.eye(len(x)):
        step = -h if np.any(x + h * d > hi + 1e-12) else h
        cols.append((np.array(fit.itl_error(Host.of(x + step * d, names))) - r) / step)
    return np.column_stack(cols)


PRIOR = 0.1   # a factor a spread off the prior's centre weighs as a run missed by 0.1 x NOISE


def prior(base: dict, names: tuple):
    """Where the fit leans where the runs cannot tell two factors apart (runs whose host and
    device times grow alike): the nominal host (sim/bands.py CPU_SEED) and the catalog's device
    level (the drafter's at the target's), each with half its documented range (in log) as its
    spread, weighed as a run missed by PRIOR x NOISE (0.1 % of its mean ITL), so that it moves
    nothing the runs determine. A
    CPU device (vLLM's CPU build) has no documented range: stepgap's defaults, a spread of e
    (2.7 x) each way."""
    import numpy as np
    from stepgap.sim.bands import CPU_HIGH, CPU_LOW, CPU_SEED, DEVICE_HIGH, DEVICE_LOW
    if base.get("gpu") == "cpu" or base.get("device") == "cpu":
        return np.zeros(len(names)), np.ones(len(names))
    cpu, dev = math.log(CPU_HIGH / CPU_LOW) / 2, math.log(DEVICE_HIGH / DEVICE_LOW) / 2
    centre = {"cpu": math.log(CPU_SEED), "per": math.log(CPU_SEED), "device": 0.0, "draft": 0.0}
    spread = {"cpu": cpu, "per": cpu, "device": dev, "draft": dev}
    return np.array([centre[n] for n in names]), np.array([spread[n] for n in names])


def least_squares(fit: Fitter, host: Host, names: tuple) -> Host:
    """The host (the factors `names`: CPU, device, per-request CPU, drafter) minimising the
    squared log errors of the runs' mean ITL (Huber's: a run missed by more than OUTLIER x the
    noise weighs by its error, not its square, so that one run far from the others does not
    drag the fit to it), with `prior`'s weak pull towards the nominal host:
    Levenberg-Marquardt (a step is taken only where it lowers the sum), each step held within
    the fit's bounds."""
    import numpy as np
    lo, hi = _bounds(names)
    centre, spread = prior(fit.base, names)
    noise = fit.base.get("_noise", NOISE)
    weight, c = PRIOR * NOISE, OUTLIER * noise

    def robust(r):   # Huber's: a run missed by more than c weighs as |r|, not r²
        a = np.abs(r)
        return np.where(a <= c, r, np.sign(r) * np.sqrt(np.maximum(2 * c * a - c * c, 0.0)))

    def slope(r):    # d robust(r) / dr
        a = np.abs(r)
        return np.where(a <= c, 1.0, c / np.sqrt(np.maximum(2 * c * a - c * c, 1e-30)))

    def errors(x, r):
        return np.concatenate([robust(r), weight * (x - centre) / spread])
    n = len(names)
    x = np.clip(host.log(names), lo, hi)
    r = np.array(fit.itl_error(Host.of(x, names)))
    e = errors(x, r)
    cost, damp = float(e @ e), 1e-2
    for _ in range(25):
        jac = np.vstack([slope(r)[:, None] * _jacobian(fit, x, r, names),
                         np.diag(weight / spread)])
        a, g = jac.T @ jac, jac.T @ e
        while damp < 1e6:
            step = np.linalg.solve(a + damp * (np.diag(np.diag(a)) + 1e-12 * np.eye(n)), -g)
            x_new = np.clip(x + np.clip(step, -0.7, 0.7), lo, hi)
            r_new = np.array(fit.itl_error(Host.of(x_new, names)))
            e_new = errors(x_new, r_new)
            if float(e_new @ e_new) < cost:
                break
            damp *= 4.0
        else:
            break   # no step lowers the sum: a minimum
        done = np.max(np.abs(x_new - x)) < 1e-4 or cost - float(e_new @ e_new) < 1e-12
        x, r, e, cost = x_new, r_new, e_new, float(e_new @ e_new)
        damp = max(damp / 3.0, 1e-6)
        if done:
            break
    return Host.of(x, names)


def split_fitted(fit: Fitter, host: Host, names: tuple, noise: float, cpu: tuple,
                 device: tuple) -> tuple[dict, str]:
    """What the runs leave open of the host against the device: every host within the ranges
    (each widened to the fit where the fit lies outside it; the drafter's level, the device's)
    that keeps each run's mean ITL within 95 % of its noise (or within its residual at the fit
    and the noise, where the fit misses it by more), the runs' mean ITL taken as linear in each
    factor around the fit; its lowest and highest CPU level (the CPU factor; with the
    per-request part fitted too, the mean of the two logs), each with its device level."""
    import numpy as np
    n = len(names)
    x0 = host.log(names)
    r0 = np.array(fit.itl_error(host))
    jac = _jacobian(fit, x0, r0, names)
    v0 = np.exp(x0)
    grad = jac / v0   # d(log ITL)/d(factor), for ITL linear in each factor
    tol = np.maximum(1.96 * noise, np.abs(r0) + noise)
    ranges = {"cpu": cpu, "per": cpu, "device": device, "draft": device}
    steps = {2: 401, 3: 61, 4: 25}.get(n, 25)
    axes = []
    for i, name in enumerate(names):
        lo, hi = ranges[name]
        axes.append(np.linspace(min(math.log(lo), x0[i]), max(math.log(hi), x0[i]), steps))
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, n)
    ratio = 1.0 + (np.exp(grid) - v0) @ grad.T   # ITL / ITL at the fit, each run
    ok = np.all(ratio > 0, axis=1)
    err = np.log(np.where(ratio > 0, ratio, 1.0)) + r0
    ok &= np.all(np.abs(err) <= tol, axis=1)
    w = np.array([0.5 if (name in ("cpu", "per") and "per" in names) else
                  1.0 if name == "cpu" else 0.0 for name in names])
    level0, dev = float(w @ x0), names.index("device")
    ends = {}
    if not ok.any():   # (the fit itself is the one host: nothing around it holds the runs)
        ends = {end: {"cpu": 1.0, "device": 1.0} for end in ("low", "high")}
    else:
        pts, u = grid[ok], grid[ok] @ w
        for name, pick in (("low", np.min), ("high", np.max)):
            at = pts[np.isclose(u, pick(u))]
            best = at[np.argmin(np.abs(at[:, dev] - x0[dev]))]
            ends[name] = {"cpu": math.exp(float(w @ best) - level0),
                          "device": math.exp(float(best[dev] - x0[dev]))}
    why = (f"every host within the ranges of sim/bands.py that keeps each run's mean ITL within "
           f"95 % of a {100 * noise:.1f} % noise")
    return {**ends, "source": why}, why


def split_one(fit: Fitter, host: Host, noise: float, cpu: tuple, device: tuple
              ) -> tuple[dict, str]:
    """What one cell leaves open: the CPU factor from the lowest to the highest that the
    ranges of sim/bands.py allow with some device level reproducing the measured mean ITL
    (within the noise); each end with the device level on the measured ITL."""
    s, e = host.cpu, host.device

    def itl(x, y):
        return statistics.fmean(fit.itl_error(Host(x, y)))
    # the most CPU: the fastest device within its range, the ITL at the top of its noise
    s_hi = min(max(cpu[1], s), solve(lambda x: itl(x, device[0]) - noise, s, s * 1.1,
                                     *CPU_LIMITS))
    s_lo = max(min(cpu[0], s), solve(lambda x: itl(x, device[1]) + noise, s, s * 0.9,
                                     *CPU_LIMITS))
    ends = {}
    for name, x in (("low", s_lo), ("high", s_hi)):
        y = solve(lambda v: itl(x, v), e, e * 1.02, device[0] * 0.5, device[1] * 2)
        ends[name] = {"cpu": x / s, "device": y / e}
    why = (f"CPU x {s_lo:.2f} to {s_hi:.2f} with the device's level at {e * ends['low']['device']:.3f}"
           f" to {e * ends['high']['device']:.3f}: the ranges of sim/bands.py that keep the "
           f"measured mean ITL within {100 * noise:.1f} %")
    return {**ends, "source": why}, why


OUTLIER = 3.0   # a run whose mean ITL the fit misses by this many times the noise is named


def fit_warnings(fit: Fitter, host: Host, n: int, noise: float, base: dict, cpu: tuple,
                 device: tuple) -> list[str]:
    """What the fit should make the user look again at: a run far from the fit of the others
    (named with its residual; it stays in the fit), and a host factor outside its documented
    range (the range, and the likely cause)."""
    from stepgap.sim.bands import CPU_HIGH_SOURCE, CPU_LOW_SOURCE
    out = []
    errors = fit.itl_error(host)
    if len(fit.runs) > 1:
        worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
        others = [abs(e) for i, e in enumerate(errors) if i != worst]
        if abs(errors[worst]) > max(OUTLIER * noise, 2 * max(others)):
            r = fit.runs[worst]
            out.append(f"{r.path}: the fit of all {len(fit.runs)} runs misses its mean ITL by "
                       f"{100 * (math.exp(errors[worst]) - 1):+.1f} % (the others within "
                       f"{100 * max(others):.1f} %, the noise {100 * noise:.1f} %): it is kept "
                       "in the fit; is it of this setup (GPU, model, k, workload, concurrency), "
                       "or noisy (repeat it)?")
    if base.get("gpu") == "cpu" or base.get("device") == "cpu":
        return out   # (the documented ranges are GPU hosts')
    level = host.level
    if not cpu[0] <= level <= cpu[1]:
        side = "above" if level > cpu[1] else "below"
        cause = ("the workload simulated may not be the run's (without --save-detailed give "
                 "--dataset-name and its options, or the file's token totals are used), the "
                 "run may differ from the command line (GPU, model, k, --max-num-seqs), or the "
                 "host's CPU was shared" if level > cpu[1] else
                 "the device may be slower than the roofline says (one cell puts the whole "
                 "difference on the host), or the workload simulated is not the run's")
        out.append(f"the host's CPU factor x {level:.2f} is {side} its documented range x "
                   f"{cpu[0]:g} to x {cpu[1]:g} (sim/bands.py: {CPU_LOW_SOURCE}; "
                   f"{CPU_HIGH_SOURCE}); likely {cause}")
    if n > 1 and not device[0] <= host.device <= device[1]:
        out.append(f"the device's level x {host.device:.3f} on the roofline is outside its "
                   f"documented range x {device[0]:.3f} to x {device[1]:.3f} (sim/bands.py: "
                   "the roofline against real GPUs); likely another GPU than --gpu, another "
                   "model or k, or a workload that is not the run's")
    return out


def make_profile(runs, base, fit: Fitter, host: Host, prof, shift, how, split, undetermined,
                 noise, gpu: str, warnings: list[str]):
    from stepgap.sim.profile import CpuFit, Profile
    residuals = []
    for r, res in zip(runs, fit.results(host)):
        residuals.append({"run": r.path.name, "k": r.k, "conc": r.conc, "mode": r.mode,
                          **{m: round((res.metrics.get(m) - r.metrics.get(m))
                                      / r.metrics.get(m), 4)
                             for m in ("mean_tpot_ms", "mean_itl_ms", "p99_tpot_ms",
                                       "mean_ttft_ms") if r.metrics.get(m)}})
    acc = None
    if fit.rates is not None:
        acc = {"rates": [round(x, 6) for x in fit.rates], "spread": fit.spread,
               "k": max(r.k for r in runs), "source": how["acceptance"]}
    device = base.get("device") or ("cpu" if gpu == "cpu" else "cuda")
    executor = base.get("executor") or "inline"
    what = ("one CPU factor" if host.per is None else
            "the CPU's fixed and per-request factors") + \
        (", the drafter's level" if host.draft is not None else "")
    about = {"device": device, "gpu": gpu,
             "model": {"target": base["model"], "draft": base.get("draft"),
                       "method": base["method"]},
             "topology": {"engine": base.get("topology") or "stepgap", "executor": executor,
                          "device": device},
             **({"acceptance": acc} if acc else {}),
             **({"device_profile": base["device_profile"]} if base.get("device_profile") else {}),
             "calibration": {
                 "what": f"fitted on {len(runs)} vLLM bench file(s) of {gpu} runs (no traces): "
                         f"the acceptance, {what}, the roofline's level",
                 "runs": [r.path.name for r in runs],
                 "cells": [{"k": r.k, "max_concurrency": r.conc, "mode": r.mode} for r in runs],
                 "cpu_scale": round(host.cpu, 4),
                 **({"per_request_scale": round(host.per, 4)} if host.per is not None else {}),
                 **({"draft_level": round(host.draft, 5)} if host.draft is not None else {}),
                 "roofline_level": round(host.device, 5),
                 "acceptance_shift": round(shift, 4), "noise": noise,
                 "how": how, "simulations": fit.sims},
             "scheduler": {key: base[key] for key in ("max_num_seqs", "max_model_len",
                                                      "block_size", "enable_prefix_caching")
                           if key in base}}
    costs = host.costs().to_dict()
    notes = {"bands": {"split": split}, "residuals": residuals}
    if warnings:
        notes["warnings"] = warnings
    return Profile([], CpuFit({k: v for k, v in costs.items() if v is not None}), {}, None,
                   undetermined, about, notes, roofline_level=round(host.device, 5),
                   draft_level=None if host.draft is None else round(host.draft, 5))


def report(profile, out) -> str:
    cal = profile.about["calibration"]
    split = profile.notes["bands"]["split"]
    lines = [f"profile: {out}: {cal['what']}",
             f"  acceptance: {cal['how']['acceptance']}" if "acceptance" in cal["how"] else
             "  acceptance: none (k = 0)",
             f"  level: {cal['how']['level']}",
             f"  band: CPU x {split['low']['cpu']:.3f} .. {split['high']['cpu']:.3f} of the fit, "
             f"device x {split['low']['device']:.4f} .. {split['high']['device']:.4f} "
             f"({split['source']})",
             "  residuals (simulated against measured, each run):"]
    for r in profile.notes["residuals"]:
        lines.append(f"    {r['run']}: " + ", ".join(
            f"{m} {100 * v:+.1f} %" for m, v in r.items() if m.endswith("_ms")))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The next run to make (`stepgap advise`): the `vllm bench serve` run whose calibration would
# narrow the answer most, and the band to expect after it.
#
# The answer's widest band of what async saves (at one load point) is dominated by an input
# (sim/bands.py): the host's CPU, the device, a borrowed acceptance, or what a calibration left
# open (`split`). Each candidate run (sync or async, at the answer's best k, at that load or at
# the highest load asked about) is judged the way a user's run would be: it is simulated at each
# end of that input's range and halfway between them (the truth, for all we know, lies anywhere
# in it; where the range clips the band after, its middle leaves the widest), together with the
# runs the profile was already calibrated on (`about.calibration.cells`); `fit_bench` is run
# on those simulated bench files; and the band of the saving
# is computed again with the profile it makes. The run whose wider end band is narrowest is
# named, the cheapest (the least GPU time) among those within NEAR of it; with the band to
# expect, the two ends' bands, and the band now, computed alike. A user who made it calibrates on
# it (with the runs before) and asks again: the runs in the profile are not proposed again, and
# the next one is named.
#
# The judging runs are small (at most NEXT_PROMPTS prompts of at most NEXT_OUTPUT tokens of the
# question's workload): the bands they give are compared with each other, not with the
# answer's own.


NEXT_PROMPTS = 16
NEXT_OUTPUT = 64
NEAR = 0.10          # candidates within this share of the narrowest band: the cheapest wins
SETUP_ONLY = ("profile", "cpu_scale", "speed", "device_scale", "cpu_costs", "launch_latency_us",
              "wake_us", "ipc_us", "acceptance", "acceptance_rates", "acceptance_spread", "mode", "k",
              "max_concurrency", "request_rate", "detailed", "timeline")


@dataclass
class Candidate:
    mode: str
    k: int
    conc: int | None
    cost_s: float = 0.0                          # the run's duration at the nominal inputs
    ends: dict = field(default_factory=dict)     # truth (low, middle, high) -> saving band

    @property
    def width(self) -> float:
        return max(hi - lo for lo, hi in self.ends.values()) if self.ends else math.inf

    def cell(self) -> dict:
        return {"k": self.k, "max_concurrency": self.conc, "mode": self.mode}

    def command(self, base: dict) -> str:
        """The run, as the user types it: the server's line and the bench's."""
        spec = (f" --speculative-config '{{\"method\": \"{base.get('method', 'eagle3')}\", "
                f"\"model\": \"{base.get('draft') or 'HEAD'}\", \"num_speculative_tokens\": "
                f"{self.k}}}'" if self.k else "")
        sched = "--async-scheduling" if self.mode != "sync" else "--no-async-scheduling"
        conc = f" --max-concurrency {self.conc}" if self.conc else ""
        return (f"vllm serve {base.get('model')} {sched}{spec}; vllm bench serve ...{conc} "
                f"--save-result --metadata mode={self.mode} num_speculative_tokens={self.k}")


@dataclass
class NextRun:
    load: dict                  # the load point whose saving band is judged
    input: str                  # the input that dominates it
    now: tuple                  # (low, high) of the saving now, computed as the candidates'
    best: Candidate
    candidates: list
    made: list                  # the cells the profile was calibrated on
    base: dict = field(default_factory=dict)   # the setup (for the run's command line)

    def width_after(self) -> float:
        """How wide the band is to be after the run: the wider of its ends' (the truth may lie
        at either)."""
        return self.best.width

    def to_dict(self) -> dict:
        def band(b):
            return [round(b[0], 4), round(b[1], 4)]
        return {"load": self.load, "input": self.input, "saving_now": band(self.now),
                "run": {**self.best.cell(), "duration_s": round(self.best.cost_s, 1)},
                "width_now": round(self.now[1] - self.now[0], 4),
                "width_after": round(self.width_after(), 4),
                "saving_after_by_end": {e: band(b) for e, b in self.best.ends.items()},
                "candidates": [{**c.cell(), "width": round(c.width, 4),
                                "duration_s": round(c.cost_s, 1)} for c in self.candidates],
                "made": self.made}


def plan_next_run(advice, progress=None, jobs: int = 1) -> NextRun | None:
    """The next run for `advice` (sim/advise.py Advice, with bands), or None where its bands
    have no input that a run narrows (`progress`, where given, is called with 1 after each
    candidate run's calibration at each end). A profile that prices the device from its own op fits (a
    measured engine's, or vLLM traces') is one that no bench file narrows: calibrating on one
    fits the roofline's level, which such a profile does not use. The band now, each
    candidate's duration and each candidate's calibration at each end are computed over `jobs`
    processes (`judged`), as advise's cells are."""
    from stepgap.sim.bands import band_inputs
    from stepgap.sim.profile import load_profile
    from stepgap.sim.sweep_runners import run_local
    if advice.base.get("profile") and load_profile(advice.base["profile"]).fits:
        return None
    answers = [a for a in advice.answers if a.async_saving.dominant]
    if not answers:
        return None
    ans = max(answers, key=lambda a: a.async_saving.high - a.async_saving.low)
    name = ans.async_saving.dominant[0]
    inp = next(i for i in advice.inputs if i.name == name)
    base = {key: v for key, v in advice.base.items() if key not in ("detailed", "timeline")}
    small = {**base, "num_prompts": min(NEXT_PROMPTS, base.get("num_prompts") or NEXT_PROMPTS),
             "output_len": min(NEXT_OUTPUT, base.get("output_len") or NEXT_OUTPUT)}
    made, noise = made_cells(base), made_noise(base)
    # at the k of the runs made (the same server, a flag or the client's concurrency changed),
    # else at each mode's best k
    ks = {m: int(made[0]["k"]) if made else int(ans.modes[m].best_k.value)
          for m in ("sync", "async")}
    concs = [a.load.get("max_concurrency") for a in advice.answers]
    given = [c for c in concs if c is not None]
    # the load judged, and the lowest and highest asked about (where the host's share of a
    # step differs most)
    tried = [ans.load.get("max_concurrency")] + ([min(given), max(given)] if given else [])
    cands = []
    for mode in ("sync", "async"):
        for c in dict.fromkeys(tried):
            cand = Candidate(mode, ks[mode], c)
            if cand.cell() not in made:
                cands.append(cand)
    if not cands:
        return None
    inputs = band_inputs(small, max(ks.values()))
    ends = ("low", "middle", "high")
    with tempfile.TemporaryDirectory(prefix="stepgap-next-") as tmp:
        # the calibrations first (the longest), then each candidate's duration, the band now
        tasks = [(judged, inp, small, made + [cand.cell()], Path(tmp) / f"{i}-{end}.json",
                  noise, ans.load, ks, end) for i, cand in enumerate(cands) for end in ends]
        tasks += [(duration, base, cand) for cand in cands]
        tasks.append((saving_band, small, ans.load, ks, inputs))
        done = [None] * len(tasks)
        for j, value in run_local(tasks, jobs, call):
            done[j] = value
            if progress is not None and j < len(cands) * len(ends):
                progress(1)
    for i, cand in enumerate(cands):   # (in order: the same bytes however they finished)
        cand.ends = {end: done[i * len(ends) + e] for e, end in enumerate(ends)}
        cand.cost_s = done[len(cands) * len(ends) + i]
    now = done[-1]
    narrowest = min(c.width for c in cands)
    best = min((c for c in cands if c.width <= narrowest * (1 + NEAR)), key=lambda c: c.cost_s)
    return NextRun(ans.load, name, now, best, cands, made, base)


def call(task: tuple):
    """A task of `plan_next_run`'s: (a function of this module, its arguments), in a worker."""
    return task[0](*task[1:])


def judged(inp, small: dict, cells: list[dict], out: Path, noise: float, load: dict,
           ks: dict, end: str) -> tuple[float, float]:
    """The saving's band after a calibration on runs of `cells` made where `inp` lies at `end`
    of its range (low, middle or high): the profile `project` fits, its bands."""
    from stepgap.sim.bands import band_inputs
    from stepgap.sim.config import profile_defaults
    truth = middle(inp, small) if end == "middle" else inp.settings(small, end)
    prof = project(truth, cells, out, noise)
    after, _ = profile_defaults({**fit_setup(small), "profile": str(prof)}, set())
    return saving_band(after, load, ks, band_inputs(after, max(ks.values())))


def middle(inp, settings: dict) -> dict:
    """`settings` with `inp` (sim/bands.py BandInput) halfway between its ends: each factor of
    the host at the geometric mean of its two ends (an acceptance at its nominal value)."""
    from dataclasses import replace
    over = {key: math.sqrt(inp.at_low[key] * inp.at_high[key])
            for key in ("cpu_factor", "device_scale") if key in inp.at_low and key in inp.at_high}
    return replace(inp, at_low=over).settings(settings, "low")


def made_noise(base: dict) -> float:
    """The noise the profile was calibrated with (--noise, or its runs' repeats), else NOISE."""
    if base.get("profile"):
        from stepgap.sim.profile import load_profile
        cal = load_profile(base["profile"]).about.get("calibration")
        v = cal.get("noise") if isinstance(cal, dict) else None
        if isinstance(v, (int, float)) and 0 < v < 0.5:
            return float(v)
    return NOISE


def made_cells(base: dict) -> list[dict]:
    """The cells (k, concurrency, mode) of the runs a bench-file profile was calibrated on."""
    if not base.get("profile"):
        return []
    from stepgap.sim.profile import load_profile
    cal = load_profile(base["profile"]).about.get("calibration")
    cells = cal.get("cells") if isinstance(cal, dict) else None
    return [{"k": c.get("k"), "max_concurrency": c.get("max_concurrency"),
             "mode": c.get("mode")} for c in cells or [] if isinstance(c, dict)]


def fit_setup(settings: dict) -> dict:
    """The setup without what a calibration fits or a run sets (its host, its acceptance, its
    load and mode)."""
    return {key: v for key, v in settings.items() if key not in SETUP_ONLY}


def duration(settings: dict, cand: Candidate) -> float:
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate
    res = simulate(SimConfig(**{**settings, "mode": cand.mode, "k": cand.k,
                                "max_concurrency": cand.conc}))[0]
    return res.metrics.duration


def bench_doc(res: RunResult, cell: dict) -> dict:
    """A simulated run as the `vllm bench serve --save-result` file vLLM 0.32 writes of it
    (its spec_decode_* counters included, as it writes them for a server that speculates)."""
    m = res.metrics
    doc = {"date": "20260101-000000", "backend": "vllm", "model_id": "projected",
           "num_prompts": m.completed, "completed": m.completed,
           "request_rate": "inf", "burstiness": 1.0, "max_concurrency": cell["max_concurrency"],
           "duration": m.duration, "mode": cell["mode"],
           "num_speculative_tokens": str(cell["k"]),
           **{k: m.get(k) for k in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                                    "mean_ttft_ms")}}
    spec = res.spec_decode
    if cell["k"] and spec:
        doc["spec_decode_num_drafts"] = spec.num_drafts
        doc["spec_decode_per_position_acceptance_rates"] = spec.acceptance_rate_per_pos
    return doc


def project(truth: dict, cells: list[dict], out: Path, noise: float = NOISE) -> Path:
    """The profile `stepgap calibrate` would fit on runs of `cells` made on the host `truth`
    (SimConfig settings: the setup at one end of an input's range), with the runs' `noise`,
    written to `out`."""
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import build_workload, simulate
    from stepgap.sim.profile import save_profile
    setup = fit_setup(truth)
    runs = []
    for cell in cells:
        cfg = SimConfig(**{**truth, **cell})
        reqs = build_workload(cfg)
        res = simulate(cfg, reqs)[0]
        doc = bench_doc(res, cell)
        rates = doc.get("spec_decode_per_position_acceptance_rates")
        runs.append(BenchRun(Path(f"{cell['mode']}-k{cell['k']}-c{cell['max_concurrency']}.json"),
                             doc, cell["k"], cell["max_concurrency"], cell["mode"], reqs,
                             tuple(rates) if rates else None))
    base = {**setup, "jitter": False, "method": setup.get("method", "eagle3")}
    base["_noise"] = noise
    save_profile(out, fit_bench(runs, base, noise))
    return out


def saving_band(settings: dict, load: dict, ks: dict, inputs: list) -> tuple[float, float]:
    """The band of what async saves of sync's mean TPOT at `load`, each mode at its k of `ks`,
    over `inputs` (sim/bands.py combine: each input's swing on its side)."""
    from stepgap.sim.bands import combine
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import Recording, simulate
    steps = {m: Recording() for m in ("sync", "async")}

    def tpot(s, m):
        cell = {**s, **load, "mode": m, "k": ks[m]}
        return simulate(SimConfig(**cell), recording=steps[m])[0].metrics.mean_tpot_ms

    def saving(s_sync, s_async):
        return 1 - tpot(s_async, "async") / tpot(s_sync, "sync")
    ends = {}
    for inp in inputs:
        if not any(inp.applies(k) for k in ks.values()):
            continue
        ends[inp.name] = tuple(
            saving(inp.settings(settings, e) if inp.applies(ks["sync"]) else settings,
                   inp.settings(settings, e) if inp.applies(ks["async"]) else settings)
            for e in ("low", "high"))
    b = combine(saving(settings, settings), ends)
    return b.low, b.high


def extend_advise(p) -> None:
    """`stepgap advise` (sim/advise_cli.py) with the next run to make: its option, and its
    command given this module's `plan`."""
    import functools

    from stepgap.sim.advise_cli import run
    p.add_argument("--no-next-run", dest="next_run", action="store_false",
                   help="leave out the next run to make (it calibrates on runs simulated at "
                        "each end of the dominant input, a few seconds per candidate run)")
    p.set_defaults(func=functools.partial(run, next_run=plan_next_run))
