"""Timelines cut into samples, for the fits (calibrate/fit.py, vllm_fit.py, serve_fit.py): one
point per device op of every step (`device_points`), and the samples of every CPU term of the
step loop, as the topology's loop runs (`cpu_samples`; sim/loop.py models the same terms).

How a step is cut into terms, from its spans (docs/explanation/design.md §2 lanes and ops):

    engine:  ...update N-1 | loop | schedule N |                                 | update N ...
    worker:                               | prepare N | launch N .............| turnaround |
    device:                                           | head | op | op | ... op |

- `launch` (on the CPU) = prepare_inputs' end to the first device op: packing and copying the
  inputs, the attention metadata;
- a device op's cost runs from the end of the previous device op of its step (the Python
  between two ops belongs to issuing the next), the first op's from its own start; where the
  worker waited in between (vLLM's sample_tokens RPC), from the wait's end;
- `ipc_us` = from update N-1's end to prepare N's start, less schedule N (sync runs): the
  message's trip plus the engine loop's own turn, which has no op of its own;
- `result_latency` = the last device op's end to update N's start, when the engine was waiting;
- `worker_turnaround` = the last device op's end to prepare N+1's start, when N+1's message was
  already waiting (async runs): collecting and sending N's result, receiving N+1.

vLLM's topology (docs/explanation/vllm.md) has its engine core's RPCs instead of one message:
`rpc_mid` (the worker's wait for the sample_tokens RPC), `rpc_drafts` (take_draft_token_ids),
`ipc_us` from schedule N's end to prepare N's start, and its API server's `add_request` and
`process_outputs` (bench/vllm/stepgap_hooks.py spans). A served stepgap engine (`served`) is
stepgap's loop with `stepgap serve`'s front end: its `add_request`, and per step its process_outputs
with the stream of every chunk.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from stepgap.common.formats import Span
from stepgap.sim.profile import features

def steps_of(spans: list[Span]) -> dict[int, dict]:
    """step -> {"engine": {op: span}, "worker": {op: span}, "device": [spans by start]}."""
    out: dict[int, dict] = defaultdict(lambda: {"engine": {}, "worker": {}, "device": []})
    for s in spans:
        if s.lane == "device":
            out[s.step]["device"].append(s)
        else:
            out[s.step]["engine" if s.lane == "cpu.engine" else "worker"][s.op] = s
    for st in out.values():
        st["device"].sort(key=lambda s: s.start_us)
    return dict(out)


def _shape(dev: list[Span]) -> dict:
    """The step's batch shape, from its first device op's args (engine/worker.py)."""
    a = dev[0].args or {}
    return {"tokens": a.get("tokens", 0), "reqs": a.get("reqs", 1), "q": a.get("q") or 1,
            "blocks": a.get("blocks") or 0}


def device_points(spans: list[Span], k: int) -> list[dict]:
    """One point per device op of every step: {op, i, k, x (features), us, t (its step's
    start), step}. An op's time runs from the previous op's end (what lies between is the
    device's), except where the worker waited in between (vLLM's sample_tokens RPC on a
    synchronous device): that is the worker's, modelled apart (`rpc_mid`)."""
    points = []
    waits = defaultdict(list)
    for s in spans:
        if s.lane == "cpu.worker" and s.op == "wait":
            waits[s.step].append(s.end_us)
    for n, st in sorted(steps_of(spans).items()):
        dev = st["device"]
        if not dev:
            continue
        shape = _shape(dev)
        prev_end = None
        for s in dev:
            i = (s.args or {}).get("i") if s.op == "draft_forward" else None
            start = s.start_us
            if prev_end is not None:
                start = max([prev_end] + [e for e in waits[n] if prev_end < e <= s.start_us])
            us = s.end_us - start
            prev_end = s.end_us
            points.append({"op": s.op, "i": i, "k": k, "us": us, "t": dev[0].start_us,
                           "step": n, "x": features(s.op, i, shape["tokens"], shape["reqs"],
                                                    shape["q"], shape["blocks"])})
    return points


def _stepgap_terms(spans: list[Span], mode: str) -> dict[str, list[tuple[int, int, float]]]:
    """stepgap's step loop: one message per step to the worker, one result back."""
    steps = steps_of(spans)
    out: dict[str, list] = defaultdict(list)
    engine_ends = sorted(s.end_us for s in spans if s.lane == "cpu.engine")
    order = sorted(steps)
    for n in order:
        st = steps[n]
        for op, s in list(st["engine"].items()) + list(st["worker"].items()):
            if op in ("schedule", "update_from_output", "prepare_inputs"):
                a = s.args or {}
                out[op].append((a.get("reqs", 0), a.get("tokens", 0), s.end_us - s.start_us))
        dev, prep = st["device"], st["worker"].get("prepare_inputs")
        if not dev or prep is None:
            continue
        reqs, tokens = (prep.args or {}).get("reqs", 0), (prep.args or {}).get("tokens", 0)
        out["launch"].append((reqs, tokens, dev[0].start_us - prep.end_us))
        end = dev[-1].end_us
        upd = st["engine"].get("update_from_output")
        if upd is not None:
            i = bisect.bisect_right(engine_ends, upd.start_us)
            if i and engine_ends[i - 1] < end:   # the engine was waiting for this result
                out["result_latency"].append((reqs, tokens, upd.start_us - end))
        nxt = steps.get(n + 1)
        if nxt is None:
            continue
        sched, nprep = nxt["engine"].get("schedule"), nxt["worker"].get("prepare_inputs")
        if sched is None or nprep is None:
            continue
        if mode != "sync" and sched.end_us < end - 100.0:   # N+1's message was waiting
            out["worker_turnaround"].append((reqs, tokens, nprep.start_us - end))
        if mode == "sync" and upd is not None:
            trip = nprep.start_us - upd.end_us - (sched.end_us - sched.start_us)
            out["ipc_us"].append((0, 0, trip))
    return dict(out)


def cpu_samples(spans: list[Span], mode: str = "sync", topology: str = "stepgap"
                ) -> dict[str, list[tuple[int, int, float]]]:
    """Samples of every CPU term in one timeline: term -> [(reqs, tokens, us)] (ipc_us: reqs =
    tokens = 0), cut as `topology`'s step loop runs (module docstring); `mode`: the run's."""
    if topology == "vllm":
        return _vllm_terms(spans)
    out = _stepgap_terms(spans, mode)
    if topology == "served":
        _front_end_terms(spans, out)
    return out


def _vllm_terms(spans) -> dict[str, list[tuple[int, int, float]]]:
    """vLLM's step loop: its engine core's RPCs to the worker and its API server's hooks."""
    out = defaultdict(list)
    steps = steps_of(spans)
    upd_starts, mid_waits = {}, {}
    for n, st in steps.items():
        for op, s in st["engine"].items():
            a = s.args or {}
            if op in ("schedule", "update_from_output"):
                out[op].append((a.get("reqs", 0), a.get("tokens", 0), s.end_us - s.start_us))
            if op == "update_from_output":
                upd_starts[n] = s
    for s in spans:
        a = s.args or {}
        if s.lane == "cpu.engine" and s.op == "wait" and a.get("on") == "take_draft_token_ids":
            sched = steps.get(s.step, {}).get("engine", {}).get("schedule")
            b = (sched.args or {}) if sched is not None else {}
            out["rpc_drafts"].append((b.get("reqs", 0), b.get("tokens", 0),
                                      s.end_us - s.start_us))
        elif s.lane == "cpu.frontend" and s.op == "process_outputs":
            out["process_outputs"].append((a.get("reqs", 0), 0, s.end_us - s.start_us))
        elif s.lane == "cpu.frontend" and s.op == "add_request":
            out["add_request"].append((1, 0, s.end_us - s.start_us))
        elif s.op == "wait" and a.get("on") == "sample_tokens RPC":
            mid_waits.setdefault(s.step, s)
    for n, st in sorted(steps.items()):
        dev = st["device"]
        prep = st["worker"].get("prepare_inputs")
        if not dev or prep is None:
            continue
        a = dev[0].args or {}
        reqs, tokens = a.get("reqs", 0), a.get("tokens", 0)
        out["prepare_inputs"].append((reqs, tokens, prep.end_us - prep.start_us))
        out["launch"].append((reqs, tokens, dev[0].start_us - prep.end_us))
        wait = mid_waits.get(n)
        if wait is not None:
            out["rpc_mid"].append((reqs, tokens, wait.end_us - wait.start_us))
        upd = upd_starts.get(n)
        if upd is not None and upd.start_us > dev[-1].end_us:
            out["result_latency"].append((reqs, tokens, upd.start_us - dev[-1].end_us))
        sched = st["engine"].get("schedule")
        if sched is not None and prep.start_us > sched.end_us:
            out["ipc_us"].append((0, 0, prep.start_us - sched.end_us))
    return out


def _front_end_terms(spans, out: dict) -> None:
    """`stepgap serve`'s front end (its timeline's cpu.frontend lane): add_request, and per
    step its process_outputs span with that step's stream spans (each chunk written)."""
    per_step = defaultdict(lambda: [0, 0, 0.0])   # step -> [reqs, tokens, front-end us]
    for s in spans:
        a, us = s.args or {}, s.end_us - s.start_us
        if s.lane == "cpu.frontend" and s.op == "add_request":
            out.setdefault("add_request", []).append((a.get("reqs", 1), a.get("tokens", 0), us))
        elif s.lane == "cpu.frontend" and s.op in ("process_outputs", "stream"):
            p = per_step[s.step]
            if s.op == "stream":
                p[0] += 1
                p[1] += a.get("tokens", 0)
            p[2] += us
    out["process_outputs"] = [tuple(p) for p in per_step.values() if p[0]]
