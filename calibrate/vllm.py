"""vLLM as the measured side: its profiler traces, its metrics and its benchmark files, read into
stepgap's formats (docs/explanation/design.md §8; docs/explanation/vllm.md says how each mapping was
read off vLLM 0.32).

- `vllm_timeline`: the torch-profiler traces a vLLM server writes (the worker's, and the API
  server's) become a stepgap timeline on docs/explanation/design.md's lanes and ops (`SCOPES`), step
  by step; the spans of bench/vllm/stepgap_hooks.py (vLLM's engine core and API server, which its
  profiler does not trace) join them on the same clock. What maps to no op keeps vLLM's name in
  `args["vllm"]`.
- `acceptance_from_scrapes`: two `/metrics` scrapes become an acceptance profile (per-position
  rates, as `stepgap simulate --acceptance FILE` takes them).
(`vllm bench serve` files are read by common/vllm_bench.py, which every command can take.)
"""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict, deque
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from stepgap.common.acceptance import FILE_FORMAT
from stepgap.common.errors import UserError, where
from stepgap.common.fileio import decode_text, gunzip, parse_json, read_bytes
from stepgap.common.formats import LANES, Span
from stepgap.common.limits import is_finite
from stepgap.common.options import MAX_K, add_command

# vLLM 0.32's annotations (VLLM_CUSTOM_SCOPES_FOR_PROFILING=1; vllm/v1/worker/gpu_model_runner.py
# record_function scopes, vllm/v1/worker/gpu_worker.py annotate_profile) -> (lane, op). Several
# vLLM scopes can make one op: the forward and its logits (postprocess) are one target forward,
# the output's steps one d2h. On a CPU the device lane is the worker's own compute.
SCOPES = {
    "gpu_model_runner: preprocess": ("cpu.worker", "prepare_inputs"),
    "gpu_model_runner: forward": ("device", "target_forward"),
    "gpu_model_runner: postprocess": ("device", "target_forward"),
    "gpu_model_runner: sample": ("device", "rejection_sample"),
    "gpu_model_runner: draft": ("device", "draft_forward"),
    "gpu_model_runner: bookkeep": ("device", "d2h"),
    "gpu_model_runner: eplb": ("device", "d2h"),
    "gpu_model_runner: ModelRunnerOutput": ("device", "d2h"),
    "gpu_model_runner: AsyncGPUModelRunnerOutput": ("device", "d2h"),
    "gpu_model_runner: set_async_sampled_token_ids": ("device", "d2h"),
}
HOOK_MARGIN_US = 50_000   # hook spans this far outside the worker's steps may still be theirs
# One engine step on the worker: the execute_model RPC's annotation.
STEP = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
# The first op of each EAGLE draft pass after the first (vllm/v1/spec_decode/llm_base_proposer.py
# _update_positions_dependent_metadata; on a CPU the kernel's CPU replacement).
PASS_MARKS = ("eagle_step_slot_mapping_metadata", "eagle_step_update_slot_mapping")


@dataclass
class Source:
    """One process's events on the Unix-epoch microsecond clock: a torch-profiler trace, or a
    stepgap_hooks span file. `events` are dicts {name, ts, dur, cat} by start: vLLM's
    annotations (cat user_annotation), ops (cpu_op, or a GPU's kernel/cuda_runtime) and, from the
    hooks, the spans of lanes the profiler does not trace (cat "hook", with lane, op, args)."""

    path: Path
    role: str            # "worker", "api_server", "engine_core"
    events: list[dict]

    @cached_property
    def starts(self) -> list[float]:
        return [e["ts"] for e in self.events]

    @cached_property
    def annotations(self) -> tuple[list[dict], list[float]]:
        """vLLM's annotations (user_annotation events), with their starts."""
        ann = [e for e in self.events if e["cat"] == "user_annotation"]
        return ann, [e["ts"] for e in ann]

    def inside(self, start: float, end: float) -> list[dict]:
        """The events that start in [start, end]."""
        return self.events[bisect_left(self.starts, start):bisect_right(self.starts, end)]


def read_trace(path, data: bytes | None = None) -> Source:
    """One torch-profiler trace of a vLLM process (`*.pt.trace.json[.gz]`; `data`: its bytes,
    where already read)."""
    path = Path(path)
    data = read_bytes(path) if data is None else data
    if data[:2] == b"\x1f\x8b":   # decompressed a piece at a time, capped (a gzip bomb)
        data = gunzip(data, path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text (a torch-profiler trace is JSON)") from None
    doc = parse_json(text, path)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise UserError(f"{path}: not a torch-profiler trace (no traceEvents list)")
    base = doc.get("baseTimeNanoseconds") or 0
    if not is_finite(base) or base < 0:
        raise UserError(f"{where(path, field='baseTimeNanoseconds')}: expected nanoseconds "
                        f">= 0, got {base!r}")
    events = []
    # A complete ("X") event is a span: its name, start and duration must be ones (a NaN or a
    # negative duration would become a span that ends before it starts).
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        at = f"traceEvents[{i}]"
        name, ts, dur, args = e.get("name"), e.get("ts"), e.get("dur"), e.get("args")
        if not isinstance(name, str) or not name:
            raise UserError(f"{where(path, field=f'{at}.name')}: expected an event name, "
                            f"got {name!r}")
        for key, v in (("ts", ts), ("dur", dur)):
            if not is_finite(v) or (key == "dur" and v < 0):
                raise UserError(f"{where(path, field=f'{at}.{key}')}: expected microseconds"
                                f"{' >= 0' if key == 'dur' else ''}, got {v!r} (event "
                                f"{name!r})")
        if args is not None and not isinstance(args, dict):
            raise UserError(f"{where(path, field=f'{at}.args')}: expected an object, got "
                            f"{args!r}")
        events.append({"name": name, "ts": ts + base / 1000.0, "dur": dur,
                       "cat": e.get("cat"), "args": args or {}})
    names = {e["args"].get("name") for e in doc["traceEvents"] if isinstance(e, dict)
             and e.get("ph") == "M" and e.get("name") == "process_name"
             and isinstance(e.get("args"), dict)}
    worker = any(STEP.match(e["name"]) for e in events) or "VLLM::Worker" in names
    if "vllm_version" not in doc and not worker:
        raise UserError(f"{path}: not a vLLM profile (no vllm_version and no "
                        "execute_context annotation: was it written by a vLLM server with "
                        "--profiler-config?)")
    return Source(path, "worker" if worker else "api_server",
                  sorted(events, key=lambda e: e["ts"]))


def read_hooks(path, data: bytes | None = None) -> Source:
    """One process's spans of bench/vllm/stepgap_hooks.py (JSON lines of lane, op, start_us,
    end_us, args): its worker scopes as annotations, the other lanes' spans as they are. Read as
    every loader reads (common/fileio.py), and every span checked: a line that is not one names
    its line and field."""
    path = Path(path)
    events = []
    text = decode_text(read_bytes(path) if data is None else data, path)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        d = parse_json(line, path, n)
        if not isinstance(d, dict):
            raise UserError(f"{where(path, n)}: not a span of stepgap_hooks (an object of lane, "
                            f"op, start_us, end_us), got {type(d).__name__}")
        lane, op, args = d.get("lane"), d.get("op"), d.get("args")
        if lane not in LANES:
            raise UserError(f"{where(path, n, 'lane')}: unknown lane {lane!r}" + (
                "; not a span of stepgap_hooks (lane, op, start_us, end_us)" if lane is None
                else ""))
        if not isinstance(op, str) or not op:
            raise UserError(f"{where(path, n, 'op')}: expected an op name, got {op!r}")
        t0, t1 = (_span_time(d, key, path, n) for key in ("start_us", "end_us"))
        if t1 < t0:
            raise UserError(f"{where(path, n, 'end_us')}: {t1:.1f} is before start_us {t0:.1f}")
        if args is not None and not isinstance(args, dict):
            raise UserError(f"{where(path, n, 'args')}: expected an object, got {args!r}")
        args = args or {}
        if op == "vllm" and lane != "cpu.worker":
            continue   # the engine core's own scopes: its schedule and update spans say it all
        if lane == "cpu.worker" and op == "vllm":
            events.append({"name": str(args.get("vllm", "")), "ts": t0, "dur": t1 - t0,
                           "cat": "user_annotation"})
        else:
            events.append({"name": op, "ts": t0, "dur": t1 - t0, "cat": "hook", "lane": lane,
                           "args": args})
    lanes = {e.get("lane") for e in events}
    role = "worker" if any(e["cat"] == "user_annotation" for e in events) else \
        "engine_core" if "cpu.engine" in lanes else "api_server"
    return Source(path, role, sorted(events, key=lambda e: e["ts"]))


HOOK_LINE = re.compile(rb'(?:\xef\xbb\xbf)?\s*\{\s*"lane"\s*:')   # a stepgap_hooks span's start


def _span_time(d: dict, key: str, path, n: int) -> float:
    v = d.get(key)
    if not is_finite(v):
        raise UserError(f"{where(path, n, key)}: expected microseconds (a finite number), got "
                        f"{v!r}")
    return float(v)


def read_source(path) -> Source:
    """A torch-profiler trace, or a stepgap_hooks span file: by its content (gzip, or a
    traceEvents object: a trace), else a `.jsonl` name or a first line that is a span (hooks);
    anything else is read as a trace, and named as not being one."""
    data = read_bytes(path)
    if data[:2] == b"\x1f\x8b" or data[:64].lstrip()[:1] == b"{" and b"traceEvents" in \
            data[:4096]:
        return read_trace(path, data)
    if str(path).endswith(".jsonl") or HOOK_LINE.match(data[:256]):
        return read_hooks(path, data)
    return read_trace(path, data)


def worker_steps(src: Source, window: tuple[float, float] | None = None) -> list[dict]:
    """The worker's steps: each execute_context annotation, the vLLM scopes that follow it up to
    the next one, and its shape ({reqs, tokens, prefill, decode, q})."""
    ann, starts = src.annotations
    if window is not None:   # the window's annotations, and the next one (its last step's end)
        ann = ann[bisect_left(starts, window[0]):bisect_right(starts, window[1]) + 64]
        starts = [e["ts"] for e in ann]
    marks = [e for e in ann if STEP.match(e["name"])]
    steps = []
    for i, m in enumerate(marks):
        if window is not None and not window[0] <= m["ts"] <= window[1]:
            continue
        end = marks[i + 1]["ts"] if i + 1 < len(marks) else math.inf
        c, ct, g, gt = (int(x) for x in STEP.match(m["name"]).groups())
        inside = ann[bisect_left(starts, m["ts"]):bisect_right(starts, end)]
        scopes = [e for e in inside if e is not m and e["ts"] < end]
        steps.append({"mark": m, "scopes": scopes, "reqs": c + g, "tokens": ct + gt,
                      "prefill": c, "decode": g,
                      "q": max(ct // c if c else 0, gt // g if g else 0) or 1})
    return steps


def _draft_passes(src: Source, draft: dict) -> list[tuple[float, float]]:
    """The EAGLE proposer's passes inside one `draft` scope, as (start, end), tiling it: cut
    where each later pass starts (in a trace, its position-update kernel; from the hooks, its
    forward context)."""
    t0, t1 = draft["ts"], draft["ts"] + draft["dur"]
    inside = src.inside(t0, t1)
    cuts = [e["ts"] for e in inside if any(m in e["name"] for m in PASS_MARKS)]
    if not cuts:
        cuts = [e["ts"] for e in inside if e["name"] == "draft pass"][1:]
    bounds = [t0, *cuts, t1]
    return list(zip(bounds, bounds[1:]))


def _gpu_kernels(src: Source) -> dict[int, list[dict]]:
    """On a GPU trace: kernel and memcpy events by the correlation id of their launch."""
    out = defaultdict(list)
    for e in src.events:
        if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset"):
            cid = e["args"].get("correlation")
            if cid is not None:
                out[cid].append(e)
    return out


def _device_time(src: Source, kernels: dict, start: float, end: float):
    """(first kernel start, last kernel end) of the kernels launched from host [start, end]
    (a GPU trace), or None when nothing ran on a GPU."""
    ks = [k for e in src.inside(start, end) if e["cat"] == "cuda_runtime"
          for k in kernels.get(e["args"].get("correlation"), ())]
    if not ks:
        return None
    return min(k["ts"] for k in ks), max(k["ts"] + k["dur"] for k in ks)


def step_spans(src: Source, n: int, step: dict, kernels: dict) -> list[Span]:
    """One worker step as spans: prepare_inputs on the worker; target_forward, rejection_sample,
    draft_forward i and d2h on the device (a GPU's kernels where the trace has them, else the
    worker's own compute)."""
    shape = {"reqs": step["reqs"], "tokens": step["tokens"], "q": step["q"],
             "prefill": step["prefill"], "decode": step["decode"]}
    by_op: dict[tuple[str, str], list[dict]] = defaultdict(list)
    other = []
    for e in step["scopes"]:
        key = SCOPES.get(e["name"])
        if key:
            by_op[key].append(e)
        elif e["name"] != "draft pass":
            other.append(e)
    spans = []

    def add(lane, op, t0, t1, names, **args):
        dev = _device_time(src, kernels, t0, t1) if lane == "device" and kernels else None
        a, b = dev or (t0, t1)
        spans.append(Span(lane, op, n, a, b, {**shape, **args, "vllm": names}))

    for (lane, op), evs in sorted(by_op.items(), key=lambda kv: min(e["ts"] for e in kv[1])):
        names = sorted({e["name"] for e in evs})
        t0, t1 = min(e["ts"] for e in evs), max(e["ts"] + e["dur"] for e in evs)
        if op == "draft_forward":
            for i, (a, b) in enumerate(_draft_passes(src, evs[0])):
                add(lane, op, a, b, names, i=i, **({"tokens": step["reqs"], "q": 1} if i
                                                   else {}))
        else:
            add(lane, op, t0, t1, names)
    for e in other:   # a scope stepgap has no op for: kept, with vLLM's name
        spans.append(Span("cpu.worker", "unmapped", n, e["ts"], e["ts"] + e["dur"],
                          {"vllm": e["name"]}))
    return spans


def vllm_timeline(paths, window: tuple[float, float] | None = None) -> list[Span]:
    """A vLLM server's traces and stepgap_hooks span files as one timeline, microseconds from
    its first worker step (`paths` may hold Sources already read). The worker's steps come from
    its torch-profiler trace where one is given, else from its hook spans; `window` (epoch
    microseconds) keeps the steps of one run.
    Worker `wait` spans cover its unannotated gaps: before a step (blocked on the engine core,
    at the shared-memory queue's dequeue) and between its execute_model and sample_tokens RPCs."""
    sources = [p if isinstance(p, Source) else read_source(p) for p in paths]
    workers = [s for s in sources if s.role == "worker"]
    traced = [s for s in workers if not s.path.name.endswith(".jsonl")]
    if len(traced) > 1 or (not traced and len(workers) > 1):
        raise UserError("give one worker trace per timeline (one profiled run): got "
                        + ", ".join(str(s.path) for s in (traced or workers)))
    if not workers:
        raise UserError(f"{', '.join(str(p) for p in paths)}: no worker among them (a trace "
                        "named rank0.*.pt.trace.json.gz, or the worker's hook spans)")
    w = (traced or workers)[0]
    kernels = _gpu_kernels(w)
    steps = worker_steps(w, window)
    if not steps:
        raise UserError(f"{w.path}: no execute_context step" + (" in the window" if window
                        else "") + ": not a vLLM worker of a served run")
    spans: list[Span] = []
    prev_end = None
    for n, st in enumerate(steps):
        sp = step_spans(w, n, st, kernels)
        t0 = st["mark"]["ts"]
        if prev_end is not None and t0 > prev_end:
            spans.append(Span("cpu.worker", "wait", n, prev_end, t0,
                              {"on": "engine core", "vllm": "shm_broadcast dequeue"}))
        fwd = [s for s in sp if s.op == "target_forward"]
        smp = [s for s in sp if s.op == "rejection_sample"]
        if fwd and smp and smp[0].start_us > fwd[-1].end_us and not kernels:
            spans.append(Span("cpu.worker", "wait", n, fwd[-1].end_us, smp[0].start_us,
                              {"on": "sample_tokens RPC", "vllm": "shm_broadcast dequeue"}))
        spans += sp
        ends = [s.end_us for s in sp if s.lane != "device" or not kernels]
        prev_end = max(ends + [st["mark"]["ts"] + st["mark"]["dur"]])
    lo, hi = steps[0]["mark"]["ts"] - HOOK_MARGIN_US, prev_end + HOOK_MARGIN_US
    others = [e for s in sources if s is not w for e in s.inside(lo, hi) if e["cat"] == "hook"]
    spans += hook_spans(others, steps)
    t_first = steps[0]["mark"]["ts"]
    return sorted((s._replace(start_us=s.start_us - t_first, end_us=s.end_us - t_first)
                   for s in spans), key=lambda s: (s.start_us, s.end_us))


def _first_schedule(sched: list[dict], steps: list[dict], probe: int = 24) -> int:
    """The index of step 0's schedule in `sched` (negative when it lies before them): the
    offset at which each schedule ends before its step starts (under async scheduling the next
    step is scheduled before the worker has even begun the current one) and the token counts
    agree best."""
    def score(s0):
        good = bad = 0
        for i, st in enumerate(steps[:probe]):
            if 0 <= s0 + i < len(sched):
                e = sched[s0 + i]
                if e["ts"] + e["dur"] > st["mark"]["ts"]:
                    bad += 1
                else:
                    good += 1 + (e["args"].get("tokens") == st["tokens"])
        return good - 4 * bad
    before = sum(1 for e in sched if e["ts"] + e["dur"] <= steps[0]["mark"]["ts"])
    return max(range(before - 3, before + 1), key=lambda s0: (score(s0), -abs(before - 1 - s0)))


def hook_spans(events: list[dict], steps: list[dict]) -> list[Span]:
    """The engine core's and API server's hook spans around the worker's steps, with step
    numbers: a `schedule` belongs to the next worker step that starts after it; the i-th
    update_from_output to the i-th schedule's step (vLLM updates in schedule order);
    process_outputs and the engine core's wait for the drafts (its post-step) to the update
    before them; add_request to the step scheduled next."""
    starts = [st["mark"]["ts"] for st in steps]
    last = steps[-1]["mark"]["ts"] + steps[-1]["mark"]["dur"]
    lo, hi = starts[0] - HOOK_MARGIN_US, last + HOOK_MARGIN_US
    raw = sorted((e for e in events if lo <= e["ts"] <= hi), key=lambda e: e["ts"])
    sched = [e for e in raw if e["name"] == "schedule" and e["lane"] == "cpu.engine"]
    s0 = _first_schedule(sched, steps)
    step_of = {s0 + i: i for i in range(len(steps)) if 0 <= s0 + i < len(sched)}
    out = [(n, sched[i]) for i, n in step_of.items()]
    queue = deque(range(len(sched)))   # schedules not yet updated, oldest first
    upd = []
    for u in (e for e in raw if e["name"] == "update_from_output"):
        if not queue or sched[queue[0]]["ts"] + sched[queue[0]]["dur"] > u["ts"]:
            continue   # the update of a step scheduled before the window
        i = queue.popleft()
        if i in step_of:
            upd.append((step_of[i], u))
    out += upd
    upd_ends = sorted((u["ts"] + u["dur"], n) for n, u in upd)
    ends = [t for t, _ in upd_ends]
    for e in raw:
        if e["name"] in ("schedule", "update_from_output"):
            continue
        if e["name"] == "process_outputs" or e["name"] == "wait" and e["lane"] == "cpu.engine":
            k = bisect_right(ends, e["ts"]) - 1   # the output, or the drafts, of that step
            n = upd_ends[k][1] if k >= 0 else None
        else:
            j = bisect_left(starts, e["ts"] + e["dur"])
            n = j if j < len(starts) else None
        if n is not None:
            out.append((n, e))
    return [Span(e["lane"], e["name"], n, e["ts"], e["ts"] + e["dur"], e.get("args") or None)
            for n, e in out]


# ---------------------------------------------------------------------------------------------
# Metrics


SPEC = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def parse_metrics(text: str, source) -> dict:
    """The spec-decode counters of one Prometheus scrape: {num_drafts, num_draft_tokens,
    num_accepted_tokens, per_pos: {position: count}}, summed over engines."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {key: 0.0 for key in SPEC}
    out["per_pos"] = defaultdict(float)
    found = False
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                name = s.name.removeprefix("vllm:spec_decode_").removesuffix("_total")
                if not s.name.startswith("vllm:spec_decode_") or not s.name.endswith("_total"):
                    continue
                found = True
                # a counter is a count: NaN, an infinity or a negative one is no measurement
                if not math.isfinite(s.value) or s.value < 0:
                    raise UserError(f"{source}: {s.name}: expected a count (a finite number "
                                    f">= 0), got {s.value!r}")
                if name in SPEC:
                    out[name] += s.value
                elif name == "num_accepted_tokens_per_pos":
                    pos = s.labels.get("position", "")
                    if not pos.isdigit() or int(pos) >= MAX_K:
                        raise UserError(f"{source}: {s.name}: expected a position from 0 to "
                                        f"{MAX_K - 1} (a draft token of the step), got "
                                        f"position={pos!r}")
                    out["per_pos"][int(pos)] += s.value
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{source}: not Prometheus text ({e})") from None
    if not found:
        raise UserError(f"{source}: no vllm:spec_decode_* counters (a scrape of a vLLM server "
                        "with --speculative-config, taken from its /metrics)")
    return out


def acceptance_from_scrapes(after: str, before: str | None = None, source="scrape",
                            before_source="before") -> dict:
    """Per-position acceptance between two scrapes (the counters are cumulative since the
    server started), as an acceptance profile file."""
    a = parse_metrics(after, source)
    b = parse_metrics(before, before_source) if before is not None else None
    d = {key: a[key] - (b[key] if b else 0.0) for key in SPEC}
    pos = sorted(a["per_pos"])
    per = [a["per_pos"][p] - (b["per_pos"].get(p, 0.0) if b else 0.0) for p in pos]
    if any(x < 0 for x in [*d.values(), *per]):
        raise UserError(f"{before_source}: its counters exceed {source}'s: is it the scrape "
                        "before the run, of the same server?")
    drafts, draft_tokens, accepted = (d[key] for key in SPEC)
    if drafts <= 0:
        raise UserError(f"{source}: no drafts between the two scrapes (give --before the "
                        "scrape taken before the run, and check the run used the server)")
    if not pos:
        raise UserError(f"{source}: no vllm:spec_decode_num_accepted_tokens_per_pos counters: "
                        "the per-position acceptance cannot be read (a vLLM server with "
                        "--speculative-config writes one per draft position)")
    if pos != list(range(len(pos))):
        missing = min(set(range(max(pos) + 1)) - set(pos))
        raise UserError(f"{source}: vllm:spec_decode_num_accepted_tokens_per_pos has no "
                        f"position {missing} (it has {', '.join(map(str, pos))}): positions "
                        "run from 0 to k-1")
    rates = [c / drafts for c in per]
    over = [(p, r) for p, r in zip(pos, rates) if r > 1]
    if over:
        raise UserError(f"{source}: position {over[0][0]} accepted {over[0][1]:.2f} tokens per "
                        "draft (at most 1): the counters are not of one server's run")
    return {"format": FILE_FORMAT, "k": len(pos), "rates": rates,
            "num_drafts": int(drafts), "num_draft_tokens": int(draft_tokens),
            "num_accepted_tokens": int(accepted), "acceptance_length": 1 + accepted / drafts,
            "source": f"vllm:spec_decode_* counters, {before_source} -> {source}"}


# ---------------------------------------------------------------------------------------------
# The command: `stepgap ingest`


INGEST_EPILOG = """\
the workflow (docs/explanation/vllm.md shows it end to end on the committed data):
  # 1. a short profiled vLLM sync run (the server with --profiler-config, the bench with
  #    --profile), then ingest its worker and API-server traces as a stepgap timeline
  vllm serve MODEL --profiler-config '{"profiler": "torch", "torch_profiler_dir": "prof",
      "torch_profiler_with_stack": false}' --no-async-scheduling ...
  vllm bench serve ... --profile --save-result --save-detailed --result-dir runs
  stepgap ingest vllm-profile prof/*.pt.trace.json.gz --out timeline.jsonl
  stepgap plot timeline vllm=timeline.jsonl --out timeline.png
  # 2. the acceptance between two /metrics scrapes taken around a run
  curl -s localhost:8000/metrics > before.txt; vllm bench serve ...; curl ... > after.txt
  stepgap ingest vllm-metrics after.txt --before before.txt --out acceptance.json
  # 3. a bench file as a run result and the trace that produced it
  stepgap ingest vllm-bench runs/RESULT.json --out result.json --trace-out trace.jsonl
  # then: stepgap calibrate (see its --help)
"""


def register(sub) -> None:
    p = add_command(sub, "ingest", help="read vLLM's profiler traces, metrics and bench files",
                    description="Read what a vLLM server and `vllm bench serve` write into "
                    "stepgap's formats.", epilog=INGEST_EPILOG)
    psub = p.add_subparsers(dest="what", metavar="WHAT")
    p.set_defaults(func=lambda args: p.print_help() or 2)
    q = add_command(psub, "vllm-profile", help="torch-profiler traces -> a stepgap timeline",
                    description="A vLLM server's torch-profiler traces (the worker's "
                    "rank0.*.pt.trace.json.gz and the API server's) as a stepgap timeline "
                    "on docs/explanation/design.md's lanes and ops (docs/explanation/vllm.md "
                    "has the mapping); "
                    "stepgap_hooks span files add the engine core's and the API server's "
                    "spans.")
    q.add_argument("traces", nargs="+", metavar="TRACE")
    q.add_argument("--out", required=True, metavar="TIMELINE.jsonl")
    q.add_argument("--chrome", metavar="JSON", help="also a Chrome-trace/Perfetto file")
    q.set_defaults(func=cmd_ingest_profile)
    q = psub.add_parser("vllm-metrics", help="/metrics scrapes -> an acceptance profile",
                        description="vLLM's spec-decode counters (vllm:spec_decode_num_drafts, "
                        "..._num_draft_tokens, ..._num_accepted_tokens, "
                        "..._num_accepted_tokens_per_pos) between two scrapes, as per-position "
                        "acceptance rates for `stepgap simulate --acceptance FILE`.")
    q.add_argument("scrape", metavar="SCRAPE", help="the scrape after the run")
    q.add_argument("--before", metavar="SCRAPE0",
                   help="the scrape before it (counters are cumulative since the server "
                        "started); without it, everything since the start")
    q.add_argument("--out", required=True, metavar="ACCEPTANCE.json")
    q.set_defaults(func=cmd_ingest_metrics)
    q = psub.add_parser("vllm-bench", help="a vllm bench serve result -> a run result and trace",
                        description="A `vllm bench serve --save-result --save-detailed` file "
                        "as a stepgap run result (its own per-request lists, so it pools and "
                        "compares like any result) and the trace that produced it.")
    q.add_argument("result", metavar="RESULT.json")
    q.add_argument("--out", metavar="RESULT.json", help="the run result")
    q.add_argument("--trace-out", metavar="TRACE.jsonl", help="the trace (lengths; arrivals)")
    q.set_defaults(func=cmd_ingest_bench)


def cmd_ingest_profile(args) -> int:
    from stepgap.common.fileio import check_distinct, check_writable
    from stepgap.common.formats import save_chrome_trace, save_timeline, step_gaps
    check_distinct([("--out", args.out), ("--chrome", args.chrome)])
    check_writable(args.out, "--out")
    if args.chrome:
        check_writable(args.chrome, "--chrome")
    spans = vllm_timeline(args.traces)
    gaps = step_gaps(spans)
    steps = len({s.step for s in spans})
    med = statistics.median(gaps) if gaps else 0.0
    unmapped = sum(1 for s in spans if s.op == "unmapped")
    # printed before the files are written: a stdout that fails leaves nothing behind
    print(f"timeline: {args.out} ({steps} steps, {len(spans)} spans, {unmapped} unmapped; "
          f"median step gap {med:.0f} us)", flush=True)
    save_timeline(args.out, spans)
    if args.chrome:
        save_chrome_trace(args.chrome, spans, "vllm")
    return 0


def cmd_ingest_metrics(args) -> int:
    from stepgap.common.fileio import check_writable, read_text, write_json
    check_writable(args.out, "--out")
    doc = acceptance_from_scrapes(read_text(args.scrape), read_text(args.before)
                                  if args.before else None, args.scrape, args.before)
    print(f"acceptance: {args.out} (k={doc['k']}, {doc['num_drafts']} drafts, length "
          f"{doc['acceptance_length']:.3f}, per position "
          f"{', '.join(f'{r:.3f}' for r in doc['rates'])})", flush=True)
    write_json(args.out, doc)
    return 0


def cmd_ingest_bench(args) -> int:
    from stepgap.common.run_result import bench_result
    from stepgap.common.vllm_bench import bench_requests, merged_chunks, read_bench
    from stepgap.common.fileio import check_distinct, check_writable
    from stepgap.common.formats import format_summary, save_result, save_trace
    check_distinct([("--out", args.out), ("--trace-out", args.trace_out)])
    for path, option in ((args.out, "--out"), (args.trace_out, "--trace-out")):
        if path:
            check_writable(path, option)
    doc = read_bench(args.result)
    res = bench_result(doc, args.result)
    merged = merged_chunks(doc, args.result)
    if merged:
        print(f"warning: {merged}")
    print(format_summary(res, f"vllm bench serve: {Path(args.result).name}"), flush=True)
    if args.out:
        save_result(args.out, res)
    if args.trace_out:
        save_trace(args.trace_out, bench_requests(doc, args.result))
    return 0
