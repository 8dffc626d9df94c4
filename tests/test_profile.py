"""Profiles: how steps are cut into terms, the fits, ProfileCosts, and `simulate --profile`."""

import json
from pathlib import Path

import numpy as np
import pytest

from stepgap.calibrate.fit import build_profile
from stepgap.calibrate.samples import cpu_samples, device_points
from stepgap.sim.costs import Batch, ConstantCosts
from stepgap.calibrate.fit import fit_points, nnls
from stepgap.sim.profile import (FEATURES, CpuFit, Fit, Profile, batch_features, features,
                                 load_profile, save_profile)
from stepgap.sim.profile_costs import ProfileCosts
from stepgap.cli import main
from stepgap.common.errors import UserError
from stepgap.common.formats import Span

SHAPE = {"tokens": 5, "reqs": 1, "q": 5, "blocks": 2}


def step_spans(n, t0, mode_async=False):
    """One k=2 step of a process worker on the CPU, its ops at known times (us from t0)."""
    e, w, d = "cpu.engine", "cpu.worker", "device"
    at = lambda a, b: (t0 + a, t0 + b)  # noqa: E731
    return [
        Span(w, "prepare_inputs", n, *at(100, 150), {"reqs": 1, "tokens": 5}),
        Span(w, "launch", n, *at(150, 1020), {"reqs": 1, "tokens": 5}),
        Span(d, "target_forward", n, *at(200, 700), SHAPE),
        Span(d, "rejection_sample", n, *at(720, 760), SHAPE),
        Span(d, "draft_forward", n, *at(780, 900), {**SHAPE, "i": 0}),
        Span(d, "draft_forward", n, *at(910, 1000), {**SHAPE, "i": 1}),
        Span(d, "d2h", n, *at(1005, 1010), {"reqs": 1}),
        Span(e, "update_from_output", n, *at(1300, 1320), {"reqs": 1, "tokens": 5}),
    ]


def sync_timeline():
    spans = [Span("cpu.engine", "schedule", 0, 0, 10, {"reqs": 1, "tokens": 5})]
    spans += step_spans(0, 0)
    spans.append(Span("cpu.engine", "schedule", 1, 1330, 1345, {"reqs": 1, "tokens": 5}))
    spans += step_spans(1, 1400)   # prepare 1 starts at 1500
    return spans


def test_device_op_costs_run_from_the_previous_ops_end():
    pts = device_points(sync_timeline(), k=2)
    first = [(p["op"], p["i"], p["us"]) for p in pts[:5]]
    assert first == [("target_forward", None, 500.0), ("rejection_sample", None, 60.0),
                     ("draft_forward", 0, 140.0), ("draft_forward", 1, 100.0),
                     ("d2h", None, 10.0)]
    # features: [1, tokens, reqs, reqs * q * blocks * 16]; a one-token pass has one per request
    assert pts[0]["x"] == [1.0, 5.0, 1.0, 160.0]
    assert pts[3]["x"] == [1.0, 1.0, 1.0, 32.0]


def test_cpu_terms_of_a_sync_timeline():
    t = cpu_samples(sync_timeline(), "sync")
    assert t["schedule"][0] == (1, 5, 10.0)
    assert t["update_from_output"][0] == (1, 5, 20.0)
    assert t["prepare_inputs"][0] == (1, 5, 50.0)
    assert t["launch"][0] == (1, 5, 50.0)                 # prepare's end to the first op
    assert t["result_latency"][0] == (1, 5, 290.0)        # last op's end to update
    # the message: update 0's end to prepare 1's start, less schedule 1
    assert t["ipc_us"] == [(0, 0, 1500 - 1320 - 15)]
    assert "worker_turnaround" not in t                   # sync: the worker waits instead


def test_cpu_terms_of_an_async_timeline():
    spans = [Span("cpu.engine", "schedule", 0, 0, 10, {"reqs": 1, "tokens": 5})]
    spans += step_spans(0, 0)
    # step 1 was scheduled (and sent) while step 0 computed: the worker turns straight to it
    spans.append(Span("cpu.engine", "schedule", 1, 400, 420, {"reqs": 1, "tokens": 5}))
    spans += step_spans(1, 1150)   # prepare 1 at 1250: 240 after step 0's last op
    t = cpu_samples(spans, "async")
    assert t["worker_turnaround"] == [(1, 5, 240.0)]
    assert "ipc_us" not in t


def test_nnls_keeps_every_coefficient_non_negative():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(50), rng.uniform(1, 100, 50), rng.uniform(1, 4, 50)])
    y = x @ np.array([300.0, 2.0, 50.0])
    assert nnls(x, y) == pytest.approx([300.0, 2.0, 50.0])
    coef = nnls(x, 1000.0 - 3.0 * x[:, 1])   # a falling cost: clamped to the best >= 0 fit
    assert (coef >= 0).all()


def test_fit_points_reports_the_median_relative_error():
    coef, err = fit_points([[1, 1], [1, 2], [1, 3]], [10.0, 20.0, 30.0])
    assert coef == pytest.approx((0.0, 10.0)) and err == pytest.approx(0.0, abs=1e-12)


def profile(fits, cpu=None):
    return Profile(fits, None if cpu is None else CpuFit(cpu),
                   about={"topology": {"executor": "process", "device": "cpu"}}, path="p.json")


def fit(op, k, coef, i=None):
    return Fit(op, i, k, tuple(coef), 100, 0.01, "test")


B = Batch(num_tokens=5, num_reqs=1, num_sampling=1, num_logits=5, num_drafts=4, kv_tokens=100,
          attn_pairs=0.0, max_query=5, max_blocks=7)


def test_profile_costs_answer_from_the_fit_of_their_k():
    p = profile([fit("target_forward", 2, [1000, 10, 0, 0]),
                 fit("target_forward", 4, [2000, 10, 0, 0]),
                 fit("draft_forward", 4, [300, 0, 0, 0], i=0),
                 fit("draft_forward", 4, [200, 0, 0, 0], i=1)])
    c = ProfileCosts(p, 4, ConstantCosts(target=1.0, fix=7.0))
    assert c.target_forward(B) == 2050.0
    assert c.draft_forward(B, 0) == 300.0
    assert c.draft_forward(B, 3) == 200.0          # later passes: the last measured
    assert c.fixup(B) == 7.0                       # not in the profile: the fallback
    assert c.sources["fixup"].startswith("roofline")
    assert "k=4" in c.sources["target_forward"]
    # k=3 was not measured: the nearest k, said so
    c3 = ProfileCosts(p, 3, ConstantCosts())
    assert c3.target_forward(B) == 2050.0
    assert "nearest measured to k=3" in c3.sources["target_forward"]


def test_at_k0_the_engines_sampler_is_its_own_op():
    p = profile([fit("target_forward", 0, [1000, 0, 0, 0]),
                 fit("rejection_sample", 0, [60, 0, 0, 0])])
    costs = ProfileCosts(p, 0, ConstantCosts())
    assert (costs.target_forward(B), costs.rejection_sample(B)) == (1000.0, 60.0)


def test_batch_features_match_the_engines_padded_grid():
    assert batch_features("target_forward", None, B) == features("target_forward", None, 5, 1,
                                                                  5, 7)
    assert features("target_forward", None, 20, 4, 5, 7) == [1.0, 20.0, 4.0, 4 * 5 * 7 * 16]
    assert len(FEATURES) == 4


def test_a_profile_read_and_written_back_is_the_same_file(tmp_path):
    """One reader and one writer: the committed CPU profile (written by `stepgap validate`'s
    fit) comes back byte for byte, what the fit found besides the typed sections included."""
    src = Path(__file__).resolve().parents[1] / "traces" / "measured" / "cpu" / "profile.json"
    prof = load_profile(src)
    assert prof.engine is None and prof.jitter.bin_ms == 50 and 4 in prof.cpu_by_k
    assert "grid" in prof.notes and "machine" in prof.about
    save_profile(tmp_path / "p.json", prof)
    assert (tmp_path / "p.json").read_bytes() == src.read_bytes()
    again = load_profile(tmp_path / "p.json")
    assert again.fits == prof.fits and again.cpu_costs(k=2) == prof.cpu_costs(k=2)


def test_load_profile_names_what_is_wrong(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"format": "stepgap-profile/1",
                               "device_ops": [{"op": "warp_drive", "coef": [1, 2, 3, 4]}]}))
    with pytest.raises(UserError, match=r"device_ops\[0\]\.op.*unknown op 'warp_drive'"):
        load_profile(bad)
    bad.write_text(json.dumps({"format": "stepgap-profile/1",
                               "device_ops": [{"op": "d2h", "coef": [1, 2]}]}))
    with pytest.raises(UserError, match="expected 4 finite numbers"):
        load_profile(bad)
    for ops in ("null", "{}"):   # not "no fits": the roofline would answer for every op
        bad.write_text(f'{{"format": "stepgap-profile/1", "device_ops": {ops}}}')
        with pytest.raises(UserError, match=r"field 'device_ops': expected a list of fits "
                                            r"\(\[\] for none\)"):
            load_profile(bad)
    bad.write_text(json.dumps({"format": "stepgap-profile/1", "device_ops": [],
                               "topology": {"device": "tpu", "executor": "process"}}))
    with pytest.raises(UserError, match=r"field 'topology.device': expected cpu or cuda, "
                                        r"got 'tpu'"):
        load_profile(bad)
    bad.write_text("{}")
    with pytest.raises(UserError, match="format"):
        load_profile(bad)
    with pytest.raises(UserError, match="profile not found"):
        load_profile(tmp_path / "none.json")


def write_profile(path, k=2):
    fits = [fit("target_forward", k, [2000, 20, 50, 0.05]),
            fit("rejection_sample", k, [100, 0, 10, 0]),
            fit("draft_forward", k, [500, 5, 30, 0.01], i=0),
            fit("draft_forward", k, [450, 40, 0, 0.05], i=1),
            fit("d2h", k, [20, 0, 1, 0])]
    doc = {"format": "stepgap-profile/1", "device": "cpu",
           "device_ops": [f.to_dict() for f in fits],
           "cpu": {"schedule": [15, 4, 0.03], "update_from_output": [15, 4, 0.04],
                   "prepare_inputs": [80, 10, 0.2], "launch": [90, 2, 0.1],
                   "result_latency": [350, 10, 0.8], "worker_turnaround": [260, 9, 0.6],
                   "ipc_us": 180.0},
           "topology": {"executor": "process", "device": "cpu"}}
    path.write_text(json.dumps(doc))


def test_simulate_with_a_profile_uses_its_device_and_cpu_costs(tmp_path):
    write_profile(tmp_path / "p.json")
    out = tmp_path / "r.json"
    assert main(["simulate", "--gpu", "cpu", "--worker", "process", "--model", "llama-3.2-1b",
                 "--draft", "eagle3", "-k", "2", "--mode", "async", "--num-prompts", "4",
                 "--output-len", "16", "--max-concurrency", "2", "--num-kv-blocks", "256",
                 "--profile", str(tmp_path / "p.json"), "--result-json", str(out),
                 "--quiet"]) == 0
    res = json.loads(out.read_text())
    resolved = res["config"]["resolved"]
    assert resolved["device_costs"]["target_forward"].startswith("profile (k=2")
    assert resolved["device_costs"]["fixup"].startswith("roofline")
    assert resolved["cpu_costs_us"]["worker_turnaround"] == [260, 9, 0.6]
    assert resolved["cpu_costs_us"]["ipc_us"] == 180.0
    # the same run without the profile is the roofline's, much faster on this "cpu" entry
    out2 = tmp_path / "r2.json"
    assert main(["simulate", "--gpu", "cpu", "--worker", "process", "--model", "llama-3.2-1b",
                 "--draft", "eagle3", "-k", "2", "--mode", "async", "--num-prompts", "4",
                 "--output-len", "16", "--max-concurrency", "2", "--num-kv-blocks", "256",
                 "--result-json", str(out2), "--quiet"]) == 0
    assert "device_costs" not in json.loads(out2.read_text())["config"]["resolved"]


def test_a_profile_fitted_on_engine_runs_predicts_their_device_time():
    from stepgap.common.workloads import mtbench_like
    from stepgap.engine.args import EngineArgs
    from stepgap.engine.loop import run_trace
    ea = EngineArgs(model="tiny", draft="tiny-eagle3", k=2, dtype="float32",
                    num_gpu_blocks_override=256, max_model_len=512, max_num_seqs=4,
                    num_threads=1)
    ex = ea.make_executor()
    runs = []
    for mode, conc in (("sync", 1), ("async", 3), ("sync", 3)):
        out = run_trace(ex, mtbench_like(6, 12), ea.engine_config(mode), vocab_size=512,
                        max_concurrency=conc)
        runs.append((mode, 2, out.spans))
    prof, series = build_profile(runs, [], {"device": "cpu"})
    assert len(series) == 3 and all(len(row) == 3 for row in series[0])
    assert prof.jitter.runs == 3 and set(prof.cpu_by_k) == {2}
    assert {f.op for f in prof.fits} == {"target_forward", "rejection_sample", "draft_forward",
                                         "d2h"}
    assert {"schedule", "update_from_output", "prepare_inputs", "launch"} <= set(prof.cpu.terms)
    # Least squares with a constant term puts the fitted total on the measured one, wherever
    # the non-negative fit kept that term (on a busy machine the timings may make it drop it:
    # then the total is off by what the noise made it, which is no property of the fit).
    ratios = prof.notes["checks"]["calibration_fit_over_calibration_steps"]
    keys = {f"{f.op}{'' if f.i is None else '/' + str(f.i)} k={f.k}": f for f in prof.fits}
    assert set(ratios) == set(keys)
    assert all(abs(ratios[key] - 1) < 1e-6 for key, f in keys.items() if f.coef[0] > 0)
