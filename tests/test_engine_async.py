"""Async and zero-bubble scheduling: the same tokens as sync, with both executors; and a clean
shutdown when the worker process dies or the run is interrupted."""

import os
import signal

import pytest

from stepgap.engine.executor import ProcessExecutor, WorkerDied
from stepgap.engine.sampler import SamplingConfig
from stepgap.engine.worker import WorkerSpec
from tests.helpers import (REQS, assert_lossless, inline_executor, mixed_requests, run,
                           tiny_args, tiny_checkpoints)


@pytest.fixture(scope="module")
def process_executor():
    with tiny_args(executor="process").make_executor() as ex:
        yield ex
    assert not ex.proc.is_alive()


# The executor changes only how a step travels (calls in this process, or pipes to a worker
# process), not what it computes: every case runs inline, and the process executor runs a subset
# that takes every value of every axis (docs/explanation/design.md, "Tests"). Its own faults (a
# killed worker, an interrupt, an error) are tested below.
MODES, KS, CONCURRENCIES = ("async", "zero-bubble"), (0, 1, 3, 5), (1, 4, 16)
CASES = [(mode, k, c) for mode in MODES for k in KS for c in CONCURRENCIES]
# each mode with each k once, the concurrency turning: k > 0 at concurrency 1 in both modes
PROCESS_CASES = [(mode, k, CONCURRENCIES[(i + j) % len(CONCURRENCIES)])
                 for i, mode in enumerate(MODES) for j, k in enumerate(KS)]


def assert_emits_the_sync_tokens(executor, mode, k, concurrency):
    out = run(executor, REQS, mode=mode, k=k, max_num_seqs=16, max_concurrency=concurrency)
    assert_lossless(out)  # the target's own greedy output, which sync also gives
    if k and concurrency == 1:
        # Requests finish while their next step is in flight; that step's tokens are dropped.
        assert out.num_discarded > 0


@pytest.mark.parametrize("mode, k, concurrency", CASES)
def test_overlapped_modes_emit_exactly_the_sync_tokens(mode, k, concurrency):
    assert_emits_the_sync_tokens(inline_executor(), mode, k, concurrency)


@pytest.mark.parametrize("mode, k, concurrency", PROCESS_CASES)
def test_overlapped_modes_emit_exactly_the_sync_tokens_through_a_worker_process(
        process_executor, mode, k, concurrency):
    assert_emits_the_sync_tokens(process_executor, mode, k, concurrency)


def assert_lossless_under_preemption(executor, mode, k):
    out = run(executor, REQS, mode=mode, k=k, num_blocks=12)
    assert out.result["config"]["num_preemptions"] > 0
    assert_lossless(out)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_overlapped_modes_are_lossless_under_preemption(mode, k):
    assert_lossless_under_preemption(inline_executor(), mode, k)


@pytest.mark.parametrize("mode, k", [("async", 3), ("zero-bubble", 1)])
def test_overlapped_modes_are_lossless_under_preemption_through_a_worker_process(
        process_executor, mode, k):
    assert_lossless_under_preemption(process_executor, mode, k)


def test_zero_bubble_fixes_up_on_the_device_and_async_waits_for_counts():
    def waits_before_prepare(out):
        # a worker `wait` span that ends where the same step's prepare_inputs begins
        prep = {s.step: s.start_us for s in out.spans if s.op == "prepare_inputs"}
        return [s for s in out.spans if s.lane == "cpu.worker" and s.op == "wait"
                and s.step in prep and s.end_us <= prep[s.step]]

    zb = run(inline_executor(), REQS, mode="zero-bubble", k=3)
    assert any(s.op == "fixup" for s in zb.spans)
    assert not waits_before_prepare(zb)          # zero-bubble never waits for the counts
    sync = run(inline_executor(), REQS, mode="sync", k=3)
    assert not any(s.op == "fixup" for s in sync.spans)
    asy = run(inline_executor(), REQS, mode="async", k=3)
    assert not any(s.op == "fixup" for s in asy.spans)
    waits = waits_before_prepare(asy)
    # async waits for the previous step's accepted counts before it prepares the next step,
    # once for every step launched while a step with drafts was still in flight
    launched = sorted({s.step for s in asy.spans if s.op == "target_forward"})
    drafted = {s.step for s in asy.spans if s.op == "target_forward" and s.args["drafts"]}
    prev = dict(zip(launched[1:], launched))       # each step's previously launched one
    assert {w.step for w in waits} == {n for n in launched[1:] if prev[n] in drafted}


def test_synthetic_acceptance_follows_the_given_rates():
    out = run(inline_executor(), mixed_requests(30), mode="async", k=3, max_num_seqs=16,
              sampling=SamplingConfig(synthetic=(0.9, 0.6, 0.3), seed=3))
    spec = out.result["spec_decode"]
    assert spec["num_drafts"] > 200
    assert spec["acceptance_rate_per_pos"] == pytest.approx([0.9, 0.6, 0.3], abs=0.1)


def test_replay_reproduces_recorded_accepted_counts():
    recorded = run(inline_executor(), REQS, k=3)
    from dataclasses import replace
    reqs = [replace(r, accepted=recorded.accepted[r.request_id]) for r in REQS]
    for mode in ("sync", "zero-bubble"):
        again = run(inline_executor(), reqs, mode=mode, k=3, sampling=SamplingConfig(replay=True))
        assert again.accepted == recorded.accepted


def test_a_killed_worker_is_reported_and_the_engine_exits():
    paths = tiny_checkpoints()
    spec = WorkerSpec(paths["target"], paths["eagle3-yuhuili"], "cpu", "float32", 256,
                      max_model_len=512, max_num_seqs=8, max_k=3)
    ex = ProcessExecutor(spec)
    pid = ex.pid

    def kill_at_step_3(step):
        if step == 3:
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(WorkerDied, match=rf"worker process \(pid {pid}\) was killed by signal 9"):
        with ex:
            run(ex, REQS, mode="async", k=3, on_step=kill_at_step_3)
    assert not ex.proc.is_alive() and ex.proc.exitcode == -signal.SIGKILL


def test_an_interrupted_run_stops_the_worker():
    paths = tiny_checkpoints()
    spec = WorkerSpec(paths["target"], None, "cpu", "float32", 256, max_model_len=512,
                      max_num_seqs=8)
    ex = ProcessExecutor(spec)

    def interrupt(step):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with ex:
            run(ex, REQS, mode="zero-bubble", k=0, on_step=interrupt)
    assert not ex.proc.is_alive() and ex.proc.exitcode == 0  # asked to stop, not killed


def test_a_worker_error_is_reported_not_hung(tmp_path):
    paths = tiny_checkpoints()
    spec = WorkerSpec(paths["target"], None, "cpu", "float32", 256, max_model_len=512)
    with ProcessExecutor(spec) as ex:
        with pytest.raises(Exception, match="needs a draft head"):
            run(ex, REQS, k=2)  # configure fails in the worker; the worker lives on
        assert ex.proc.is_alive()
        assert run(ex, REQS[:2], k=0).result["completed"] == 2


@pytest.fixture(scope="module")
def graph_executor():
    """The CUDA-graph path (static inputs padded to batch and KV-window buckets), emulated on
    the CPU: a replay runs the captured forward eagerly on the padded inputs."""
    from stepgap.engine.executor import InlineExecutor
    paths = tiny_checkpoints()
    spec = WorkerSpec(paths["target"], paths["eagle3-yuhuili"], "cpu", "float64", 512,
                      max_model_len=512, max_num_seqs=8, max_k=5, emulate_graphs=True)
    return InlineExecutor(spec)


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("mode", ["sync", "async", "zero-bubble"])
def test_graph_path_emits_the_same_tokens(graph_executor, mode, k):
    out = run(graph_executor, REQS, mode=mode, k=k, max_num_seqs=3)  # 3 rows: bucket 4
    assert_lossless(out)
    replayed = [s for s in out.spans if s.op in ("target_forward", "draft_forward")
                and s.args.get("graph")]
    assert replayed and all(s.args["reqs"] <= 3 for s in replayed)


@pytest.mark.parametrize("mode", ["sync", "zero-bubble"])
def test_the_drafters_graphs_draft_what_its_eager_passes_draft(graph_executor, mode):
    """The drafter runs one function per pass, replayed from its graphs or eagerly with the
    batch's own metadata: on the same steps both propose drafts that are accepted alike at
    every position."""
    graphed = run(graph_executor, REQS, mode=mode, k=3, max_num_seqs=3)
    eager = run(inline_executor(), REQS, mode=mode, k=3, max_num_seqs=3)
    assert any(s.op == "draft_forward" and s.args["i"] == 2 and s.args.get("graph")
               for s in graphed.spans)
    assert graphed.result["spec_decode"] == eager.result["spec_decode"]
    assert graphed.result["spec_decode"]["num_accepted_tokens"] > 0
