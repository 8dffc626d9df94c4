"""Round 4 of the hostile sweep (issue 55): a fresh set of cases, written apart from the fixes,
over the surfaces issue 55 names: calibrate profiles under `advise`, `simulate --band` and
`sweep --band`; every numeric option of simulate, advise, sweep (`--set`), calibrate and serve;
GPU files and `hardware.yaml`; MoE and DP/EP with `moe.csv` and `mtp.csv`; the operator tables
of LLMServingSim's bundles; calibrate on bench files (broken, contradicting, a thousand of them,
folders, its --out among its inputs); `compare` over every result layout; degenerate workloads
(one prompt, one output token); sweeps of absurd size; signals (SIGTERM during start-up, a pool
worker killed as the OOM killer kills); `serve`'s options.

The machinery is bench/hostile.py's, imported: its case runner (every case a process of its own
under a 4 GB address-space limit and a timeout, in a folder of its own, with every input hashed
before and after), its fixtures and its classes (OK, POOR, BAD; read its docstring). This file
adds the cases, and four rules of its own:

- exit 0 with a number past physics is BAD (a silently wrong number, as issue 55 counts an
  mtp.csv at 10^9 us giving a TPOT of 2.8e6 ms): a run result, sweep row or advise answer
  whose mean TPOT or ITL is above 60 s a token, or NaN or infinite; an advise band whose value
  is not within its own low and high; a calibrate profile whose CPU factor or device level is
  not a finite number > 0, or whose split band has zero width;
- a case that sends a signal (SIGTERM or SIGINT to the command, SIGKILL to a pool worker) is
  OK when the command ends in one line with 143/130 (or the signal's own status), or, for a
  killed worker, with exit 0 (it recovered) or 1/2 and an error line; it is BAD with a
  traceback, another status, or processes of its own left running; POOR when the command ran
  on for more than 5 s after a SIGTERM and then exited 0;
- a `serve` case whose server starts (still serving at its timeout) is POOR where the case
  expected a refusal, OK where the value is legitimate;
- every case says what a good answer is (`good`, printed by --list and in the report).

    .venv/bin/python bench/hostile_round4.py --jobs 2            # every case (about 1,500)
    .venv/bin/python bench/hostile_round4.py --sample 60         # a spread of 60 of them
    .venv/bin/python bench/hostile_round4.py --only profile,moe  # some families
    .venv/bin/python bench/hostile_round4.py --list              # the cases, not run
    .venv/bin/python bench/hostile_round4.py --rerun R.jsonl     # the BAD cases of a run again

It prints the counts by family and class and every BAD and POOR case with its command, writes
every result as JSON lines (--out) and, with --md, the summary as Markdown.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile as H  # noqa: E402  (bench/hostile.py: the runner, fixtures, setup helpers)
from hostile import chain, cp, csv_edit, edit_json, edit_text, edit_yaml, link, mkdir, \
    write  # noqa: E402

D400 = "1" + "0" * 399        # an integer of 400 digits (10^399; as a float, inf)
PAST_PHYSICS_MS = 60_000.0     # a mean TPOT or ITL above this is no device's
MISSING = object()             # a field deleted


@dataclass
class Case(H.Case):
    good: str = ""                          # what a good answer is, in words
    signal: tuple | None = None             # ("main" | "worker" | "workers", signum, delay s)
    serve: bool = False                     # a server: started at the timeout is not a hang
    also: tuple = ()                        # (name, another spelling of it the error may use)


def good_of(c: Case) -> str:
    if c.good:
        return c.good
    if c.expect == "error":
        named = " and ".join(repr(n) for n in c.names) if c.names else "what is wrong"
        return f"exit 2, one line naming {named}"
    if c.expect == "ok":
        return "exit 0 with sane numbers"
    return ("exit 2 with one line naming " + " and ".join(repr(n) for n in c.names)
            if c.names else "exit 2 with one line") + ", or exit 0 with sane numbers"


# ---------------------------------------------------------------------------------------------
# Fixtures: hostile.py's, and the files of this round (made by stepgap itself, once)

R4 = "r4"   # under the fixtures folder
SEED_SYNC = "bench.json"   # hostile.py's copy of traces/seed/vllm-pr25872-sync.json
CAL_ARGS = ["--gpu", "l20", "--model", "llama-3.1-8b", "--draft", "llama-3.1-8b-eagle3",
            "-k", "4"]


def build_round4(fx: Path) -> None:
    """fx/r4: two calibrate profiles (one bench file; two), results of every layout compare
    reads (simulator plain and detailed, engine detailed, gzipped, vLLM's without the
    per-request lists), the seed's async file."""
    r4 = fx / R4
    if (r4 / "done").exists():
        return
    if r4.exists():
        shutil.rmtree(r4)
    r4.mkdir(parents=True)
    stepgap = str(H.STEPGAP)
    shutil.copy(H.ROOT / "traces/seed/vllm-pr25872-async.json", r4 / "async.json")

    def run(*argv):
        print("fixture: stepgap " + " ".join(argv), flush=True)
        subprocess.run([stepgap, *argv], cwd=r4, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    run("calibrate", str(fx / SEED_SYNC), *CAL_ARGS, "--out", "cal1.json")
    run("calibrate", str(fx / SEED_SYNC), str(r4 / "async.json"), *CAL_ARGS, "--out",
        "cal2.json")
    trace = ["--trace", str(fx / "trace.jsonl")]   # hostile.py's: 4 short requests
    run("simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "-k", "2", *trace,
        "--result-json", "sim.json")
    run("simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "-k", "2", *trace,
        "--detailed", "--result-json", "simd.json")
    pair = fx / "pair"
    run("run", "--model", str(pair / "target"), "--draft", str(pair / "eagle3"), "-k", "2",
        *trace, "--detailed", "--result-json", "eng.json")
    # what `vllm bench serve --save-result` writes without --save-detailed
    bench = json.loads((fx / "vllm/bench.json").read_text())
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                "queue_times", "generated_texts", "errors"):
        bench.pop(key, None)
    (r4 / "vllm-summary.json").write_text(json.dumps(bench))
    import gzip
    (r4 / "simd.json.gz").write_bytes(gzip.compress((r4 / "simd.json").read_bytes(), mtime=0))
    (r4 / "done").write_text("")


# ---------------------------------------------------------------------------------------------
# Mutations of a field of a JSON or YAML document


def getp(doc, path: str):
    d = doc
    for k in path.split("."):
        d = d[int(k)] if isinstance(d, list) else d[k]
    return d


def setp(doc, path: str, value):
    """doc with the dotted `path` (list indexes as numbers) set to `value`, or deleted where
    `value` is MISSING; objects made where missing."""
    keys = path.split(".")
    d = doc
    for k in keys[:-1]:
        if isinstance(d, list):
            d = d[int(k)]
        else:
            if not isinstance(d.get(k), (dict, list)):
                d[k] = {}
            d = d[k]
    last = keys[-1]
    if isinstance(d, list):
        if value is MISSING:
            del d[int(last)]
        else:
            d[int(last)] = value
    elif value is MISSING:
        d.pop(last, None)
    else:
        d[last] = value
    return doc


NAN, INF = float("nan"), float("inf")
# (label, value) by the kind of field they break
NUM_MUTS = [("missing", MISSING), ("null", None), ("'x'", "x"), ("0", 0), ("-1", -1),
            ("NaN", NAN), ("inf", INF), ("1e300", 1e300), ("1e-300", 1e-300), ("true", True),
            ("10^399", 10 ** 399), ("[1]", [1]), ("{}", {})]
OBJ_MUTS = [("missing", MISSING), ("null", None), ("{}", {}), ("[]", []), ("'x'", "x"),
            ("5", 5), ("[{}]", [{}])]
LIST_MUTS = [("missing", MISSING), ("null", None), ("[]", []), ("'x'", "x"), ("{}", {}),
             ("[NaN]", [NAN]), ("[-1]", [-1]), ("1,000 items", [0.5] * 1000)]
STR_MUTS = [("missing", MISSING), ("null", None), ("5", 5), ("[]", []), ("''", ""),
            ("10,000 characters", "x" * 10000)]
MUTS = {"num": NUM_MUTS, "obj": OBJ_MUTS, "list": LIST_MUTS, "str": STR_MUTS}


def leaf(path: str) -> str:
    """The field's name as an error names it: the last key that is not a list index."""
    return [k for k in path.split(".") if not k.isdigit()][-1]


# ---------------------------------------------------------------------------------------------
# Family: calibrate profiles under advise, simulate --band, sweep --band


# (path, kind, expectation by mutation label: what a good answer is; default "error")
PROFILE_FIELDS = [
    ("bands", "obj", {"missing": "any", "null": "any"}),
    ("bands.split", "obj", {"missing": "any", "null": "any"}),
    ("bands.split.low", "obj", {}),
    ("bands.split.high", "obj", {}),
    ("bands.split.low.cpu", "num", {}),
    ("bands.split.low.device", "num", {}),
    ("bands.split.high.cpu", "num", {}),
    ("bands.split.high.device", "num", {}),
    ("bands.split.source", "str", {"missing": "any", "''": "any",
                                   "10,000 characters": "any"}),
    ("residuals", "list", {"missing": "any", "null": "any", "[]": "any"}),
    ("residuals.0", "obj", {"missing": "any", "{}": "any"}),
    ("residuals.0.mean_itl_ms", "num", {"missing": "any", "null": "any", "0": "ok",
                                        "1e-300": "ok"}),
    ("residuals.0.mean_tpot_ms", "num", {"missing": "any", "null": "any", "0": "ok",
                                         "1e-300": "ok"}),
    ("cpu", "obj", {}),
    ("cpu.schedule", "list", {"missing": "any"}),
    ("cpu.launch", "list", {"missing": "any"}),
    ("cpu.ipc_us", "num", {"missing": "any", "0": "any", "1e-300": "any"}),
    ("cpu.launch_latency_us", "num", {"missing": "any", "0": "any", "1e-300": "any"}),
    ("roofline_level", "num", {"missing": "any"}),
    ("calibration.cpu_scale", "num", {"missing": "any"}),
    ("acceptance.rates", "list", {"missing": "any", "1,000 items": "any"}),
    ("acceptance.spread", "num", {"missing": "any", "0": "any", "1e-300": "any"}),
    ("acceptance.k", "num", {"missing": "any"}),
    ("gpu", "str", {"missing": "any", "10,000 characters": "error"}),
    ("model.target", "str", {"missing": "any"}),
    ("format", "str", {}),
    ("undetermined", "list", {"missing": "any", "null": "any", "[]": "any", "[NaN]": "error",
                              "[-1]": "error", "1,000 items": "any"}),
    ("scheduler", "obj", {"missing": "any", "null": "any", "{}": "ok"}),
]
ADVISE_P = ["advise", "--profile", "{C}/p.json", "--model", "llama-3.1-8b", "--max-k", "2",
            "--num-prompts", "4", "--output-len", "8", "--max-concurrency", "1", "--jobs", "1",
            "--result-json", "{C}/a.json"]
SIM_BAND = ["simulate", "--profile", "{C}/p.json", "--model", "llama-3.1-8b", "-k", "2",
            "--num-prompts", "4", "--output-len", "8", "--band", "--result-json", "{C}/r.json"]
SWEEP_BAND = ["sweep", "--set", "profile={C}/p.json", "--set", "model=llama-3.1-8b", "--set",
              "num_prompts=2", "--set", "output_len=4", "--grid", "k=0,2", "--band", "--out",
              "{C}/o", "--jobs", "1", "--quiet"]
BAND_FIELDS = ("bands", "bands.split", "bands.split.low", "bands.split.high",
               "bands.split.low.cpu", "bands.split.low.device", "bands.split.high.cpu",
               "bands.split.high.device", "residuals", "residuals.0.mean_itl_ms")


def profile_case(family, consumer, argv, src, path, label, value, expect, timeout=120):
    names = ("p.json", leaf(path)) if expect != "ok" else ()
    return Case(family, f"{consumer}: {src} {path} {label}", argv, timeout=timeout,
                setup=chain(cp(f"{R4}/{src}", "p.json"),
                            edit_json("p.json", lambda d, p=path, v=value: setp(d, p, v))),
                expect=expect, names=names)


def profiles() -> list[Case]:
    """A calibrate profile's every field, broken every way its kind can be, under advise; the
    band's fields under simulate --band and sweep --band (and the second profile's, of two
    bench files); a hand-made split whose ends cross or coincide."""
    out = [Case("profile", "advise: cal1.json as it is", ADVISE_P, expect="ok", timeout=120,
                setup=cp(f"{R4}/cal1.json", "p.json"))]
    for path, kind, exp in PROFILE_FIELDS:
        for label, value in MUTS[kind]:
            out.append(profile_case("profile", "advise", ADVISE_P, "cal1.json", path, label,
                                    value, exp.get(label, "error")))
    band_muts = [("missing", MISSING), ("{}", {}), ("'x'", "x"), ("0", 0), ("-1", -1),
                 ("NaN", NAN), ("inf", INF)]
    exp_of = {path: exp for path, _, exp in PROFILE_FIELDS}
    for consumer, argv, muts in (("simulate --band", SIM_BAND, band_muts),
                                 ("sweep --band", SWEEP_BAND, band_muts[1:6])):
        out.append(Case("profile", f"{consumer}: cal1.json as it is", argv, expect="ok",
                        setup=cp(f"{R4}/cal1.json", "p.json"), timeout=150))
        for path in BAND_FIELDS:
            for label, value in muts:
                out.append(profile_case("profile", consumer, argv, "cal1.json", path, label,
                                        value, exp_of[path].get(label, "error"), timeout=150))
    # the profile of two bench files: its second residual, its split
    for path, label, value in (("residuals.1.mean_itl_ms", "-1", -1),
                               ("residuals.1.mean_itl_ms", "inf", INF),
                               ("residuals.1", "'x'", "x"), ("bands.split.low.cpu", "0", 0),
                               ("bands.split.high.device", "null", None)):
        out.append(profile_case("profile", "advise", ADVISE_P, "cal2.json", path, label, value,
                                "error"))
    # splits that are numbers of the right kind, and wrong together

    def split(low, high, name, expect="error"):
        def fn(d):
            d["bands"]["split"]["low"] = low
            d["bands"]["split"]["high"] = high
        out.append(Case("profile", f"advise: split {name}", ADVISE_P, timeout=120,
                        setup=chain(cp(f"{R4}/cal1.json", "p.json"), edit_json("p.json", fn)),
                        expect=expect, names=("p.json", "split") if expect != "ok" else ()))
    split({"cpu": 2.0, "device": 1.0}, {"cpu": 0.5, "device": 1.0}, "low above high", "any")
    split({"cpu": 1.0, "device": 1.0}, {"cpu": 1.0, "device": 1.0}, "of zero width", "any")
    split({"cpu": 1e-9, "device": 1.0}, {"cpu": 1e9, "device": 1.0}, "cpu 1e-9 to 1e9")
    split({"cpu": 1.0, "device": 1e-9}, {"cpu": 1.0, "device": 1e9}, "device 1e-9 to 1e9")
    split({"cpu": 1.0}, {"cpu": 1.0}, "without device ends")
    split({"cpu": "1", "device": "1"}, {"cpu": "2", "device": "1"}, "of strings")
    # a profile's CPU costs far past the command line's own limits
    for key, v in (("schedule", [1e300, 0, 0]), ("launch", [0, 0, 1e300]),
                   ("schedule", [1e9, 1e9, 1e9]), ("prepare_inputs", [-1, 0, 0])):
        out.append(Case("profile", f"advise: cpu.{key} {v[0]:g},{v[1]:g},{v[2]:g}", ADVISE_P,
                        setup=chain(cp(f"{R4}/cal1.json", "p.json"), edit_json(
                            "p.json", lambda d, key=key, v=v: setp(d, f"cpu.{key}", v))),
                        names=("p.json", key), timeout=120))
    # the CPU engine profile (stepgap profile's) under advise --device cpu
    cpu_adv = ["advise", "--device", "cpu", "--gpu", "cpu", "--profile", "{C}/p.json",
               "--num-prompts", "3", "--output-len", "8", "--max-k", "2", "--max-concurrency",
               "1", "--jobs", "1", "--result-json", "{C}/a.json"]
    out.append(Case("profile", "advise --device cpu: profile.json as it is", cpu_adv,
                    setup=cp("measured/profile.json", "p.json"), expect="ok", timeout=150))
    for path, kind in (("cpu.schedule", "list"), ("cpu.ipc_us", "num"), ("device_ops", "list"),
                       ("device_ops.0.coef", "list"), ("jitter.run_log_factors", "list"),
                       ("scheduler.num_blocks", "num")):
        for label, value in MUTS[kind][1:8]:
            expect = "any" if (path, label) in (
                (("cpu.ipc_us", "0")), ("jitter.run_log_factors", "[]"),
                ("jitter.run_log_factors", "null"), ("jitter.run_log_factors", "1,000 items"),
                ("device_ops", "1,000 items"), ("cpu.ipc_us", "1e-300")) else "error"
            out.append(Case("profile", f"advise --device cpu: profile.json {path} {label}",
                            cpu_adv, timeout=150, expect=expect,
                            names=("p.json", leaf(path)) if expect != "ok" else (),
                            setup=chain(cp("measured/profile.json", "p.json"), edit_json(
                                "p.json", lambda d, p=path, v=value: setp(d, p, v)))))
    return out


# ---------------------------------------------------------------------------------------------
# Family: every numeric option of simulate, advise, sweep (--set), calibrate and serve

# kind: pos (an integer >= 1), cap (an integer >= 1 where any size means "no limit"),
# nonneg (an integer >= 0), k (speculative tokens), f0 (a number >= 0 of no natural bound),
# fpos (a number > 0), rate, burst, frac (0 < x <= 1), ratio (0 <= x < 1), skew, share (0..1)
SIM_OPTIONS = {
    "--num-speculative-tokens": ("k", []), "--spec-tokens": ("k", []),
    "--tensor-parallel-size": ("pos", []),
    "--data-parallel-size": ("pos", ["--model", "qwen3-30b-a3b", "-ep"]),
    "--speed": ("fpos", []),
    "--moe-routing-skew": ("skew", ["--model", "qwen3-30b-a3b", "-dp", "2", "-ep"]),
    "--all-reduce-latency-us": ("f0", ["-tp", "2"]),
    "--acceptance-spread": ("f0", ["-k", "2"]),
    "--max-num-seqs": ("cap", []), "--max-num-batched-tokens": ("cap", []),
    "--max-model-len": ("pos", []), "--block-size": ("pos", []),
    "--num-gpu-blocks-override": ("cap", []), "--gpu-memory-utilization": ("frac", []),
    "--cpu-scale": ("f0", []), "--launch-latency-us": ("f0", []),
    "--wake-us": ("f0", ["--executor", "process"]), "--ipc-us": ("f0", ["--executor", "process"]),
    "--output-latency-ms": ("f0", []), "--num-prompts": ("pos", []), "--output-len": ("pos", []),
    "--request-rate": ("rate", []), "--burstiness": ("burst", ["--request-rate", "4"]),
    "--max-concurrency": ("cap", []), "--seed": ("seed", []),
    "--random-input-len": ("nonneg", ["--dataset-name", "random", "--random-output-len", "8"]),
    "--random-output-len": ("pos", ["--dataset-name", "random", "--random-input-len", "32"]),
    "--random-range-ratio": ("ratio", ["--dataset-name", "random", "--random-input-len", "32",
                                       "--random-output-len", "8"]),
    "--random-prefix-len": ("nonneg", ["--dataset-name", "random", "--random-input-len", "32",
                                       "--random-output-len", "8"]),
    "--sharegpt-output-len": ("pos", ["--dataset-name", "sharegpt", "--dataset-path",
                                      "{F}/sharegpt.json", "--tokenizer", "{F}/pair/target"]),
    "--hf-output-len": ("pos", ["--dataset-name", "hf", "--dataset-path",
                                "philschmid/mt-bench"]),
}
PREFIX_CTX = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "16",
              "--prefix-repetition-suffix-len", "16", "--prefix-repetition-num-prefixes", "2",
              "--prefix-repetition-output-len", "8"]
GSP_CTX = ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
           "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "32", "--gsp-question-len",
           "8", "--gsp-output-len", "8"]
MT_CTX = ["--dataset-name", "multi-turn", "--multi-turn-sessions", "2", "--multi-turn-turns",
          "2", "--multi-turn-first-len", "32", "--multi-turn-user-len", "8"]
for _ctx, _kinds in ((PREFIX_CTX, {"--prefix-repetition-prefix-len": "nonneg",
                                   "--prefix-repetition-suffix-len": "nonneg",
                                   "--prefix-repetition-num-prefixes": "pos",
                                   "--prefix-repetition-output-len": "pos",
                                   "--shared-fraction": "share"}),
                     (GSP_CTX, {"--gsp-num-groups": "pos", "--gsp-prompts-per-group": "pos",
                                "--gsp-system-prompt-len": "pos", "--gsp-question-len": "nonneg",
                                "--gsp-output-len": "pos"}),
                     (MT_CTX, {"--multi-turn-sessions": "pos", "--multi-turn-turns": "pos",
                               "--multi-turn-first-len": "pos",
                               "--multi-turn-user-len": "nonneg"})):
    for _opt, _kind in _kinds.items():
        SIM_OPTIONS[_opt] = (_kind, _ctx)
SIM_OPTIONS["--timeseries-interval"] = ("interval", [])

INTS = {"pos", "cap", "nonneg", "k", "seed"}
VALUES = [("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("-1", "-1"), ("0", "0"),
          ("0.5", "0.5"), ("1e-300", "1e-300"), ("1e308", "1e308"), ("10^399", D400),
          ("'x'", "x"), ("''", "")]


def expect_of(kind: str, label: str) -> str:
    """A good answer to option kind `kind` given value `label`: "error" (exit 2 naming the
    option), "ok" or "any" (a refusal naming it, or exit 0 with sane numbers)."""
    if label in ("nan", "-inf", "'x'", "''"):
        return "error"
    if kind in INTS:
        if label in ("0.5", "1e-300", "1e308", "inf"):
            return "error"
        if label == "-1":
            return "any" if kind == "seed" else "error"
        if label == "0":
            return "any" if kind in ("nonneg", "k", "seed") else "error"
        return "any" if kind in ("cap", "seed") else "error"          # 10^399
    # numbers (10^399 reads as inf)
    if label in ("inf", "10^399"):
        return "any" if kind == "rate" else "error"
    if label == "-1":
        return "error"
    if label == "0":
        return "any" if kind in ("f0", "skew", "ratio", "share") else "error"
    if label == "0.5":
        return "any"
    if label == "1e-300":
        return "any" if kind in ("f0", "rate", "ratio", "skew", "share") else "error"
    return "any" if kind in ("rate", "burst", "interval") else "error"  # 1e308


SIM = ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "4",
       "--output-len", "8"]
RJ = ["--result-json", "{C}/r.json"]


def with_option(base: list[str], ctx: list[str], option: str, value: str) -> list[str]:
    """base + ctx with `option value` in place of any value base or ctx gave it."""
    argv = [*base, *ctx]
    while option in argv:
        i = argv.index(option)
        del argv[i:i + 2]
    return [*argv, option, value]


def sweep_key(option: str) -> str | None:
    """The sweep setting of a simulate option (None: no setting of its own)."""
    special = {"--num-speculative-tokens": "k", "--spec-tokens": None,
               "--timeseries-interval": "timeseries_interval_s"}
    return special[option] if option in special else option[2:].replace("-", "_")


def spellings(key: str, option: str) -> tuple:
    """What a sweep's error may name for setting `key`: its option (`--max-num-seqs`), or a
    workload's own name for it (`suffix_len` of prefix_repetition)."""
    out = [(key, option)]
    for prefix in ("prefix_repetition_", "gsp_", "multi_turn_", "random_", "sharegpt_", "hf_"):
        if key.startswith(prefix):
            out.append((key, key[len(prefix):]))
    return tuple(out)


def as_settings(ctx: list[str]) -> list[tuple[str, str]]:
    """A context's options (simulate's spelling) as sweep settings."""
    short = {"-tp": "tensor_parallel_size", "-dp": "data_parallel_size", "-k": "k"}
    out, j = [], 0
    while j < len(ctx):
        if ctx[j] == "-ep":
            out.append(("enable_expert_parallel", "true"))
            j += 1
            continue
        out.append((short.get(ctx[j]) or sweep_key(ctx[j]), ctx[j + 1]))
        j += 2
    return out


def options() -> list[Case]:
    """Every numeric option: simulate each with eleven values, advise with five, sweep's --set
    of the same settings with five, calibrate's with eight, serve's with four; the list-valued
    options with their own nonsense."""
    out = []
    adv = ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "3",
           "--output-len", "8", "--max-k", "2", "--max-concurrency", "1", "--jobs", "1",
           "--result-json", "{C}/a.json"]
    for option, (kind, ctx) in SIM_OPTIONS.items():
        for label, value in VALUES:
            e = expect_of(kind, label)
            out.append(Case("options", f"simulate {option} {label}",
                            [*with_option(SIM, ctx, option, value), *RJ], expect=e,
                            names=(option,) if e != "ok" else (), timeout=90))
        if option in ("--spec-tokens", "--request-rate", "--max-concurrency"):
            continue   # advise takes -k as --max-k, and loads as lists (below)
        for label, value in [VALUES[i] for i in (0, 3, 6, 7, 8)]:
            e = expect_of(kind, label)
            out.append(Case("options", f"advise {option} {label}",
                            with_option(adv, ctx, option, value), expect=e,
                            names=(option,) if e != "ok" else (), timeout=120))
    for option, kind in (("--max-k", "k1"), ("--jobs", "cap")):
        for label, value in VALUES:
            e = expect_of("pos" if kind == "k1" else "cap", label)
            out.append(Case("options", f"advise {option} {label}", [*adv, option, value],
                            expect=e, names=(option,) if e != "ok" else (), timeout=120))
    # advise's loads are lists: the value among good ones
    no_load = adv[:adv.index("--max-concurrency")] + adv[adv.index("--max-concurrency") + 2:]
    for option, kind in (("--max-concurrency", "cap"), ("--request-rate", "rate")):
        for label, value in VALUES:
            e = "any" if label == "''" else expect_of(kind, label)   # '1,' is the list 1
            out.append(Case("options", f"advise {option} 1,{label}",
                            [*no_load, option, f"1,{value}"], expect=e,
                            names=(option,) if e != "ok" else (), timeout=120))
    # sweep: the same settings as --set keys, one cell each
    for option, (kind, ctx) in SIM_OPTIONS.items():
        key = sweep_key(option)
        if key is None:
            continue
        fixed = [("num_prompts", "2"), ("output_len", "4"), *as_settings(ctx)]
        sets = [w for name, v in fixed if name != key for w in ("--set", f"{name}={v}")]
        for label, value in [VALUES[i] for i in (0, 3, 4, 7, 8)]:
            e = expect_of(kind, label)
            out.append(Case("options", f"sweep --set {key}={label}",
                            ["sweep", *sets, "--set", f"{key}={value}", "--grid", "mode=sync",
                             "--out", "{C}/o", "--jobs", "1", "--quiet"],
                            expect=e, names=(key,) if e != "ok" else (), timeout=90,
                            also=spellings(key, option)))
    # calibrate's options
    cal = ["calibrate", "{F}/" + SEED_SYNC, *CAL_ARGS, "--out", "{C}/prof.json"]
    cal_kinds = {"--max-num-seqs": "cap", "--max-model-len": "pos", "--block-size": "pos",
                 "--num-speculative-tokens": "k", "--max-concurrency": "cap",
                 "--output-len": "pos", "--noise": "fpos"}
    for option, kind in cal_kinds.items():
        for label, value in [VALUES[i] for i in (0, 1, 3, 4, 6, 7, 8, 9)]:
            e = expect_of(kind, label)
            if option == "--num-speculative-tokens" and label == "0":
                e = "error"   # the bench file's run had k 4 and its drafts' counters
            argv = [a for a in cal]
            if option == "--num-speculative-tokens":
                i = argv.index("-k")
                del argv[i:i + 2]
            out.append(Case("options", f"calibrate {option} {label}", [*argv, option, value],
                            expect=e, names=(option,) if e != "ok" else (), timeout=300))
    # serve's options: refused before the server starts, or the server starts (see `serve`)
    serve_kinds = {"--tensor-parallel-size": "pos", "--max-num-seqs": "cap",
                   "--max-num-batched-tokens": "cap", "--max-model-len": "pos",
                   "--block-size": "pos", "--num-gpu-blocks-override": "cap",
                   "--gpu-memory-utilization": "frac", "--kv-cache-gib": "fpos",
                   "--temperature": "f0", "--top-k": "nonneg", "--top-p": "frac",
                   "--acceptance-spread": "f0", "--seed": "seed", "--num-speculative-tokens": "k",
                   "--port": "port"}
    for n, (option, kind) in enumerate(serve_kinds.items()):
        for m, (label, value) in enumerate([VALUES[i] for i in (0, 3, 7, 8)]):
            e = "error" if kind == "port" else expect_of(kind, label)
            port = [] if option == "--port" else ["--port", str(31000 + 10 * n + m)]
            out.append(Case("options", f"serve {option} {label}",
                            ["serve", "--model", "tiny", *port, option, value], expect=e,
                            names=(option,) if e != "ok" else (), timeout=40, serve=True))
    # list-valued options
    lists = {
        "--acceptance-rates": (["-k", "2"], ["nan,0.5", "0.5,inf", "1e-300,1e-300", "1,1,1,1",
                                             "0.5," * 200, ",", "0.5;0.4"],
                               {"1e-300,1e-300": "any", "1,1,1,1": "any"}),
        "--metric-percentiles": ([], ["0", "100", "nan", "50,nan", "1e-300", "99.9999999999",
                                      "50;90"], {"1e-300": "any", "99.9999999999": "any"}),
        "--cpu-cost": ([], ["schedule=inf", "schedule=1e300", "launch=-1,0,0",
                            "launch=nan,0,0", "schedule=" + D400, "schedule=1,2",
                            "prepare_inputs=0,0,0"], {"prepare_inputs=0,0,0": "any",
                                                      "schedule=1,2": "any"}),
        "--speculative-config": ([], ['{"num_speculative_tokens": ' + D400 + "}",
                                      '{"num_speculative_tokens": -1}',
                                      '{"num_speculative_tokens": 1e308}',
                                      '{"num_speculative_tokens": NaN}',
                                      '{"method": "eagle3", "num_speculative_tokens": 2.5}',
                                      '{"method": 5}', '{"model": ["x"]}'], {}),
    }
    for option, (ctx, values, exp) in lists.items():
        for v in values:
            e = exp.get(v, "error")
            shown = v if len(v) < 30 else f"{v[:10]}..({len(v)} characters)"
            out.append(Case("options", f"simulate {option} {shown}",
                            [*SIM, *ctx, option, v, *RJ], expect=e,
                            names=(option,) if e != "ok" else (), timeout=90))
    return out


# ---------------------------------------------------------------------------------------------
# Family: GPU files and hardware.yaml

GPU_FIELDS = ["bf16_tflops", "fp8_tflops", "memory_gb", "memory_bw_gbps", "flop_eff", "bw_eff",
              "kernel_us", "d2h_us", "interconnect.bw_gbps", "interconnect.latency_us",
              "spec.memory_total_gib", "spec.memory_bw_gbps"]
GPU_VALUES = [("NaN", ".nan"), ("inf", ".inf"), ("-1", "-1"), ("0", "0"), ("1e300", "1.0e+300"),
              ("1e-300", "1.0e-300"), ("10^399", D400), ("'x'", "x"), ("[1]", "[1]"),
              ("true", "true")]
# in range by the file's own ranges, and still past any GPU
GPU_ABSURD = {"bf16_tflops": "0.001", "memory_bw_gbps": "0.001", "kernel_us": "900000",
              "d2h_us": "900000", "interconnect.latency_us": "900000",
              "interconnect.bw_gbps": "0.001"}


def gpu_yaml(path: str, value: str) -> str:
    """A GPU file on h100 with `path` (one level of nesting at most) set to `value`."""
    lines = ["base: h100", "name: mine"]
    if "." in path:
        top, key = path.split(".")
        body = {"interconnect": {"bw_gbps": "450", "latency_us": "3"}, "spec": {}}[top]
        body = {**body, key: value}
        lines.append(f"{top}:")
        lines += [f"  {k}: {v}" for k, v in body.items()]
    else:
        lines.append(f"{path}: {value}")
    return "\n".join(lines) + "\n"


def gpus() -> list[Case]:
    """Each field of stepgap's GPU file with ten values and with one past any GPU though in
    its range, under simulate (at TP 2 for the interconnect), and the same file under advise,
    sweep and calibrate; hardware.yaml's measured collectives broken as a whole."""
    out = []
    sim = ["simulate", "--gpu", "{C}/g.yaml", "--model", "llama-3.1-8b", "--num-prompts", "4",
           "--output-len", "8", *RJ]
    for path in GPU_FIELDS:
        tp = ["-tp", "2"] if path.startswith("interconnect") else []
        values = list(GPU_VALUES)
        if path in GPU_ABSURD:
            values.append(("past any GPU", GPU_ABSURD[path]))
        for label, v in values:
            e = "any" if (label == "0" and path in ("fp8_tflops", "kernel_us", "d2h_us",
                                                    "interconnect.latency_us")) else "error"
            out.append(Case("gpu", f"simulate {path} {label}", [*sim, *tp],
                            setup=write("g.yaml", gpu_yaml(path, v)), expect=e,
                            names=("g.yaml", leaf(path)) if e != "ok" else ()))
    consumers = {
        "advise": ["advise", "--gpu", "{C}/g.yaml", "--model", "llama-3.1-8b", "--num-prompts",
                   "3", "--output-len", "8", "--max-k", "1", "--max-concurrency", "1", "--jobs",
                   "1", "--result-json", "{C}/a.json"],
        "sweep": ["sweep", "--set", "gpu={C}/g.yaml", "--set", "num_prompts=2", "--set",
                  "output_len=4", "--grid", "k=0,1", "--out", "{C}/o", "--jobs", "1",
                  "--quiet"],
        "calibrate": ["calibrate", "{F}/" + SEED_SYNC, "--gpu", "{C}/g.yaml", *CAL_ARGS[2:],
                      "--out", "{C}/prof.json"],
    }
    for consumer, argv in consumers.items():
        for path, label, v in (("bf16_tflops", "NaN", ".nan"), ("memory_bw_gbps", "0", "0"),
                               ("kernel_us", "1e300", "1.0e+300"), ("flop_eff", "'x'", "x"),
                               ("d2h_us", "10^399", D400),
                               ("memory_bw_gbps", "past any GPU", "0.001")):
            out.append(Case("gpu", f"{consumer} {path} {label}", argv,
                            setup=write("g.yaml", gpu_yaml(path, v).replace("h100", "l20")),
                            names=("g.yaml", leaf(path)),
                            timeout=300 if consumer == "calibrate" else 120))
    # hardware.yaml (LLMServingSim's): its collectives, broken in whole
    hw_sim = ["simulate", "--gpu", "{C}/hw.yaml", "--model", "llama-3.1-8b", "-tp", "2",
              "--num-prompts", "4", "--output-len", "8", *RJ]

    def samples(fn):
        def go(d):
            for s in d["measured"]["interconnect"]["samples"]:
                fn(s)
        return go

    hw_muts = {
        "every us_graphed 0": samples(lambda s: s.update(us_graphed=0, us=0)),
        "every us_graphed 1e9": samples(lambda s: s.update(us_graphed=1e9, us=1e9)),
        "every us_graphed x1e6": samples(lambda s: s.update(
            us_graphed=s.get("us_graphed", 1) * 1e6, us=s.get("us", 1) * 1e6)),
        "every us_graphed NaN": samples(lambda s: s.update(us_graphed=NAN)),
        "every us_graphed -5": samples(lambda s: s.update(us_graphed=-5)),
        "every bytes 0": samples(lambda s: s.update(bytes=0)),
        "every bytes the same": samples(lambda s: s.update(bytes=1024)),
        "every collective 'all_reduce'": samples(lambda s: s.update(collective="all_reduce")),
        "samples of one": lambda d: d["measured"]["interconnect"].update(
            samples=d["measured"]["interconnect"]["samples"][:1]),
        "npus 1": lambda d: H.setin(d, "measured.interconnect.npus", 1),
        "npus 10^399": lambda d: H.setin(d, "measured.interconnect.npus", 10 ** 399),
        "spec.memory_total_gib 0.001": lambda d: H.setin(d, "spec.memory_total_gib", 0.001),
        "spec.memory_bw_gbps 10^399": lambda d: H.setin(d, "spec.memory_bw_gbps", 10 ** 399),
        "spec.gpu_name 5": lambda d: H.setin(d, "spec.gpu_name", 5),
        "spec a string": lambda d: d.update(spec="x"),
        "measured.interconnect null": lambda d: H.setin(d, "measured.interconnect", None),
    }
    exp = {"every bytes the same": "error", "spec.gpu_name 5": "any", "npus 1": "error"}
    for name, fn in hw_muts.items():
        e = exp.get(name, "error")
        out.append(Case("gpu", f"hardware.yaml {name}", hw_sim, expect=e,
                        setup=chain(cp("hw.yaml"), edit_yaml("hw.yaml", fn)),
                        names=("hw.yaml",) if e != "ok" else ()))
    # the same, found beside a bundle (Qwen3-32B at TP 2 reads perf/RTXPRO6000/hardware.yaml)
    qdev = ["simulate", "--gpu", "rtxpro6000", "--model", "Qwen/Qwen3-32B", "-tp", "2",
            "--num-prompts", "4", "--output-len", "8", "--device-profile",
            "{C}/" + H.QWEN_BUNDLE, *RJ]
    beside = "perf/RTXPRO6000/hardware.yaml"
    for name in ("every us_graphed 1e9", "every us_graphed NaN", "every bytes 0",
                 "samples of one", "npus 1", "measured.interconnect null"):
        out.append(Case("gpu", f"bundle's hardware.yaml {name}", qdev,
                        setup=chain(cp(H.QWEN_BUNDLE), cp(beside),
                                    edit_yaml(beside, hw_muts[name])),
                        names=("hardware.yaml",), timeout=120))
    return out


# ---------------------------------------------------------------------------------------------
# Family: MoE and DP/EP with moe.csv and mtp.csv

DSB = H.DS_BUNDLE
DS_RUNS = {
    "tp1 mtp": ["-k", "1", "--spec-method", "mtp"],
    "dp2 ep mtp": ["-dp", "2", "-ep", "-k", "1", "--spec-method", "mtp"],
    "dp4 ep mtp": ["-dp", "4", "-ep", "-k", "1", "--spec-method", "mtp"],
    "dp8 ep": ["-dp", "8", "-ep"],
}


def ds_argv(run: str, bundle: str = "{C}/" + DSB) -> list[str]:
    return ["simulate", "--gpu", "rtxpro6000", "--model", "deepseek-v3", *DS_RUNS[run],
            "--num-prompts", "4", "--output-len", "8", "--num-gpu-blocks-override", "2048",
            "--device-profile", bundle, *RJ]


def column(fn, col: str = "time_us"):
    """A CSV edit that maps column `col` of every row through fn(text) -> text."""
    def go(h, rows):
        i = h.split(",").index(col)
        out = [h]
        for r in rows:
            parts = r.split(",")
            parts[i] = fn(parts[i])
            out.append(",".join(parts))
        return out
    return go


def scaled(f: float):
    return lambda t: repr(float(t) * f)


# Every row's time broken alike: what each table family starts its edits from.
EVERY_TIME = {
    "every time 0": column(lambda t: "0"),
    "every time x1e9": column(scaled(1e9)),
    "every time 1e300": column(lambda t: "1e300"),
    "every time 1e-300": column(lambda t: "1e-300"),
    "every time negative": column(lambda t: "-" + t),
    "every time NaN": column(lambda t: "nan"),
}


def moe() -> list[Case]:
    """moe.csv and mtp.csv broken in whole (every time 0, x1e9, 1e300, negative, NaN; empty,
    header only, gone; counts past the model), under DeepSeek-V3 at TP 1 with MTP, DP 2 and
    DP 4 with EP and MTP, DP 8 with EP; the bundle's meta.yaml naming another model; advise
    over it."""
    out = []
    moe_p, mtp_p = DSB + "/tp1/moe.csv", DSB + "/tp1/mtp.csv"
    table_muts = {
        **EVERY_TIME,
        "one time 0": lambda h, r: [h, H.cell(r[0], -1, "0"), *r[1:]],
        "empty": lambda h, r: [],
        "header only": lambda h, r: [h],
        "rows reversed": lambda h, r: [h, *r[::-1]],
    }
    moe_only = {
        "tokens all 1": column(lambda t: "1", "tokens"),
        "activated_experts 10^6": column(lambda t: "1000000", "activated_experts"),
        "ep 0": column(lambda t: "0", "ep"),
        "only the ep 32 grid": lambda h, r: [h, *[x for x in r if x.startswith("32,")]],
        "a row at 10^12 tokens": lambda h, r: [h, *r, "1,1000000000000,8,90.0"],
    }
    mtp_only = {
        "sequences all 1": column(lambda t: "1", "sequences"),
        "mtp_eh_proj only": lambda h, r: [h, *[x for x in r if x.startswith("mtp_eh_proj")]],
    }
    ok = {"rows reversed": "ok", "one time 0": "any", "only the ep 32 grid": "any",
          "a row at 10^12 tokens": "any"}
    for table, rel, muts in (("moe.csv", moe_p, {**table_muts, **moe_only}),
                             ("mtp.csv", mtp_p, {**table_muts, **mtp_only})):
        for name, fn in muts.items():
            for run in DS_RUNS:
                if table == "mtp.csv" and "mtp" not in run:
                    continue
                e = ok.get(name, "error")
                setup = chain(cp(DSB), (lambda c, fx, rel=rel: (c / rel).write_text(""))
                              if name == "empty" else csv_edit(rel, fn))
                out.append(Case("moe", f"{table} {name}, {run}", ds_argv(run), setup=setup,
                                expect=e, names=(table,) if e != "ok" else (),
                                timeout=120))
    for run in DS_RUNS:
        out.append(Case("moe", f"as it is, {run}", ds_argv(run), setup=cp(DSB), expect="ok",
                        timeout=120))
        out.append(Case("moe", f"moe.csv gone, {run}", ds_argv(run), expect="any",
                        setup=chain(cp(DSB), lambda c, fx: (c / moe_p).unlink()),
                        timeout=120))
    for run in ("tp1 mtp", "dp2 ep mtp"):
        out.append(Case("moe", f"mtp.csv gone, {run}", ds_argv(run), expect="any",
                        setup=chain(cp(DSB), lambda c, fx: (c / mtp_p).unlink()),
                        timeout=120))
    # the bundle says it is of another model
    meta = DSB + "/meta.yaml"
    for name, fn in (("model Qwen/Qwen3-30B-A3B", lambda d: d.update(model="Qwen/Qwen3-30B-A3B")),
                     ("architecture qwen3_moe", lambda d: d.update(architecture="qwen3_moe")),
                     ("model a list", lambda d: d.update(model=["deepseek-ai/DeepSeek-V3"])),
                     ("tp_degrees [2]", lambda d: d.update(tp_degrees=[2]))):
        for run in ("tp1 mtp", "dp2 ep mtp"):
            out.append(Case("moe", f"meta.yaml {name}, {run}", ds_argv(run),
                            setup=chain(cp(DSB), edit_yaml(meta, fn)),
                            names=("meta.yaml",), timeout=120))
    # the DeepSeek bundle for other MoE models
    for model in ("qwen3-30b-a3b", "gpt-oss-20b"):
        out.append(Case("moe", f"the DeepSeek bundle for {model} dp2 ep",
                        ["simulate", "--gpu", "rtxpro6000", "--model", model, "-dp", "2", "-ep",
                         "--num-prompts", "4", "--output-len", "8", "--device-profile",
                         "{F}/" + DSB, *RJ], names=("meta.yaml",), timeout=120))
    # advise over the bundle, some of the above
    adv = ["advise", "--gpu", "rtxpro6000", "--model", "deepseek-v3", "-dp", "2", "-ep",
           "--spec-method", "mtp", "--max-k", "1", "--num-prompts", "3", "--output-len", "8",
           "--num-gpu-blocks-override", "2048", "--max-concurrency", "1,2", "--jobs", "1",
           "--device-profile", "{C}/" + DSB, "--result-json", "{C}/a.json"]
    out.append(Case("moe", "advise dp2 ep mtp, as it is", adv, setup=cp(DSB), expect="ok",
                    timeout=240))
    for table, rel in (("moe.csv", moe_p), ("mtp.csv", mtp_p)):
        for name in ("every time 0", "every time x1e9", "every time NaN", "header only"):
            out.append(Case("moe", f"advise dp2 ep mtp, {table} {name}", adv,
                            setup=chain(cp(DSB), csv_edit(rel, table_muts[name])),
                            names=(table,), timeout=240))
    return out


# ---------------------------------------------------------------------------------------------
# Family: operator tables (LLMServingSim's bundles; a peer run), copied then broken


def tables() -> list[Case]:
    """The dense, attention and per-sequence tables of the Llama bundle (TP 1) and the Qwen
    bundle (TP 2, with its skew fit), each broken in whole, under simulate; advise and sweep
    over some; a peer run's requests.jsonl under simulate --trace."""
    out = []
    muts = {
        **EVERY_TIME,
        "every time inf": column(lambda t: "inf"),
        "every time 10^399": column(lambda t: D400),
        "header only": lambda h, r: [h],
        "rows reversed": lambda h, r: [h, *r[::-1]],
        "the first row only": lambda h, r: [h, r[0]],
        "time_us renamed": lambda h, r: [h.replace("time_us", "time_ms"), *r],
    }
    exp = {"rows reversed": "ok", "the first row only": "any", "every time 1e-300": "error"}
    llama = ["simulate", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--num-prompts", "4",
             "--output-len", "8", "-k", "2", "--device-profile", "{C}/" + H.LLAMA_BUNDLE, *RJ]
    qwen = ["simulate", "--gpu", "rtxpro6000", "--model", "Qwen/Qwen3-32B", "-tp", "2",
            "--num-prompts", "4", "--output-len", "8", "--device-profile",
            "{C}/" + H.QWEN_BUNDLE, *RJ]
    for bundle, tp, argv, tabs in ((H.LLAMA_BUNDLE, "tp1", llama,
                                    ("dense", "attention", "per_sequence")),
                                   (H.QWEN_BUNDLE, "tp2", qwen,
                                    ("dense", "attention", "per_sequence"))):
        for tab in tabs:
            rel = f"{bundle}/{tp}/{tab}.csv"
            for name, fn in muts.items():
                e = exp.get(name, "error")
                setup = [cp(bundle), csv_edit(rel, fn)]
                if bundle == H.QWEN_BUNDLE:
                    setup.insert(1, cp("perf/RTXPRO6000/hardware.yaml"))
                out.append(Case("tables", f"{bundle.split('/')[3]} {tab}.csv {name}", argv,
                                setup=chain(*setup), expect=e,
                                names=(f"{tab}.csv",) if e != "ok" else (), timeout=120))
    skew = f"{H.QWEN_BUNDLE}/tp2/skew_fit.csv"
    for name, fn in (("alpha all 0", column(lambda t: "0", "alpha")),
                     ("alpha all 1e9", column(lambda t: "1e9", "alpha")),
                     ("alpha all NaN", column(lambda t: "nan", "alpha")),
                     ("alpha all -1", column(lambda t: "-1", "alpha")),
                     ("header only", lambda h, r: [h])):
        e = "any" if name == "alpha all 0" else "error"
        out.append(Case("tables", f"Qwen3-32B skew_fit.csv {name}", qwen, expect=e,
                        setup=chain(cp(H.QWEN_BUNDLE), cp("perf/RTXPRO6000/hardware.yaml"),
                                    csv_edit(skew, fn)),
                        names=("skew_fit.csv",) if e != "ok" else (), timeout=120))
    # advise and sweep over the Llama bundle
    adv = ["advise", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--num-prompts", "3",
           "--output-len", "8", "--max-k", "1", "--max-concurrency", "1", "--jobs", "1",
           "--device-profile", "{C}/" + H.LLAMA_BUNDLE, "--result-json", "{C}/a.json"]
    sw = ["sweep", "--set", "gpu=rtx4090", "--set", "model=llama-3.1-8b", "--set",
          "device_profile={C}/" + H.LLAMA_BUNDLE, "--set", "num_prompts=2", "--set",
          "output_len=4", "--grid", "k=0,1", "--out", "{C}/o", "--jobs", "1", "--quiet"]
    for consumer, argv in (("advise", adv), ("sweep", sw)):
        for tab in ("dense", "per_sequence"):
            for name in ("every time 0", "every time x1e9", "every time NaN", "header only"):
                rel = f"{H.LLAMA_BUNDLE}/tp1/{tab}.csv"
                out.append(Case("tables", f"{consumer}: Llama-3.1-8B {tab}.csv {name}", argv,
                                setup=chain(cp(H.LLAMA_BUNDLE), csv_edit(rel, muts[name])),
                                names=(f"{tab}.csv",), timeout=180))
    # a peer run's requests as a trace
    reqs = H.PEER_RUN + "/requests.jsonl"
    psim = ["simulate", "--model", "llama-3.1-8b", "--gpu", "rtx4090", "--trace", "{C}/" + reqs,
            "--num-prompts", "6", *RJ]

    peer_muts = {
        "every output_toks 1": lambda r: r.update(output_toks=1),
        "every output_toks 0": lambda r: r.update(output_toks=0),
        "every input_toks 10^12": lambda r: r.update(input_toks=10 ** 12),
        "every input_toks 10^399": lambda r: r.update(input_toks=10 ** 399),
        "every arrival_time NaN": lambda r: r.update(arrival_time=NAN),
        "arrival times all equal": lambda r: r.update(arrival_time=1.0),
        "arrival times 1e300 apart": None,
        "first token before queued": lambda r: r.update(first_token_ts=r["queued_ts"] - 5),
    }
    for name, fn in peer_muts.items():
        if fn is None:
            setup = H.jsonl_edit(reqs, lambda rs: [{**r, "arrival_time": 1e300 * i}
                                                   for i, r in enumerate(rs)])
        else:
            setup = H.jsonl_edit(reqs, lambda rs, fn=fn: [fn(r) or r for r in rs])
        e = {"every output_toks 1": "ok", "arrival times all equal": "ok",
             "first token before queued": "any"}.get(name, "error")
        out.append(Case("tables", f"peer requests.jsonl {name}", psim,
                        setup=chain(cp("peer"), setup), expect=e,
                        names=("requests.jsonl",) if e != "ok" else (), timeout=120))
    return out


# ---------------------------------------------------------------------------------------------
# Family: calibrate on bench files

CAL = ["calibrate", "{C}/b.json", *CAL_ARGS, "--out", "{C}/prof.json"]


def relabel(src: str, dst: str, **changes):
    """A setup: the bench file `src` copied to `dst` with `changes` (scale_ms=f multiplies
    every ms metric)."""
    def go(c: Path, fx: Path):
        d = json.loads((fx / src).read_text())
        for k, v in changes.items():
            if k == "scale_ms":
                for m in list(d):
                    if m.endswith("_ms") and isinstance(d[m], (int, float)):
                        d[m] = d[m] * v
            else:
                d[k] = v
        p = c / dst
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(d))
    return go


def many_copies(folder: str, n: int, every: dict | None = None, step_ms: float = 0.0):
    """n copies of the seed's bench file under `folder`, each with the changes `every`, and
    its ms metrics moved by i * step_ms (so no two are the same file)."""
    def go(c: Path, fx: Path):
        d = json.loads((fx / SEED_SYNC).read_text())
        d.update(every or {})
        (c / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            e = dict(d)
            if step_ms:
                for m in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms"):
                    e[m] = d[m] + i * step_ms
            (c / folder / f"run{i:05d}.json").write_text(json.dumps(e))
    return go


def benchcal() -> list[Case]:
    """calibrate --gpu: one bench file's fields broken; files that contradict each other;
    a thousand files; folders (empty, nested, holding the --out, holding a link to itself);
    one-token outputs."""
    out = []
    fields = {"mean_itl_ms": "num", "mean_tpot_ms": "num", "p99_tpot_ms": "num",
              "p99_itl_ms": "num", "num_prompts": "num", "completed": "num",
              "max_concurrency": "num", "duration": "num", "request_rate": "num",
              "model_id": "str", "date": "str"}
    muts = [("null", None), ("'x'", "x"), ("0", 0), ("-1", -1), ("NaN", NAN), ("inf", INF),
            ("1e300", 1e300), ("10^399", 10 ** 399), ("[1]", [1])]
    for key, kind in fields.items():
        for label, value in (muts if kind == "num" else STR_MUTS[1:]):
            e = "error"
            if key == "request_rate" and label == "inf":
                e = "any"   # JSON's Infinity, where vLLM writes "inf"
            if key in ("duration",) and label in ("1e300",):
                e = "any"
            if key == "model_id" and label in ("null", "''", "10,000 characters"):
                e = "any"
            if key == "max_concurrency" and label == "null":
                e = "any"
            if key == "max_concurrency" and label == "10^399":
                e = "any"
            out.append(Case("benchcal", f"b.json {key} {label}", CAL, expect=e, timeout=300,
                            setup=chain(cp(SEED_SYNC, "b.json"), edit_json(
                                "b.json", lambda d, k=key, v=value: setp(d, k, v))),
                            names=("b.json", key) if e != "ok" else ()))
    out.append(Case("benchcal", "b.json as it is", CAL, setup=cp(SEED_SYNC, "b.json"),
                    expect="ok", timeout=300))
    # files that contradict each other (two or three; the seed's run, relabelled)
    two = ["calibrate", "{C}/b.json", "{C}/c.json", *CAL_ARGS, "--out", "{C}/prof.json"]
    contra = {
        "the same run twice, two names": {},
        "the same run relabelled concurrency 8": {"max_concurrency": 8},
        "the same run relabelled concurrency 64": {"max_concurrency": 64},
        "the same run relabelled k 2": {"num_speculative_tokens": 2},
        "the same run relabelled async": {"mode": "async"},
        "the same labels, every time x2": {"scale_ms": 2.0},
        "the same labels, every time x0.5": {"scale_ms": 0.5},
        "the same labels, every time x100": {"scale_ms": 100.0},
        "concurrency 64 ten times faster": {"max_concurrency": 64, "scale_ms": 0.1},
        "another model": {"model_id": "Qwen/Qwen3-8B"},
        "request rate 1 instead of inf": {"request_rate": 1.0},
    }
    for name, changes in contra.items():
        e = "error" if name == "another model" else "any"
        out.append(Case("benchcal", f"contradicting: {name}", two, expect=e, timeout=400,
                        setup=chain(cp(SEED_SYNC, "b.json"),
                                    relabel(SEED_SYNC, "c.json", **changes)),
                        names=("model_id",) if e == "error" else (),
                        good="exit 2 naming the files that contradict, or exit 0 with a "
                             "finite CPU factor > 0 and a split band of non-zero width"))
    three = ["calibrate", "{C}/b.json", "{C}/c.json", "{C}/d.json", *CAL_ARGS, "--out",
             "{C}/prof.json"]
    out.append(Case("benchcal", "contradicting: concurrency 1, 8, 64 with the same times",
                    three, expect="any", timeout=500,
                    setup=chain(cp(SEED_SYNC, "b.json"),
                                relabel(SEED_SYNC, "c.json", max_concurrency=8),
                                relabel(SEED_SYNC, "d.json", max_concurrency=64)),
                    good="exit 2 naming the files, or a sane profile"))
    # the seed's sync and async files (the async one's file has no mode: it says sync)
    out.append(Case("benchcal", "the seed's sync and async files", ["calibrate", "{F}/" +
                                                                    SEED_SYNC,
                                                                    "{F}/r4/async.json",
                                                                    *CAL_ARGS, "--out",
                                                                    "{C}/prof.json"],
                    expect="any", timeout=400))
    # a thousand bench files, and other counts
    cal_dir = ["calibrate", "{C}/d", *CAL_ARGS, "--out", "{C}/prof.json"]
    for n, every, step, what in ((1000, None, 0.001, "1,000 distinct files in a folder"),
                                 (1000, None, 0.0, "1,000 identical files in a folder"),
                                 (200, None, 0.001, "200 distinct files in a folder"),
                                 (1000, {"max_concurrency": 4}, 0.001,
                                  "1,000 files at concurrency 4")):
        out.append(Case("benchcal", what, cal_dir, setup=many_copies("d", n, every, step),
                        expect="any", timeout=420,
                        good="exit 2 naming the count (a bound on the files), or exit 0 in "
                             "bounded memory and time with a sane profile"))
    out.append(Case("benchcal", "1,000 bench files as arguments",
                    ["calibrate", *[f"{{C}}/d/run{i:05d}.json" for i in range(1000)],
                     *CAL_ARGS, "--out", "{C}/prof.json"],
                    setup=many_copies("d", 1000, None, 0.001), expect="any", timeout=420,
                    good="exit 2 naming the count, or exit 0 in bounded memory and time"))
    out.append(Case("benchcal", "a folder of 20,000 files of {}", cal_dir, timeout=300,
                    setup=chain(cp(SEED_SYNC, "d/b.json"),
                                lambda c, fx: [(c / "d" / f"e{i}.json").write_text("{}")
                                               for i in range(20000)]),
                    expect="any", good="exit 2 naming a file that is no bench file, or exit "
                                       "0 having fitted the one that is"))
    out.append(Case("benchcal", "num_prompts and completed 10^7", CAL, timeout=300,
                    setup=chain(cp(SEED_SYNC, "b.json"), edit_json(
                        "b.json", lambda d: d.update(num_prompts=10 ** 7, completed=10 ** 7))),
                    expect="any", good="exit 2 naming num_prompts, or a fit in bounded time"))
    out.append(Case("benchcal", "per-request lists of 300,000 requests", CAL, timeout=400,
                    setup=chain(cp(SEED_SYNC, "b.json"), edit_json(
                        "b.json", lambda d: d.update(
                            num_prompts=300000, completed=300000, input_lens=[100] * 300000,
                            output_lens=[256] * 300000, ttfts=[0.05] * 300000,
                            itls=[[0.028] * 2] * 300000, errors=[""] * 300000))),
                    expect="any", names=(),
                    good="exit 2 naming a field (the itls rows do not match output_lens), "
                         "in bounded memory"))
    # folders
    out += [
        Case("benchcal", "an empty folder", cal_dir, setup=mkdir("d"), names=("d",)),
        Case("benchcal", "a folder of one non-bench JSON", cal_dir,
             setup=write("d/x.json", json.dumps({"a": 1})), names=("x.json",)),
        Case("benchcal", "a folder nested 60 deep", ["calibrate", "{C}/d", *CAL_ARGS, "--out",
                                                     "{C}/prof.json"],
             setup=cp(SEED_SYNC, "d/" + "/".join(["n"] * 60) + "/b.json"), expect="any",
             timeout=300),
        Case("benchcal", "a folder holding a link to itself", cal_dir, timeout=300,
             setup=chain(cp(SEED_SYNC, "d/b.json"), link("d/loop", "{C}/d")), expect="any"),
        Case("benchcal", "--out new, inside the scanned folder",
             ["calibrate", "{C}/d", *CAL_ARGS, "--out", "{C}/d/prof.json"],
             setup=cp(SEED_SYNC, "d/b.json"), names=("--out",),
             good="exit 2 naming --out (it would be read back as an input next time), or exit "
                  "0 with the --out kept out of the next scan"),
        Case("benchcal", "--out in a subfolder of the scanned folder",
             ["calibrate", "{C}/d", *CAL_ARGS, "--out", "{C}/d/sub/prof.json"],
             setup=chain(cp(SEED_SYNC, "d/b.json"), mkdir("d/sub")), names=("--out",)),
        Case("benchcal", "a second run with the last run's --out inside the folder",
             ["calibrate", "{C}/d", *CAL_ARGS, "--out", "{C}/prof.json"],
             setup=chain(cp(SEED_SYNC, "d/b.json"), cp(f"{R4}/cal1.json", "d/prof-old.json")),
             expect="any", timeout=300,
             good="exit 2 naming prof-old.json as no bench file, or exit 0 having left it out"),
        Case("benchcal", "the folder and a file in it", ["calibrate", "{C}/d", "{C}/d/b.json",
                                                         *CAL_ARGS, "--out", "{C}/prof.json"],
             setup=cp(SEED_SYNC, "d/b.json"), names=("b.json",), expect="any", timeout=300),
        Case("benchcal", "a gzipped bench file", ["calibrate", "{C}/b.json.gz", *CAL_ARGS,
                                                  "--out", "{C}/prof.json"],
             setup=lambda c, fx: (c / "b.json.gz").write_bytes(H.gz((fx / SEED_SYNC)
                                                                    .read_bytes())),
             expect="any", timeout=300),
    ]
    # one-token outputs
    out.append(Case("benchcal", "--output-len 1", [*CAL, "--output-len", "1"],
                    setup=cp(SEED_SYNC, "b.json"), expect="any", timeout=300,
                    good="exit 2 saying one-token outputs have no TPOT to fit, or a sane "
                         "profile; never a division by zero"))
    out.append(Case("benchcal", "mean_tpot_ms 0 and mean_itl_ms 0 (one-token outputs)", CAL,
                    setup=chain(cp(SEED_SYNC, "b.json"), edit_json("b.json", lambda d: d.update(
                        mean_tpot_ms=0.0, p99_tpot_ms=0.0, mean_itl_ms=0.0, p99_itl_ms=0.0))),
                    names=("b.json",), timeout=300))
    out.append(Case("benchcal", "detailed, every output_lens 1", CAL, timeout=300,
                    setup=chain(cp(SEED_SYNC, "b.json"), edit_json(
                        "b.json", lambda d: d.update(
                            input_lens=[100] * 80, output_lens=[1] * 80, ttfts=[0.05] * 80,
                            itls=[[]] * 80, errors=[""] * 80, mean_tpot_ms=0.0,
                            p99_tpot_ms=0.0, mean_itl_ms=0.0, p99_itl_ms=0.0))),
                    expect="any", good="exit 2 naming the one-token outputs, or a sane profile"))
    return out


# ---------------------------------------------------------------------------------------------
# Family: compare over every result layout

LAYOUTS = {   # name: (fixture, its name in the case folder)
    "simulator": (f"{R4}/sim.json", "s.json"),
    "simulator detailed": (f"{R4}/simd.json", "s.json"),
    "simulator detailed gz": (f"{R4}/simd.json.gz", "s.json.gz"),
    "engine detailed": (f"{R4}/eng.json", "s.json"),
    "vLLM detailed": ("vllm/bench.json", "s.json"),
    "vLLM summary": (f"{R4}/vllm-summary.json", "s.json"),
}


def compare_muts(layout: str) -> dict:
    """name: (fn(doc), field the error must name, expectation)"""
    m = {
        "config a list": (lambda d: d.update(config=[1, 2]), "config", "error"),
        "config a string": (lambda d: d.update(config="x"), "config", "error"),
        "config.resolved a list": (lambda d: setp(d, "config.resolved", [1]), "resolved",
                                   "error"),
        "config.resolved a number": (lambda d: setp(d, "config.resolved", 5), "resolved",
                                     "error"),
        "config.resolved.prefix_cache a list": (
            lambda d: setp(d, "config.resolved.prefix_cache", [1]), "prefix_cache", "error"),
        "config.prefix_cache a string": (lambda d: setp(d, "config.prefix_cache", "x"),
                                         "prefix_cache", "error"),
        "config.prefix_cache hits > queries": (
            lambda d: setp(d, "config.prefix_cache", {"queries": 10, "hits": 50}),
            "prefix_cache", "error"),
        "config.prefix_cache queries NaN": (
            lambda d: setp(d, "config.prefix_cache", {"queries": NAN, "hits": 0}),
            "prefix_cache", "error"),
        "step_gaps a list": (lambda d: d.update(step_gaps=[1]), "step_gaps", "error"),
        "step_gaps.values_us [NaN]": (lambda d: setp(d, "step_gaps.values_us", [NAN, 1.0]),
                                      "values_us", "error"),
        "step_gaps.median_us -5": (lambda d: setp(d, "step_gaps.median_us", -5),
                                   "median_us", "error"),
        "spec_decode a list": (lambda d: d.update(spec_decode=[1]), "spec_decode", "error"),
        "num_prompts 0": (lambda d: d.update(num_prompts=0), "num_prompts", "error"),
        "completed > num_prompts": (lambda d: d.update(completed=d.get("num_prompts", 1) + 5),
                                    "completed", "error"),
        "a top-level list": (lambda d: [d], "s.json", "error"),
        "an empty object": (lambda d: "{}", "s.json", "error"),   # (a string: written as is)
    }
    for metric in ("mean_tpot_ms", "p99_ttft_ms"):
        for label, v, e in (("NaN", NAN, "error"), ("inf", INF, "error"), ("-1", -1, "error"),
                            ("0", 0, "any"), ("'x'", "x", "error"), ("[1]", [1], "error"),
                            ("null", None, "any"), ("1e300", 1e300, "error")):
            m[f"{metric} {label}"] = (lambda d, k=metric, v=v: d.update({k: v}), metric, e)
    if layout in ("simulator detailed", "simulator detailed gz", "engine detailed",
                  "vLLM detailed"):
        m.update({
            "ttfts one short": (lambda d: d.update(ttfts=d["ttfts"][:-1]), "ttfts", "error"),
            "itls one row more": (lambda d: d.update(itls=d["itls"] + [[0.01]]), "itls",
                                  "error"),
            "input_lens of strings": (lambda d: d.update(input_lens=[str(x) for x in
                                                                     d["input_lens"]]),
                                      "input_lens", "error"),
            "ttfts with NaN": (lambda d: d.update(ttfts=[NAN] + d["ttfts"][1:]), "ttfts",
                               "error"),
            "itls a flat list": (lambda d: d.update(itls=[0.01] * len(d["itls"])), "itls",
                                 "error"),
            "output_lens negative": (lambda d: d.update(output_lens=[-x for x in
                                                                     d["output_lens"]]),
                                     "output_lens", "error"),
            "itls rows of 10,000": (lambda d: d.update(itls=[[0.01] * 10000] * len(d["itls"])),
                                    "itls", "error"),
        })
    return m


def compare_cases() -> list[Case]:
    """compare MEASURED SIMULATED: every layout broken on the simulated side, and on the
    measured side for the simulator's and vLLM's files; a peer run's requests.jsonl broken."""
    out = []
    ref = f"{R4}/simd.json"

    def edit(rel, fn):
        if rel.endswith(".gz"):
            import gzip

            def go(c, fx):
                p = c / rel
                d = json.loads(gzip.decompress(p.read_bytes()))
                d = fn(d) or d
                p.write_bytes(gzip.compress(json.dumps(d).encode(), mtime=0))
            return go
        return edit_json(rel, fn)

    for layout, (src, name) in LAYOUTS.items():
        out.append(Case("compare", f"{layout}: as it is", ["compare", "{F}/" + ref,
                                                           "{C}/" + name],
                        setup=cp(src, name), expect="ok"))
        for mut, (fn, field, e) in compare_muts(layout).items():
            if field == "s.json":
                field = name
            out.append(Case("compare", f"{layout}: simulated {mut}",
                            ["compare", "{F}/" + ref, "{C}/" + name],
                            setup=chain(cp(src, name), edit(name, fn)), expect=e,
                            names=(name, field) if e != "ok" else ()))
        if layout in ("simulator", "vLLM summary"):
            for mut in ("config a list", "config.resolved a list", "mean_tpot_ms NaN",
                        "mean_tpot_ms -1", "completed > num_prompts", "step_gaps a list"):
                fn, field, e = compare_muts(layout)[mut]
                out.append(Case("compare", f"{layout}: measured {mut}",
                                ["compare", "{C}/" + name, "{F}/" + ref],
                                setup=chain(cp(src, name), edit(name, fn)), expect=e,
                                names=(name, field) if e != "ok" else ()))
    # a peer's requests.jsonl
    reqs = H.PEER_RUN + "/requests.jsonl"
    pcmp = ["compare", "{C}/" + reqs, "{F}/" + ref]
    peer = {
        "as it is": (None, "ok"),
        "first token before queued": (lambda r: r.update(first_token_ts=r["queued_ts"] - 1),
                                      "error"),
        "last token before first": (lambda r: r.update(last_token_ts=r["first_token_ts"] - 1),
                                    "error"),
        "output_toks 0": (lambda r: r.update(output_toks=0), "error"),
        "output_toks 1": (lambda r: r.update(output_toks=1), "ok"),
        "output_toks NaN": (lambda r: r.update(output_toks=NAN), "error"),
        "input_toks '5'": (lambda r: r.update(input_toks="5"), "error"),
        "queued_ts 10^399": (lambda r: r.update(queued_ts=10 ** 399), "error"),
        "first_token_ts inf": (lambda r: r.update(first_token_ts=INF), "error"),
        "a line a list": ("list", "error"),
        "empty": ("empty", "error"),
    }
    for name, (fn, e) in peer.items():
        if fn is None:
            setup = cp("peer")
        elif fn == "list":
            setup = chain(cp("peer"), edit_text(reqs, lambda t: "[1, 2]\n" + t))
        elif fn == "empty":
            setup = chain(cp("peer"), write(reqs, ""))
        else:
            setup = chain(cp("peer"), H.jsonl_edit(reqs, lambda rs, fn=fn: [fn(r) or r
                                                                            for r in rs]))
        out.append(Case("compare", f"peer requests.jsonl {name}", pcmp, setup=setup, expect=e,
                        names=("requests.jsonl",) if e != "ok" else ()))
    # results of the wrong kind
    for what, src in (("an advise result", None), ("a calibrate profile", f"{R4}/cal1.json"),
                      ("a GPU's hardware.yaml", "hw.yaml")):
        if src is None:
            setup = write("s.json", json.dumps({"format": "stepgap-advise/1", "loads": []}))
        else:
            setup = cp(src, "s.json")
        out.append(Case("compare", f"simulated is {what}", ["compare", "{F}/" + ref,
                                                            "{C}/s.json"],
                        setup=setup, names=("s.json",)))
    return out


# ---------------------------------------------------------------------------------------------
# Family: degenerate workloads (one prompt, one output token): legitimate, so an answer


def degenerate() -> list[Case]:
    out = []

    def d(name, argv, expect="ok", timeout=120, setup=None, good=""):
        out.append(Case("degenerate", name, argv, expect=expect, timeout=timeout, setup=setup,
                        good=good or "exit 0 with sane numbers (a TPOT of 0 or none for one "
                                     "token), or exit 2 with one line saying why; never a "
                                     "division by zero"))

    for prompts, outlen in ((1, 1), (4, 1), (1, 8)):
        tag = f"{prompts} prompt{'s' * (prompts > 1)}, output {outlen}"
        base = ["--num-prompts", str(prompts), "--output-len", str(outlen)]
        for k in (0, 4):
            for mode in ("sync", "async", "zero-bubble"):
                d(f"simulate {tag}, k {k}, {mode}",
                  ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", *base, "-k", str(k),
                   "--mode", mode, *RJ])
        d(f"simulate {tag}, --band", ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b",
                                      *base, "-k", "2", "--band", *RJ])
        d(f"simulate {tag}, qwen3-30b-a3b dp 2 ep", ["simulate", "--gpu", "h100", "--model",
                                                     "qwen3-30b-a3b", "-dp", "2", "-ep", *base,
                                                     *RJ])
        d(f"simulate {tag}, the Llama bundle", ["simulate", "--gpu", "rtx4090", "--model",
                                                "llama-3.1-8b", *base, "-k", "2",
                                                "--device-profile", "{F}/" + H.LLAMA_BUNDLE,
                                                *RJ])
        d(f"simulate {tag}, DeepSeek dp 2 ep mtp",
          ["simulate", "--gpu", "rtxpro6000", "--model", "deepseek-v3", "-dp", "2", "-ep",
           "-k", "1", "--spec-method", "mtp", *base, "--num-gpu-blocks-override", "2048",
           "--device-profile", "{F}/" + DSB, *RJ])
        d(f"simulate {tag}, the calibrate profile --band",
          ["simulate", "--profile", "{F}/r4/cal1.json", "--model", "llama-3.1-8b", "-k", "2",
           *base, "--band", *RJ])
        d(f"simulate {tag}, the CPU profile", ["simulate", "--device", "cpu", "--gpu", "cpu",
                                               "--profile", "{F}/measured/profile.json", "-k",
                                               "2", *base, *RJ])
        adv = ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", *base, "--max-k", "2",
               "--jobs", "1", "--result-json", "{C}/a.json"]
        d(f"advise {tag}, concurrency 1", [*adv, "--max-concurrency", "1"], expect="any")
        d(f"advise {tag}, rates 1,inf", [*adv, "--request-rate", "1,inf"], expect="any")
        d(f"advise {tag}, --no-band", [*adv, "--max-concurrency", "1", "--no-band"],
          expect="any")
        d(f"advise {tag}, the calibrate profile",
          ["advise", "--profile", "{F}/r4/cal1.json", "--model", "llama-3.1-8b", *base,
           "--max-k", "2", "--max-concurrency", "1", "--jobs", "1", "--result-json",
           "{C}/a.json"], expect="any")
        d(f"sweep {tag}, --band", ["sweep", "--set", f"num_prompts={prompts}", "--set",
                                   f"output_len={outlen}", "--grid", "k=0,2", "--grid",
                                   "mode=sync,async", "--band", "--out", "{C}/o", "--jobs",
                                   "1", "--quiet"])
    d("calibrate --output-len 1 with one prompt's file",
      ["calibrate", "{C}/b.json", *CAL_ARGS, "--output-len", "1", "--out", "{C}/prof.json"],
      setup=chain(cp(SEED_SYNC, "b.json"), edit_json("b.json", lambda d: d.update(
          num_prompts=1, completed=1))), expect="any", timeout=300)
    d("random --random-input-len 1 --random-output-len 1",
      [*SIM, "--dataset-name", "random", "--random-input-len", "1", "--random-output-len", "1",
       *RJ], expect="any")
    d("one output token at k 64", [*SIM[:-4], "--num-prompts", "1", "--output-len", "1",
                                   "--num-speculative-tokens", "64", *RJ], expect="any")
    d("compare two one-token results", ["compare", "{C}/a.json", "{C}/b.json"],
      setup=lambda c, fx: [subprocess.run(
          [str(H.STEPGAP), "simulate", "--gpu", "h100", "--num-prompts", "2", "--output-len",
           "1", "--quiet", "--seed", str(i), "--result-json", str(c / n)], check=True)
          for i, n in ((0, "a.json"), (1, "b.json"))])
    return out


# ---------------------------------------------------------------------------------------------
# Family: sweeps and load lists of absurd size


def sparse(rel: str, size: int):
    """A setup: a file of `size` zero bytes that takes no room (a hole)."""
    def go(c: Path, fx: Path):
        with open(c / rel, "wb") as f:
            f.truncate(size)
    return go


def sizes() -> list[Case]:
    out = []
    sw = ["sweep", "--set", "num_prompts=2", "--set", "output_len=4", "--out", "{C}/o",
          "--quiet"]

    def s(name, extra, expect="any", names=(), timeout=120, setup=None, base=sw, good=""):
        out.append(Case("sizes", name, [*base, *extra], expect=expect, names=names,
                        timeout=timeout, setup=setup,
                        good=good or "exit 2 naming the size and its bound, or exit 0 in "
                                     "bounded time and memory"))

    s("an axis of 3,000 values, dry run", ["--grid", "max_concurrency=1..3000", "--dry-run"])
    s("an axis of 10^6 values, dry run", ["--grid", "max_concurrency=1..1000000", "--dry-run"])
    s("an axis of 10^12 values, dry run", ["--grid", "max_num_seqs=1..1000000000000",
                                           "--dry-run"], names=("max_num_seqs",),
      expect="error")
    s("four axes of 100: 10^8 cells, dry run", ["--grid", "max_num_seqs=1..100", "--grid",
                                                "max_concurrency=1..100", "--grid", "k=0..99",
                                                "--grid", "output_len=1..100", "--dry-run"],
      expect="error", names=("cells",))
    s("an axis of 3,000 listed values", ["--grid", "max_concurrency=" +
                                         ",".join(str(i) for i in range(1, 3001)),
                                         "--dry-run"])
    s("a grid file of 100,000 values", ["--grid-file", "{C}/g.json", "--dry-run"], timeout=300,
      setup=write("g.json", json.dumps({"grid": {"max_concurrency": list(range(1,
                                                                               100001))}})))
    s("a grid file with a 10^399 value", ["--grid-file", "{C}/g.json", "--dry-run"],
      setup=write("g.json", '{"grid": {"max_concurrency": [1, ' + D400 + "]}}"),
      expect="any", names=())
    s("a grid file of 10 MB of one string", ["--grid-file", "{C}/g.json", "--dry-run"],
      setup=write("g.json", json.dumps({"grid": {"mode": ["x" * 10_000_000]}})),
      expect="error", names=("mode",))
    s("--jobs 2, 40 cells", ["--grid", "k=0..4", "--grid", "max_concurrency=1..8", "--jobs",
                             "2"], expect="ok", timeout=300)
    s("--jobs 10^399", ["--grid", "k=0,1", "--jobs", D400], expect="any", names=("--jobs",))
    adv = ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "2",
           "--output-len", "4", "--max-k", "1", "--no-band", "--jobs", "1", "--result-json",
           "{C}/a.json"]

    def upto(n):
        return ",".join(str(i) for i in range(1, n + 1))

    s("advise, 3,000 concurrencies", ["--max-concurrency", upto(3000)], base=adv, timeout=600)
    s("advise, 3,000 request rates", ["--request-rate", upto(3000)], base=adv, timeout=600)
    s("advise, 60 rates x 60 concurrencies", ["--request-rate", upto(60), "--max-concurrency",
                                              upto(60)], base=adv, timeout=600)
    s("advise, --max-k 64 at 1,000 prompts", ["--max-k", "64", "--num-prompts", "1000",
                                              "--max-concurrency", "1"],
      base=[a for a in adv if a not in ("--max-k", "1")], timeout=300)
    s("simulate 10^6 prompts", ["--num-prompts", "1000000"],
      base=["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--output-len", "8", *RJ],
      timeout=900)
    s("simulate a trace of 10^6 lines", ["--trace", "{C}/t.jsonl", "--num-prompts",
                                         "1000000"],
      base=["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", *RJ], timeout=900,
      setup=write("t.jsonl", lambda c, fx: "".join(
          f'{{"request_id": "r{i}", "arrival_s": {i * 1e-3}, "prompt_len": 20, '
          f'"output_len": 4}}\n' for i in range(1_000_000))))
    s("a 2 GB sparse trace file", ["--trace", "{C}/t.jsonl"],
      base=["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", *RJ], timeout=120,
      setup=sparse("t.jsonl", 2 << 30),
      expect="error", names=("t.jsonl",))
    return out


# ---------------------------------------------------------------------------------------------
# Family: signals (SIGTERM during start-up; a pool worker killed)

SIG_CMDS = {
    "simulate": ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "40",
                 "--output-len", "64", *RJ],
    "advise": ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "8",
               "--output-len", "32", "--max-k", "2", "--max-concurrency", "1,2", "--jobs", "1",
               "--result-json", "{C}/a.json"],
    "sweep": ["sweep", "--set", "num_prompts=4", "--set", "output_len=16", "--grid", "k=0..3",
              "--out", "{C}/o", "--jobs", "1", "--quiet"],
    "calibrate": ["calibrate", "{F}/" + SEED_SYNC, *CAL_ARGS, "--out", "{C}/prof.json"],
    "compare": ["compare", "{F}/r4/simd.json", "{F}/r4/eng.json"],
}
POOL_CMDS = {
    "advise --jobs 2": ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts",
                        "80", "--output-len", "128", "--max-k", "4", "--max-concurrency",
                        "1,2,4,8,16,32", "--jobs", "2", "--result-json", "{C}/a.json"],
    "sweep --jobs 2": ["sweep", "--set", "num_prompts=80", "--set", "output_len=128", "--grid",
                       "k=0..4", "--grid", "max_concurrency=1..32:x2", "--out", "{C}/o",
                       "--jobs", "2", "--quiet"],
}


def signals() -> list[Case]:
    out = []
    for cmd, argv in SIG_CMDS.items():
        # most fall in start-up: the interpreter's, then stepgap's imports (0.1-0.4 s)
        for delay in (0.02, 0.06, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.6, 1.0):
            out.append(Case("signals", f"{cmd}: SIGTERM at {delay:g} s", argv, expect="ok",
                            signal=("main", signal.SIGTERM, delay), timeout=300,
                            good="exit 143 with one line 'terminated', or the signal's own "
                                 "status before stepgap starts; never a traceback"))
        for delay in (0.1, 0.5):
            out.append(Case("signals", f"{cmd}: SIGINT at {delay:g} s", argv, expect="ok",
                            signal=("main", signal.SIGINT, delay), timeout=300,
                            good="exit 130 with one line 'interrupted'; never a traceback"))
    for cmd, argv in POOL_CMDS.items():
        for delay in (0.0, 0.5, 2.0):
            out.append(Case("signals", f"{cmd}: a worker SIGKILLed at {delay:g} s", argv,
                            expect="ok", signal=("worker", signal.SIGKILL, delay), timeout=400,
                            good="exit 1 or 2 with one line saying a worker died (or exit 0 "
                                 "having run its cells again); no traceback, nothing left "
                                 "running"))
        out.append(Case("signals", f"{cmd}: both workers SIGKILLed", argv, expect="ok",
                        signal=("workers", signal.SIGKILL, 0.5), timeout=400,
                        good="exit 1 or 2 with one line; no traceback, nothing left running"))
        out.append(Case("signals", f"{cmd}: SIGTERM to the command mid-run", argv, expect="ok",
                        signal=("main", signal.SIGTERM, 3.0), timeout=400,
                        good="exit 143 with one line; no worker left running"))
    big = ["calibrate", "{C}/d", *CAL_ARGS, "--out", "{C}/prof.json"]
    out.append(Case("signals", "calibrate of 1,000 files: SIGTERM at 5 s", big, expect="ok",
                    setup=many_copies("d", 1000, None, 0.001),
                    signal=("main", signal.SIGTERM, 5.0), timeout=300,
                    good="exit 143 within 5 s of the signal"))
    return out


# ---------------------------------------------------------------------------------------------
# Family: names (models, drafts and folders that look alike)


def names() -> list[Case]:
    out = []
    base = ["simulate", "--gpu", "h100", "--num-prompts", "4", "--output-len", "8", *RJ]
    out.append(Case("names", "a folder ./llama-3.1-8b holding another model's config",
                    [*base, "--model", "llama-3.1-8b"],
                    setup=cp("pair/target/config.json", "llama-3.1-8b/config.json"),
                    expect="any", good="exit 0 with a line saying which of the two it took, "
                                       "or exit 2 naming both"))
    out.append(Case("names", "--draft llama-3.1-8b (a preset, of a target)",
                    [*base, "--model", "llama-3.1-8b", "-k", "2", "--draft", "llama-3.1-8b"],
                    expect="any", good="exit 2 saying llama-3.1-8b is a target, not a draft, or "
                                       "a draft-model run"))
    out.append(Case("names", "--model a bundle folder", [*base, "--model", "{F}/" + DSB],
                    names=(DSB.split("/")[-1],)))
    out.append(Case("names", "--model a calibrate profile",
                    [*base, "--model", "{F}/r4/cal1.json"], names=("cal1.json",)))
    out.append(Case("names", "--profile a bench file", [*base, "--model", "llama-3.1-8b",
                                                        "--profile", "{F}/" + SEED_SYNC],
                    names=(SEED_SYNC,)))
    out.append(Case("names", "--profile a run result", [*base, "--model", "llama-3.1-8b",
                                                        "--profile", "{F}/r4/sim.json"],
                    names=("sim.json",)))
    out.append(Case("names", "--gpu a calibrate profile", ["simulate", "--gpu",
                                                           "{F}/r4/cal1.json", *base[3:],
                                                           "--model", "llama-3.1-8b"],
                    names=("cal1.json",)))
    out.append(Case("names", "--device-profile a file", [*base, "--model", "llama-3.1-8b",
                                                         "--device-profile",
                                                         "{F}/r4/cal1.json"],
                    names=("cal1.json",)))
    out.append(Case("names", "--profile of l20 with --gpu h100",
                    ["advise", "--profile", "{F}/r4/cal1.json", "--gpu", "h100", "--model",
                     "llama-3.1-8b", "--max-k", "1", "--num-prompts", "3", "--output-len", "8",
                     "--max-concurrency", "1", "--jobs", "1", "--result-json", "{C}/a.json"],
                    expect="any", good="exit 2 naming the GPUs, or exit 0 saying which it used"))
    out.append(Case("names", "--profile of llama-3.1-8b with --model qwen3-8b",
                    ["advise", "--profile", "{F}/r4/cal1.json", "--model", "qwen3-8b",
                     "--max-k", "1", "--num-prompts", "3", "--output-len", "8",
                     "--max-concurrency", "1", "--jobs", "1", "--result-json", "{C}/a.json"],
                    expect="any", good="exit 2 naming both models, or exit 0 saying so"))
    return out


FAMILIES = {"profile": profiles, "options": options, "gpu": gpus, "moe": moe,
            "tables": tables, "benchcal": benchcal, "compare": compare_cases,
            "degenerate": degenerate, "sizes": sizes, "signals": signals, "names": names}


# ---------------------------------------------------------------------------------------------
# Judging what hostile.run_case cannot see: outputs past physics, signals, servers

SIGNAL_STATE: dict[str, dict] = {}


def _procs(keep) -> list[int]:
    """The pids whose /proc/PID/stat fields after the name (state, ppid, pgrp, ...) `keep`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if keep(fields):
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _children(ppid: int) -> list[int]:
    return _procs(lambda fields: int(fields[1]) == ppid)


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _watch(folder: Path, target: str, signum: int, delay: float, state: dict) -> None:
    """Find the case's stepgap process (a child of this one, in `folder`, once it has exec'd),
    wait `delay` and signal it, or one or both of its pool workers."""
    me, t0 = os.getpid(), time.monotonic()
    mine = _cmdline(me)   # a child that still has it has not yet become stepgap (exec)
    main = None
    while main is None and time.monotonic() - t0 < 120:
        for pid in _children(me):
            if _cwd(pid) == str(folder) and _cmdline(pid) not in (mine, b""):
                main = pid
                break
        else:
            time.sleep(0.003)
    if main is None:
        state["note"] = "the command was never seen"
        return
    state["main"] = main
    state["pgid"] = main   # hostile.limit_memory makes it a session leader
    if target == "main":
        time.sleep(delay)
        if _alive(main):
            os.kill(main, signum)
            state["sent"] = time.monotonic()
    else:
        want = 2 if target == "workers" else 1
        while _alive(main) and time.monotonic() - t0 < 300:
            line = _cmdline(main)
            kids = [p for p in _children(main) if _cmdline(p) == line]
            if len(kids) >= want:
                time.sleep(delay)
                victims = [p for p in kids[:want] if _alive(p)]
                for p in victims:
                    os.kill(p, signum)
                state["victims"] = victims
                if victims:
                    state["sent"] = time.monotonic()
                break
            time.sleep(0.01)
        if "sent" not in state:
            state["note"] = "its pool had ended before the signal" if "victims" in state \
                else "no pool worker was seen"
    while _alive(main):
        time.sleep(0.01)
    state["ended"] = time.monotonic()


def _leftovers(pgid: int) -> list[int]:
    return _procs(lambda fields: int(fields[2]) == pgid and fields[0] != "Z")


def past_physics(folder: Path) -> str | None:
    """Why an output the case wrote with exit 0 is silently wrong (module docstring), or None."""
    def bad_ms(v) -> bool:
        return isinstance(v, bool) or not isinstance(v, (int, float)) or \
            not math.isfinite(v) or v < 0 or v > PAST_PHYSICS_MS

    for rel in ("r.json", "o/sweep.json", "a.json", "prof.json"):
        p = folder / rel
        if not p.is_file():
            continue
        try:
            doc = json.loads(p.read_text())
        except (ValueError, OSError):
            return f"{rel}: not JSON"
        if rel == "r.json" and isinstance(doc, dict):
            for key in ("mean_tpot_ms", "mean_itl_ms"):
                if key in doc and bad_ms(doc[key]):
                    return f"{rel}: {key} = {doc[key]!r}"
        if rel == "o/sweep.json" and isinstance(doc, dict):
            for row in doc.get("rows") or []:
                for key in ("mean_tpot_ms", "mean_itl_ms", "mean_tpot_ms_low",
                            "mean_tpot_ms_high"):
                    if key in row and row[key] is not None and bad_ms(row[key]):
                        return f"{rel}: a row's {key} = {row[key]!r}"
        if rel == "a.json" and isinstance(doc, dict):
            for load in doc.get("loads") or []:
                for mode in ("sync", "async", "zero_bubble"):
                    cell = load.get(mode) or {}
                    band = cell.get("mean_tpot_ms") or {}
                    v, lo, hi = band.get("value"), band.get("low"), band.get("high")
                    for x in (v, lo, hi):
                        if x is not None and bad_ms(x):
                            return f"{rel}: {mode} mean TPOT {x!r}"
                    if None not in (v, lo, hi) and not lo - 1e-9 <= v <= hi + 1e-9:
                        return f"{rel}: {mode} mean TPOT {v} outside its band [{lo}, {hi}]"
                    for k, x in (cell.get("mean_tpot_ms_by_k") or {}).items():
                        if x is not None and bad_ms(x):
                            return f"{rel}: {mode} mean TPOT at k {k} = {x!r}"
        if rel == "prof.json" and isinstance(doc, dict):
            cal = doc.get("calibration") or {}
            for key, v in (("calibration.cpu_scale", cal.get("cpu_scale")),
                           ("roofline_level", doc.get("roofline_level"))):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                        not math.isfinite(v) or v <= 0:
                    return f"{rel}: {key} = {v!r}"
            split = (doc.get("bands") or {}).get("split")
            if isinstance(split, dict):
                ends = [(split.get(e) or {}).get(s) for e in ("low", "high")
                        for s in ("cpu", "device")]
                if any(isinstance(x, bool) or not isinstance(x, (int, float)) or
                       not math.isfinite(x) or x <= 0 for x in ends):
                    return f"{rel}: a split end of {ends}"
                if ends[0] == ends[2] and ends[1] == ends[3]:
                    return f"{rel}: a split band of zero width ({ends})"
    return None


def resume_store_only(why: str) -> bool:
    """Whether a "failed, and wrote [...]" wrote nothing but `sweep`'s store of finished cells
    (OUT/cells.jsonl and its folder), which a sweep keeps after an interruption by design, for
    its rerun to go on from (sim/sweep_cli.py); the list is whole (hostile.py shows three)."""
    import ast
    written = ast.literal_eval(why.removeprefix("failed, and wrote "))
    return len(written) < 3 and all(p.endswith("/cells.jsonl") or any(
        q.startswith(p + "/") for q in written) for p in written)


def judge_signal(res: H.Result, case: Case, state: dict) -> H.Result:
    target, signum, _ = case.signal
    if res.why.startswith("failed, and wrote") and target != "main" \
            and resume_store_only(res.why):
        res = replace(res, why="failed, keeping the sweep's finished cells")   # judged below
    if res.why.startswith(("traceback", "still running", "fixtures", "input changed",
                           "failed, and wrote")):
        return res
    if "sent" not in state:
        return replace(res, why=f"{res.why} ({state.get('note', 'ended before the signal')})")
    after = state.get("ended", time.monotonic()) - state["sent"]
    rc = res.rc
    if target == "main":
        codes = {signal.SIGTERM: (143, -signal.SIGTERM), signal.SIGINT: (130, -signal.SIGINT)}
        if rc in codes[signum]:
            return replace(res, cls="OK",
                           why=f"ended {after:.1f} s after the signal, exit {rc}")
        if rc == 0:
            if after > 5:
                name = signal.Signals(signum).name
                return replace(res, cls="POOR", why=f"ran on {after:.0f} s after {name}, exit 0")
            return replace(res, cls="OK", why="finished as the signal came")
        if rc == 2:
            return replace(res, cls="POOR", why="exit 2 (bad input) after a signal")
        return replace(res, cls="BAD", why=f"exit {rc} after {signal.Signals(signum).name}")
    if rc == 0:
        return replace(res, cls="OK", why="recovered from the killed worker, exit 0")
    if rc in (1, 2) and H.ERROR_LINE.match(res.last or ""):
        return replace(res, cls="OK", why=f"exit {rc}: {res.last[:100]}")
    return replace(res, cls="BAD", why=f"exit {rc} after a worker was killed: "
                                       f"{(res.last or '')[:100]}")


def run4(case: Case, fx: Path, work: Path, fx_before: dict) -> H.Result:
    holder: dict = {}

    def note(c: Path, fx_: Path):
        holder["dir"] = c
        if case.signal is not None:
            state = SIGNAL_STATE[str(c)] = {}
            target, signum, delay = case.signal
            threading.Thread(target=_watch, args=(c, target, signum, delay, state),
                             daemon=True).start()

    plain = replace(case, setup=chain(*(f for f in (case.setup, note) if f is not None)))
    res = H.run_case(plain, fx, work, fx_before)
    folder = holder.get("dir")
    if case.signal is not None and folder is not None:
        state = SIGNAL_STATE.pop(str(folder), {})
        res = judge_signal(res, case, state)
        pgid = state.get("pgid")
        if pgid is not None:
            time.sleep(2)
            left = _leftovers(pgid)
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if left and res.cls != "BAD":
                res = replace(res, cls="BAD", why=f"left {len(left)} process(es) running")
    if case.serve and res.rc is None and res.why.startswith("still running") and \
            "serving" in (res.last or ""):
        res = replace(res, cls="POOR" if case.expect == "error" else "OK",
                      why="the server started" + (" on nonsense" if case.expect == "error"
                                                  else ""))
    if res.why.startswith("the error does not name") and case.also:
        missing = [n for n in case.names if n not in (res.last or "")]
        if all(any(alt in res.last for name, alt in case.also if name == n) for n in missing):
            res = replace(res, cls="OK", why="refused, naming it in another spelling")
    if res.rc == 0 and res.cls != "BAD" and folder is not None:
        why = past_physics(folder)
        if why:
            res = replace(res, cls="BAD", why=f"exit 0 with a number past physics: {why}")
    return res


# ---------------------------------------------------------------------------------------------
# The sweep


def all_cases(only: set[str] | None) -> list[Case]:
    return H.all_cases(only, FAMILIES)


def sample(cases: list[Case], n: int) -> list[Case]:
    """n cases spread over every family (each family's share, at least one), evenly."""
    by = defaultdict(list)
    for c in cases:
        by[c.family].append(c)
    out = []
    for fam, cs in by.items():
        want = max(1, round(n * len(cs) / len(cases)))
        step = len(cs) / want
        out += [cs[int(i * step)] for i in range(min(want, len(cs)))]
    return out


def reason(r: H.Result) -> str:
    """A result's why, without the case's own values: a traceback by its exception's type."""
    why = r.why
    if why.startswith("traceback: "):
        return "traceback: " + why[len("traceback: "):].split(":")[0].split(".")[-1]
    if why.startswith("still running"):
        return "still running at the timeout"
    if why.startswith("exit 0 with a number past physics"):
        return "exit 0 with a number past physics"
    if why.startswith(("the error does not name", "exit 0 with a wrong result",
                       "the server started")):
        return why.split(":")[0].split(" [")[0]
    return why


def markdown(results: list[H.Result], cases: dict, head: str) -> str:
    counts, t = H.tally(results)
    lines = [head, "", "| family | cases | OK | POOR | BAD |", "|---|---:|---:|---:|---:|"]
    for f in FAMILIES:
        if f in counts:
            c = counts[f]
            lines.append(f"| {f} | {sum(c.values())} | {c['OK']} | {c['POOR']} | {c['BAD']} |")
    lines.append(f"| **all** | **{len(results)}** | **{t['OK']}** | **{t['POOR']}** | "
                 f"**{t['BAD']}** |")
    for cls, chosen in H.failures(results):
        groups = defaultdict(list)
        for r in chosen:
            groups[(r.family, reason(r))].append(r)
        lines += ["", f"## {cls} ({len(chosen)}) by family and reason", "",
                  "| family | reason | cases | e.g. |", "|---|---|---:|---|"]
        for (fam, why), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"| {fam} | {why} | {len(rs)} | {'; '.join(r.name for r in rs[:2])} |")
    bad = [r for r in results if r.cls == "BAD"]
    lines += ["", f"## Every BAD case ({len(bad)}), with its command", "",
              "`$F` is the sweep's fixtures folder, `$C` the case's own (bench/hostile.py).", ""]
    for r in bad:
        c = cases.get((r.family, r.name))
        lines.append(f"- **[{r.family}] {r.name}**: {r.why}")
        lines.append(f"  - good answer: {good_of(c) if c else '?'}")
        lines.append(f"  - command: `{r.cmd}`")
        if r.last and not r.why.endswith(r.last[:100]):
            lines.append(f"  - last line: `{r.last[:240]}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = H.sweep_parser(__doc__, FAMILIES, "round4-results.jsonl")
    ap.add_argument("--sample", type=int, default=None, help="a spread of about N cases")
    ap.add_argument("--rerun", default=None, help="only the BAD cases of this results file")
    ap.add_argument("--hangs", action="store_true",
                    help="with --rerun: only those still running at their timeout")
    ap.add_argument("--timeout-scale", type=float, default=1.0,
                    help="multiply every case's timeout (a loaded machine; default 1)")
    ap.add_argument("--md", default=None, help="also write the summary as Markdown here")
    ap.add_argument("--summarize", nargs="+", default=None, metavar="RESULTS",
                    help="run nothing: summarize these results files (a later file's result of "
                         "a case replaces an earlier one's: a rerun of the hangs)")
    args = ap.parse_args(argv)
    # a sweep started in the background (`cmd &`) ignores SIGINT, and so would every command
    # it starts: the SIGINT cases need the default
    signal.signal(signal.SIGINT, signal.default_int_handler)
    only = set(args.only.split(",")) if args.only else None
    cases = all_cases(only)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    if args.rerun:
        bad = {(r["family"], r["name"]) for r in map(json.loads, Path(args.rerun).read_text()
                                                     .splitlines()) if r["cls"] == "BAD"
               and (not args.hangs or r["why"].startswith("still running"))}
        cases = [c for c in cases if (c.family, c.name) in bad]
    if args.sample:
        cases = sample(cases, args.sample)
    cases = [replace(c, timeout=c.timeout * args.timeout_scale) for c in cases]
    if args.summarize:
        merged = {}
        for path in args.summarize:
            for line in Path(path).read_text().splitlines():
                r = H.Result(**json.loads(line))
                merged[(r.family, r.name)] = r
        order = {(c.family, c.name): i for i, c in enumerate(cases)}
        results = sorted(merged.values(), key=lambda r: order.get((r.family, r.name), 0))
        print(H.report(results))
        if args.md:
            Path(args.md).write_text(markdown(results, {(c.family, c.name): c for c in cases},
                                              "# Hostile sweep, round 4"))
        return 0
    if args.list:
        for c in cases:
            print(f"[{c.family}] {c.name}  ->  {good_of(c)}")
        fam = Counter(c.family for c in cases)
        print(f"{len(cases)} cases: " + ", ".join(f"{f} {n}" for f, n in fam.items()))
        return 0
    work, fx = H.work_folder(args.work, "stepgap-round4-")
    build_round4(fx)
    fx_before = H.snapshot(fx)
    t0 = time.monotonic()
    results = H.run_cases(cases, run4, fx, work, fx_before, args.jobs, t0)
    H.write_results(results, cases,
                    Path(args.out) if args.out else work / "round4-results.jsonl", t0)
    if args.md:
        by_name = {(c.family, c.name): c for c in cases}
        Path(args.md).write_text(markdown(results, by_name, "# Hostile sweep, round 4"))
    return 1 if any(r.cls == "BAD" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
