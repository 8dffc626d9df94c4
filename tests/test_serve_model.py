"""The simulator's `served` topology (sim/loop.py) and the fit of the HTTP path's costs
(calibrate/serve_fit.py) on served timelines, with no server: timelines built from known costs."""

import json
from pathlib import Path

import numpy as np
import pytest

from stepgap.calibrate.samples import cpu_samples
from stepgap.calibrate.serve_fit import fit_served, run_level
from stepgap.common.errors import UserError
from stepgap.common.formats import Span, TraceRequest
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from stepgap.sim.profile import features, load_profile, save_profile

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "checkpoints" / "pystdlib"
BASE = ROOT / "traces" / "measured" / "cpu" / "profile.json"


BASE_DOC = json.loads(BASE.read_text())
BASE_PROFILE = load_profile(BASE)


def served_timeline(steps: int = 40, seed: int = 0, level: float = 1.0) -> list[Span]:
    """A served sync k=0 run whose every time is a known function of its step's shape, times
    the machine's `level` (its device ops take `level` times the base profile's prediction):
    schedule 10 + 2/req, message to the worker 90, result back 150 + 10/req,
    update_from_output 30 + 5/req, process_outputs 20 + 0.5/req and each chunk's stream
    60 + 1/token, add_request 300 + 2/prompt token."""
    fit = next(f["coef"] for f in BASE_DOC["device_ops"]
               if f["op"] == "target_forward" and f["k"] == 0)
    spans, t = [], 0.0

    def add(lane, op, n, us, **args):
        spans.append(Span(lane, op, n, t, t + us * level, args))
        return us * level

    for n in range(steps):
        reqs = 1 + (n * 7 + seed) % 4
        tokens = [1 + (n + i) % 5 for i in range(reqs)]
        shape = {"reqs": reqs, "tokens": sum(tokens)}
        t += add("cpu.engine", "schedule", n, 10 + 2 * reqs, **shape)
        t += 90 * level
        t += add("cpu.worker", "prepare_inputs", n, 50, **shape)
        t += 5 * level
        x = features("target_forward", None, reqs, reqs, 1, 4 * reqs)
        t += add("device", "target_forward", n, float(np.dot(fit, x)), reqs=reqs, tokens=reqs,
                 q=1, blocks=4 * reqs)
        t += (150 + 10 * reqs) * level
        t += add("cpu.engine", "update_from_output", n, 30 + 5 * reqs, **shape)
        t_front, t = t, t    # the front end's work overlaps the next step's
        t += add("cpu.frontend", "process_outputs", n, 20 + 0.5 * reqs, reqs=reqs)
        for tok in tokens:
            t += add("cpu.frontend", "stream", n, 60 + tok, reqs=1, tokens=tok)
        t = t_front
    for i in range(8):
        prompt = 40 + 9 * i
        t += add("cpu.frontend", "add_request", -1, 300 + 2 * prompt, reqs=1, tokens=prompt)
    return spans


def run(k: int, client: float, server: float, seed: int = 0, level: float = 1.0) -> dict:
    return {"timeline": served_timeline(seed=seed, level=level), "k": k, "mode": "sync",
            "client_ttft_ms": client, "server_ttft_ms": server}


def test_the_fit_recovers_the_costs_the_timeline_was_made_of_at_the_profiles_level():
    s = cpu_samples(served_timeline(), topology="served")
    # one process_outputs sample a step: its own span and its chunks' writes
    assert len(s["process_outputs"]) == 40
    assert s["process_outputs"][0] == (1, 1, 20.5 + 61)
    assert run_level(served_timeline(level=1.25), 0, BASE_PROFILE) == pytest.approx(1.25)
    doc = fit_served(BASE_PROFILE, [run(0, 9.0, 7.5), run(0, 10.0, 7.0, seed=1, level=1.25),
                                    run(0, 9.5, 8.5, level=0.9)]).to_dict()
    assert doc["served_fit"]["levels"] == pytest.approx([1.0, 1.25, 0.9])
    want = {"schedule": [10, 2, 0], "update_from_output": [30, 5, 0],
            "result_latency": [150, 10, 0], "ipc_us": 90,
            "process_outputs": [20, 60.5, 1], "add_request": [300, 0, 2]}
    for c in (doc["cpu"], *doc["cpu_by_k"].values()):
        for term, abc in want.items():
            assert c[term] == pytest.approx(abc, abs=1e-3), term
        # the median of 1.5, 3.0 / 1.25 and 1.0 / 0.9 ms, at the profile's level
        assert c["client_latency_us"] == pytest.approx(1500.0, abs=0.1)
    assert doc["topology"]["engine"] == "served"
    # the engine's own worker and device costs stay the base profile's
    assert doc["cpu"]["prepare_inputs"] == BASE_DOC["cpu"]["prepare_inputs"]
    assert doc["device_ops"] == BASE_DOC["device_ops"]


def test_the_fit_refuses_runs_without_the_front_ends_spans():
    spans = [s for s in served_timeline() if s.op != "add_request"]
    with pytest.raises(UserError, match="too few samples of add_request"):
        fit_served(BASE_PROFILE, [{"timeline": spans, "k": 0, "client_ttft_ms": 1,
                                   "server_ttft_ms": 1}])
    with pytest.raises(UserError, match="no served run"):
        fit_served(BASE_PROFILE, [])


@pytest.fixture(scope="module")
def served_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("served") / "profile.json"
    save_profile(path, fit_served(BASE_PROFILE, [run(0, 9.0, 7.5), run(4, 9.0, 7.5)]))
    return path


def pair_sim(profile, mode, topology=None, k=4, conc=4):
    cfg = SimConfig(mode=mode, k=k, model=str(PAIR / "target"), draft=str(PAIR / "eagle3"),
                    gpu="cpu", device="cpu", executor="process", profile=str(profile),
                    topology=topology, max_num_seqs=8, max_model_len=256, max_concurrency=conc,
                    timeline=True, jitter=False)
    reqs = [TraceRequest(f"r{i}", 0.0, 40 + 7 * i, 30 + 5 * i) for i in range(8)]
    return reqs, simulate(cfg, reqs)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_served_topology_puts_the_front_end_on_the_engine_cores_cpu(mode, served_profile):
    assert load_profile(served_profile).engine == "served"
    reqs, (res, spans) = pair_sim(served_profile, mode)
    assert res["completed"] == len(reqs)
    assert res["total_output_tokens"] == sum(r.output_len for r in reqs)
    host = sorted((s for s in spans if s.lane in ("cpu.engine", "cpu.frontend")
                   and s.op != "wait"), key=lambda s: s.start_us)
    assert all(a.end_us <= b.start_us + 1e-6 for a, b in zip(host, host[1:]))
    ops = [s.op for s in spans if s.lane == "cpu.frontend"]
    assert ops.count("add_request") == len(reqs)
    # stepgap's own RPCs: none of vLLM's mid-step or draft-token waits
    assert not [s for s in spans if (s.args or {}).get("on") in ("take_draft_token_ids",)]
    # the same profile without the API server: every step is as fast or faster, and the
    # client sees its first token at least the client latency sooner
    _, (alone, _) = pair_sim(served_profile, mode, topology="stepgap")
    assert alone["completed"] == len(reqs)
    assert res["mean_tpot_ms"] > alone["mean_tpot_ms"]
    assert res["mean_ttft_ms"] - alone["mean_ttft_ms"] > 1.5
