"""The simulator's step loop, pinned by closed-form cases with constant costs."""

from dataclasses import replace

import numpy as np
import pytest

from stepgap.sim.config import SimConfig
from stepgap.sim.costs import ConstantCosts
from stepgap.sim.device_lane import Clock
from stepgap.sim.loop import simulate
from stepgap.common.errors import UserError
from stepgap.common.formats import LANES, OPS, TraceRequest, save_result, step_gaps
from stepgap.common.workloads import sharegpt_like

# CPU costs (us). The launch latency equals the launch cost: the device starts a step when its
# launch ends, so "CPU" below is simply the sum of the CPU ops.
S, P, L, U = 100.0, 200.0, 50.0, 150.0


def cfg(**kw) -> SimConfig:
    base = dict(model="llama-3.2-1b", num_gpu_blocks_override=4096, max_model_len=4096,
                cpu_costs={"schedule": [S], "update_from_output": [U], "prepare_inputs": [P],
                           "launch": [L]},
                launch_latency_us=L, wake_us=0.0, ipc_us=0.0, acceptance_rates=(0.0,),
                # the step loop's structure alone: the drafter's own host costs
                # (sim/drafter_costs.py) are tests/test_drafter_costs.py's
                drafter_host_scale=0.0)
    base.update(kw)
    return SimConfig(**base)


def one_request(output_len=40, prompt_len=16, accepted=None):
    return [TraceRequest("r", 0.0, prompt_len, output_len, accepted=accepted)]


def steady_itl_us(res, periodic: bool = False) -> float:
    """The inter-chunk time once the pipeline is full (without the first and last chunks).
    Every step takes it, or with `periodic` steps alternate and it is their mean."""
    itls = np.asarray(res["itls"][0][4:-2]) * 1e6
    if periodic:
        itls = itls[:len(itls) // 2 * 2].reshape(-1, 2).sum(axis=1) / 2
    assert itls.std() < 1e-3, itls
    return float(itls.mean())


def run(costs, **kw):
    res, spans = simulate(cfg(detailed=True, **kw), one_request(), costs)
    return res, spans


# -- sync: CPU + device; async: max(CPU, device) -------------------------------------------

@pytest.mark.parametrize("worker", ["inline", "process"])
@pytest.mark.parametrize("t_dev", [2000.0, 300.0])
def test_sync_step_is_cpu_plus_device(worker, t_dev):
    res, _ = run(ConstantCosts(target=t_dev), mode="sync", executor=worker)
    assert steady_itl_us(res) == pytest.approx(S + P + L + U + t_dev)


@pytest.mark.parametrize("mode", ["async", "zero-bubble"])
@pytest.mark.parametrize("t_dev", [2000.0, 300.0])
def test_async_step_is_max_of_cpu_and_device_inline(mode, t_dev):
    res, _ = run(ConstantCosts(target=t_dev), mode=mode, k=0)
    assert steady_itl_us(res) == pytest.approx(max(S + P + L + U, t_dev))


@pytest.mark.parametrize("mode", ["async", "zero-bubble"])
def test_async_process_worker_overlaps_engine_worker_and_device(mode):
    # Device-bound: the device sets the pace, as inline.
    res, _ = run(ConstantCosts(target=2000.0), mode=mode, k=0, executor="process")
    assert steady_itl_us(res) == pytest.approx(2000.0)
    # CPU-bound: engine (S+U) and worker (P+L) are separate threads, so the slower one paces,
    # unless one step's round trip (schedule, prepare, launch, device, update) exceeds two
    # periods: the batch queue holds only two steps.
    res, _ = run(ConstantCosts(target=100.0), mode=mode, k=0, executor="process")
    round_trip = S + P + L + 100.0 + U
    assert steady_itl_us(res, periodic=True) == pytest.approx(
        max(S + U, P + L, 100.0, round_trip / 2))


def test_sync_device_runs_on_the_worker_thread():
    # The CPU as device: launch packs the inputs (its cost, L), then the ops run on the worker's
    # thread; inline, nothing overlaps in any mode.
    for mode in ("sync", "async", "zero-bubble"):
        res, _ = run(ConstantCosts(target=900.0), mode=mode, device="cpu")
        assert steady_itl_us(res) == pytest.approx(S + P + L + U + 900.0)
    # With its own process the worker still computes serially, but the engine's schedule and
    # update overlap it: async hides the engine side, not the worker's prepare and launch.
    res, _ = run(ConstantCosts(target=900.0), mode="async", device="cpu", executor="process")
    assert steady_itl_us(res) == pytest.approx(max(S + U, P + L + 900.0))


def test_process_worker_on_a_sync_device_sends_its_result_then_turns_around():
    # R: the result's latency to update_from_output; C: the worker's turnaround (collect, send,
    # receive) before it can prepare the next step. Sync: the whole round trip, with the
    # message's IPC latency. Async: the worker's loop, or the engine's if slower.
    R, C, I = 120.0, 80.0, 30.0
    costs = {"schedule": [S], "update_from_output": [U], "prepare_inputs": [P], "launch": [L],
             "result_latency": [R], "worker_turnaround": [C]}
    res, spans = run(ConstantCosts(target=900.0), mode="sync", device="cpu", executor="process",
                     cpu_costs=costs, ipc_us=I, timeline=True)
    assert steady_itl_us(res) == pytest.approx(P + L + 900.0 + R + U + S + I)
    assert not [s for s in spans if s.op == "wait"]   # nothing waits on a device here
    for mode in ("async", "zero-bubble"):
        res, spans = run(ConstantCosts(target=900.0), mode=mode, k=2, device="cpu",
                         executor="process", cpu_costs=costs, ipc_us=I, timeline=True)
        assert steady_itl_us(res) == pytest.approx(P + L + 900.0 + C)
        assert not [s for s in spans if s.op == "fixup"]   # it computed N before preparing N+1


def test_async_with_drafts_waits_for_accepted_counts_then_overlaps_the_drafter():
    verify, draft, copy, k = 1400.0 + 100.0, 150.0, 50.0, 3
    drafting = k * draft + copy
    dev = ConstantCosts(target=1400.0, rejection=100.0, draft=draft, copy=copy)
    # prepare + launch fit in the drafter: fully hidden.
    res, _ = run(dev, mode="async", k=k)
    assert steady_itl_us(res) == pytest.approx(verify + max(drafting, P + L))
    # prepare + launch longer than the drafter: the excess is exposed.
    slow = {"schedule": [S], "update_from_output": [U], "prepare_inputs": [800.0],
            "launch": [L]}
    res, _ = run(dev, mode="async", k=k, cpu_costs=slow)
    assert steady_itl_us(res) == pytest.approx(verify + 800.0 + L)
    # zero-bubble never waits: the device paces.
    res, _ = run(dev, mode="zero-bubble", k=k, cpu_costs=slow)
    assert steady_itl_us(res) == pytest.approx(verify + drafting)


@pytest.mark.parametrize("t_dev, prep", [(2000.0, 200.0), (300.0, 200.0), (900.0, 700.0),
                                         (200.0, 900.0)])
@pytest.mark.parametrize("worker", ["inline", "process"])
@pytest.mark.parametrize("k", [0, 2])
def test_zero_bubble_no_slower_than_async_no_slower_than_sync(t_dev, prep, worker, k):
    dev = ConstantCosts(target=t_dev, rejection=30.0, draft=t_dev / 4, copy=10.0)
    costs = {"schedule": [S], "update_from_output": [U], "prepare_inputs": [prep], "launch": [L]}
    reqs = sharegpt_like(30, seed=2)
    itl = {}
    for mode in ("sync", "async", "zero-bubble"):
        res, _ = simulate(cfg(mode=mode, k=k, executor=worker, cpu_costs=costs,
                              acceptance_rates=(0.7, 0.4), max_concurrency=4), reqs, dev)
        itl[mode] = res["duration"]
    assert itl["zero-bubble"] <= itl["async"] * (1 + 1e-9) <= itl["sync"] * (1 + 1e-9)


def test_sync_step_gap_is_the_exposed_cpu_time():
    res, spans = run(ConstantCosts(target=2000.0), mode="sync", timeline=True)
    gaps = res["step_gaps"]["values_us"]
    assert gaps[3:] == pytest.approx([U + S + P + L] * len(gaps[3:]))
    assert step_gaps(spans) == pytest.approx(gaps)


# -- speculative decoding ------------------------------------------------------------------

def test_k0_is_plain_decoding():
    res, spans = simulate(cfg(gpu="h100", k=0, mode="async", detailed=True, timeline=True,
                              cpu_costs={}, launch_latency_us=None, wake_us=None),
                          one_request(output_len=30))
    assert res["chunk_tokens"] == [[1] * 30]
    ops = {s.op for s in spans}
    assert not ops & {"draft_forward", "fixup"}
    # the sampler is its own op at k = 0 too, right after the forward, one per sampling step
    fwd = [s for s in spans if s.op == "target_forward"]
    sample = [s for s in spans if s.op == "rejection_sample"]
    assert len(sample) == len(fwd) == 30
    assert all(r.start_us == f.end_us and r.end_us > r.start_us for f, r in zip(fwd, sample))
    assert not any(s.op == "wait" and s.args for s in spans)  # no accepted-count wait
    assert "spec_decode" not in res
    assert res["step_gaps"]["count"] + 1 == 30  # one prefill step, then one step per token


@pytest.mark.parametrize("mode", ["sync", "async", "zero-bubble"])
def test_replay_reproduces_recorded_accepted_counts(mode):
    accepted = [3, 0, 2, 1, 3, 3, 0, 1, 2, 2, 3]
    reqs = one_request(output_len=25, accepted=accepted)
    res, _ = simulate(cfg(gpu="h100", k=3, mode=mode, detailed=True, cpu_costs={}), reqs)
    expected, total = [1], 1
    for a in accepted:
        n = min(1 + a, 25 - total)
        expected.append(n)
        total += n
        if total == 25:
            break
    assert res["chunk_tokens"] == [expected]


def test_a_recorded_count_above_k_is_an_error_not_clipped():
    with pytest.raises(UserError, match=r"request 'r': field 'accepted': decode step 0 "
                                        r"accepted 5 drafts, more than k = 2"):
        simulate(cfg(gpu="h100", k=2, detailed=True, cpu_costs={}),
                 one_request(output_len=10, accepted=[5, 5, 5, 5]))


def test_replay_at_a_requests_end_accepts_only_the_drafts_that_step_verified():
    # 6 tokens: the prefill's 1, a step of 1 + 2, then one of 1 + 1 (one token is left to draft)
    res, _ = simulate(cfg(gpu="h100", k=2, detailed=True, cpu_costs={}),
                      one_request(output_len=6, accepted=[2, 2, 2]))
    assert res["chunk_tokens"] == [[1, 3, 2]]


@pytest.mark.parametrize("mode", ["sync", "async", "zero-bubble"])
@pytest.mark.parametrize("worker, device", [("inline", None), ("process", None),
                                            ("process", "cpu")])
def test_every_request_ends_with_exactly_its_output_tokens(mode, worker, device):
    reqs = sharegpt_like(60, seed=5)
    # A small KV cache forces preemption by recompute along the way.
    res, _ = simulate(cfg(gpu="h100", k=3, mode=mode, executor=worker, device=device,
                          num_gpu_blocks_override=120, max_num_seqs=24, acceptance="mtbench",
                          acceptance_rates=None, detailed=True, cpu_costs={}), reqs)
    assert res["completed"] == 60
    assert res["output_lens"] == [r.output_len for r in reqs]
    assert all(1 <= n <= 4 for chunks in res["chunk_tokens"] for n in chunks)
    assert res["config"]["resolved"]["num_preemptions"] > 0


def test_async_runs_one_extra_step_per_request_that_finishes_early():
    # Full acceptance: the scheduler cannot know the last step finishes the request.
    full = dict(gpu="h100", k=3, acceptance_rates=(1.0,), cpu_costs={}, num_prompts=None)
    sync, _ = simulate(cfg(mode="sync", **full), one_request(output_len=13))
    async_, _ = simulate(cfg(mode="async", **full), one_request(output_len=13))
    assert sync["config"]["resolved"]["num_steps"] == 4      # 1 + 4 + 4 + 4 tokens
    assert async_["config"]["resolved"]["num_steps"] == 5
    assert async_["total_output_tokens"] == sync["total_output_tokens"] == 13


def test_same_seed_same_bytes(tmp_path):
    c = cfg(gpu="l20", k=4, mode="async", acceptance="mtbench", acceptance_rates=None,
            workload="mtbench", num_prompts=12, max_concurrency=3, detailed=True, cpu_costs={})
    for name in ("a", "b"):
        save_result(tmp_path / f"{name}.json", simulate(c)[0])
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    c = replace(c, seed=1)   # (a SimConfig is frozen)
    save_result(tmp_path / "c.json", simulate(c)[0])
    assert (tmp_path / "c.json").read_bytes() != (tmp_path / "a.json").read_bytes()


def test_timeline_uses_the_design_vocabulary():
    _, spans = simulate(cfg(gpu="h100", k=2, mode="zero-bubble", timeline=True, cpu_costs={},
                            workload="sharegpt", num_prompts=6, max_concurrency=3))
    assert {s.lane for s in spans} <= set(LANES)
    assert all(s.op in OPS[s.lane] and s.end_us >= s.start_us for s in spans)
    assert {s.args["i"] for s in spans if s.op == "draft_forward"} == {0, 1}
    assert {"schedule", "update_from_output", "prepare_inputs", "launch", "target_forward",
            "rejection_sample", "draft_forward", "d2h", "fixup"} <= {s.op for s in spans}


def test_request_rate_and_concurrency_shape_the_load():
    base = dict(gpu="h100", k=0, cpu_costs={}, workload="sharegpt", num_prompts=40)
    burst, _ = simulate(cfg(**base))
    capped, _ = simulate(cfg(max_concurrency=2, **base))
    paced, _ = simulate(cfg(request_rate=2.0, **base))
    assert capped["duration"] > burst["duration"]
    assert paced["duration"] >= 20.0 * 0.99 - 1.0  # the last request arrives at 40 / 2 s
    assert capped["max_concurrency"] == 2


# -- the clock: hold() is a timeout that skips the event queue when it can ---------------------

def test_hold_moves_the_clock_at_once_only_when_nothing_else_is_due():
    env, seen = Clock(), []

    def proc():
        first = env.hold(5.0)
        seen.append((first is env.passed, env.now))   # nothing due: no event, time moved on
        yield first
        env.timeout(7.0)                             # an event due at 12
        second = env.hold(10.0)                      # 15 is past it: a real timeout
        seen.append((second is env.passed, env.now))
        yield second
        seen.append((None, env.now))

    env.process(proc())
    env.run()
    assert seen == [(True, 5.0), (False, 5.0), (None, 15.0)]


VLLM_TERMS = {"rpc_mid": [30, 1, 0.01], "rpc_drafts": [40, 0.5, 0],
              "process_outputs": [50, 3, 0.1], "add_request": [80, 0, 0.05]}


@pytest.mark.parametrize("kw", [
    dict(mode="sync"),
    dict(mode="async", executor="process"),
    dict(mode="zero-bubble", request_rate=40.0, output_latency_ms=2.0),
    dict(mode="async", gpu="cpu", device="cpu", executor="process"),
    dict(mode="sync", topology="vllm", cpu_costs=VLLM_TERMS),
    dict(mode="async", executor="process", topology="served",
         cpu_costs={"process_outputs": [50, 3, 0.1], "add_request": [80, 0, 0.05]}),
    dict(mode="async", tensor_parallel_size=2),
])
def test_hold_gives_the_times_and_order_that_timeouts_give(kw, tmp_path, monkeypatch):
    c = cfg(**{**dict(gpu="h100", k=3, acceptance="mtbench", acceptance_rates=None,
                      cpu_costs={}, workload="sharegpt", num_prompts=24, max_concurrency=4,
                      timeline=True, detailed=True), **kw})
    fast, fast_spans = simulate(c)
    monkeypatch.setattr(Clock, "hold", lambda env, dt: env.timeout(dt))   # plain SimPy
    plain, plain_spans = simulate(c)
    save_result(tmp_path / "fast.json", fast)
    save_result(tmp_path / "plain.json", plain)
    assert (tmp_path / "fast.json").read_bytes() == (tmp_path / "plain.json").read_bytes()
    assert fast_spans == plain_spans


@pytest.mark.parametrize("kw", [dict(mode="sync"), dict(mode="async"),
                                dict(mode="async", executor="process", topology="vllm"),
                                dict(mode="async", data_parallel_size=2),
                                dict(mode="async", data_parallel_size=2, k=0,
                                     model="qwen3-30b-a3b", enable_expert_parallel=True)])
def test_a_finished_run_is_freed_at_once(kw):
    """The processes still waiting when a run ends (the engine loop, a worker's) are closed
    (`Clock.close`): their frames no longer hold the run in a cycle, which only the cycle
    collector would free, after scanning everything the run made."""
    import gc
    from stepgap.sim.core import EngineCore
    from stepgap.sim.loop import Run
    gc.collect()
    gc.disable()
    try:
        simulate(cfg(**{"k": 2, "num_prompts": 6, "workload": "sharegpt",
                        "max_concurrency": 2, **kw}))
        assert not [o for o in gc.get_objects() if isinstance(o, (Run, EngineCore))]
    finally:
        gc.enable()
