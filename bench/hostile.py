"""A hostile user's sweep of stepgap's command line and its HTTP server (issue 38's check).

Every case runs `.venv/bin/stepgap ARGS` as a subprocess of its own, under a 4 GB address-space
limit and a timeout, in a folder of its own that its setup fills with the files it breaks (copies
of the committed bundles, peer runs, bench files, the trained pair). Every file the case could
read (the shared fixtures and its own folder) is hashed before and after. Each result is one of:

- OK: exit 2 with the error as the last stderr line (`stepgap CMD: error: ...`), naming what the
  case expects it to name, and nothing written; or a legitimate success;
- BAD: a traceback, a MemoryError, a hang past the timeout, a crash (any other exit status), an
  input changed, a file written by a case that failed, a result of exit 0 that is wrong (a NaN
  or negative metric);
- POOR: it works but misleads: nonsense accepted with exit 0, an error that does not name the
  file, field or option the case broke, a legitimate input refused.

The serve part (`--serve`) starts `stepgap serve` on the trained pair and sends hostile HTTP
requests, each followed by a normal completion that must succeed; a 5xx, a dropped connection, a
dead server or a failed normal request is BAD, a 200 to nonsense or a 4xx naming the wrong field
POOR.

    .venv/bin/python bench/hostile.py                      # the command line (about 560 cases)
    .venv/bin/python bench/hostile.py --serve              # and the server (88 requests)
    .venv/bin/python bench/hostile.py --only bundle,peer   # some families
    .venv/bin/python bench/hostile.py --list               # the cases, not run

It prints the counts by family and class and every BAD and POOR case with its command, and
writes them all as JSON lines to --out (default: hostile-results.jsonl in the work folder).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
STEPGAP = ROOT / ".venv" / "bin" / "stepgap"
PYTHON = ROOT / ".venv" / "bin" / "python"
MEMORY = 4 << 30          # the address-space limit of every case
PEERS = ROOT / "traces" / "peers" / "llmservingsim"
LLAMA_BUNDLE = "perf/RTX4090/meta-llama/Llama-3.1-8B/bf16"
QWEN_BUNDLE = "perf/RTXPRO6000/Qwen/Qwen3-32B/bf16"
DS_BUNDLE = "perf/RTXPRO6000/deepseek-ai/DeepSeek-V3.2-Exp/fp8"
PEER_RUN = "peer/bench/examples/RTX4090/Llama-3.1-8B/vllm"
BIG = "1" + "0" * 30      # an integer no setting means
HUGE_DIGITS = "9" * 5000  # past Python's int-from-string limit


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    family: str
    name: str
    argv: list[str]                 # after `stepgap`; {F} the fixtures, {C} the case's folder
    setup: Callable | None = None   # setup(case folder, fixtures folder)
    expect: str = "error"           # error: nonsense to refuse; ok: legitimate; any: either
    names: tuple[str, ...] = ()     # what the error line must name (every one)
    timeout: float = 60.0
    stdin: bytes | None = None
    kill_worker: bool = False       # SIGKILL one of its worker processes once two run
    sigterm_after: float | None = None   # SIGTERM it this many seconds after it starts


def words(argv, cdir: Path, fx: Path) -> list[str]:
    return [a.replace("{F}", str(fx)).replace("{C}", str(cdir)) for a in argv]


# ---------------------------------------------------------------------------------------------
# Fixtures: copies of the committed files every case may read (and must not change)


def gz_bomb(path: Path, gib: float = 3.0, content: bytes = b"\0") -> None:
    """A gzip file of `gib` GiB of `content` repeated: 64 MiB compressed once, that member
    written again and again (gzip readers read concatenated members as one stream)."""
    piece = content * ((64 << 20) // len(content))
    member = gzip.compress(piece, compresslevel=9, mtime=0)
    with open(path, "wb") as f:
        for _ in range(int(gib * 16)):
            f.write(member)


def build_fixtures(fx: Path) -> None:
    fx.mkdir(parents=True, exist_ok=True)
    perf = PEERS / "profiler" / "perf"
    for rel in ("RTX4090/meta-llama", "RTXPRO6000/Qwen", "RTXPRO6000/deepseek-ai",
                "RTXPRO6000/meta-llama"):
        shutil.copytree(perf / rel, fx / "perf" / rel)
    shutil.copy(perf / "RTXPRO6000" / "hardware.yaml", fx / "perf" / "RTXPRO6000")
    shutil.copy(PEERS / "at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml", fx / "hw.yaml")
    for run in ("RTX4090/Llama-3.1-8B", "RTXPRO6000/Qwen3-32B"):
        dst = fx / "peer" / "bench" / "examples" / run
        shutil.copytree(PEERS / "bench" / "examples" / run, dst)
    shutil.copytree(PEERS / "workloads", fx / "peer" / "workloads")
    shutil.copy(ROOT / "traces/seed/vllm-pr25872-sync.json", fx / "bench.json")
    shutil.copytree(ROOT / "tests/data/vllm", fx / "vllm")
    shutil.copytree(ROOT / "checkpoints/pystdlib", fx / "pair")
    shutil.copytree(ROOT / "traces/measured/cpu", fx / "measured")
    lines = [{"request_id": f"r{i}", "arrival_s": 0.1 * i, "prompt_len": 20 + 7 * i,
              "output_len": 8 + i} for i in range(4)]
    (fx / "trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    share = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": "Tell me about the number %d, please. " % i * 4},
        {"from": "gpt", "value": "It is a number that comes after %d. " % (i - 1) * 6}]}
        for i in range(12)]
    (fx / "sharegpt.json").write_text(json.dumps(share))
    # what stepgap writes and reads back: a profile of `stepgap calibrate` on the bench file, a
    # simulated result with its per-request lists
    for argv in (["calibrate", str(fx / "bench.json"), "--gpu", "l20", "--model", "llama-3.1-8b",
                  "--draft", "llama-3.1-8b-eagle3", "-k", "4", "--out", str(fx / "cal.json")],
                 ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "4",
                  "--output-len", "8", "--detailed", "--quiet", "--result-json",
                  str(fx / "result.json")]):
        subprocess.run([str(STEPGAP), *argv], check=True, capture_output=True, cwd=fx)
    gz_bomb(fx / "bomb.gz")


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder`: a regular file by its sha256, a link by its target, anything
    else (a FIFO, a folder) by its kind, so that nothing is read that would block."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                out[rel] = h.hexdigest()
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = "special"
    return out


# ---------------------------------------------------------------------------------------------
# Running and judging one case


@dataclass
class Result:
    family: str
    name: str
    cls: str
    why: str
    cmd: str
    rc: int | None
    seconds: float
    last: str = ""


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    os.setsid()


ERROR_LINE = re.compile(r"^stepgap( [\w-]+)*: error: ")
RESULT_MS = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def bad_result(path: Path) -> str | None:
    """Why a run result written with exit 0 is wrong: a metric that is NaN, infinite or
    negative, a duration that is not positive, requests lost."""
    try:
        doc = json.loads(path.read_text())
    except (ValueError, OSError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or "mean_tpot_ms" not in doc:
        return None
    for key, v in doc.items():
        if RESULT_MS.match(key):
            if v in ("nan", "inf", "-inf") or not isinstance(v, (int, float)) or v != v \
                    or v < 0 or v == float("inf"):
                return f"{path.name}: {key} = {v!r}"
    d = doc.get("duration")
    if not isinstance(d, (int, float)) or not d > 0 or d == float("inf"):
        return f"{path.name}: duration = {d!r}"
    if doc.get("completed") != doc.get("num_prompts", doc.get("completed")):
        return f"{path.name}: completed {doc.get('completed')} of {doc.get('num_prompts')}"
    return None


def run_case(case: Case, fx: Path, work: Path, fx_before: dict) -> Result:
    # the name's own letters, and a hash of it: '١٢' and '' would both be `time_us_`, and two
    # cases at once in one folder break each other's files
    tag = hashlib.sha256(case.name.encode()).hexdigest()[:6]
    cdir = work / "cases" / \
        f"{case.family}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', case.name)[:80]}-{tag}"
    if cdir.exists():
        shutil.rmtree(cdir)
    cdir.mkdir(parents=True)
    (cdir / ".tmp").mkdir()
    if case.setup is not None:
        case.setup(cdir, fx)
    argv = [str(STEPGAP), *words(case.argv, cdir, fx)]
    cmd = shlex.join(["stepgap", *argv[1:]]).replace(str(cdir), "$C").replace(str(fx), "$F")
    if len(cmd) > 400:
        cmd = cmd[:400] + f"... ({len(cmd)} characters)"
    before = snapshot(cdir)
    env = {**os.environ, "TMPDIR": str(cdir / ".tmp"), "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "100"}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            stdin=subprocess.PIPE if case.stdin is not None else
                            subprocess.DEVNULL, preexec_fn=limit_memory)
    if case.kill_worker or case.sigterm_after is not None:
        import threading
        threading.Thread(target=fault, args=(proc, case), daemon=True).start()
    try:
        out, err = proc.communicate(case.stdin, timeout=case.timeout)
        rc, hung = proc.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc, hung = None, True
    secs = time.monotonic() - t0
    err_text = err.decode(errors="replace")
    lines = [x for x in err_text.splitlines() if x.strip()]
    last = lines[-1][:300] if lines else ""
    after = snapshot(cdir)
    fx_after = snapshot(fx)

    def result(cls: str, why: str) -> Result:
        return Result(case.family, case.name, cls, why, cmd, rc, round(secs, 2), last)

    if hung:
        return result("BAD", f"still running after {case.timeout:g} s")
    if "Traceback" in err_text or "MemoryError" in err_text:
        tail = [x for x in lines if not x.startswith(" ")][-1:] or [""]
        return result("BAD", f"traceback: {tail[0][:200]}")
    if case.sigterm_after is not None and rc in (143, -signal.SIGTERM):
        lines_ = [x for x in lines if not x.startswith("stepgap") or ": terminated" not in x]
        return result("OK" if len(lines) <= 1 and not lines_ else "POOR",
                      "terminated" if not lines_ else f"terminated, saying: {lines_[0][:100]}")
    changed = [k for k, v in fx_before.items() if fx_after.get(k) != v] + \
        [k for k in fx_after if k not in fx_before]
    if changed:
        return result("BAD", f"fixtures changed: {changed[:3]}")
    altered = [k for k, v in before.items() if after.get(k) != v]
    if altered:
        return result("BAD", f"input changed: {altered[:3]}")
    new = [k for k in after if k not in before and not k.startswith(".tmp")]
    leftover = [k for k in after if k.startswith(".tmp/")]
    if rc == 2:
        if new:
            return result("BAD", f"failed, and wrote {new[:3]}")
        if not ERROR_LINE.match(last):
            return result("POOR", f"exit 2, but the last line is no error line: {last[:120]}")
        others = [x for x in lines[:-1] if not x.startswith("stepgap")]
        if others:
            return result("POOR", f"exit 2 with {len(others)} more lines: {others[0][:100]}")
        missing = [n for n in case.names if n not in last]
        if missing:
            return result("POOR", f"the error does not name {missing}")
        if case.expect == "ok":
            return result("POOR", "a legitimate input refused")
        if leftover:
            return result("POOR", f"temporary files left: {leftover[:3]}")
        return result("OK", "refused")
    if rc == 0:
        for k in new:
            why = bad_result(cdir / k) if k.endswith(".json") else None
            if why:
                return result("BAD", f"exit 0 with a wrong result: {why}")
        if leftover:
            return result("POOR", f"temporary files left: {leftover[:3]}")
        if case.expect == "error":
            return result("POOR", "nonsense accepted with exit 0")
        return result("OK", "ran")
    return result("BAD", f"exit status {rc}")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc), oldest first."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return sorted(out)


def fault(proc: subprocess.Popen, case: Case) -> None:
    """A case's fault, while it runs: SIGTERM after `sigterm_after` seconds (during its
    start-up), or SIGKILL to one of its workers once two of them run (as the OOM killer ends
    the largest process)."""
    if case.sigterm_after is not None:
        time.sleep(case.sigterm_after)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return
    end = time.monotonic() + case.timeout
    while proc.poll() is None and time.monotonic() < end:
        kids = children(proc.pid)
        if len(kids) >= 2:
            time.sleep(0.5)
            try:
                os.kill(kids[-1], signal.SIGKILL)
            except ProcessLookupError:
                continue
            return
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# Setup helpers


def cp(src_rel: str, dst_rel: str | None = None):
    """A setup that copies a fixture into the case's folder (same relative path by default)."""
    def go(c: Path, fx: Path):
        src, dst = fx / src_rel, c / (dst_rel or src_rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy(src, dst)
    return go


def chain(*fns):
    def go(c: Path, fx: Path):
        for f in fns:
            f(c, fx)
    return go


def write(rel: str, data):
    def go(c: Path, fx: Path):
        p = c / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        v = data(c, fx) if callable(data) else data
        p.write_bytes(v if isinstance(v, bytes) else v.encode())
    return go


def edit_text(rel: str, fn):
    def go(c: Path, fx: Path):
        p = c / rel
        p.write_text(fn(p.read_text()))
    return go


def edit_doc(rel: str, fn, load, dump):
    """edit_text on the parsed document: `fn` changes it in place or returns the new one (a
    string is written as it is)."""
    def edit(text: str) -> str:
        doc = load(text)
        doc = fn(doc) or doc
        return doc if isinstance(doc, str) else dump(doc)
    return edit_text(rel, edit)


def edit_json(rel: str, fn):
    return edit_doc(rel, fn, json.loads, json.dumps)


def edit_yaml(rel: str, fn):
    import yaml
    return edit_doc(rel, fn, yaml.safe_load, lambda d: yaml.safe_dump(d, sort_keys=False))


def fifo(rel: str):
    def go(c: Path, fx: Path):
        p = c / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(p)
    return go


def link(rel: str, target: str):
    def go(c: Path, fx: Path):
        p = c / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target.replace("{C}", str(c)).replace("{F}", str(fx)), p)
    return go


def hardlink(rel: str, target_rel: str):
    def go(c: Path, fx: Path):
        os.link(c / target_rel, c / rel)
    return go


def mkdir(rel: str):
    def go(c: Path, fx: Path):
        (c / rel).mkdir(parents=True, exist_ok=True)
    return go


def setin(doc, path: str, value):
    """doc with the dotted `path` set to `value` (made where missing)."""
    keys = path.split(".")
    d = doc
    for k in keys[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    d[keys[-1]] = value
    return doc


def delin(doc, path: str):
    keys = path.split(".")
    d = doc
    for k in keys[:-1]:
        d = d[k]
    d.pop(keys[-1], None)
    return doc


def laughs(depth: int = 30, key: str = "a") -> str:
    """YAML anchors that expand 2^depth-fold (each level a list of the one before, twice)."""
    lines = [f"{key}0: &{key}0 [x, x]"]
    for i in range(1, depth):
        lines.append(f"{key}{i}: &{key}{i} [*{key}{i - 1}, *{key}{i - 1}]")
    return "\n".join(lines) + "\n"


def deep_json(n: int = 100_000) -> str:
    return "[" * n + "]" * n


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


# ---------------------------------------------------------------------------------------------
# The families

SIM = ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "4",
       "--output-len", "8"]
RESULT = ["--result-json", "{C}/out.json"]


def options() -> list[Case]:
    """Numbers of every kind into simulate's options: NaN, infinities, 1e308, -1, 0, integers
    of 31 and 5,000 digits, unicode digits, hex, underscores."""
    E, A = "error", "any"
    table = {
        "--request-rate": [("nan", E), ("-1", E), ("0", E), ("1e-20", E), ("5e-324", E),
                           ("-inf", E), ("1e308", A), ("0x10", E), ("1e-5", A), ("٣", A)],
        "--burstiness": [("nan", E), ("inf", E), ("0", E), ("-1", E), ("1e-300", E),
                         ("1e308", A), ("0.009", E)],
        "--speed": [("nan", E), ("inf", E), ("0", E), ("-1", E), ("1e-7", E), ("1e308", E),
                    ("1e7", E)],
        "--cpu-scale": [("nan", E), ("inf", E), ("-1", E), ("1e308", E), ("1e-300", A)],
        "--max-concurrency": [("0", E), ("-1", E), ("nan", E), ("1e308", E), (BIG, A),
                              ("1.5", E), ("٢", A)],
        "--num-prompts": [("0", E), ("-1", E), ("1000001", E), (BIG, E), ("1.0", E),
                          (HUGE_DIGITS, E)],
        "--output-len": [("0", E), ("-1", E), ("1000000000000", E), (BIG, E), ("nan", E)],
        "--num-speculative-tokens": [("-1", E), ("65", E), (BIG, E), ("nan", E), ("1.5", E),
                                     ("²", E)],
        "--max-num-seqs": [("0", E), ("-1", E), (BIG, A), ("1e308", E)],
        "--max-num-batched-tokens": [("0", E), ("1", A), (BIG, A)],
        "--max-model-len": [("0", E), ("1", E), (BIG, E), ("1000000000000", E)],
        "--block-size": [("0", E), ("-1", E), ("1000000000", E), (BIG, E), ("3", A)],
        "--num-gpu-blocks-override": [("0", E), ("-1", E), (BIG, A), ("1", E),
                                      ("1000000000000000", A)],
        "--gpu-memory-utilization": [("0", E), ("-0.1", E), ("1.5", E), ("nan", E),
                                     ("inf", E), ("1e-300", E)],
        "--tensor-parallel-size": [("0", E), ("9", E), ("-1", E), ("3", E), (BIG, E)],
        "--data-parallel-size": [("0", E), ("9", E), ("-1", E), (BIG, E), ("3", A)],
        "--moe-routing-skew": [("nan", E), ("-1", E), ("11", E), ("1e308", E)],
        "--acceptance-spread": [("nan", E), ("-1", E), ("101", E), ("inf", E)],
        "--launch-latency-us": [("nan", E), ("-1", E), ("1e10", E), ("inf", E)],
        "--all-reduce-latency-us": [("nan", E), ("-1", E), ("1e308", E)],
        "--seed": [("-1", A), (BIG, A), ("nan", E), ("1.5", E)],
        "--timeseries-interval": [("0", E), ("-1", E), ("nan", E), ("1e-300", E),
                                  ("1e308", A), ("inf", E)],
        "--acceptance-rates": [("1.5", E), ("nan", E), ("0.9,0.95", E), ("-0.1", E),
                               (",,", E), ("0.9/0.8", E), ("1e308", E), ("0.9," * 70, E)],
        "--cpu-cost": [("schedule=nan", E), ("schedule=-1", E), ("nope=1", E),
                       ("schedule=1e308", E), ("schedule=1,2,3,4", E), ("schedule=", E),
                       ("=1", E)],
        "--metric-percentiles": [("101", E), ("-1", E), ("nan", E), ("50,50", E),
                                 ("99.999999999999", A), ("", E)],
        "--percentile-metrics": [("nope", E), ("ttft,ttft", E), ("", E)],
        "--output-latency-ms": [("nan", E), ("1e308", E), ("-1", E)],
        "--wake-us": [("nan", E), ("-1", E)],
        "--ipc-us": [("inf", E), ("-5", E)],
        "--random-range-ratio": [("1", E), ("-0.1", E), ("nan", E), ("0.9999999", A)],
    }
    out = []
    for option, values in table.items():
        for value, expect in values:
            extra = ["-k", "2"] if option == "--acceptance-rates" else []
            if option in ("--data-parallel-size", "--moe-routing-skew"):
                base = [a if a != "llama-3.1-8b" else "qwen3-30b-a3b" for a in SIM]
            else:
                base = SIM
            shown = value if len(value) < 24 else f"{value[:6]}..{len(value)}ch"
            out.append(Case("options", f"{option}={shown}",
                            [*base, *extra, option, value, *RESULT], expect=expect,
                            names=(option,) if expect == E else ()))
    # the same values where advise and sweep take them
    for value in ("nan", "-1", "1e-20", "0"):
        out.append(Case("options", f"sweep request_rate={value}",
                        ["sweep", "--set", "num_prompts=4", "--grid", f"request_rate=1,{value}",
                         "--out", "{C}/sw", "--dry-run"], names=("request_rate",)))
    return out


ADV = ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", "--num-prompts", "3",
       "--output-len", "8", "--max-k", "2", "--no-band", "--jobs", "1"]


def advise() -> list[Case]:
    """stepgap advise: its load lists, --max-k, --jobs, --plot and --result-json."""
    E = "error"
    out = []
    for v in (",", "1,,2", "0", "-1", "nan", "inf", "1e308", "1 x", BIG, "1..4", "٣,4",
              "1,1", ",1", "1," * 3000):
        argv = [*ADV, "--max-concurrency", *v.split(" ")]
        expect = "any" if v in ("1,1", ",1", "٣,4") else E
        out.append(Case("advise", f"--max-concurrency {v[:20]}", argv, expect=expect,
                        names=("--max-concurrency",) if expect == E else (), timeout=90))
    for v in ("1e-20", "0", "-1", "nan", "inf,inf", "1e-300,1", "x", "5e-324", "1e-6"):
        out.append(Case("advise", f"--request-rate {v}", [*ADV, "--request-rate", v],
                        names=("--request-rate",)))
    out.append(Case("advise", "both lists, every pair",
                    [*ADV, "--request-rate", "1,inf", "--max-concurrency", "1,2"], expect="ok"))
    for v in ("0", "-1", "65", BIG):
        out.append(Case("advise", f"--max-k {v[:10]}", [*ADV, "--max-k", v], names=("--max-k",)))
    for v in ("0", "-1", "1000000", BIG):
        out.append(Case("advise", f"--jobs {v[:10]}", [*ADV, "--jobs", v,
                                                        "--max-concurrency", "1"],
                        expect="error" if v in ("0", "-1") else "any",
                        names=("--jobs",) if v in ("0", "-1") else (), timeout=90))
    out += [
        Case("advise", "--plot x.jpg", [*ADV, "--plot", "{C}/x.jpg"], names=("--plot",)),
        Case("advise", "--plot without a suffix", [*ADV, "--plot", "{C}/x"], names=("--plot",)),
        Case("advise", "--plot a folder", [*ADV, "--plot", "{C}"], names=("--plot",)),
        Case("advise", "--plot over the trace (a .png of JSON lines)",
             [*ADV, "--trace", "{C}/t.png", "--plot", "{C}/t.png"],
             setup=cp("trace.jsonl", "t.png"), names=("--plot",)),
        Case("advise", "--plot over the ShareGPT file",
             [*ADV, "--dataset-name", "sharegpt", "--dataset-path", "{C}/s.svg", "--plot",
              "{C}/s.svg"], setup=cp("sharegpt.json", "s.svg"), names=("--plot",)),
        Case("advise", "--result-json = --plot", [*ADV, "--result-json", "{C}/a.png",
                                                  "--plot", "{C}/a.png"],
             names=("--plot",)),
        Case("advise", "--result-json over the --gpu file",
             [*ADV[:2], "{C}/hw.yaml", *ADV[3:], "--result-json", "{C}/hw.yaml"],
             setup=cp("hw.yaml"), names=("--result-json",)),
        Case("advise", "--result-json over --profile",
             [*ADV, "--profile", "{C}/p.json", "--result-json", "{C}/p.json"],
             setup=cp("measured/profile.json", "p.json"), names=("--result-json",)),
        Case("advise", "--plot over --profile, named .pdf",
             [*ADV, "--profile", "{C}/p.pdf", "--plot", "{C}/p.pdf"],
             setup=cp("measured/profile.json", "p.pdf"), names=("--plot",)),
        Case("advise", "ngram -k", [*ADV, "--spec-method", "ngram"], expect="any"),
        Case("advise", "mtp on llama", [*ADV, "--spec-method", "mtp"], names=("mtp",)),
        Case("advise", "--preset sharegpt-h100, 3 prompts",
             ["advise", "--preset", "sharegpt-h100", "--num-prompts", "3", "--output-len", "8",
              "--max-k", "1", "--no-band", "--jobs", "1"], expect="ok"),
        Case("advise", "with bands, a bundle and k 0-1",
             ["advise", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--device-profile",
              "{F}/" + LLAMA_BUNDLE, "--num-prompts", "3", "--output-len", "8", "--max-k", "1",
              "--jobs", "1", "--max-concurrency", "1", *RESULT], expect="ok", timeout=120),
        Case("advise", "MoE dp 2 ep, with bands",
             ["advise", "--gpu", "h100", "--model", "qwen3-30b-a3b", "-dp", "2", "-ep",
              "--num-prompts", "3", "--output-len", "8", "--max-k", "1", "--jobs", "1",
              "--max-concurrency", "2", *RESULT], expect="ok", timeout=120),
    ]
    return out


def gpu_files() -> list[Case]:
    """--gpu FILE.yaml: stepgap's fields and LLMServingSim's hardware.yaml, each field of the
    wrong type or range, and YAML that is hostile as YAML."""
    base = "base: h100\nname: mine\n"
    fields = {
        "bf16_tflops": [".nan", ".inf", "-1", "0", "1e308", "1.0e-300", "x", "[1]", "{a: 1}",
                        "true", "null"],
        "memory_gb": ["1.0e+308", "1.0e-300", "0", "-80"],
        "memory_bw_gbps": ["1.0e-300", "1.0e+308", ".nan"],
        "flop_eff": ["1.0e+308", "0", "2.0", "-0.5"],
        "bw_eff": ["5", ".inf"],
        "kernel_us": ["1.0e+308", ".nan", "-1"],
        "d2h_us": ["1.0e+12", "-1"],
        "fp8_tflops": ["-1", ".nan"],
        "interconnect": ["nope", "[1, 2]", "{bw_gbps: 0}", "{bw_gbps: 1.0e-300}",
                         "{bw_gbps: 100, latency_us: .nan}", "{bw_gbps: 100, fully_connected: yes1}",
                         "{bw_gbps: 100, latency_us: 1.0e+308}"],
        "base": ["[h100]", "{a: 1}", "nope", "5", "''"],
        "name": ["[1, 2]", "{a: b}", "''"],
    }
    out = []
    for key, values in fields.items():
        for v in values:
            text = base.replace(f"{key}: ", f"_{key}: ") if key in ("base", "name") else base
            text += f"{key}: {v}\n"
            legit = (key == "name") or v == "null"
            out.append(Case("gpu", f"{key}: {v}", [*SIM[:1], "--gpu", "{C}/g.yaml", *SIM[3:],
                                                     *RESULT],
                            setup=write("g.yaml", text), expect="any" if legit else "error",
                            names=("g.yaml",) if not legit else ()))
    hw = "hw.yaml"

    def hwcase(name, fn, expect="error", names=("hw.yaml",), extra=("-tp", "2")):
        out.append(Case("gpu", f"hardware.yaml {name}",
                        ["simulate", "--gpu", "{C}/hw.yaml", "--model", "llama-3.1-8b",
                         "--num-prompts", "4", "--output-len", "8", *extra, *RESULT],
                        setup=chain(cp(hw), edit_yaml(hw, fn)), expect=expect, names=names))

    hwcase("as it is", lambda d: d, expect="ok", names=())
    hwcase("npus 0", lambda d: setin(d, "measured.interconnect.npus", 0))
    hwcase("npus 1e308", lambda d: setin(d, "measured.interconnect.npus", 1e308))
    hwcase("npus 10**30", lambda d: setin(d, "measured.interconnect.npus", 10 ** 30),
           expect="any", names=())
    hwcase("npus '2'", lambda d: setin(d, "measured.interconnect.npus", "2"))
    hwcase("samples []", lambda d: setin(d, "measured.interconnect.samples", []))
    hwcase("samples a mapping", lambda d: setin(d, "measured.interconnect.samples", {"a": 1}))
    hwcase("a sample's bytes -1",
           lambda d: d["measured"]["interconnect"]["samples"][0].update(bytes=-1))
    hwcase("a sample's us_graphed nan",
           lambda d: d["measured"]["interconnect"]["samples"][0].update(us_graphed=float("nan")))
    hwcase("a sample's us_graphed 1e308",
           lambda d: d["measured"]["interconnect"]["samples"][0].update(us_graphed=1e308))
    hwcase("a sample's us_graphed 0",
           lambda d: d["measured"]["interconnect"]["samples"][0].update(us_graphed=0))
    hwcase("a sample's collective a list",
           lambda d: d["measured"]["interconnect"]["samples"][0].update(collective=["x"]))
    hwcase("a sample's bytes 1e300",
           lambda d: d["measured"]["interconnect"]["samples"][0].update(bytes=1e300),
           expect="any", names=())
    hwcase("no all_reduce samples", lambda d: d["measured"]["interconnect"].update(
        samples=[s for s in d["measured"]["interconnect"]["samples"]
                 if s["collective"] != "all_reduce"]))
    hwcase("every sample twice", lambda d: d["measured"]["interconnect"]["samples"].extend(
        d["measured"]["interconnect"]["samples"]))
    hwcase("spec a list", lambda d: d.update(spec=[1, 2]))
    hwcase("spec.gpu_name a list", lambda d: setin(d, "spec.gpu_name", ["a"]), expect="any",
           names=())
    hwcase("spec.gpu_name unknown, no base",
           lambda d: setin(d, "spec.gpu_name", "NVIDIA Imaginary 9000"))
    hwcase("memory_total_gib 1e308", lambda d: setin(d, "spec.memory_total_gib", 1e308))
    hwcase("memory_total_gib 1e-300", lambda d: setin(d, "spec.memory_total_gib", 1e-300))
    hwcase("measured a string", lambda d: d.update(measured="x"))
    hwcase("measured.interconnect a list", lambda d: setin(d, "measured.interconnect", [1]))
    out += [
        Case("gpu", "billion laughs under name",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:], *RESULT],
             setup=write("g.yaml", laughs(32) + "base: h100\nname: *a31\n"), names=("g.yaml",)),
        Case("gpu", "billion laughs under bf16_tflops",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:], *RESULT],
             setup=write("g.yaml", laughs(32) + "base: h100\nbf16_tflops: *a31\n"),
             names=("g.yaml",)),
        Case("gpu", "billion laughs under interconnect",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:], *RESULT],
             setup=write("g.yaml", laughs(32) + "base: h100\ninterconnect: *a31\n"),
             names=("g.yaml",)),
        Case("gpu", "billion laughs under base",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:], *RESULT],
             setup=write("g.yaml", laughs(32) + "base: *a31\n"), names=("g.yaml",)),
        Case("gpu", "billion laughs under spec.gpu_name",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:], *RESULT],
             setup=write("g.yaml", laughs(32) + "spec: {gpu_name: *a31}\n"), names=("g.yaml",)),
        Case("gpu", "billion laughs under measured.interconnect.samples",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:], "-tp", "2", *RESULT],
             setup=write("g.yaml", laughs(32) + "base: h100\nmeasured: {interconnect: "
                                                "{npus: 2, samples: *a31}}\n"),
             names=("g.yaml",)),
        Case("gpu", "YAML 50,000 deep", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=write("g.yaml", "a: " + "[" * 50000 + "]" * 50000 + "\n"), names=("g.yaml",)),
        Case("gpu", "YAML of 20,000 nested mappings",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=write("g.yaml", "".join("  " * i + f"k{i}:\n" for i in range(3000))),
             names=("g.yaml",)),
        Case("gpu", "a YAML integer of 5,000 digits",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=write("g.yaml", f"base: h100\nbf16_tflops: {HUGE_DIGITS}\n"),
             names=("g.yaml",)),
        Case("gpu", "a YAML list at the top", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=write("g.yaml", "- base: h100\n"), names=("g.yaml",)),
        Case("gpu", "empty", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=write("g.yaml", ""), names=("g.yaml",)),
        Case("gpu", "not UTF-8", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=write("g.yaml", b"base: h100\nname: \xff\xfe\n"), names=("g.yaml",)),
        Case("gpu", "a Python object tag", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=write("g.yaml", "base: !!python/object/apply:os.system ['true']\n"),
             names=("g.yaml",)),
        Case("gpu", "a FIFO", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=fifo("g.yaml"), names=("g.yaml",), timeout=30),
        Case("gpu", "a folder named .yaml", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=mkdir("g.yaml"), names=("g.yaml",)),
        Case("gpu", "a link that loops", ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:]],
             setup=link("g.yaml", "g.yaml"), names=("g.yaml",)),
        Case("gpu", "missing .yml", ["simulate", "--gpu", "{C}/nope.yml", *SIM[3:]],
             names=("nope.yml",)),
        Case("gpu", "a gzip bomb named .yaml.gz",
             ["simulate", "--gpu", "{F}/bomb.gz", *SIM[3:]], names=("bomb.gz",)),
        Case("gpu", "fp8 weights on a GPU file of fp8_tflops 0",
             ["simulate", "--gpu", "{C}/g.yaml", *SIM[3:], "--quantization", "fp8", *RESULT],
             setup=write("g.yaml", "base: h100\nfp8_tflops: 0\n"), expect="any"),
        Case("gpu", "calibrate --gpu FILE.yaml",
             ["calibrate", "{F}/bench.json", "--gpu", "{C}/g.yaml", "--model", "llama-3.1-8b",
              "--draft", "llama-3.1-8b-eagle3", "-k", "4", "--out", "{C}/p.json"],
             setup=write("g.yaml", "base: l20\nbf16_tflops: .nan\n"), names=("g.yaml",),
             timeout=120),
    ]
    return out


LB = LLAMA_BUNDLE
DEV = ["simulate", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--num-prompts", "4",
       "--output-len", "8", "-k", "2", "--device-profile", "{C}/" + LB, *RESULT]
QDEV = ["simulate", "--gpu", "rtxpro6000", "--model", "Qwen/Qwen3-32B", "-tp", "2",
        "--num-prompts", "4", "--output-len", "8", "--device-profile", "{C}/" + QWEN_BUNDLE,
        *RESULT]
DDEV = ["simulate", "--gpu", "h200", "--model", "deepseek-v3", "-dp", "8", "-ep",
        "--spec-method", "mtp", "-k", "1", "--num-prompts", "4", "--output-len", "8",
        "--device-profile", "{C}/" + DS_BUNDLE, *RESULT]


def csv_edit(rel: str, fn):
    """Edit a CSV as lines: fn(header, rows) -> lines."""
    def go(c: Path, fx: Path):
        p = c / rel
        lines = p.read_text().splitlines()
        p.write_text("\n".join(fn(lines[0], lines[1:])) + "\n")
    return go


def cell(row: str, col: int, value: str) -> str:
    parts = row.split(",")
    parts[col] = value
    return ",".join(parts)


def bundles() -> list[Case]:
    """--device-profile: a bundle's meta.yaml, its tables, the skew fit, moe.csv and mtp.csv,
    each broken in one way; the bundle's files as FIFOs, links, folders, bombs."""
    out = []
    meta, tp1 = LB + "/meta.yaml", LB + "/tp1"

    def m(name, fn, expect="error", names=("meta.yaml",)):
        out.append(Case("bundle", f"meta.yaml {name}", DEV,
                        setup=chain(cp(LB), edit_yaml(meta, fn)), expect=expect, names=names))

    m("as it is", lambda d: d, expect="ok", names=())
    m("engine_effective null", lambda d: d.update(engine_effective=None), expect="any", names=())
    m("engine_effective 0", lambda d: d.update(engine_effective=0))
    m("engine_effective []", lambda d: d.update(engine_effective=[]))
    m("hf_overrides a list", lambda d: setin(d, "engine_effective.hf_overrides", [1]))
    m("hf_overrides null", lambda d: setin(d, "engine_effective.hf_overrides", None),
      expect="any", names=())
    for key, v in (("num_attention_heads", 0), ("num_attention_heads", -1),
                   ("num_attention_heads", 10 ** 12), ("num_attention_heads", "32"),
                   ("num_attention_heads", True), ("num_key_value_heads", 2 ** 64),
                   ("intermediate_size", 1e308), ("vocab_size", float("nan")),
                   ("num_hidden_layers", 10 ** 9), ("num_key_value_heads", 7)):
        m(f"hf_overrides.{key} {str(v)[:12]}",
          lambda d, key=key, v=v: setin(d, f"engine_effective.hf_overrides.{key}", v))
    for v in ([], [0], [9], [True], None, "1", [1, 1], [1.0], [2], {"1": 1}):
        m(f"tp_degrees {v!r}", lambda d, v=v: d.update(tp_degrees=v),
          expect="any" if v in ([1, 1], [1.0]) else "error")
    m("model a list", lambda d: d.update(model=["x"]), expect="any", names=())
    m("model another model", lambda d: d.update(model="Qwen/Qwen3-8B"), expect="error",
      names=())
    m("architecture unknown", lambda d: d.update(architecture="mamba"), names=())
    m("architecture a mapping", lambda d: d.update(architecture={"a": 1}))
    m("variant ../..", lambda d: d.update(variant="../.."), expect="any", names=())
    m("skew_fit enabled 'yes'", lambda d: setin(d, "skew_fit.enabled", "yes"))
    m("attention_grid a string", lambda d: d.update(attention_grid="x"), expect="any", names=())
    out.append(Case("bundle", "meta.yaml billion laughs under model", DEV,
                    setup=chain(cp(LB), edit_text(meta, lambda t: laughs(32) +
                                                  t.replace("model: meta-llama/Llama-3.1-8B\n",
                                                            "model: *a31\n"))),
                    names=("meta.yaml",)))
    out.append(Case("bundle", "meta.yaml billion laughs under hf_overrides", DEV,
                    setup=chain(cp(LB), edit_text(meta, lambda t: laughs(32) + t.replace(
                        "    num_attention_heads: 32\n", "    num_attention_heads: *a31\n"))),
                    names=("meta.yaml",)))
    out.append(Case("bundle", "meta.yaml a tab in the indentation", DEV,
                    setup=chain(cp(LB), edit_text(meta, lambda t: t.replace("  load_format",
                                                                            "\tload_format"))),
                    names=("meta.yaml",)))
    out.append(Case("bundle", "meta.yaml missing", DEV,
                    setup=chain(cp(LB), lambda c, fx: (c / meta).unlink()), names=("meta.yaml",)))
    out.append(Case("bundle", "meta.yaml a FIFO", DEV, timeout=30,
                    setup=chain(cp(LB), lambda c, fx: (c / meta).unlink(), fifo(meta)),
                    names=("meta.yaml",)))

    def t(name, table, fn, expect="error", names=None):
        rel = f"{tp1}/{table}"
        out.append(Case("bundle", f"{table} {name}", DEV,
                        setup=chain(cp(LB), csv_edit(rel, fn)), expect=expect,
                        names=(table,) if names is None else names))

    for v in ("nan", "inf", "-1", "1e308", "0x10", "١٢", "", " 5", "1_0", "1e400"):
        t(f"time_us {v!r}", "dense.csv", lambda h, r, v=v: [h, cell(r[0], 2, v), *r[1:]],
          expect="any" if v in (" 5", "١٢", "1_0") else "error")
    for v in ("0", "-1", "1e300", "1.5", "nan", "16777217"):
        t(f"tokens {v!r}", "dense.csv", lambda h, r, v=v: [h, cell(r[5], 1, v), *r[1:]])
    for v in ("-1", "1e300", "nan", "2.5"):
        t(f"kv_decode {v!r}", "attention.csv", lambda h, r, v=v: [h, cell(r[3], 3, v), *r])
    t("header only", "dense.csv", lambda h, r: [h])
    t("empty", "dense.csv", lambda h, r: [])
    t("no header", "dense.csv", lambda h, r: r)
    t("a column missing", "dense.csv", lambda h, r: [h.rsplit(",", 1)[0],
                                                     *[x.rsplit(",", 1)[0] for x in r]])
    t("a short row", "dense.csv", lambda h, r: [h, r[0].rsplit(",", 1)[0], *r[1:]])
    t("a long row", "dense.csv", lambda h, r: [h, r[0] + ",5", *r[1:]], expect="any", names=())
    t("every row twice", "dense.csv", lambda h, r: [h, *r, *r])
    t("rows reversed", "dense.csv", lambda h, r: [h, *reversed(r)], expect="ok", names=())
    t("an unknown layer", "dense.csv", lambda h, r: [h, cell(r[0], 0, "warp_drive"), *r[1:]],
      expect="any", names=())
    t("a NUL byte", "dense.csv", lambda h, r: [h, r[0].replace(",", "\0,", 1), *r[1:]])
    t("a field of 200,000 characters", "dense.csv",
      lambda h, r: [h, cell(r[0], 0, "x" * 200_000), *r[1:]])
    t("an open quote", "dense.csv", lambda h, r: [h, '"' + r[0], *r[1:]])
    t("CRLF lines", "per_sequence.csv", lambda h, r: [x + "\r" for x in (h, *r)], expect="ok",
      names=())
    t("a BOM", "per_sequence.csv", lambda h, r: ["\ufeff" + h, *r], expect="ok", names=())
    t("lm_head rows gone", "per_sequence.csv",
      lambda h, r: [h, *[x for x in r if not x.startswith("lm_head")]], expect="any", names=())
    t("one million rows", "per_sequence.csv",
      lambda h, r: [h, *r, *(f"sampler,{i},1.0" for i in range(1000, 1_001_000))],
      expect="any", names=())
    out += [
        Case("bundle", "tp1 a file", DEV, names=("tp1",),
             setup=chain(cp(LB), lambda c, fx: shutil.rmtree(c / tp1),
                         write(tp1, "x"))),
        Case("bundle", "dense.csv a folder", DEV, names=("dense.csv",),
             setup=chain(cp(LB), lambda c, fx: (c / tp1 / "dense.csv").unlink(),
                         mkdir(tp1 + "/dense.csv"))),
        Case("bundle", "dense.csv a FIFO", DEV, names=("dense.csv",), timeout=30,
             setup=chain(cp(LB), lambda c, fx: (c / tp1 / "dense.csv").unlink(),
                         fifo(tp1 + "/dense.csv"))),
        Case("bundle", "dense.csv a link that loops", DEV, names=("dense.csv",),
             setup=chain(cp(LB), lambda c, fx: (c / tp1 / "dense.csv").unlink(),
                         link(tp1 + "/dense.csv", "dense.csv"))),
        Case("bundle", "dense.csv /dev/zero", DEV, names=("dense.csv",), timeout=30,
             setup=chain(cp(LB), lambda c, fx: (c / tp1 / "dense.csv").unlink(),
                         link(tp1 + "/dense.csv", "/dev/zero"))),
        Case("bundle", "attention.csv not UTF-8", DEV, names=("attention.csv",),
             setup=chain(cp(LB), write(tp1 + "/attention.csv", b"\xff\xfe\x00a,b\n"))),
        Case("bundle", "the bundle a file", [*DEV[:-4], "--device-profile", "{F}/trace.jsonl",
                                             *RESULT], names=("trace.jsonl",)),
        Case("bundle", "the bundle missing", [*DEV[:-4], "--device-profile", "{C}/nope",
                                              *RESULT], names=("nope",)),
        Case("bundle", "the bundle a FIFO", [*DEV[:-4], "--device-profile", "{C}/b", *RESULT],
             setup=fifo("b"), names=("b",), timeout=30),
        Case("bundle", "the bundle's parent, not a variant",
             [*DEV[:-4], "--device-profile", "{F}/perf/RTX4090/meta-llama", *RESULT],
             expect="any", names=()),
        Case("bundle", "another model's bundle",
             [*DEV[:-4], "--device-profile", "{F}/" + QWEN_BUNDLE, *RESULT], names=()),
        Case("bundle", "--kv-cache-dtype fp8 without a kvfp8 variant",
             ["simulate", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--num-prompts", "4",
              "--output-len", "8", "--device-profile", "{F}/" + LB, "--kv-cache-dtype", "fp8"],
             names=("--kv-cache-dtype",)),
        Case("bundle", "--quantization fp8 on a bf16 bundle",
             ["simulate", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--num-prompts", "4",
              "--output-len", "8", "--device-profile", "{F}/" + LB, "--quantization", "fp8",
              *RESULT], expect="any"),
        Case("bundle", "-tp 2 on a TP 1 bundle",
             ["simulate", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "-tp", "2",
              "--num-prompts", "4", "--output-len", "8", "--device-profile", "{F}/" + LB,
              *RESULT], expect="any"),
        Case("bundle", "a prompt past the tables' grid",
             ["simulate", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--num-prompts", "2",
              "--output-len", "8", "--device-profile", "{F}/" + LB, "--dataset-name", "random",
              "--random-input-len", "100000", "--max-model-len", "131072", *RESULT],
             expect="any", timeout=120),
    ]
    # the skew fit of the Qwen3-32B TP 2 bundle
    qmeta, qcsv = QWEN_BUNDLE + "/meta.yaml", QWEN_BUNDLE + "/tp2/skew_fit.csv"

    def s(name, fn, expect="error", names=("meta.yaml",)):
        out.append(Case("bundle", f"skew {name}", QDEV,
                        setup=chain(cp(QWEN_BUNDLE), edit_yaml(qmeta, fn)), expect=expect,
                        names=names))

    s("as it is", lambda d: d, expect="ok", names=())
    s("alpha_default 100", lambda d: setin(d, "skew_fit.per_tp.2.alpha_default", 100.0),
      expect="any", names=())
    s("alpha_default 100.0001", lambda d: setin(d, "skew_fit.per_tp.2.alpha_default", 100.0001))
    s("alpha_default '0.05'", lambda d: setin(d, "skew_fit.per_tp.2.alpha_default", "0.05"))
    s("alpha_default true", lambda d: setin(d, "skew_fit.per_tp.2.alpha_default", True))
    s("n_bins equal", lambda d: setin(d, "skew_fit.bucket_axes.n_bins", [0, 2, 2, 8]))
    s("n_bins falling", lambda d: setin(d, "skew_fit.bucket_axes.n_bins", [8, 4, 2]))
    s("n_bins []", lambda d: setin(d, "skew_fit.bucket_axes.n_bins", []))
    s("n_bins nan", lambda d: setin(d, "skew_fit.bucket_axes.n_bins", [0, float("nan")]))
    s("labels fewer than bins", lambda d: setin(d, "skew_fit.bucket_axes.n_labels", ["a"]))
    s("labels numbers", lambda d: setin(d, "skew_fit.bucket_axes.n_labels",
                                        list(range(9))))
    s("per_tp keys strings", lambda d: d["skew_fit"].update(
        per_tp={"tp-2": d["skew_fit"]["per_tp"][2]}), expect="any", names=())
    s("per_tp key 1e308", lambda d: d["skew_fit"].update(
        per_tp={1e308: d["skew_fit"]["per_tp"][2]}), expect="any", names=())
    s("bucket_table absolute /etc/hostname",
      lambda d: setin(d, "skew_fit.per_tp.2.bucket_table", "/etc/hostname"),
      names=("hostname",))
    s("bucket_table ../../../../../../etc/passwd",
      lambda d: setin(d, "skew_fit.per_tp.2.bucket_table", "../../../../../../../etc/passwd"),
      names=("passwd",))
    s("bucket_table /dev/zero",
      lambda d: setin(d, "skew_fit.per_tp.2.bucket_table", "/dev/zero"), names=("zero",))
    s("bucket_table a list", lambda d: setin(d, "skew_fit.per_tp.2.bucket_table", ["a"]))
    out.append(Case("bundle", "skew bucket_table a gzip bomb", QDEV, names=("bomb",),
                    setup=chain(cp(QWEN_BUNDLE), cp("bomb.gz", QWEN_BUNDLE + "/tp2/bomb.csv.gz"),
                                edit_yaml(qmeta, lambda d: setin(
                                    d, "skew_fit.per_tp.2.bucket_table", "tp2/bomb.csv.gz")))))

    def sc(name, fn, expect="error"):
        out.append(Case("bundle", f"skew_fit.csv {name}", QDEV,
                        setup=chain(cp(QWEN_BUNDLE), csv_edit(qcsv, fn)), expect=expect,
                        names=("skew_fit.csv",) if expect == "error" else ()))

    for v in ("nan", "inf", "-1e9", "100.5", "1e400", "x", ""):
        sc(f"alpha {v!r}", lambda h, r, v=v: [h, cell(r[0], 5, v), *r[1:]])
    sc("an unknown label", lambda h, r: [h, cell(r[0], 1, "n<=3"), *r[1:]], expect="any")
    sc("a bucket twice", lambda h, r: [h, r[0], r[0], *r[1:]], expect="any")
    sc("n_samples -1", lambda h, r: [h, cell(r[0], 6, "-1"), *r[1:]], expect="any")
    # moe.csv and mtp.csv of the DeepSeek bundle
    moe, mtp = DS_BUNDLE + "/tp1/moe.csv", DS_BUNDLE + "/tp1/mtp.csv"

    def mo(name, table, fn, expect="error"):
        rel = moe if table == "moe.csv" else mtp
        out.append(Case("bundle", f"{table} {name}", DDEV, timeout=120,
                        setup=chain(cp(DS_BUNDLE), cp("perf/RTXPRO6000/hardware.yaml"),
                                    csv_edit(rel, fn)), expect=expect,
                        names=(table,) if expect == "error" else ()))

    mo("as it is", "moe.csv", lambda h, r: [h, *r], expect="ok")
    for col, name in ((0, "ep"), (1, "tokens"), (2, "activated_experts"), (3, "time_us")):
        for v in ("0", "-1", "nan", "1e308", "x", "1.5", "inf"):
            if name == "time_us" and v == "0":
                continue
            mo(f"{name} {v!r}", "moe.csv", lambda h, r, col=col, v=v: [h, cell(r[0], col, v),
                                                                       *r[1:]],
               expect="any" if (name, v) in (("time_us", "1.5"), ("tokens", "1e308"))
               else "error")
    mo("a row twice", "moe.csv", lambda h, r: [h, r[0], r[0], *r[1:]])
    mo("no ep column", "moe.csv", lambda h, r: [h.split(",", 1)[1],
                                                *[x.split(",", 1)[1] for x in r]],
       expect="any")
    mo("header only", "moe.csv", lambda h, r: [h])
    mo("one row", "moe.csv", lambda h, r: [h, r[0]], expect="any")
    mo("ep 1000000 grid", "moe.csv", lambda h, r: [h, *r, "1000000,1,1,5.0"], expect="any")
    mo("a column missing", "moe.csv", lambda h, r: [h.rsplit(",", 1)[0],
                                                    *[x.rsplit(",", 1)[0] for x in r]])
    for v in ("nan", "-1", "1e308", "x"):
        mo(f"time_us {v!r}", "mtp.csv", lambda h, r, v=v: [h, cell(r[0], 2, v), *r[1:]])
    for v in ("0", "nan", "1e300"):
        mo(f"sequences {v!r}", "mtp.csv", lambda h, r, v=v: [h, cell(r[0], 1, v), *r[1:]])
    mo("no mtp_eh_proj", "mtp.csv", lambda h, r: [h, *[x for x in r
                                                        if not x.startswith("mtp_eh_proj")]])
    mo("an unknown layer", "mtp.csv", lambda h, r: [h, cell(r[0], 0, "mtp_warp"), *r[1:]],
       expect="any")
    out += [
        Case("bundle", "moe.csv a FIFO", DDEV, timeout=30, names=("moe.csv",),
             setup=chain(cp(DS_BUNDLE), lambda c, fx: (c / moe).unlink(), fifo(moe))),
        Case("bundle", "moe.csv a folder", DDEV, names=("moe.csv",),
             setup=chain(cp(DS_BUNDLE), lambda c, fx: (c / moe).unlink(), mkdir(moe))),
        Case("bundle", "mtp.csv a link that loops", DDEV, names=("mtp.csv",),
             setup=chain(cp(DS_BUNDLE), lambda c, fx: (c / mtp).unlink(), link(mtp, "mtp.csv"))),
        Case("bundle", "moe.csv with dense tables of another TP", DDEV, expect="any",
             setup=chain(cp(DS_BUNDLE), cp(LB + "/tp1/dense.csv", DS_BUNDLE + "/tp1/dense.csv"))),
        Case("bundle", "a MoE bundle for a dense model",
             ["simulate", "--gpu", "h200", "--model", "llama-3.1-8b", "--num-prompts", "4",
              "--output-len", "8", "--device-profile", "{F}/" + DS_BUNDLE], names=()),
        Case("bundle", "a dense bundle for a MoE model",
             ["simulate", "--gpu", "rtx4090", "--model", "qwen3-30b-a3b", "--num-prompts", "4",
              "--output-len", "8", "--device-profile", "{F}/" + LB], names=()),
    ]
    return out


REQS = PEER_RUN + "/requests.jsonl"
META = PEER_RUN + "/meta.json"
PSIM = ["simulate", "--model", "llama-3.1-8b", "--gpu", "rtx4090", "--trace", "{C}/" + REQS,
        "--num-prompts", "6", *RESULT]


def jsonl_edit(rel: str, fn):
    """Edit a JSON-lines file as a list of objects: fn(rows) -> rows (or text)."""
    def go(c: Path, fx: Path):
        p = c / rel
        rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        new = fn(rows)
        new = rows if new is None else new
        p.write_text(new if isinstance(new, str) else "".join(json.dumps(r) + "\n" for r in new))
    return go


def peers() -> list[Case]:
    """A peer's vLLM run (LLMServingSim's requests.jsonl, meta.json, its dataset): meta.json's
    settings of every wrong type (data_parallel_size among them), requests past belief."""
    out = []

    def mj(name, fn, expect="error", names=("meta.json",), argv=PSIM):
        out.append(Case("peer", f"meta.json {name}", argv,
                        setup=chain(cp("peer"), edit_json(META, fn)), expect=expect,
                        names=names))

    mj("as it is", lambda d: d, expect="ok", names=())
    for v in (0, -1, 9, 2.0, "2", True, None, 10 ** 30, float("nan"), [2], 1.0):
        mj(f"data_parallel_size {v!r}", lambda d, v=v: setin(d, "engine_kwargs.data_parallel_size",
                                                             v),
           expect="any" if v in (None, 1.0) and v is not True else "error",
           names=("data_parallel_size",) if v not in (None, 1.0) else ())
    mj("data_parallel_size 2 (a dense model)",
       lambda d: setin(d, "engine_kwargs.data_parallel_size", 2), expect="ok", names=())
    mj("data_parallel_size 8 and tensor_parallel_size 8",
       lambda d: (setin(d, "engine_kwargs.data_parallel_size", 8),
                  setin(d, "engine_kwargs.tensor_parallel_size", 8)), names=())
    mj("parallel_config.data_parallel_size 3, engine_kwargs' null",
       lambda d: (setin(d, "engine_kwargs.data_parallel_size", None),
                  setin(d, "resolved_config.parallel_config.data_parallel_size", 3)),
       expect="any", names=())
    mj("data_parallel_size 2 against parallel_config's 4",
       lambda d: (setin(d, "engine_kwargs.data_parallel_size", 2),
                  setin(d, "resolved_config.parallel_config.data_parallel_size", 4)),
       expect="any", names=())
    for v in ("true", 1, [True]):
        mj(f"enable_expert_parallel {v!r}",
           lambda d, v=v: setin(d, "engine_kwargs.enable_expert_parallel", v),
           names=("enable_expert_parallel",))
    mj("enable_expert_parallel true on a dense model",
       lambda d: setin(d, "engine_kwargs.enable_expert_parallel", True), expect="any", names=())
    for key, v in (("max_num_seqs", 10 ** 30), ("max_num_batched_tokens", 1),
                   ("max_model_len", 1), ("max_model_len", 10 ** 30),
                   ("tensor_parallel_size", 0), ("tensor_parallel_size", 3),
                   ("max_num_seqs", "256"), ("max_num_seqs", 256.5)):
        mj(f"{key} {str(v)[:12]}", lambda d, key=key, v=v: setin(d, f"engine_kwargs.{key}", v),
           expect="any" if (key, v) == ("max_num_batched_tokens", 1) else "error",
           names=(key,) if isinstance(v, str) or v in (0, 256.5) else ())
    for key, v in (("block_size", 10 ** 9), ("block_size", 7), ("num_gpu_blocks", 1),
                   ("num_gpu_blocks", 10 ** 15), ("num_gpu_blocks", -5),
                   ("gpu_memory_utilization", 1e-300)):
        mj(f"kv_cache.{key} {v!r}", lambda d, key=key, v=v: setin(d, f"kv_cache.{key}", v),
           expect="any" if (key, v) == ("num_gpu_blocks", 10 ** 15) else "error", names=())
    mj("engine_kwargs a list", lambda d: d.update(engine_kwargs=[1]), names=("engine_kwargs",))
    mj("resolved_config.scheduler_config 5",
       lambda d: setin(d, "resolved_config.scheduler_config", 5), names=("scheduler_config",))
    mj("cudagraph_capture_sizes [0]",
       lambda d: setin(d, "resolved_config.compilation_config.cudagraph_capture_sizes", [0]),
       names=("cudagraph_capture_sizes",))
    mj("a top-level list", lambda d: [d], names=("meta.json",))
    mj("vllm_version a mapping", lambda d: d.update(vllm_version={"a": 1}), expect="any",
       names=())
    mj("dataset_path absolute /etc/hostname", lambda d: d.update(dataset_path="/etc/hostname"),
       expect="any", names=())
    mj("dataset_path ../../../../../../../../../../etc/passwd",
       lambda d: d.update(dataset_path="../" * 12 + "etc/passwd"), expect="any", names=())
    mj("dataset_path /dev/zero", lambda d: d.update(dataset_path="/dev/zero"), expect="any",
       names=())
    mj("dataset_path a list", lambda d: d.update(dataset_path=["a"]), expect="any", names=())
    mj("dataset_hash another", lambda d: d.update(dataset_hash="0" * 64), names=("dataset_hash",))
    mj("dataset_hash a list", lambda d: d.update(dataset_hash=[1]), names=())
    mj("nested 100,000 deep", lambda d: deep_json(), names=("meta.json",))
    mj("an integer of 5,000 digits",
       lambda d: json.dumps(d).replace('"max_num_seqs": 256', '"max_num_seqs": ' + HUGE_DIGITS),
       names=("meta.json",))
    out += [
        Case("peer", "meta.json a FIFO", PSIM, timeout=30, names=("meta.json",),
             setup=chain(cp("peer"), lambda c, fx: (c / META).unlink(), fifo(META))),
        Case("peer", "meta.json a folder", PSIM, names=("meta.json",),
             setup=chain(cp("peer"), lambda c, fx: (c / META).unlink(), mkdir(META))),
        Case("peer", "meta.json a link that loops", PSIM, names=("meta.json",),
             setup=chain(cp("peer"), lambda c, fx: (c / META).unlink(), link(META, "meta.json"))),
        Case("peer", "meta.json not UTF-8", PSIM, names=("meta.json",),
             setup=chain(cp("peer"), write(META, b'{"model": "\xff"}'))),
        Case("peer", "meta.json gone", PSIM, expect="any",
             setup=chain(cp("peer"), lambda c, fx: (c / META).unlink())),
        Case("peer", "the dataset a gzip bomb", PSIM, names=("sharegpt",),
             setup=chain(cp("peer"), edit_json(META, lambda d: d.update(dataset_hash=None)),
                         lambda c, fx: shutil.copy(
                             fx / "bomb.gz",
                             c / "peer/workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"))),
        Case("peer", "the dataset a FIFO", PSIM, timeout=30, expect="any",
             setup=chain(cp("peer"), lambda c, fx: (
                 c / "peer/workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz").unlink(),
                 fifo("peer/workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"))),
    ]

    def rq(name, fn, expect="error", names=("requests.jsonl",), argv=PSIM):
        out.append(Case("peer", f"requests {name}", argv,
                        setup=chain(cp("peer"), jsonl_edit(REQS, fn)), expect=expect,
                        names=names))

    def first(**kw):
        return lambda rows: rows[0].update(kw)

    for key, v in (("input_toks", 10 ** 30), ("input_toks", 2 ** 63), ("input_toks", 0),
                   ("input_toks", "5"), ("input_toks", 5.0), ("output_toks", 10 ** 12),
                   ("output_toks", True), ("request_id", ["a"]), ("request_id", None),
                   ("request_id", ""), ("queued_ts", "27536.6"), ("queued_ts", -1),
                   ("queued_ts", float("inf")), ("first_token_ts", None),
                   ("last_token_ts", 1e10 + 1)):
        rq(f"{key} {str(v)[:12]}", first(**{key: v}),
           names=("requests.jsonl",) + ((key,) if key != "input_toks" or v != 10 ** 30 else ()))
    rq("an id twice, int and string", lambda rows: (rows[0].update(request_id=7),
                                                    rows[1].update(request_id="7")),
       names=("request_id",))
    rq("every stamp equal", lambda rows: [r.update(queued_ts=5.0, scheduled_ts=5.0,
                                                   first_token_ts=5.0, last_token_ts=5.0)
                                          for r in rows], expect="any", names=())
    rq("order reversed", lambda rows: list(reversed(rows)), expect="ok", names=())
    rq("blank lines only", lambda rows: "\n\n\n", names=("requests.jsonl",))
    rq("a line of 100,000 brackets", lambda rows: deep_json() + "\n",
       names=("requests.jsonl",))
    rq("ids bench-² ", lambda rows: rows[0].update(request_id="bench-²"), names=("bench-",))
    rq("ids bench-99999999999999999999",
       lambda rows: rows[0].update(request_id="bench-" + "9" * 20), names=("bench-",))
    rq("200,000 requests", lambda rows: [dict(rows[i % len(rows)], request_id=f"x{i}")
                                         for i in range(200_000)], expect="any", names=(),
       argv=[*PSIM[:-3], *RESULT])
    # the replayed dataset's token ids
    ds = "peer/workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"

    def dsedit(name, fn, expect="error", names=("sharegpt",)):
        def go(c: Path, fx: Path):
            p = c / ds
            rows = [json.loads(x) for x in gzip.decompress(p.read_bytes()).decode().splitlines()]
            fn(rows)
            text = "".join(json.dumps(r) + "\n" for r in rows)
            p.write_bytes(gz(text.encode()))
        out.append(Case("peer", f"dataset {name}", PSIM, expect=expect, names=names,
                        setup=chain(cp("peer"), edit_json(META, lambda d: d.update(
                            dataset_hash=None)), go)))

    dsedit("ids negative", lambda rows: rows[0].update(
        input_tok_ids=[-1] * len(rows[0]["input_tok_ids"])))
    dsedit("ids past any vocabulary", lambda rows: rows[0].update(
        input_tok_ids=[10 ** 30] * len(rows[0]["input_tok_ids"])), expect="any", names=())
    dsedit("ids one short", lambda rows: rows[0].update(
        input_tok_ids=rows[0]["input_tok_ids"][:-1]))
    dsedit("ids floats", lambda rows: rows[0].update(
        input_tok_ids=[1.5] * len(rows[0]["input_tok_ids"])))
    dsedit("a line a list", lambda rows: rows.__setitem__(0, [1]))
    # compare with a peer's run
    out += [
        Case("peer", "compare: a requests.jsonl with input_toks 10**30",
             ["compare", "{C}/" + REQS, "{C}/" + REQS],
             setup=chain(cp("peer"), jsonl_edit(REQS, first(input_toks=10 ** 30))),
             expect="any"),
        Case("peer", "compare: output_toks 1 everywhere",
             ["compare", "{C}/" + REQS, "{C}/" + REQS],
             setup=chain(cp("peer"), jsonl_edit(REQS, lambda rows: [r.update(output_toks=1)
                                                                    for r in rows])),
             expect="any"),
        Case("peer", "compare --json, last_token_ts before first_token_ts",
             ["compare", "--json", "{C}/" + REQS, "{C}/" + REQS],
             setup=chain(cp("peer"), jsonl_edit(REQS, first(last_token_ts=1.0))),
             names=("last_token_ts",)),
    ]
    return out


def bombs() -> list[Case]:
    """Every .gz input as a gzip bomb (3 GiB of zeros in 3 MB), a truncated gzip, a gzip that
    is not one, gzip inside gzip."""
    out = []
    bomb = lambda rel: cp("bomb.gz", rel)   # noqa: E731
    targets = [
        ("simulate --trace x.jsonl.gz", [*SIM, "--trace", "{C}/x.jsonl.gz"], "x.jsonl.gz"),
        ("simulate --trace x.json.gz", [*SIM, "--trace", "{C}/x.json.gz"], "x.json.gz"),
        ("compare a.json.gz", ["compare", "{C}/x.json.gz", "{C}/x.json.gz"], "x.json.gz"),
        ("sharegpt --dataset-path x.json.gz", [*SIM, "--dataset-name", "sharegpt",
                                               "--dataset-path", "{C}/x.json.gz"], "x.json.gz"),
        ("--profile x.json.gz", [*SIM, "--profile", "{C}/x.json.gz"], "x.json.gz"),
        ("ingest vllm-bench x.json.gz", ["ingest", "vllm-bench", "{C}/x.json.gz", "--out",
                                         "{C}/r.json"], "x.json.gz"),
        ("ingest vllm-profile x.pt.trace.json.gz",
         ["ingest", "vllm-profile", "{C}/x.pt.trace.json.gz", "--out", "{C}/t.jsonl"],
         "x.pt.trace.json.gz"),
        ("calibrate with a trace x.pt.trace.json.gz",
         ["calibrate", "{F}/vllm/bench.json", "{C}/x.pt.trace.json.gz", "--model",
          "llama-3.2-1b", "--out", "{C}/p.json"], "x.pt.trace.json.gz"),
        ("plot timeline x.jsonl.gz", ["plot", "timeline", "{C}/x.jsonl.gz", "--out",
                                      "{C}/t.png"], "x.jsonl.gz"),
        ("--acceptance a file .json.gz", [*SIM, "-k", "2", "--acceptance", "{C}/x.json.gz"],
         "x.json.gz"),
    ]
    for name, argv, f in targets:
        out.append(Case("gzip", f"bomb: {name}", argv, setup=bomb(f), names=(f,), timeout=120))
    out += [
        Case("gzip", "a truncated gzip", [*SIM, "--trace", "{C}/t.jsonl.gz"],
             setup=lambda c, fx: (c / "t.jsonl.gz").write_bytes(
                 gz((fx / "trace.jsonl").read_bytes())[:-10]), names=("t.jsonl.gz",)),
        Case("gzip", "plain text named .gz", [*SIM, "--trace", "{C}/t.jsonl.gz"],
             setup=cp("trace.jsonl", "t.jsonl.gz"), names=("t.jsonl.gz",)),
        Case("gzip", "gzip inside gzip", [*SIM, "--trace", "{C}/t.jsonl.gz"],
             setup=lambda c, fx: (c / "t.jsonl.gz").write_bytes(
                 gz(gz((fx / "trace.jsonl").read_bytes()))), names=("t.jsonl.gz",)),
        Case("gzip", "a good gzip trace", [*SIM, "--trace", "{C}/t.jsonl.gz", *RESULT],
             setup=lambda c, fx: (c / "t.jsonl.gz").write_bytes(
                 gz((fx / "trace.jsonl").read_bytes())), expect="ok"),
        Case("gzip", "gzip of bytes not UTF-8", [*SIM, "--trace", "{C}/t.jsonl.gz"],
             setup=lambda c, fx: (c / "t.jsonl.gz").write_bytes(gz(b"\xff\xfe\xfd\n")),
             names=("t.jsonl.gz",)),
        Case("gzip", "two members, the second a bomb of '[' ",
             [*SIM, "--trace", "{C}/t.jsonl.gz"], timeout=120,
             setup=lambda c, fx: (c / "t.jsonl.gz").write_bytes(
                 gz((fx / "trace.jsonl").read_bytes()) + gz(b"[" * (200 << 20))),
             names=("t.jsonl.gz",)),
        Case("gzip", "a bomb of one 900 MB JSON line",
             [*SIM, "--trace", "{C}/t.jsonl.gz"], timeout=180,
             setup=lambda c, fx: (c / "t.jsonl.gz").write_bytes(
                 gz(b'{"request_id": "' + b"a" * (900 << 20) + b'"}\n')),
             expect="error", names=("t.jsonl.gz",)),
    ]
    return out


def workloads() -> list[Case]:
    """--dataset-name random, sharegpt, hf and the generated workloads, with their options at
    the edges, and a hostile ShareGPT file."""
    E = "error"
    out = []

    def w(name, extra, expect=E, names=(), timeout=60, setup=None, base=SIM):
        out.append(Case("workload", name, [*base, *extra, *RESULT], expect=expect, names=names,
                        timeout=timeout, setup=setup))

    R = ["--dataset-name", "random"]
    w("random defaults", R, expect="ok")
    w("random --random-input-len 10**9", [*R, "--random-input-len", "1000000000"],
      names=("--random-input-len",))
    w("random --random-input-len 10**30", [*R, "--random-input-len", BIG])
    w("random --random-prefix-len 10**8", [*R, "--random-prefix-len", "100000000"],
      timeout=120)
    w("random --random-prefix-len 10**8, --max-model-len 2**30",
      [*R, "--random-prefix-len", "100000000", "--max-model-len", str(2 ** 30)], timeout=120)
    w("random --random-output-len 0", [*R, "--random-output-len", "0"],
      names=("--random-output-len",))
    w("random --random-input-len 1 with a BOS", [*R, "--random-input-len", "1"], expect="any")
    w("random --random-range-ratio 0.99 --random-input-len 2", [
        *R, "--random-range-ratio", "0.99", "--random-input-len", "2"], expect="any")
    w("random with --dataset-path", [*R, "--dataset-path", "{F}/sharegpt.json"],
      names=("--dataset-path",))
    w("random --num-prompts 1000000, sweep --dry-run", [], expect="ok",
      base=["sweep", "--set", "dataset_name=random", "--set", "num_prompts=1000000",
            "--grid", "k=0,1", "--out", "{C}/sw", "--dry-run"])
    w("hf philschmid/mt-bench", ["--dataset-name", "hf", "--dataset-path",
                                 "philschmid/mt-bench"], expect="ok")
    w("hf --hf-output-len 10**9", ["--dataset-name", "hf", "--dataset-path",
                                   "philschmid/mt-bench", "--hf-output-len", "1000000000"],
      names=())
    w("hf without a path", ["--dataset-name", "hf"], names=("--dataset-path",))
    w("hf another id", ["--dataset-name", "hf", "--dataset-path", "lmsys/lmsys-chat-1m"],
      names=("lmsys",))
    w("hf the id with ../", ["--dataset-name", "hf", "--dataset-path",
                             "../../philschmid/mt-bench"], names=("--dataset-path",))
    w("sonnet", ["--dataset-name", "sonnet"], names=("sonnet",))
    w("a dataset name of 10,000 characters", ["--dataset-name", "x" * 10000],
      names=("--dataset-name",))
    w("prefix_repetition num_prefixes 0", ["--dataset-name", "prefix_repetition",
                                           "--prefix-repetition-num-prefixes", "0"],
      names=("--prefix-repetition-num-prefixes",))
    w("prefix_repetition num_prefixes 10**9", ["--dataset-name", "prefix_repetition",
                                               "--prefix-repetition-num-prefixes",
                                               "1000000000"], expect="any")
    w("prefix_repetition prefix 10**9", ["--dataset-name", "prefix_repetition",
                                         "--prefix-repetition-prefix-len", "1000000000"],
      timeout=120)
    w("generated-shared-prefix 10**9 x 10**9", ["--dataset-name", "generated-shared-prefix",
                                                "--gsp-num-groups", "1000000000",
                                                "--gsp-prompts-per-group", "1000000000"],
      expect="any", timeout=120)
    w("generated-shared-prefix system prompt 10**9", [
        "--dataset-name", "generated-shared-prefix", "--gsp-system-prompt-len", "1000000000"],
      timeout=120)
    w("multi-turn 10**9 turns", ["--dataset-name", "multi-turn", "--multi-turn-turns",
                                 "1000000000"], expect="any", timeout=120)
    w("multi-turn first-len 10**12", ["--dataset-name", "multi-turn",
                                      "--multi-turn-first-len", "1000000000000"], timeout=120)
    w("multi-turn, no --num-prompts, 10**6 sessions x 10**6 turns", [
        "--dataset-name", "multi-turn", "--multi-turn-sessions", "1000000",
        "--multi-turn-turns", "1000000"], base=[a for a in SIM if a not in ("--num-prompts",
                                                                             "4")],
      timeout=120, names=("multi-turn",))
    for v in ("1.0", "0", "nan", "1.5", "-0.0"):
        w(f"--shared-fraction {v}", ["--dataset-name", "prefix_repetition",
                                     "--shared-fraction", v],
          expect="any" if v in ("1.0", "0", "-0.0") else E,
          names=() if v in ("1.0", "0", "-0.0") else ("--shared-fraction",))
    w("--shared-fraction on mtbench", ["--shared-fraction", "0.5"], names=("--shared-fraction",))
    for v in ("0", "-1", "1000000000"):
        w(f"--sharegpt-output-len {v}", ["--dataset-name", "sharegpt", "--dataset-path",
                                         "{F}/sharegpt.json", "--sharegpt-output-len", v],
          names=("--sharegpt-output-len",) if v != "1000000000" else ())
    # a hostile ShareGPT file
    S = ["--dataset-name", "sharegpt", "--dataset-path", "{C}/s.json"]

    def sg(name, doc, expect=E, names=("s.json",), extra=(), timeout=60):
        data = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
        w(f"sharegpt {name}", [*S, *extra], expect=expect, names=names, timeout=timeout,
          setup=write("s.json", data))

    conv = lambda a, b: {"conversations": [{"from": "human", "value": a},   # noqa: E731
                                           {"from": "gpt", "value": b}]}
    ok = "a fine question about the weather " * 3
    sg("a list of numbers", [1, 2, 3], names=("s.json",))
    sg("an object", {"a": 1})
    sg("empty list", [])
    sg("values numbers", [conv(5, 6)] * 4)
    sg("values null", [conv(None, ok)] * 4)
    sg("conversations a string", [{"conversations": "hi"}] * 4)
    sg("one turn only", [{"conversations": [{"from": "human", "value": ok}]}] * 4)
    sg("every prompt 2 characters", [conv("hi", ok)] * 10)
    sg("a lone surrogate", '[{"conversations": [{"from": "human", "value": "\\ud800 ' + ok +
       '"}, {"from": "gpt", "value": "' + ok + '"}]}]', expect="any", names=())
    sg("a lone surrogate, with a tokenizer",
       '[{"conversations": [{"from": "human", "value": "\\ud800 ' + ok + '"}, '
       '{"from": "gpt", "value": "' + ok + '"}]}]', expect="any", names=(),
       extra=("--tokenizer", "{F}/pair/target"))
    sg("a 20 MB prompt, with a tokenizer", [conv("word " * 4_000_000, ok)], expect="any",
       names=(), extra=("--tokenizer", "{F}/pair/target"), timeout=120)
    sg("100,000 conversations, all too short", [conv("a", "b")] * 100_000)
    sg("nested 100,000 deep", deep_json())
    sg("a BOM", "\ufeff" + json.dumps([conv(ok, ok)] * 4), expect="ok", names=())
    sg("not UTF-8", b"[\xff]")
    sg("NaN in it", "[" + json.dumps(conv(ok, ok)) + ", NaN]", expect="any", names=())
    w("sharegpt a FIFO", S, setup=fifo("s.json"), names=("s.json",), timeout=30)
    w("sharegpt a folder", S, setup=mkdir("s.json"), names=("s.json",))
    w("sharegpt missing", S, names=("s.json",))
    w("sharegpt --tokenizer a folder without one", [*S, "--tokenizer", "{C}"],
      setup=cp("sharegpt.json", "s.json"), names=("--tokenizer",))
    w("sharegpt --tokenizer not a tokenizer", [*S, "--tokenizer", "{C}/tokenizer.json"],
      setup=chain(cp("sharegpt.json", "s.json"), write("tokenizer.json", '{"a": 1}')),
      names=("tokenizer.json",))
    w("sharegpt --tokenizer 100,000 deep", [*S, "--tokenizer", "{C}/tokenizer.json"],
      setup=chain(cp("sharegpt.json", "s.json"), write("tokenizer.json", deep_json())),
      names=("tokenizer.json",))
    w("sharegpt --tokenizer a FIFO", [*S, "--tokenizer", "{C}/tokenizer.json"], timeout=30,
      setup=chain(cp("sharegpt.json", "s.json"), fifo("tokenizer.json")),
      names=("tokenizer.json",))
    w("sharegpt --tokenizer the bomb", [*S, "--tokenizer", "{C}/tok/tokenizer.json"],
      timeout=120, setup=chain(cp("sharegpt.json", "s.json"),
                               cp("bomb.gz", "tok/tokenizer.json")), names=("tokenizer.json",))
    w("sharegpt --tokenizer an unknown id", [*S, "--tokenizer", "nobody/nothing"],
      setup=cp("sharegpt.json", "s.json"), names=("--tokenizer",))
    w("sharegpt --disable-shuffle", [*S, "--disable-shuffle"],
      setup=cp("sharegpt.json", "s.json"), expect="ok")
    return out


CAL = ["calibrate", "{C}/b.json", "--gpu", "l20", "--model", "llama-3.1-8b", "--draft",
       "llama-3.1-8b-eagle3", "-k", "4", "--out", "{C}/p.json"]


def calibrates() -> list[Case]:
    """calibrate --gpu on bench files alone: every field calibrate reads, of the wrong type or
    past belief; its options; its inputs."""
    out = []

    def b(name, fn, expect="error", names=("b.json",), argv=CAL, timeout=150):
        out.append(Case("calibrate", f"bench {name}", argv, timeout=timeout,
                        setup=chain(cp("bench.json", "b.json"), edit_json("b.json", fn)),
                        expect=expect, names=names))

    b("as it is", lambda d: d, expect="ok", names=())
    for key in ("mean_itl_ms", "p99_tpot_ms", "p99_itl_ms", "mean_tpot_ms"):
        for v in (float("nan"), "x", -1, 1e308, 0, None):
            b(f"{key} {v!r}", lambda d, key=key, v=v: d.update({key: v}),
              names=("b.json", key))
    b("mean_ttft_ms nan", lambda d: d.update(mean_ttft_ms=float("nan")), names=("mean_ttft_ms",))
    b("mean_itl_ms 1e-300", lambda d: d.update(mean_itl_ms=1e-300), names=("mean_itl_ms",))
    b("p99 below the mean", lambda d: d.update(p99_tpot_ms=1.0), names=("p99_tpot_ms",))
    b("num_prompts 10**30, completed 10**30",
      lambda d: d.update(num_prompts=10 ** 30, completed=10 ** 30), names=("num_prompts",))
    b("num_prompts 10**6, completed 10**6",
      lambda d: d.update(num_prompts=10 ** 6, completed=10 ** 6), expect="any", names=(),
      timeout=200)
    b("max_concurrency 10**30", lambda d: d.update(max_concurrency=10 ** 30),
      names=("max_concurrency",))
    b("max_concurrency '1'", lambda d: d.update(max_concurrency="1"), names=("max_concurrency",))
    b("max_concurrency 0", lambda d: d.update(max_concurrency=0), names=("max_concurrency",))
    b("request_rate 1e-300", lambda d: d.update(request_rate=1e-300), names=("request_rate",))
    b("request_rate 'fast'", lambda d: d.update(request_rate="fast"), names=("request_rate",))
    b("burstiness nan", lambda d: d.update(burstiness=float("nan")), names=("burstiness",))
    b("duration 1e-300", lambda d: d.update(duration=1e-300), expect="any", names=())
    b("model_id a list", lambda d: d.update(model_id=["x"]), names=("model_id",))
    b("model_id another model", lambda d: d.update(model_id="Qwen/Qwen3-8B"),
      names=("model_id",))
    b("rates rising", lambda d: d.update(spec_decode_per_position_acceptance_rates=[0.5, 0.9,
                                                                                   0.95, 0.99]),
      expect="any", names=())
    b("rates [nan]", lambda d: d.update(spec_decode_per_position_acceptance_rates=[float("nan")]),
      names=("spec_decode_per_position_acceptance_rates",))
    b("rates 65 long", lambda d: d.update(spec_decode_per_position_acceptance_rates=[0.5] * 65),
      names=("spec_decode_per_position_acceptance_rates",))
    b("num_speculative_tokens '٤'", lambda d: d.update(num_speculative_tokens="٤"),
      names=("num_speculative_tokens",))
    b("mode 'fast'", lambda d: d.update(mode="fast"), names=("mode",))
    b("mode async", lambda d: d.update(mode="async"), expect="any", names=())
    b("nested 100,000 deep", lambda d: deep_json(), names=("b.json",))
    b("a top-level list", lambda d: [d], names=("b.json",))
    b("itls a string", lambda d: d.update(itls="x"), names=("itls",))
    b("input_lens of 10**30", lambda d: d.update(input_lens=[10 ** 30] * 80,
                                                 output_lens=[256] * 80, ttfts=[0.1] * 80,
                                                 itls=[[0.01] * 255] * 80),
      names=("input_lens",))
    b("output_lens 10**9", lambda d: d.update(input_lens=[100] * 80,
                                              output_lens=[10 ** 9] * 80, ttfts=[0.1] * 80,
                                              itls=[[0.01] * 3] * 80),
      names=("output_lens",))
    opts = [("--noise", "0"), ("--noise", "nan"), ("--noise", "-1"), ("--noise", "1e308"),
            ("--max-model-len", "1000000000000"), ("--max-num-seqs", BIG),
            ("--block-size", "0"), ("--output-len", "0"), ("--max-concurrency", "0"),
            ("--gpu", "nope"), ("--gpu", ""), ("-k", "65"), ("--acceptance", "nope"),
            ("--trace", "{C}/nope.jsonl")]
    for opt, v in opts:
        argv = list(CAL)
        if opt in argv:
            argv[argv.index(opt) + 1] = v
        else:
            argv += [opt, v]
        out.append(Case("calibrate", f"{opt} {v[:12]}", argv, setup=cp("bench.json", "b.json"),
                        names=(opt,) if opt != "--trace" else ("nope.jsonl",), timeout=150))
    out += [
        Case("calibrate", "--out = the bench file", [*CAL[:-1], "{C}/b.json"],
             setup=cp("bench.json", "b.json"), names=("--out",)),
        Case("calibrate", "--out a link to the bench file", CAL,
             setup=chain(cp("bench.json", "b.json"), link("p.json", "b.json")),
             names=("--out",)),
        Case("calibrate", "--out a hard link to the bench file", CAL,
             setup=chain(cp("bench.json", "b.json"), hardlink("p.json", "b.json")),
             names=("--out",)),
        Case("calibrate", "--out a folder", [*CAL[:-1], "{C}"], setup=cp("bench.json", "b.json"),
             names=("--out",)),
        Case("calibrate", "the bench file twice", [*CAL[:2], "{C}/b.json", *CAL[2:]],
             setup=cp("bench.json", "b.json"), names=("b.json",)),
        Case("calibrate", "the bench file and a link to it", [*CAL[:2], "{C}/l.json", *CAL[2:]],
             setup=chain(cp("bench.json", "b.json"), link("l.json", "b.json")),
             names=("b.json",)),
        Case("calibrate", "a FIFO among the inputs", [*CAL[:2], "{C}/f.json", *CAL[2:]],
             setup=chain(cp("bench.json", "b.json"), fifo("f.json")), names=("f.json",),
             timeout=30),
        Case("calibrate", "a folder holding a FIFO", [*CAL[:1], "{C}/d", *CAL[2:]],
             setup=chain(cp("bench.json", "d/b.json"), fifo("d/f.json")), expect="any",
             names=("f.json",), timeout=150),
        Case("calibrate", "a folder holding a link that loops", [*CAL[:1], "{C}/d", *CAL[2:]],
             setup=chain(cp("bench.json", "d/b.json"), link("d/l.json", "l.json")),
             expect="any", timeout=150),
        Case("calibrate", "a folder of 2,000 empty .json files", [*CAL[:1], "{C}/d", *CAL[2:]],
             setup=chain(cp("bench.json", "d/b.json"),
                         *[write(f"d/e{i}.json", "") for i in range(2000)]), names=(".json",)),
        Case("calibrate", "the --out inside the input folder, existing",
             [*CAL[:1], "{C}/d", *CAL[2:-1], "{C}/d/p.json"],
             setup=chain(cp("bench.json", "d/b.json"), write("d/p.json", "{}")),
             names=("--out",)),
        Case("calibrate", "--gpu a hardware.yaml", [*CAL[:3], "{C}/hw.yaml", *CAL[4:]],
             setup=chain(cp("bench.json", "b.json"), cp("hw.yaml")), expect="any", names=(),
             timeout=150),
        Case("calibrate", "--device-profile without --gpu",
             ["calibrate", "{C}/b.json", "--model", "llama-3.1-8b", "-k", "4",
              "--device-profile", "{F}/" + LB, "--out", "{C}/p.json"],
             setup=cp("bench.json", "b.json"), expect="any", names=(), timeout=150),
    ]
    return out


def outputs() -> list[Case]:
    """Outputs that name an input (by name, a link, a hard link, a file the command finds by
    itself), outputs that cannot be written, outputs of folders."""
    T = [*SIM, "--trace", "{C}/t.jsonl"]
    tr = cp("trace.jsonl", "t.jsonl")
    out = []

    def o(name, argv, setup=tr, names=(), expect="error", timeout=60):
        out.append(Case("outputs", name, argv, setup=setup, names=names, expect=expect,
                        timeout=timeout))

    o("--result-json = --trace", [*T, "--result-json", "{C}/t.jsonl"], names=("--result-json",))
    o("--result-json a link to the trace", [*T, "--result-json", "{C}/r.json"],
      setup=chain(tr, link("r.json", "t.jsonl")), names=("--result-json",))
    o("--result-json a hard link to the trace", [*T, "--result-json", "{C}/r.json"],
      setup=chain(tr, hardlink("r.json", "t.jsonl")), names=("--result-json",))
    o("--result-json a link that loops", [*T, "--result-json", "{C}/r.json"],
      setup=chain(tr, link("r.json", "r.json")), names=("--result-json",))
    o("--result-json a dangling link", [*T, "--result-json", "{C}/r.json"],
      setup=chain(tr, link("r.json", "{C}/gone/x.json")), expect="any")
    o("--timeline = --trace", [*T, "--timeline", "{C}/t.jsonl"], names=("--timeline",))
    o("--timeline whose Chrome trace is the trace", [*SIM, "--trace", "{C}/t.chrome.json",
                                                     "--timeline", "{C}/t.jsonl"],
      setup=cp("trace.jsonl", "t.chrome.json"), names=("t.chrome.json",))
    o("--timeline whose Chrome trace links to the trace",
      [*T, "--timeline", "{C}/x.jsonl"], setup=chain(tr, link("x.chrome.json", "t.jsonl")),
      names=("chrome",))
    o("--save-result named as the trace", [*T, "--save-result", "--result-dir", "{C}",
                                           "--result-filename", "t.jsonl"],
      names=("t.jsonl",))
    o("--save-result --result-dir a file", [*T, "--save-result", "--result-dir", "{C}/t.jsonl"],
      names=("--result-dir",))
    o("--save-result --result-filename with a slash",
      [*T, "--save-result", "--result-dir", "{C}", "--result-filename", "../escape.json"],
      expect="any")
    o("--save-result --result-filename a path to the trace",
      [*T, "--save-result", "--result-dir", "/", "--result-filename", "{C}/t.jsonl"],
      names=("t.jsonl",))
    o("--result-json = --profile", [*SIM, "--profile", "{C}/p.json", "--result-json",
                                    "{C}/p.json"],
      setup=cp("measured/profile.json", "p.json"), names=("--result-json",))
    o("--result-json = --gpu FILE", [*SIM[:1], "--gpu", "{C}/hw.yaml", *SIM[3:],
                                     "--result-json", "{C}/hw.yaml"],
      setup=cp("hw.yaml"), names=("--result-json",))
    o("--result-json = the ShareGPT file", [*SIM, "--dataset-name", "sharegpt",
                                            "--dataset-path", "{C}/s.json", "--result-json",
                                            "{C}/s.json"],
      setup=cp("sharegpt.json", "s.json"), names=("--result-json",))
    o("--result-json = the peer run's meta.json (read, not named)",
      [*PSIM[:-2], "--result-json", "{C}/" + META], setup=cp("peer"), names=("meta.json",))
    o("--result-json = the peer run's dataset (found, not named)",
      [*PSIM[:-2], "--result-json",
       "{C}/peer/workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"], setup=cp("peer"),
      names=("sharegpt",))
    o("--timeline = the peer run's timeseries.csv",
      [*PSIM[:-2], "--timeline", "{C}/" + PEER_RUN + "/timeseries.csv"], setup=cp("peer"),
      expect="any")
    o("--result-json = a bundle's meta.yaml", [*DEV[:-2], "--result-json", "{C}/" + LB +
                                               "/meta.yaml"], setup=cp(LB),
      names=("--result-json",))
    o("--result-json = the bundle's hardware.yaml (found, not named)",
      [*DEV[:-2], "--result-json", "{C}/perf/RTX4090/hardware.yaml"],
      setup=chain(cp(LB), cp("hw.yaml", "perf/RTX4090/hardware.yaml")),
      names=("hardware.yaml",))
    o("--result-json = the skew fit's bucket table (found, not named)",
      [*QDEV[:-2], "--result-json", "{C}/" + QWEN_BUNDLE + "/tp2/skew_fit.csv"],
      setup=cp(QWEN_BUNDLE), names=("skew_fit.csv",))
    o("--result-json = --tokenizer's tokenizer.json",
      [*SIM, "--dataset-name", "sharegpt", "--dataset-path", "{F}/sharegpt.json", "--tokenizer",
       "{C}/tok", "--result-json", "{C}/tok/tokenizer.json"],
      setup=cp("pair/target/tokenizer.json", "tok/tokenizer.json"), names=("--result-json",))
    o("--result-json = MODEL's config.json (positional)",
      ["simulate", "{C}/m", "--gpu", "h100", "--num-prompts", "4", "--output-len", "8",
       "--result-json", "{C}/m/config.json"], setup=cp("pair/target/config.json",
                                                       "m/config.json"),
      names=("--result-json",))
    o("--result-json = --draft's config.json",
      [*SIM, "-k", "2", "--draft", "{C}/d/config.json", "--result-json", "{C}/d/config.json"],
      setup=cp("pair/eagle3/config.json", "d/config.json"), names=("--result-json",))
    o("--result-json /dev/full", [*T, "--result-json", "/dev/full"], names=("/dev/full",))
    o("--result-json /dev/null", [*T, "--result-json", "/dev/null"], expect="any")
    o("--result-json /proc/self/status", [*T, "--result-json", "/proc/self/status"],
      names=("/proc/self/status",))
    o("--result-json a name of 300 characters", [*T, "--result-json", "{C}/" + "x" * 300],
      names=("--result-json",))
    o("--result-json under a file", [*T, "--result-json", "{C}/t.jsonl/r.json"],
      names=("--result-json",))
    o("--result-json ending in /", [*T, "--result-json", "{C}/new/"], names=("--result-json",))
    o("--result-json = --timeline, by ./", [*T, "--result-json", "{C}/r.json", "--timeline",
                                            "{C}/./r.json"], names=("--timeline",))
    o("ingest vllm-bench --out = its input", ["ingest", "vllm-bench", "{C}/b.json", "--out",
                                              "{C}/b.json"],
      setup=cp("vllm/bench.json", "b.json"), names=("--out",))
    o("ingest vllm-bench --trace-out = its input",
      ["ingest", "vllm-bench", "{C}/b.json", "--out", "{C}/r.json", "--trace-out", "{C}/b.json"],
      setup=cp("vllm/bench.json", "b.json"), names=("--trace-out",))
    o("ingest vllm-profile --chrome = a trace it reads",
      ["ingest", "vllm-profile", "{C}/h.jsonl", "--out", "{C}/t.jsonl", "--chrome", "{C}/h.jsonl"],
      setup=cp("vllm/hooks/13476.jsonl", "h.jsonl"), names=("--chrome",))
    o("plot timeline --out a .png link to the timeline",
      ["plot", "timeline", "{C}/tl.jsonl", "--out", "{C}/f.png"],
      setup=chain(lambda c, fx: subprocess.run(
          [str(STEPGAP), "simulate", "--gpu", "h100", "--num-prompts", "2", "--output-len",
           "4", "--quiet", "--timeline", str(c / "tl.jsonl")], check=True),
          lambda c, fx: (c / "tl.chrome.json").unlink(), link("f.png", "tl.jsonl")),
      names=("--out",))
    o("plot timeline --chrome = the timeline",
      ["plot", "timeline", "{C}/tl.jsonl", "--out", "{C}/f.png", "--chrome", "{C}/tl.jsonl"],
      setup=lambda c, fx: subprocess.run(
          [str(STEPGAP), "simulate", "--gpu", "h100", "--num-prompts", "2", "--output-len",
           "4", "--quiet", "--timeline", str(c / "tl.jsonl")], check=True),
      names=("--chrome",))
    o("sweep --out holding its own --grid-file as sweep.json",
      ["sweep", "--grid-file", "{C}/o/sweep.json", "--out", "{C}/o", "--set", "num_prompts=2",
       "--set", "output_len=4"],
      setup=write("o/sweep.json", json.dumps({"grid": {"k": [0, 1]}})), names=("sweep.json",))
    o("sweep --out D with --set trace=D/cells.jsonl",
      ["sweep", "--out", "{C}/o", "--set", "trace={C}/o/cells.jsonl", "--grid", "k=0,1"],
      setup=lambda c, fx: ((c / "o").mkdir(), shutil.copy(fx / "trace.jsonl",
                                                          c / "o/cells.jsonl")),
      names=("cells.jsonl",))
    o("sweep --out D with --set trace=D/sweep.csv",
      ["sweep", "--out", "{C}/o", "--set", "trace={C}/o/sweep.csv", "--grid", "k=0,1"],
      setup=lambda c, fx: ((c / "o").mkdir(), shutil.copy(fx / "trace.jsonl",
                                                          c / "o/sweep.csv")),
      names=("sweep.csv",))
    o("sweep --out D whose sweep.csv links to the trace",
      ["sweep", "--out", "{C}/o", "--set", "trace={C}/t.jsonl", "--grid", "k=0,1"],
      setup=chain(tr, link("o/sweep.csv", "{C}/t.jsonl")), names=("sweep.csv",))
    o("sweep --out D whose cells.jsonl links to the trace",
      ["sweep", "--out", "{C}/o", "--set", "trace={C}/t.jsonl", "--grid", "k=0,1"],
      setup=chain(tr, link("o/cells.jsonl", "{C}/t.jsonl")), names=("cells.jsonl",))
    o("sweep --out = a file", ["sweep", "--out", "{C}/t.jsonl", "--grid", "k=0,1",
                               "--set", "num_prompts=2"], names=("--out",))
    o("sweep --plot --out D, D/plots a file", ["sweep", "--out", "{C}/o", "--grid", "k=0,1",
                                               "--grid", "max_concurrency=1,2", "--set",
                                               "num_prompts=2", "--set", "output_len=4",
                                               "--plot"],
      setup=write("o/plots", "x"), names=("plots",))
    o("plot sweep --out = the sweep's own folder",
      ["plot", "sweep", "{C}/o", "--out", "{C}/o"],
      setup=lambda c, fx: subprocess.run(
          [str(STEPGAP), "sweep", "--out", str(c / "o"), "--grid", "k=0,1", "--grid",
           "max_concurrency=1,2", "--set", "num_prompts=2", "--set", "output_len=4",
           "--quiet"], check=True), expect="any")
    o("calibrate --out inside a measured folder it reads",
      ["calibrate", "{C}/d", "--gpu", "l20", "--model", "llama-3.1-8b", "--draft",
       "llama-3.1-8b-eagle3", "-k", "4", "--out", "{C}/d/b.json"],
      setup=cp("bench.json", "d/b.json"), names=("--out",))
    o("validate --from-measured D --out D",
      ["validate", "--from-measured", "{C}/m", "--out", "{C}/m"], setup=cp("measured", "m"),
      names=("--out",), timeout=120)
    o("serve --result-json = --tokenizer's tokenizer.json",
      ["serve", "--model", "tiny", "--tokenizer", "{C}/tok", "--result-json",
       "{C}/tok/tokenizer.json", "--port", "1"],
      setup=cp("pair/target/tokenizer.json", "tok/tokenizer.json"), names=("--result-json",),
      timeout=120)
    o("serve --timeline = --model's config.json",
      ["serve", "--model", "{C}/m", "--timeline", "{C}/m/config.json", "--port", "1"],
      setup=cp("pair/target", "m"), names=("--timeline",), timeout=120)
    return out


SW = ["sweep", "--out", "{C}/o", "--set", "num_prompts=2", "--set", "output_len=4"]


def sweeps() -> list[Case]:
    """sweep: keys in vLLM's spelling, values of every type, grids of absurd size, grid files
    hostile as TOML and JSON, a store that lies, --jobs and --cluster."""
    out = []

    def s(name, extra, expect="error", names=(), setup=None, timeout=60, base=SW):
        out.append(Case("sweep", name, [*base, *extra], expect=expect, names=names,
                        setup=setup, timeout=timeout))

    s("vLLM spellings: max-num-seqs, num_speculative_tokens, tensor-parallel-size",
      ["--grid", "max-num-seqs=1,2", "--grid", "num_speculative_tokens=0..1",
       "--grid", "tensor-parallel-size=1,2", "--dry-run"], expect="ok")
    s("async_scheduling=true,false", ["--grid", "async_scheduling=true,false", "--dry-run"],
      expect="ok")
    s("async_scheduling=yes", ["--grid", "async_scheduling=yes", "--dry-run"],
      names=("async_scheduling",))
    s("async_scheduling=1,0", ["--grid", "async_scheduling=1,0", "--dry-run"], expect="any")
    s("speculative_config JSON in --set",
      ["--set", 'speculative_config={"method": "eagle3", "num_speculative_tokens": 2}',
       "--dry-run"], expect="ok")
    s("speculative_config not JSON", ["--set", "speculative_config={method", "--dry-run"],
      names=("speculative_config",))
    s("speculative_config a JSON list", ["--set", "speculative_config=[1]", "--dry-run"],
      names=("speculative_config",))
    s("speculative_config 10,000 deep", ["--set", "speculative_config=" + deep_json(10000),
                                         "--dry-run"], names=("speculative_config",))
    s("speculative_config k 10**30",
      ["--set", 'speculative_config={"num_speculative_tokens": ' + BIG + "}", "--dry-run"],
      names=("num_speculative_tokens",))
    s("speculative_config and k disagree",
      ["--set", 'speculative_config={"num_speculative_tokens": 2}', "--set", "k=3",
       "--dry-run"], names=("k",))
    s("data_parallel_size=1,2,4 enable_expert_parallel=true on qwen3-30b-a3b",
      ["--set", "model=qwen3-30b-a3b", "--grid", "data_parallel_size=1,2,4",
       "--set", "enable_expert_parallel=true", "--dry-run"], expect="ok")
    s("enable_expert_parallel=yes", ["--set", "enable_expert_parallel=yes", "--dry-run"],
      names=("enable_expert_parallel",))
    s("data_parallel_size=0", ["--grid", "data_parallel_size=0,1", "--dry-run"],
      names=("data_parallel_size",))
    s("data_parallel_size=8 x tensor_parallel_size=8",
      ["--set", "model=qwen3-30b-a3b", "--grid", "data_parallel_size=8",
       "--grid", "tensor_parallel_size=8", "--dry-run"], names=())
    s("dataset_name=random, random_input_len=10**9",
      ["--set", "dataset_name=random", "--grid", "random_input_len=1000000000", "--dry-run"],
      names=("random_input_len",))
    s("dataset_name=sharegpt with a FIFO path",
      ["--set", "dataset_name=sharegpt", "--set", "dataset_path={C}/f.json", "--dry-run"],
      setup=fifo("f.json"), names=("f.json",), timeout=30)
    s("dataset_name=nope", ["--set", "dataset_name=nope", "--dry-run"], names=("nope",))
    s("quantization=fp8, kv_cache_dtype=fp8", ["--grid", "quantization=fp8", "--grid",
                                               "kv_cache_dtype=fp8,auto", "--dry-run"],
      expect="ok")
    s("kv_cache_dtype=fp16", ["--grid", "kv_cache_dtype=fp16", "--dry-run"],
      names=("kv_cache_dtype",))
    s("gpu=a GPU file and a catalog name", ["--grid", "gpu={F}/hw.yaml,h100", "--dry-run"],
      expect="ok")
    s("gpu=a FIFO", ["--grid", "gpu={C}/g.yaml", "--dry-run"], setup=fifo("g.yaml"),
      names=("g.yaml",), timeout=30)
    s("device_profile=a bundle, gpu=rtx4090", ["--set", "gpu=rtx4090", "--grid",
                                               "device_profile={F}/" + LB, "--dry-run"],
      expect="ok")
    s("an unknown key", ["--grid", "warp_factor=1,2", "--dry-run"], names=("warp_factor",))
    s("a key twice", ["--grid", "k=0,1", "--grid", "k=2", "--dry-run"], expect="any")
    s("k=0..1e9", ["--grid", "k=0..1000000000", "--dry-run"], names=("k",))
    s("request_rate=0.1..1e9:0.1", ["--grid", "request_rate=0.1..1000000000:0.1", "--dry-run"],
      names=("request_rate",))
    s("max_concurrency=1..1e18:x2", ["--grid", "max_concurrency=1..1000000000000000000:x2",
                                     "--dry-run"], expect="any")
    s("max_concurrency=1..10:x1", ["--grid", "max_concurrency=1..10:x1", "--dry-run"],
      names=("max_concurrency",))
    s("max_concurrency=1..10:x0.5", ["--grid", "max_concurrency=1..10:x0.5", "--dry-run"],
      names=("max_concurrency",))
    s("request_rate=1..2:0", ["--grid", "request_rate=1..2:0", "--dry-run"],
      names=("request_rate",))
    s("request_rate=1..2:-1", ["--grid", "request_rate=1..2:-1", "--dry-run"],
      names=("request_rate",))
    s("request_rate=1..2:nan", ["--grid", "request_rate=1..2:nan", "--dry-run"],
      names=("request_rate",))
    s("three axes of 5,000: 1.25e11 cells", ["--grid", "max_num_seqs=1..5000", "--grid",
                                             "max_concurrency=1..5000", "--grid",
                                             "output_len=1..5000", "--dry-run"],
      names=("cells",), timeout=90)
    s("two axes of 10,000: 1e8 cells", ["--grid", "max_num_seqs=1..10000", "--grid",
                                        "max_concurrency=1..10000", "--dry-run"],
      names=("cells",), timeout=90)
    s("k=²", ["--grid", "k=²", "--dry-run"], names=("k",))
    s("k=٣", ["--grid", "k=٣", "--dry-run"], expect="any")
    s("k=1_0", ["--grid", "k=1_0", "--dry-run"], expect="any")
    s("num_prompts=" + HUGE_DIGITS[:8] + "..", ["--set", "num_prompts=" + HUGE_DIGITS,
                                                "--dry-run"], names=("num_prompts",))
    s("acceptance_rates=0.9/nan", ["--grid", "acceptance_rates=0.9/nan", "--set", "k=2",
                                   "--dry-run"], names=("acceptance_rates",))
    s("--set '=1'", ["--set", "=1", "--dry-run"], names=("--set",))
    s("--set 'k'", ["--set", "k", "--dry-run"], names=("--set",))
    s("--grid 'k='", ["--grid", "k=", "--dry-run"], names=("k",))
    s("--jobs 0", ["--grid", "k=0,1", "--jobs", "0"], names=("--jobs",))
    s("--jobs 1000000", ["--grid", "k=0,1", "--jobs", "1000000"], expect="any", timeout=90)
    s("--cluster ''", ["--grid", "k=0,1", "--cluster", ""], names=("--cluster",))
    s("--cluster tcp://127.0.0.1:1", ["--grid", "k=0,1", "--cluster", "tcp://127.0.0.1:1"],
      names=("--cluster",), timeout=90)
    s("--cluster a word", ["--grid", "k=0,1", "--cluster", "nowhere"], names=("--cluster",),
      timeout=90)
    s("--plot without a load axis", ["--grid", "k=0,1", "--plot"], names=("--plot",))
    s("--metric nope --plot", ["--grid", "k=0,1", "--grid", "max_concurrency=1,2", "--metric",
                               "nope", "--plot"], names=("--metric",))
    s("--preset nope", ["--preset", "nope", "--dry-run"], names=("nope",))
    # grid files
    gf = ["--grid-file", "{C}/g.toml", "--dry-run"]
    gj = ["--grid-file", "{C}/g.json", "--dry-run"]
    s("grid file TOML 10,000 deep", gf, setup=write("g.toml", "a = " + "[" * 10000 + "]" * 10000),
      names=("g.toml",))
    s("grid file JSON 100,000 deep", gj, setup=write("g.json", deep_json()), names=("g.json",))
    s("grid file TOML of vLLM keys", gf, expect="ok",
      setup=write("g.toml", '[base]\nnum_prompts = 2\n[grid]\nmax-num-seqs = [1, 2]\n'
                            'async_scheduling = [true, false]\n'))
    s("grid file: grid a list", gj, setup=write("g.json", json.dumps({"grid": [1, 2]})),
      names=("g.json",))
    s("grid file: an axis of objects", gj,
      setup=write("g.json", json.dumps({"grid": {"k": [{"a": 1}]}})), names=("k",))
    s("grid file: an axis of null", gj, setup=write("g.json", json.dumps({"grid": {"k": None}})),
      names=("k",))
    s("grid file: an axis of bools for k", gj,
      setup=write("g.json", json.dumps({"grid": {"k": [True, False]}})), names=("k",))
    s("grid file: k 1e308", gj, setup=write("g.json", json.dumps({"grid": {"k": [1e308]}})),
      names=("k",))
    s("grid file: base a list", gj, setup=write("g.json", json.dumps({"base": [1]})),
      names=("g.json",))
    s("grid file: preset a number", gj, setup=write("g.json", json.dumps({"preset": 5})),
      names=("preset",))
    s("grid file: a FIFO", ["--grid-file", "{C}/g.toml", "--dry-run"], setup=fifo("g.toml"),
      names=("g.toml",), timeout=30)
    s("grid file: .yaml", ["--grid-file", "{C}/g.yaml", "--dry-run"],
      setup=write("g.yaml", "grid: {k: [0, 1]}\n"), names=("g.yaml",))
    s("grid file: TOML integer of 5,000 digits", gf,
      setup=write("g.toml", f"[base]\nnum_prompts = {HUGE_DIGITS}\n"), names=("g.toml",))
    # a store that lies
    def store(lines):
        return write("o/cells.jsonl", "".join(x + "\n" for x in lines))
    s("store: a line 100,000 deep", ["--grid", "k=0,1"], setup=store([deep_json()]),
      names=("cells.jsonl",))
    s("store: a line of 5,000 digits", ["--grid", "k=0,1"],
      setup=store(['{"key": ' + HUGE_DIGITS + "}"]), names=("cells.jsonl",))
    s("store: a line that is a list", ["--grid", "k=0,1"], setup=store(["[1, 2]"]),
      names=("cells.jsonl",))
    s("store: not UTF-8", ["--grid", "k=0,1"], setup=write("o/cells.jsonl", b"\xff\xfe\n"),
      names=("cells.jsonl",))
    s("store: a FIFO", ["--grid", "k=0,1"], setup=fifo("o/cells.jsonl"), names=("cells.jsonl",),
      timeout=30)
    s("store: a folder", ["--grid", "k=0,1"], setup=mkdir("o/cells.jsonl"),
      names=("cells.jsonl",))
    return out


M = ["simulate", "--gpu", "h100", "--num-prompts", "4", "--output-len", "8", *RESULT]


def models() -> list[Case]:
    """Targets by Hugging Face id, by a positional MODEL, by folder; --quantization and
    --kv-cache-dtype where they mean nothing."""
    out = []

    def m(name, extra, expect="error", names=(), setup=None, base=M, timeout=60):
        out.append(Case("model", name, [*base, *extra], expect=expect, names=names,
                        setup=setup, timeout=timeout))

    m("positional HF id", ["meta-llama/Llama-3.1-8B-Instruct"], expect="ok")
    m("positional and --model disagree", ["meta-llama/Llama-3.1-8B-Instruct", "--model",
                                          "qwen3-8b"], names=("--model",))
    m("positional and --model agree", ["qwen3-8b", "--model", "Qwen/Qwen3-8B"], expect="any")
    m("an unknown id", ["--model", "nobody/nothing"], names=("nobody/nothing",))
    m("an id with ..", ["--model", "../../etc/passwd"], names=("passwd",))
    m("an id of 10,000 characters", ["--model", "a/" + "b" * 10000], names=("--model",))
    m("an id of spaces", ["--model", "   "], names=("--model",))
    m("an id with a newline", ["--model", "meta-llama/Llama-3.1-8B\n-Instruct"],
      names=("--model",))
    m("an id in another case", ["--model", "META-LLAMA/LLAMA-3.1-8B-INSTRUCT"], expect="any")
    m("two positionals", ["qwen3-8b", "qwen3-32b"], names=("qwen3-32b",))
    m("a folder without config.json", ["--model", "{C}/m"], setup=mkdir("m"), names=("m",))
    m("config.json a FIFO", ["--model", "{C}/m"], setup=fifo("m/config.json"),
      names=("config.json",), timeout=30)
    m("config.json a gzip bomb", ["--model", "{C}/m/config.json"],
      setup=cp("bomb.gz", "m/config.json"), names=("config.json",), timeout=120)
    m("config.json 100,000 deep", ["--model", "{C}/m"],
      setup=write("m/config.json", deep_json()), names=("config.json",))
    m("a MoE config with num_experts 10**12",
      ["--model", "{C}/m"], setup=write("m/config.json", lambda c, fx: json.dumps({
          **json.loads((ROOT / "common").joinpath("..").resolve().joinpath(
              "traces/peers/llmservingsim/bench/examples/RTXPRO6000/Qwen3-32B/config.json")
              .read_text()), "model_type": "qwen3_moe", "num_experts": 10 ** 12,
          "num_experts_per_tok": 8, "moe_intermediate_size": 768})), names=("num_experts",))
    m("config: quantization_config fp8 + --quantization fp8",
      ["--model", "{C}/m", "--quantization", "fp8"],
      setup=write("m/config.json", lambda c, fx: json.dumps({
          **json.loads((fx / "pair/target/config.json").read_text()),
          "quantization_config": {"quant_method": "fp8"}})), expect="any")
    m("config: quantization_config awq", ["--model", "{C}/m"],
      setup=write("m/config.json", lambda c, fx: json.dumps({
          **json.loads((fx / "pair/target/config.json").read_text()),
          "quantization_config": {"quant_method": "awq"}})), names=("quant_method",))
    m("config: quantization_config a list", ["--model", "{C}/m"],
      setup=write("m/config.json", lambda c, fx: json.dumps({
          **json.loads((fx / "pair/target/config.json").read_text()),
          "quantization_config": [1]})), names=("quantization_config",))
    for gpu in ("a100", "l4", "cpu", "mi300x"):
        m(f"--quantization fp8 on {gpu}", ["--model", "llama-3.1-8b", "--gpu", gpu,
                                           "--quantization", "fp8"], expect="any")
    m("--quantization awq", ["--quantization", "awq"], names=("--quantization",))
    m("--kv-cache-dtype fp8_e5m2 on a100", ["--gpu", "a100", "--kv-cache-dtype", "fp8_e5m2"],
      expect="any")
    m("--kv-cache-dtype int8", ["--kv-cache-dtype", "int8"], names=("--kv-cache-dtype",))
    m("--kv-cache-dtype fp8 with --device cpu", ["--device", "cpu", "--gpu", "cpu",
                                                 "--kv-cache-dtype", "fp8"], expect="any")
    m("gpt-oss with --quantization fp8", ["--model", "gpt-oss-20b", "--quantization", "fp8"],
      expect="any")
    m("deepseek-v3 on one h100", ["--model", "deepseek-v3"], names=("--gpu",))
    m("--speculative-config of 10,000 deep", ["--speculative-config", deep_json(10000)],
      names=("--speculative-config",))
    m("--speculative-config k -1", ["--speculative-config", '{"num_speculative_tokens": -1}'],
      names=("num_speculative_tokens",))
    m("--speculative-config model a list", ["--speculative-config",
                                            '{"method": "eagle3", "model": [1], '
                                            '"num_speculative_tokens": 2}'],
      names=("model",))
    m("--speculative-config method nope", ["--speculative-config", '{"method": "nope"}'],
      names=("method",))
    m("--speculative-config and -k disagree", ["--speculative-config",
                                               '{"num_speculative_tokens": 2}', "-k", "3"],
      names=("-k",))
    m("--draft a target model", ["-k", "2", "--draft", "qwen3-8b"], expect="any")
    m("--spec-method draft_model without a model", ["-k", "2", "--spec-method",
                                                    "draft_model"], names=("draft",))
    m("--acceptance a file of rates 1.5", ["-k", "2", "--acceptance", "{C}/a.json"],
      setup=write("a.json", json.dumps({"rates": [1.5, 0.5]})), names=("a.json",))
    m("--acceptance nope", ["-k", "2", "--acceptance", "nope"], names=("nope",))
    return out


def filesystem() -> list[Case]:
    """Inputs that are not files: FIFOs, devices, folders, links that loop or dangle, names
    with newlines, over-long names."""
    out = []
    kinds = [("a FIFO", fifo("x.jsonl")), ("a folder", mkdir("x.jsonl")),
             ("a link that loops", link("x.jsonl", "x.jsonl")),
             ("a dangling link", link("x.jsonl", "nowhere")),
             ("/dev/zero", link("x.jsonl", "/dev/zero")),
             ("/dev/urandom", link("x.jsonl", "/dev/urandom")),
             ("/proc/self/mem", link("x.jsonl", "/proc/self/mem")),
             ("empty", write("x.jsonl", ""))]
    where = {"--trace": [*SIM, "--trace", "{C}/x.jsonl"],
             "--profile": [*SIM, "--profile", "{C}/x.jsonl"],
             "compare": ["compare", "{C}/x.jsonl", "{F}/trace.jsonl"],
             "plot timeline": ["plot", "timeline", "{C}/x.jsonl", "--out", "{C}/f.png"],
             "ingest vllm-bench": ["ingest", "vllm-bench", "{C}/x.jsonl", "--out", "{C}/r.json"]}
    for wname, argv in where.items():
        for kname, setup in kinds:
            out.append(Case("files", f"{wname}: {kname}", argv, setup=setup,
                            names=("x.jsonl",), timeout=30))
    out += [
        Case("files", "a trace named with a newline", [*SIM, "--trace", "{C}/a\nb.jsonl",
                                                       *RESULT],
             setup=cp("trace.jsonl", "a\nb.jsonl"), expect="ok"),
        Case("files", "a trace of 5,000 characters' path", [*SIM, "--trace", "{C}/" +
                                                            "d/" * 2000 + "t.jsonl"],
             names=("t.jsonl",)),
        Case("files", "a trace through 40 links", [*SIM, "--trace", "{C}/l39", *RESULT],
             setup=chain(cp("trace.jsonl", "l0"),
                         *[link(f"l{i}", f"l{i - 1}") for i in range(1, 40)]), expect="any"),
        Case("files", "a trace from stdin (-)", [*SIM, "--trace", "-"],
             stdin=b'{"request_id": "a", "arrival_s": 0, "prompt_len": 5, "output_len": 3}\n',
             expect="any"),
        Case("files", "a trace /dev/stdin, a FIFO-like", [*SIM, "--trace", "/dev/stdin"],
             stdin=b'{"request_id": "a", "arrival_s": 0, "prompt_len": 5, "output_len": 3}\n',
             expect="any", timeout=30),
        Case("files", "a trace line of 50 MB", [*SIM, "--trace", "{C}/t.jsonl"],
             setup=write("t.jsonl", '{"request_id": "' + "a" * (50 << 20) + '", "arrival_s": 0, '
                                    '"prompt_len": 5, "output_len": 3}\n'), expect="any",
             timeout=120),
        Case("files", "a trace of 2,000,000 lines", [*SIM, "--trace", "{C}/t.jsonl"],
             setup=write("t.jsonl", "".join(
                 '{"request_id": "r%d", "arrival_s": 0, "prompt_len": 5, "output_len": 3}\n' % i
                 for i in range(2_000_000))), expect="any", timeout=180),
        Case("files", "a trace of 2,000,000 blank lines", [*SIM, "--trace", "{C}/t.jsonl"],
             setup=write("t.jsonl", "\n" * 2_000_000), names=("t.jsonl",), timeout=60),
        Case("files", "a trace of prompt_len 10**30", [*SIM, "--trace", "{C}/t.jsonl"],
             setup=write("t.jsonl", '{"request_id": "a", "arrival_s": 0, "prompt_len": ' + BIG +
                         ', "output_len": 3}\n'), names=("t.jsonl",)),
        Case("files", "a trace of 10**6 prompt_token_ids", [*SIM, "--trace", "{C}/t.jsonl"],
             setup=write("t.jsonl", json.dumps({"request_id": "a", "arrival_s": 0,
                                                "prompt_len": 10 ** 6, "output_len": 3,
                                                "prompt_token_ids": [1] * 10 ** 6}) + "\n"),
             names=(), timeout=120),
        Case("files", "a trace with accepted past k", [*SIM, "-k", "2", "--trace", "{C}/t.jsonl"],
             setup=write("t.jsonl", json.dumps({"request_id": "a", "arrival_s": 0,
                                                "prompt_len": 5, "output_len": 4,
                                                "accepted": [5, 5, 5]}) + "\n"),
             names=("accepted",)),
        Case("files", "a trace with accepted of 10**6 steps", [*SIM, "-k", "2", "--trace",
                                                               "{C}/t.jsonl"],
             setup=write("t.jsonl", json.dumps({"request_id": "a", "arrival_s": 0,
                                                "prompt_len": 5, "output_len": 4,
                                                "accepted": [1] * 10 ** 6}) + "\n"),
             expect="any"),
        Case("files", "a trace with arrival_s 1e6 exactly", [*SIM, "--trace", "{C}/t.jsonl",
                                                             *RESULT],
             setup=write("t.jsonl", json.dumps({"request_id": "a", "arrival_s": 1e6,
                                                "prompt_len": 5, "output_len": 4}) + "\n"),
             expect="ok"),
        Case("files", "a bench file with 10**6 requests", [*SIM, "--trace", "{C}/b.json"],
             setup=write("b.json", lambda c, fx: json.dumps({
                 **json.loads((fx / "vllm/bench.json").read_text()), "num_prompts": 10 ** 6,
                 "completed": 10 ** 6})), names=("b.json",)),
    ]
    return out


def parallel() -> list[Case]:
    """--data-parallel-size and --enable-expert-parallel where they mean nothing or too much."""
    Q = ["simulate", "--gpu", "h100", "--model", "qwen3-30b-a3b", "--num-prompts", "4",
         "--output-len", "8", *RESULT]
    out = []

    def p(name, extra, expect="error", names=(), base=Q, timeout=60):
        out.append(Case("parallel", name, [*base, *extra], expect=expect, names=names,
                        timeout=timeout))

    p("dp 2 ep", ["-dp", "2", "-ep"], expect="ok")
    p("dp 8 tp 2", ["-dp", "8", "-tp", "2"], names=("--data-parallel-size",))
    p("dp 2 on a dense model", ["-dp", "2"], base=SIM + RESULT, expect="ok")
    p("ep on a dense model", ["-ep"], base=SIM + RESULT, expect="any")
    p("ep with dp 1", ["-ep"], expect="any")
    p("ep and no-ep", ["--enable-expert-parallel", "--no-enable-expert-parallel"], expect="any")
    p("dp 2 on the CPU", ["-dp", "2", "--device", "cpu", "--gpu", "cpu"], expect="any")
    p("dp 2 with a CPU profile", ["-dp", "2", "--profile", "{F}/measured/profile.json"],
      expect="any")
    p("dp 8 at max-concurrency 1", ["-dp", "8", "--max-concurrency", "1"], expect="ok")
    p("dp 4 ep with 1 prompt", ["-dp", "4", "-ep", "--num-prompts", "1"], expect="ok")
    p("dp 2 ep with --timeline", ["-dp", "2", "-ep", "--timeline", "{C}/t.jsonl"], expect="ok")
    p("dp 2 ep with --moe-routing-skew 10", ["-dp", "2", "-ep", "--moe-routing-skew", "10"],
      expect="ok")
    p("dp 3 ep", ["-dp", "3", "-ep"], expect="any")
    p("dp 2 with --timeseries-interval 0.001", ["-dp", "2", "-ep", "--timeseries-interval",
                                                "0.001"], expect="ok")
    p("dp 2 tp 4 ep with a hardware.yaml of 2 GPUs", ["-dp", "2", "-tp", "4", "-ep", "--gpu",
                                                      "{F}/hw.yaml"], expect="any")
    p("gpt-oss dp 2 ep mtp", ["--model", "gpt-oss-20b", "-dp", "2", "-ep", "--spec-method",
                              "mtp", "-k", "1"], names=("mtp",))
    p("--band dp 2 ep", ["-dp", "2", "-ep", "--band"], expect="ok", timeout=120)
    p("--band with a bundle", ["--band"], expect="ok", timeout=120,
      base=["simulate", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "--num-prompts", "4",
            "--output-len", "8", "-k", "2", "--device-profile", "{F}/" + LB, *RESULT])
    p("--band with a CPU profile", ["--band", "--device", "cpu", "--gpu", "cpu", "--profile",
                                    "{F}/measured/profile.json"], expect="any", base=SIM + RESULT,
      timeout=120)
    p("--band with k 0", ["--band"], base=SIM + RESULT, expect="ok", timeout=120)
    p("--band with the seed preset", ["--band", "--preset", "seed-l20", "--num-prompts", "4"],
      base=["simulate", *RESULT], expect="ok", timeout=120)
    p("--band with --acceptance-rates given", ["--band", "-k", "2", "--acceptance-rates",
                                               "0.8,0.6"], base=SIM + RESULT, expect="ok",
      timeout=120)
    p("sweep --band --dry-run", [], base=["sweep", "--band", "--grid", "k=0,1", "--set",
                                          "num_prompts=2", "--out", "{C}/o", "--dry-run"],
      expect="ok")
    return out


# ---------------------------------------------------------------------------------------------
# Round 4 (issue 55): the files stepgap writes and reads back, the tables and surfaces added in
# round 3, degenerate workloads, sizes, and faults

PROF_ADV = ["advise", "--profile", "{C}/p.json", "--model", "llama-3.1-8b", "--max-k", "2",
        "--num-prompts", "4", "--output-len", "8", "--max-concurrency", "1", "--jobs", "1"]
PROF_SIM = ["simulate", "--profile", "{C}/p.json", "--model", "llama-3.1-8b", "-k", "2",
        "--num-prompts", "4", "--output-len", "8", "--band", *RESULT]
PROF_SWEEP = ["sweep", "--set", "profile={C}/p.json", "--set", "num_prompts=3", "--set",
          "output_len=8", "--grid", "k=0,2", "--band", "--jobs", "1", "--out", "{C}/sw"]


def profiles() -> list[Case]:
    """A calibrate profile's bands, split, residuals and CPU costs of the wrong type, empty,
    missing an end, zero, negative, NaN or out of range, under advise, simulate --band and
    sweep --band; the profile as calibrate wrote it."""
    out = [Case("profile", f"as calibrate wrote it, {argv[0]}", argv,
                setup=cp("cal.json", "p.json"), expect="ok", timeout=180)
           for argv in (PROF_ADV, PROF_SIM, PROF_SWEEP)]
    split = "bands.split"
    broken = [
        ("split {}", lambda d: setin(d, split, {}), "bands.split.low"),
        ("split without high", lambda d: delin(d, split + ".high"), "bands.split.high"),
        ("split low an int", lambda d: setin(d, split + ".low", 3), "bands.split.low"),
        ("split low.device 0", lambda d: setin(d, split + ".low.device", 0),
         "bands.split.low.device"),
        ("split high.device null", lambda d: setin(d, split + ".high.device", None),
         "bands.split.high.device"),
        ("split high.cpu a string", lambda d: setin(d, split + ".high.cpu", "1.28"),
         "bands.split.high.cpu"),
        ("split low.cpu -1", lambda d: setin(d, split + ".low.cpu", -1), "bands.split.low.cpu"),
        ("split low.cpu 1e300", lambda d: setin(d, split + ".low.cpu", 1e300),
         "bands.split.low.cpu"),
        ("split low above high", lambda d: setin(d, split + ".low.cpu", 5.0), "bands.split"),
        ("bands a list", lambda d: d.update(bands=[d["bands"]]), "bands"),
        ("bands a string", lambda d: d.update(bands="split"), "bands"),
        ("bands {}", lambda d: d.update(bands={}), "bands"),
        ("residuals a string", lambda d: d.update(residuals="x"), "residuals"),
        ("cpu launch 1e300 us", lambda d: setin(d, "cpu.launch_latency_us", 1e300), "cpu"),
        ("cpu an op of a string", lambda d: setin(d, "cpu.schedule", "1"), "cpu"),
    ]
    for name, fn, field_ in broken:
        for argv in (PROF_ADV, PROF_SIM, PROF_SWEEP):
            out.append(Case("profile", f"{name}, {argv[0]}", argv, timeout=120,
                            setup=chain(cp("cal.json", "p.json"), edit_json("p.json", fn)),
                            names=("p.json", field_)))
    for v in (-1, -1.5, float("inf"), float("nan"), 1e300, "0.1", None):
        def fn(d, v=v):   # without the split, the residuals make the profile's band
            d.pop("bands")
            d["residuals"][0]["mean_itl_ms"] = v
        for argv in (PROF_ADV, PROF_SIM, PROF_SWEEP):
            out.append(Case("profile", f"residual mean_itl_ms {v!r}, {argv[0]}", argv,
                            timeout=120, expect="any" if v is None else "error",
                            setup=chain(cp("cal.json", "p.json"), edit_json("p.json", fn)),
                            names=() if v is None else ("p.json", "residuals[0].mean_itl_ms")))
    return out


DS = ["simulate", "--gpu", "h200", "--model", "deepseek-v3", "--spec-method", "mtp", "-k", "1",
      "--num-prompts", "4", "--output-len", "8", "--num-gpu-blocks-override", "2000",
      "--device-profile", "{C}/" + DS_BUNDLE, *RESULT]


def set_times(rel: str, value: str, only: str | None = None):
    """Every time_us of a table (of the rows whose first cell is `only`) set to `value`."""
    return csv_edit(rel, lambda h, rows: [h] + [
        r.rsplit(",", 1)[0] + "," + value if only is None or r.split(",")[0] == only else r
        for r in rows])


def tables() -> list[Case]:
    """moe.csv, mtp.csv, the operator tables and the collectives range-checked: zero or absurd
    times, and ops priced past any device's physics (too fast) or its sense (too slow)."""
    out = []
    moe, mtp = DS_BUNDLE + "/tp1/moe.csv", DS_BUNDLE + "/tp1/mtp.csv"
    for par in (["-dp", "2", "-ep"], ["-dp", "4", "-ep"], ["-dp", "8", "-ep"], []):
        tag = " ".join(par) or "tp 1"
        for v in ("0", "1e9", "1e-9"):
            out.append(Case("tables", f"moe.csv all {v}, {tag}", [*DS, *par], timeout=120,
                            setup=chain(cp(DS_BUNDLE), set_times(moe, v)), names=("moe.csv",)))
        for v in ("0", "1e9", "1e-9"):
            out.append(Case("tables", f"mtp.csv all {v}, {tag}", [*DS, *par], timeout=120,
                            setup=chain(cp(DS_BUNDLE), set_times(mtp, v)), names=("mtp.csv",)))
    out.append(Case("tables", "the DeepSeek bundle as it is, dp 8 ep", [*DS, "-dp", "8", "-ep"],
                    setup=cp(DS_BUNDLE), expect="ok", timeout=120))
    dense, seq, att = LB + "/tp1/dense.csv", LB + "/tp1/per_sequence.csv", \
        LB + "/tp1/attention.csv"
    for rel, only, v, file in ((dense, "qkv_proj", "1e9", "dense.csv"),
                               (dense, None, "1e-6", "dense.csv"),
                               (dense, "embedding", "1e9", "dense.csv"),
                               (seq, "lm_head", "1e-3", "per_sequence.csv"),
                               (seq, "sampler", "1e9", "per_sequence.csv"),
                               (att, None, "1e-6", "attention.csv"),
                               (att, None, "1e9", "attention.csv")):
        out.append(Case("tables", f"{file} {only or 'every row'} at {v} us", DEV, timeout=120,
                        setup=chain(cp(LB), set_times(rel, v, only)), names=(file,)))
    qseq = QWEN_BUNDLE + "/tp2/per_sequence.csv"
    out.append(Case("tables", "qwen per_sequence.csv lm_head at 1e-3 us", QDEV, timeout=120,
                    setup=chain(cp(QWEN_BUNDLE), set_times(qseq, "1e-3", "lm_head")),
                    names=("per_sequence.csv",)))

    def collectives(v):
        def fn(d):
            for x in d["measured"]["interconnect"]["samples"]:
                x["us_graphed"] = x["us"] = v
        return fn
    for v in (1e9, 1e6, 1e-6, 0.0):
        out.append(Case("tables", f"collectives at {v:g} us", ["simulate", "--gpu", "{C}/hw.yaml",
                                                               *SIM[3:], "-tp", "2", *RESULT],
                        setup=chain(cp("hw.yaml"), edit_yaml("hw.yaml", collectives(v))),
                        names=("hw.yaml", "measured.interconnect.samples[0]")))
    out.append(Case("tables", "a bundle's meta.yaml naming another model, deepseek-v3",
                    [*DS, "-dp", "8", "-ep"], timeout=120,
                    setup=chain(cp(DS_BUNDLE), edit_yaml(DS_BUNDLE + "/meta.yaml", lambda d:
                                                         d.update(model="Qwen/Qwen3-32B"))),
                    names=("meta.yaml", "model")))
    return out


def degenerate() -> list[Case]:
    """One prompt, one output token: an answer or one clear refusal, never a division by 0."""
    out = []

    def d(name, argv, expect="ok", names=(), setup=None, timeout=120):
        out.append(Case("degenerate", name, argv, expect=expect, names=names, setup=setup,
                        timeout=timeout))
    adv = ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", "--max-k", "2",
           "--max-concurrency", "1", "--jobs", "1"]
    d("advise 4 prompts of 1 token", [*adv, "--num-prompts", "4", "--output-len", "1"],
      "error", ("--output-len",))
    d("advise 1 prompt of 1 token", [*adv, "--num-prompts", "1", "--output-len", "1"],
      "error", ("--output-len",))
    d("advise 1 prompt of 2 tokens", [*adv, "--num-prompts", "1", "--output-len", "2"])
    d("advise --profile, 1 token", [*PROF_ADV, "--output-len", "1"], "error", ("--output-len",),
      cp("cal.json", "p.json"))
    d("simulate 1 prompt of 1 token", [*SIM[:5], "--num-prompts", "1", "--output-len", "1",
                                       *RESULT])
    d("simulate --band, 1 token", [*SIM[:7], "--output-len", "1", "--band", *RESULT])
    d("simulate -k 4, 1 token", [*SIM[:7], "--output-len", "1", "-k", "4", *RESULT])
    d("sweep --band, 1 token", ["sweep", "--set", "num_prompts=1", "--set", "output_len=1",
                                "--grid", "k=0,1", "--band", "--jobs", "1", "--out", "{C}/sw"])
    d("calibrate --output-len 1", [*CAL, "--output-len", "1"], "error",
      ("b.json", "--output-len"), cp("bench.json", "b.json"))
    d("calibrate, every output_lens 1", CAL, "error", ("b.json",),
      chain(cp("bench.json", "b.json"), edit_json("b.json", lambda x: x.update(
          input_lens=[100] * 80, output_lens=[1] * 80, ttfts=[0.1] * 80, itls=[[]] * 80))))
    d("calibrate --num-prompts-like 1 prompt", CAL, "any", (),
      chain(cp("bench.json", "b.json"), edit_json("b.json", lambda x: x.update(
          num_prompts=1, completed=1))))
    return out


def sizes() -> list[Case]:
    """Sizes bounded before the work: 400 digits of every count option, a block of 2^24, a
    list of 3,000 loads, 1,000 bench files (a folder, or 1,000 arguments)."""
    out = []
    for opt in ("--block-size", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
                "--num-gpu-blocks-override", "--data-parallel-size", "--seed"):
        for v in ("9" * 400, "1" + "0" * 170):
            out.append(Case("sizes", f"{opt} of {len(v)} digits", [*SIM, opt, v, *RESULT],
                            names=(opt,), expect="any" if opt == "--seed" else "error"))
    n = str(1 << 24)
    out.append(Case("sizes", "--block-size 2^24", [*SIM, "--block-size", n, "--max-model-len",
                                                   n, "--max-num-batched-tokens", n, *RESULT],
                    names=("--block-size",)))
    out.append(Case("sizes", "--block-size 10^170 for calibrate",
                    [*CAL, "--block-size", "1" + "0" * 170], setup=cp("bench.json", "b.json"),
                    names=("--block-size",)))
    out.append(Case("sizes", "sweep block_size=10^170", ["sweep", "--set", "num_prompts=2",
                                                         "--grid", "block_size=16," + "1" + "0"
                                                         * 170, "--dry-run", "--out", "{C}/o"],
                    names=("block_size",)))
    loads = ",".join(map(str, range(1, 3001)))
    out.append(Case("sizes", "advise 3,000 concurrencies", [*ADV, "--max-concurrency", loads],
                    names=("--max-concurrency",), timeout=60))
    out.append(Case("sizes", "advise 101 x 101 loads",
                    [*ADV, "--max-concurrency", ",".join(map(str, range(1, 102))),
                     "--request-rate", ",".join(map(str, range(1, 102)))],
                    names=("--max-concurrency", "--request-rate"), timeout=60))
    copies = [cp("bench.json", f"d/b{i}.json") for i in range(1000)]
    out.append(Case("sizes", "calibrate a folder of 1,000 bench files", [CAL[0], "{C}/d",
                                                                        *CAL[2:]],
                    setup=chain(*copies), names=("1,000 bench files",), timeout=120))
    out.append(Case("sizes", "calibrate 1,000 bench files as arguments",
                    [CAL[0], *[f"{{C}}/d/b{i}.json" for i in range(1000)], *CAL[2:]],
                    setup=chain(*copies), names=("1,000 bench files",), timeout=120))
    out.append(Case("sizes", "calibrate (timelines) a folder of 1,000 bench files",
                    ["calibrate", "{C}/d", "--model", "{F}/pair/target", "--out",
                     "{C}/p.json"], setup=chain(*copies), names=("1,000 bench files",),
                    timeout=120))
    return out


def results() -> list[Case]:
    """compare (and advise's --result-json reader) on results of the wrong shape: config's
    sections lists, metrics NaN, infinite, negative or zero, per-request lists cut short."""
    out = []

    def r(name, fn, names, expect="error"):
        out.append(Case("results", name, ["compare", "{F}/result.json", "{C}/r.json"],
                        setup=chain(cp("result.json", "r.json"), edit_json("r.json", fn)),
                        names=names, expect=expect))
    r("as it is", lambda d: d, (), "ok")
    r("config.resolved a list", lambda d: setin(d, "config.resolved", [1]), ("config.resolved",))
    r("config.resolved a string", lambda d: setin(d, "config.resolved", "x"),
      ("config.resolved",))
    r("resolved.prefix_cache a list", lambda d: setin(d, "config.resolved.prefix_cache", [1]),
      ("prefix_cache",))
    r("config.prefix_cache a list", lambda d: setin(d, "config.prefix_cache", [1]),
      ("prefix_cache",))
    r("prefix_cache hits past queries", lambda d: setin(d, "config.resolved.prefix_cache",
                                                        {"queries": 1, "hits": 2}),
      ("prefix_cache",))
    r("resolved.notes a string", lambda d: setin(d, "config.resolved.notes", "x"), ("notes",))
    r("num_preemptions -1", lambda d: setin(d, "config.resolved.num_preemptions", -1),
      ("num_preemptions",))
    for key in ("mean_tpot_ms", "p99_itl_ms", "mean_ttft_ms", "output_throughput"):
        r(f"{key} -1", lambda d, key=key: d.update({key: -1}), (key,))
        r(f"{key} inf", lambda d, key=key: d.update({key: "inf"}), (key,))
        r(f"{key} nan", lambda d, key=key: d.update({key: "nan"}), (), "any")
    r("duration 0", lambda d: d.update(duration=0), ("duration",))
    r("completed nan", lambda d: d.update(completed="nan"), ("completed",))
    r("ttfts cut short", lambda d: d.update(ttfts=d["ttfts"][:1]), ("ttfts",))
    r("itls one too many", lambda d: d.update(itls=d["itls"] + [[]]), ("itls",))
    r("input_lens of strings", lambda d: d.update(input_lens=["8"] * len(d["input_lens"])),
      ("input_lens",))
    r("step_gaps values negative", lambda d: setin(d, "step_gaps.values_us", [-1.0]),
      ("step_gaps",))
    return out


def faults() -> list[Case]:
    """A worker of advise --jobs 2 or sweep --jobs 2 killed (SIGKILL, as the OOM killer does),
    SIGTERM during start-up, an output where the next run reads it, one run given twice."""
    out = []
    adv = ["advise", "--gpu", "h100", "--model", "llama-3.1-8b", "--max-k", "3",
           "--num-prompts", "40", "--output-len", "64", "--max-concurrency", "1,2", "--jobs",
           "2"]
    out.append(Case("faults", "advise --jobs 2, a worker killed", adv, kill_worker=True,
                    expect="any", names=("--jobs",), timeout=300))
    out.append(Case("faults", "sweep --jobs 2, a worker killed",
                    ["sweep", "--preset", "seed-l20", "--grid", "k=0,1,2,3", "--set",
                     "num_prompts=20", "--jobs", "2", "--out", "{C}/sw"], kill_worker=True,
                    expect="any", names=("--jobs",), timeout=300))
    for t in (0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0):
        out.append(Case("faults", f"SIGTERM at {t:g} s into simulate", [*SIM, *RESULT],
                        sigterm_after=t, expect="any"))
        out.append(Case("faults", f"SIGTERM at {t:g} s into sweep --dry-run",
                        ["sweep", "--grid", "k=0,1", "--dry-run", "--out", "{C}/o"],
                        sigterm_after=t, expect="any"))
    out.append(Case("faults", "calibrate --out inside the folder it reads, new",
                    [CAL[0], "{C}/d", *CAL[2:-1], "{C}/d/p.json"],
                    setup=cp("bench.json", "d/b.json"), names=("--out",)))
    out.append(Case("faults", "calibrate --out in a subfolder of the folder it reads",
                    [CAL[0], "{C}/d", *CAL[2:-1], "{C}/d/sub/p.json"],
                    setup=cp("bench.json", "d/b.json"), names=("--out",)))
    out.append(Case("faults", "one run's bench file twice, copied",
                    [*CAL[:2], "{C}/b2.json", *CAL[2:]],
                    setup=chain(cp("bench.json", "b.json"), cp("bench.json", "b2.json")),
                    names=("b2.json", "b.json")))
    out.append(Case("faults", "one run's bench file relabelled concurrency 8",
                    [*CAL[:2], "{C}/b8.json", *[a for a in CAL[2:]]],
                    setup=chain(cp("bench.json", "b.json"), cp("bench.json", "b8.json"),
                                edit_json("b8.json", lambda d: d.update(max_concurrency=8))),
                    names=("b8.json",)))
    out.append(Case("faults", "the band past --speed's limit", [*SIM, "--band", "--speed",
                                                                "1e6", *RESULT],
                    names=("--speed 1e+06",)))
    out.append(Case("faults", "the band past --cpu-scale's limit", [*SIM, "--band",
                                                                    "--cpu-scale", "1e6",
                                                                    *RESULT],
                    names=("--cpu-scale 1e+06",)))
    out.append(Case("faults", "a folder ./llama-3.1-8b beside the preset", [*SIM, *RESULT],
                    setup=mkdir("llama-3.1-8b"), names=("llama-3.1-8b", "preset")))
    out.append(Case("faults", "--draft a model preset", [*SIM, "--draft", "llama-3.1-8b", "-k",
                                                         "2", *RESULT],
                    names=("model preset",)))
    out.append(Case("faults", "calibrate, a torch trace that matches no run",
                    ["calibrate", "{C}/v", "--model", "{F}/pair/target", "--out", "{C}/p.json"],
                    setup=chain(cp("vllm/bench.json", "v/bench.json"),
                                write("v/w.pt.trace.json", json.dumps({
                                    "vllm_version": "0.11.0", "traceEvents": [
                                        {"ph": "X", "name": "execute_context_1(4)_generation_0(0)",
                                         "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))),
                    names=("w.pt.trace.json",)))
    return out


FAMILIES = {"options": options, "advise": advise, "gpu": gpu_files, "bundle": bundles,
            "peer": peers, "gzip": bombs, "workload": workloads, "calibrate": calibrates,
            "outputs": outputs, "sweep": sweeps, "model": models, "files": filesystem,
            "parallel": parallel, "profile": profiles, "tables": tables,
            "degenerate": degenerate, "sizes": sizes, "results": results, "faults": faults}


# ---------------------------------------------------------------------------------------------
# The server

# (the sizes come from the message, so that jinja2 cannot fold them while it compiles: a
# constant 7 ** 10000000 is refused at start-up, as any template that does not compile)
TEMPLATE = ("{% for m in messages %}"
            "{% if m['content'] == 'multiply' %}{{ 'x' * (m['content']|length * 1250000000) }}"
            "{% endif %}"
            "{% if m['content'] == 'power' %}{{ 7 ** (m['content']|length * 2000000) }}"
            "{% endif %}"
            "{% if m['content'] == 'attr' %}{{ m.__class__.__mro__ }}{% endif %}"
            "{% if m['content'] == 'loop' %}{% for i in range(99999) %}{% for j in "
            "range(99999) %}{% endfor %}{% endfor %}{% endif %}"
            "# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}# assistant:{% endif %}")


@dataclass
class Req:
    name: str
    raw: bytes | None = None                  # sent as it is on a socket
    path: str = "/v1/completions"
    body: object = None                       # JSON (bytes as they are)
    method: str = "POST"
    expect: str = "4xx"                       # 4xx | 200 | any | closed (a 4xx or a close)
    param: str | None = None                  # the field a 4xx must name
    timeout: float = 60.0
    headers: dict = field(default_factory=dict)


def chat(content, **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, **kw}


def hostile_requests() -> list[Req]:
    C, H = "/v1/chat/completions", "Host: x\r\n"
    big_int = "9" * 5000
    R = []
    # the HTTP layer
    R += [
        Req("garbage bytes", raw=b"\x00\x01\x02\xff\r\n\r\n", expect="closed"),
        Req("no HTTP version", raw=b"GET /health\r\n\r\n", expect="closed"),
        Req("HTTP/2 preface", raw=b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", expect="closed"),
        Req("a header of 5 MB", raw=b"GET /health HTTP/1.1\r\n" + H.encode() + b"X-A: " +
            b"a" * (5 << 20) + b"\r\n\r\n", expect="closed", timeout=60),
        Req("50,000 headers", raw=b"GET /health HTTP/1.1\r\n" + H.encode() +
            b"".join(b"X-%d: 1\r\n" % i for i in range(50000)) + b"\r\n", expect="any"),
        Req("Content-Length -1", raw=b"POST /v1/completions HTTP/1.1\r\n" + H.encode() +
            b"Content-Length: -1\r\n\r\n", expect="closed"),
        Req("Content-Length abc", raw=b"POST /v1/completions HTTP/1.1\r\n" + H.encode() +
            b"Content-Length: abc\r\n\r\n", expect="closed"),
        Req("Content-Length of 30 digits", raw=b"POST /v1/completions HTTP/1.1\r\n" +
            H.encode() + b"Content-Length: " + BIG.encode() + b"\r\n\r\n{}", expect="closed"),
        Req("two Content-Lengths", raw=b"POST /v1/completions HTTP/1.1\r\n" + H.encode() +
            b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}", expect="closed"),
        Req("chunked, a chunk size 'zz'", raw=b"POST /v1/completions HTTP/1.1\r\n" + H.encode() +
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", expect="closed"),
        Req("chunked, a chunk of 2^64", raw=b"POST /v1/completions HTTP/1.1\r\n" + H.encode() +
            b"Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n{}\r\n", expect="closed",
            timeout=20),
        Req("half a body, then close", raw=b"POST /v1/completions HTTP/1.1\r\n" + H.encode() +
            b"Content-Length: 100\r\n\r\n{\"prompt\"", expect="closed"),
        Req("a URL of 20 KB", raw=b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n" + H.encode() +
            b"\r\n", expect="4xx"),
        Req("a URL with %00 and unicode", raw=b"GET /health%00/\xc3\xa9 HTTP/1.1\r\n" +
            H.encode() + b"\r\n", expect="4xx"),
        Req("method FOO", raw=b"FOO /v1/completions HTTP/1.1\r\n" + H.encode() + b"\r\n",
            expect="4xx"),
        Req("100 requests pipelined", raw=(b"GET /health HTTP/1.1\r\n" + H.encode() + b"\r\n")
            * 100, expect="any"),
        Req("Expect: 100-continue for 1 GB", raw=b"POST /v1/completions HTTP/1.1\r\n" +
            H.encode() + b"Expect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n",
            expect="4xx"),
        Req("Content-Encoding gzip, a bomb", body=gzip.compress(b" " * (50 << 20)),
            headers={"Content-Encoding": "gzip"}, expect="4xx"),
        Req("Content-Type text/plain", body=b'{"prompt": "x", "max_tokens": 2}',
            headers={"Content-Type": "text/plain"}, expect="any"),
    ]
    # the JSON body
    R += [
        Req("body null", body=b"null"), Req("body []", body=b"[]"),
        Req("body 100,000 deep", body=deep_json().encode()),
        Req("body of one 5,000-digit integer", body=big_int.encode()),
        Req("max_tokens of 5,000 digits", body=b'{"prompt": "x", "max_tokens": ' +
            big_int.encode() + b"}", param="max_tokens"),
        Req("a prompt id of 5,000 digits", body=b'{"prompt": [1, ' + big_int.encode() + b"]}",
            param="prompt"),
        Req("prompt [[]]", body={"prompt": [[]]}, param="prompt"),
        Req("prompt [[1, 2], []]", body={"prompt": [[1, 2], []]}, param="prompt"),
        Req("prompt: 5,000 prompts", body={"prompt": [[1, 2]] * 5000, "max_tokens": 1},
            expect="any", timeout=120),
        Req("prompt: id -1", body={"prompt": [1, -1]}, param="prompt"),
        Req("prompt: id 2**64", body={"prompt": [1, 2 ** 64]}, param="prompt"),
        Req("prompt: true", body={"prompt": True}, param="prompt"),
        Req("prompt: an object", body={"prompt": {"a": 1}}, param="prompt"),
        Req("prompt: a lone surrogate", body=b'{"prompt": "\\ud800 hello", "max_tokens": 2}',
            expect="any"),
        Req("prompt: NUL characters", body={"prompt": "\0" * 100, "max_tokens": 2},
            expect="any"),
        Req("prompt: 60,000 characters", body={"prompt": "def f(): pass\n" * 4300,
                                               "max_tokens": 2}, param="prompt"),
        Req("max_tokens 0", body={"prompt": "x", "max_tokens": 0}, param="max_tokens"),
        Req("max_tokens 10**30", body={"prompt": "x", "max_tokens": 10 ** 30},
            param="max_tokens"),
        Req("max_tokens 1e308", body=b'{"prompt": "x", "max_tokens": 1e308}',
            param="max_tokens"),
        Req("max_tokens true", body={"prompt": "x", "max_tokens": True}, param="max_tokens"),
        Req("max_tokens 2.0", body={"prompt": "x", "max_tokens": 2.0}, expect="any"),
        Req("temperature NaN", body=b'{"prompt": "x", "max_tokens": 2, "temperature": NaN}',
            param="temperature"),
        Req("temperature Infinity", body=b'{"prompt": "x", "temperature": Infinity}',
            param="temperature"),
        Req("top_p 2", body={"prompt": "x", "top_p": 2}, param="top_p"),
        Req("top_k -5", body={"prompt": "x", "top_k": -5}, param="top_k"),
        Req("top_k 0", body={"prompt": "x", "top_k": 0}, expect="any"),
        Req("seed 10**30", body={"prompt": "x", "seed": 10 ** 30}, param="seed"),
        Req("stream 'yes'", body={"prompt": "x", "stream": "yes"}, param="stream"),
        Req("stream_options a string", body={"prompt": "x", "stream": True,
                                             "stream_options": "x"}, param="stream_options"),
        Req("n 10**9", body={"prompt": "x", "n": 10 ** 9}, param="n"),
        Req("stop: 10,000 strings", body={"prompt": "x", "stop": ["a"] * 10000},
            param="stop"),
        Req("stop_token_ids [-1]", body={"prompt": "x", "stop_token_ids": [-1]},
            param="stop_token_ids"),
        Req("model a list", body={"prompt": "x", "model": ["a"]}, param="model"),
        Req("model of 5,000 characters", body={"prompt": "x", "model": "m" * 5000},
            param="model"),
        Req("echo true", body={"prompt": "x", "echo": True}, param="echo"),
        Req("ignore_eos 'false'", body={"prompt": "x", "ignore_eos": "false"},
            param="ignore_eos"),
        Req("duplicate keys", body=b'{"prompt": "x", "prompt": [1, 2], "max_tokens": 2}',
            expect="any"),
        Req("min_tokens past max_tokens", body={"prompt": "x", "max_tokens": 2,
                                                "min_tokens": 50}, param="min_tokens"),
        Req("presence_penalty NaN", body=b'{"prompt": "x", "presence_penalty": NaN}',
            param="presence_penalty"),
        Req("repetition_penalty -1", body={"prompt": "x", "repetition_penalty": -1},
            param="repetition_penalty"),
        Req("logprobs 5", body={"prompt": "x", "logprobs": 5}, param="logprobs"),
        Req("prompt_logprobs 1", body={"prompt": "x", "prompt_logprobs": 1},
            param="prompt_logprobs"),
        Req("suffix 'x'", body={"prompt": "x", "suffix": "x"}, param="suffix"),
        Req("user of 1 MB", body={"prompt": "x", "max_tokens": 2, "user": "u" * (1 << 20)},
            expect="any"),
        Req("an unknown field", body={"prompt": "x", "max_tokens": 2, "warp": 9}, expect="any"),
    ]
    # chat
    R += [
        Req("chat: messages null", path=C, body={"messages": None}, param="messages"),
        Req("chat: messages []", path=C, body={"messages": []}, param="messages"),
        Req("chat: a message without content", path=C,
            body={"messages": [{"role": "user"}], "max_tokens": 2}, expect="any"),
        Req("chat: role 5", path=C, body={"messages": [{"role": 5, "content": "hi"}]},
            param="messages.0.role"),
        Req("chat: 10,000 text parts", path=C, body=chat([{"type": "text", "text": "a"}] *
                                                         10000), expect="any"),
        Req("chat: content an object", path=C, body=chat({"a": 1}),
            param="messages.0.content"),
        Req("chat: 100,000 messages", path=C, body={"messages": [{"role": "user",
                                                                  "content": "a"}] * 100000,
                                                    "max_tokens": 2}, param="messages",
            timeout=120),
        Req("chat: the template multiplies a string by 10**10", path=C, body=chat("multiply"),
            param="messages"),
        Req("chat: the template raises 7 to the 10,000,000th", path=C, body=chat("power"),
            param="messages", timeout=120),
        Req("chat: the template reads __class__", path=C, body=chat("attr"), param="messages"),
        Req("chat: the template loops 10**10 times", path=C, body=chat("loop"),
            param="messages", timeout=120),
        Req("chat: a chat_template of its own", path=C,
            body=chat("hi", chat_template="{{ 'x' * 10000000000 }}"), expect="any"),
        Req("chat: chat_template_kwargs", path=C, body=chat("hi", chat_template_kwargs={"a": 1}),
            expect="any"),
        Req("chat: add_generation_prompt 'x'", path=C, body=chat("hi",
                                                                 add_generation_prompt="x"),
            param="add_generation_prompt"),
        Req("chat: max_completion_tokens -1", path=C, body=chat("hi", max_completion_tokens=-1),
            param="max_completion_tokens"),
        Req("chat: logprobs true", path=C, body=chat("hi", logprobs=True), param="logprobs"),
        Req("chat: tool role", path=C, body={"messages": [{"role": "tool", "content": "x",
                                                           "tool_call_id": "1"}],
                                             "max_tokens": 2}, expect="any"),
    ]
    # other endpoints
    R += [
        Req("GET /v1/completions", method="GET", body=None, expect="4xx"),
        Req("POST /health", path="/health", body={}, expect="4xx"),
        Req("/stop_profile without a start", path="/stop_profile", body=None, expect="any"),
        Req("/metrics?x=" + "a" * 100, path="/metrics?x=" + "a" * 100, method="GET",
            body=None, expect="any"),
        Req("/v1/models/../../etc/passwd", path="/v1/models/../../etc/passwd", method="GET",
            body=None, expect="4xx"),
        Req("OPTIONS *", raw=b"OPTIONS * HTTP/1.1\r\n" + H.encode() + b"\r\n", expect="any"),
        Req("HEAD /health", raw=b"HEAD /health HTTP/1.1\r\n" + H.encode() + b"\r\n",
            expect="any"),
    ]
    return R


def raw_exchange(port: int, data: bytes, timeout: float) -> bytes | None:
    """Send `data`, read until the server closes or `timeout`; None if the connection was
    refused or reset before any answer."""
    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass
            s.shutdown(socket.SHUT_WR)
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                got += piece
    except socket.timeout:
        pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except ConnectionRefusedError:
        return None
    return got


def status_of(raw: bytes) -> int | None:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw or b"")
    return int(m[1]) if m else None


def serve_sweep(fx: Path, work: Path) -> list[Result]:
    import httpx
    sdir = work / "serve"
    if sdir.exists():
        shutil.rmtree(sdir)
    target = sdir / "target"
    shutil.copytree(fx / "pair" / "target", target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    before = snapshot(target)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(sdir / "serve.log", "w+")
    argv = [str(PYTHON), "-m", "stepgap", "serve", "--model", str(target), "--draft",
            str(fx / "pair" / "eagle3"), "-k", "2", "--max-model-len", "256", "--executor",
            "process", "--num-gpu-blocks-override", "64", "--timeline", str(sdir / "run.jsonl"),
            "--result-json", str(sdir / "run.json"), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=limit_memory,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            raise SystemExit(f"the server did not start:\n{log.read()[-3000:]}")
        time.sleep(0.5)
    results = []

    def normal() -> str | None:
        try:
            r = httpx.post(url + "/v1/completions", json={"prompt": "def f(", "max_tokens": 2},
                           timeout=60)
        except httpx.TransportError as e:
            return f"the normal request after it failed: {type(e).__name__}"
        if r.status_code != 200 or r.json().get("usage", {}).get("completion_tokens") != 2:
            return f"the normal request after it got {r.status_code}: {r.text[:100]}"
        return None

    for q in hostile_requests():
        t0 = time.monotonic()
        status, param, text = None, None, ""
        if q.raw is not None:
            got = raw_exchange(port, q.raw, q.timeout)
            status = status_of(got) if got is not None else None
            text = (got or b"")[:200].decode(errors="replace")
            if status is not None and b"\r\n\r\n" in got:
                body = got.split(b"\r\n\r\n", 1)[1]
                try:
                    param = json.loads(body)["error"]["param"]
                except (ValueError, KeyError, TypeError):
                    pass
        else:
            content = q.body if isinstance(q.body, bytes) else \
                None if q.body is None else json.dumps(q.body).encode()
            headers = {"Content-Type": "application/json", **q.headers}
            try:
                r = httpx.request(q.method, url + q.path, content=content, headers=headers,
                                  timeout=q.timeout)
                status, text = r.status_code, r.text[:200]
                try:
                    param = r.json()["error"]["param"]
                except (ValueError, KeyError, TypeError):
                    pass
            except httpx.TimeoutException:
                status, text = "timeout", ""
            except httpx.TransportError as e:
                status, text = None, type(e).__name__
        secs = time.monotonic() - t0
        cmd = q.name if q.raw is not None else \
            f"{q.method} {q.path[:60]} {(q.body if isinstance(q.body, bytes) else json.dumps(q.body) if q.body is not None else b'')!s:.120}"

        def res(cls, why):
            results.append(Result("serve", q.name, cls, why, cmd,
                                  status if isinstance(status, int) else None, round(secs, 2),
                                  text.replace("\r\n", " ")[:200]))

        after = normal()
        alive = proc.poll() is None
        if not alive:
            res("BAD", f"the server died (exit {proc.returncode})")
            break
        if status == "timeout":
            res("BAD", f"no answer in {q.timeout:g} s")
        elif isinstance(status, int) and status >= 500:
            res("BAD", f"HTTP {status}: {text[:100]}")
        elif after:
            res("BAD", after)
        elif q.expect == "4xx" and status is None:
            res("POOR", "the connection was closed with no answer")
        elif q.expect in ("4xx", "closed") and status is not None and status < 400:
            res("POOR", f"HTTP {status} to nonsense")
        elif q.param is not None and isinstance(status, int) and 400 <= status < 500 \
                and param != q.param:
            res("POOR", f"HTTP {status} names {param!r}, not {q.param!r}")
        else:
            res("OK", f"HTTP {status}" if status is not None else "closed")
    # shutdown: SIGTERM's status, no traceback, the recorded run written whole, the model
    # unchanged
    log.flush()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    log.seek(0)
    text = log.read()
    tail = "; ".join(text.strip().splitlines()[-2:])[:200]
    for name, ok, why in (
            # 143: SIGTERM's status in every command (docs/reference/robustness.md, "Exit statuses")
            ("shutdown: exit 143", rc == 143, f"exit {rc}: {tail}"),
            ("no traceback in the server's log", "Traceback" not in text,
             next((x for x in text.splitlines() if "Error" in x), "")[:200]),
            ("the run written", (sdir / "run.json").is_file() and (sdir / "run.jsonl").is_file(),
             "run.json or run.jsonl missing"),
            ("the model folder unchanged", snapshot(target) == before, "changed")):
        results.append(Result("serve", name, "OK" if ok else "BAD", "" if ok else why,
                              "SIGTERM", rc, 0.0))
    return results


# ---------------------------------------------------------------------------------------------
# The sweep


def all_cases(only: set[str] | None, families: dict | None = None) -> list[Case]:
    """Every case of `families` (name -> maker; default this file's FAMILIES) among `only`,
    each named once."""
    cases = [c for name, make in (families or FAMILIES).items() if not only or name in only
             for c in make()]
    seen = Counter((c.family, c.name) for c in cases)
    dup = [k for k, n in seen.items() if n > 1]
    assert not dup, f"cases named twice: {dup[:5]}"
    return cases


def tally(results: list[Result]) -> tuple[dict[str, Counter], Counter]:
    """Each family's count of every class (OK, POOR, BAD), and all families' together."""
    counts = defaultdict(Counter)
    for r in results:
        counts[r.family][r.cls] += 1
    return counts, Counter(r.cls for r in results)


def failures(results: list[Result]) -> list[tuple[str, list[Result]]]:
    """The BAD cases, then the POOR ones."""
    return [(cls, [r for r in results if r.cls == cls]) for cls in ("BAD", "POOR")]


def report(results: list[Result]) -> str:
    counts, total = tally(results)
    lines = [f"{'family':<11}{'cases':>6}{'OK':>6}{'POOR':>6}{'BAD':>6}"]
    for f in sorted(counts):
        c = counts[f]
        lines.append(f"{f:<11}{sum(c.values()):>6}{c['OK']:>6}{c['POOR']:>6}{c['BAD']:>6}")
    lines.append(f"{'all':<11}{len(results):>6}{total['OK']:>6}{total['POOR']:>6}"
                 f"{total['BAD']:>6}")
    for cls, chosen in failures(results):
        if chosen:
            lines += ["", f"{cls} ({len(chosen)}):"]
            for r in chosen:
                lines.append(f"- [{r.family}] {r.name}: {r.why}")
                lines.append(f"    {r.cmd}")
                if r.last:
                    lines.append(f"    last line: {r.last[:200]}")
    return "\n".join(lines)


def sweep_parser(doc: str, families, results: str) -> argparse.ArgumentParser:
    """A sweep's command line (this one's, and bench/hostile_round4.py's): its docstring's first
    paragraph, then the rest as the epilog; the options every sweep takes."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=doc.split("\n\n", 1)[1])
    ap.add_argument("--work", default=None, help="working folder (default: a new one in /tmp)")
    ap.add_argument("--only", default=None, help=f"families, comma-separated: "
                                                 f"{', '.join(families)} (default all)")
    ap.add_argument("--match", default=None, help="only cases whose name holds this")
    ap.add_argument("--jobs", type=int, default=2, help="cases at once (default 2)")
    ap.add_argument("--list", action="store_true", help="list the cases, run nothing")
    ap.add_argument("--out", default=None, help=f"results as JSON lines (default: WORK/{results})")
    return ap


def work_folder(work: str | None, prefix: str) -> tuple[Path, Path]:
    """The sweep's working folder (a new one in /tmp where `work` is None) and its fixtures,
    built there once."""
    if not STEPGAP.exists():
        raise SystemExit(f"{STEPGAP}: missing; run `make install` first")
    folder = Path(work or tempfile.mkdtemp(prefix=prefix))
    folder.mkdir(parents=True, exist_ok=True)
    fx = folder / "fixtures"
    if not (fx / "bomb.gz").exists():
        if fx.exists():
            shutil.rmtree(fx)
        build_fixtures(fx)
    return folder, fx


def run_cases(cases: list[Case], run, fx: Path, work: Path, fx_before: dict, jobs: int,
              t0: float) -> list[Result]:
    """Every case through run(case, fx, work, fx_before), `jobs` at a time; what is not OK is
    printed as it comes."""
    print(f"{len(cases)} cases in {work}, {jobs} at a time", flush=True)
    results: list[Result] = []
    with cf.ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(run, c, fx, work, fx_before): c for c in cases}
        for i, fut in enumerate(cf.as_completed(futures), 1):
            c = futures[fut]
            try:
                r = fut.result()
            except Exception as e:   # the harness's own failure: say which case
                r = Result(c.family, c.name, "BAD", f"harness: {type(e).__name__}: {e}", "",
                           None, 0.0)
            results.append(r)
            if r.cls != "OK":
                print(f"  {r.cls:<4} [{r.family}] {r.name}: {r.why[:100]}", flush=True)
            if i % 50 == 0:
                print(f"{i}/{len(cases)} cases, {time.monotonic() - t0:.0f} s", flush=True)
    return results


def write_results(results: list[Result], cases: list[Case], out: Path, t0: float) -> None:
    """The results in the cases' order, as JSON lines to `out`; the report printed."""
    order = {(c.family, c.name): i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order.get((r.family, r.name), len(order)))
    out.write_text("".join(json.dumps(r.__dict__) + "\n" for r in results))
    print()
    print(report(results))
    print(f"\n{len(results)} results in {time.monotonic() - t0:.0f} s; each as JSON in {out}")


def main(argv=None) -> int:
    ap = sweep_parser(__doc__, FAMILIES, "hostile-results.jsonl")
    ap.add_argument("--serve", action="store_true", help="also the server's part")
    ap.add_argument("--serve-only", action="store_true", help="only the server's part")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    cases = [] if args.serve_only else all_cases(only)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    if args.list:
        for c in cases:
            print(f"[{c.family}] {c.name}")
        print(f"{len(cases)} cases; the server's part: {len(hostile_requests())} requests")
        return 0
    work, fx = work_folder(args.work, "stepgap-hostile-")
    fx_before = snapshot(fx)
    t0 = time.monotonic()
    results = run_cases(cases, run_case, fx, work, fx_before, args.jobs, t0)
    if args.serve or args.serve_only:
        print("the server's part", flush=True)
        results += serve_sweep(fx, work)
    write_results(results, cases, Path(args.out) if args.out else work / "hostile-results.jsonl",
                  t0)
    return 1 if any(r.cls == "BAD" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
