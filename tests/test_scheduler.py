"""The shared vLLM V1 scheduler, driven by a stand-in model with scripted acceptance."""

import random

import pytest

from stepgap.common.errors import UserError
from stepgap.common.scheduler import Request, Scheduler, SchedulerConfig


def drive(cfg, reqs, accept, max_steps=100_000, aborts=None, eos=None):
    """Run requests to completion as an engine would: sync updates each step before the next
    schedule; async schedules step N+1 before step N's output is applied (a queue of depth 2).
    `accept(request, num_spec)` gives the accepted draft count; every sampled token is 7, or
    `eos` from output position 10 on (each request then stops at its eos_token_id `eos`; the
    position is the scheduler's own, exact when every draft is accepted).
    `aborts` maps a step number to the requests aborted before it is scheduled. Returns
    (scheduler, chunks, outputs) where chunks[rid] lists the tokens per streamed chunk."""
    s = Scheduler(cfg)
    for rid, plen, out_len in reqs:
        s.add_request(Request(rid, plen, out_len, list(range(plen)), eos_token_id=eos))
    chunks = {rid: [] for rid, _, _ in reqs}
    outputs = []
    in_flight = None
    for step in range(max_steps):
        if not s.has_unfinished() and in_flight is None:
            break
        for rid in (aborts or {}).get(step, ()):
            assert s.abort_request(rid)
        out = s.schedule() if s.has_unfinished() else None
        if out is not None and not out.scheduled:
            out = None  # nothing to launch: an engine just waits for the step in flight
        if out is not None:
            sampled = {x.request.request_id: [
                eos if eos is not None and x.start + x.num_new_tokens - x.num_spec
                - x.request.num_prompt_tokens + j >= 10 else 7
                for j in range(1 + accept(x.request, x.num_spec))]
                for x in out.scheduled if x.samples}
            outputs.append(out)
        if cfg.async_scheduling:
            ready, in_flight = in_flight, (out, sampled) if out is not None else None
        else:
            ready = (out, sampled) if out is not None else None
        if ready is not None:
            for o in s.update_from_output(*ready):
                chunks[o.request.request_id].append(len(o.new_token_ids))
                assert o.finished == (o.request.request_id not in s.requests)
    else:
        raise AssertionError("did not finish")
    return s, chunks, outputs


def full(req, n):
    return n


def none(req, n):
    return 0


def seeded(seed):
    rng = random.Random(seed)
    return lambda req, n: sum(1 for _ in range(n) if rng.random() < 0.7)


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_every_request_gets_exactly_its_tokens_and_blocks_come_back(async_, k):
    reqs = [(f"r{i}", 5 + 13 * i, 3 + 7 * i) for i in range(8)]
    cfg = SchedulerConfig(num_blocks=200, max_num_seqs=4, num_spec_tokens=k,
                          async_scheduling=async_)
    s, chunks, _ = drive(cfg, reqs, seeded(k))
    assert {rid: sum(c) for rid, c in chunks.items()} == {rid: n for rid, _, n in reqs}
    assert all(1 <= c <= k + 1 for cs in chunks.values() for c in cs)
    assert s.num_free_blocks == 200 and not s.running and not s.waiting


def test_k0_decodes_one_token_per_step():
    cfg = SchedulerConfig(num_blocks=50, num_spec_tokens=0)
    _, chunks, outputs = drive(cfg, [("a", 10, 6)], full)
    assert chunks["a"] == [1] * 6
    assert [o.scheduled[0].num_new_tokens for o in outputs] == [10, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("async_", [False, True])
def test_decode_steps_verify_one_plus_k_tokens(async_):
    cfg = SchedulerConfig(num_blocks=50, num_spec_tokens=3, async_scheduling=async_)
    _, chunks, outputs = drive(cfg, [("a", 10, 40)], none)
    assert [o.scheduled[0].num_new_tokens for o in outputs][:4] == [10, 4, 4, 4]
    assert [o.scheduled[0].num_spec for o in outputs][:3] == [0, 3, 3]
    assert chunks["a"] == [1] * 40


def test_sync_never_schedules_a_finished_request():
    cfg = SchedulerConfig(num_blocks=50, num_spec_tokens=3)
    _, chunks, outputs = drive(cfg, [("a", 10, 9)], full)
    assert chunks["a"] == [1, 4, 4]  # prefill token, then 1 + 3 twice
    assert len(outputs) == 3


def test_async_schedules_one_extra_step_whose_tokens_are_discarded():
    # Full acceptance: prefill gives 1 token, then 4 per step; 9 tokens end at step 2. When
    # step 3 is scheduled, step 2's output is not in yet and the scheduler cannot be sure step 2
    # finishes the request (it would not if all drafts were rejected): step 3 is an extra step.
    cfg = SchedulerConfig(num_blocks=50, num_spec_tokens=3, async_scheduling=True)
    s, chunks, outputs = drive(cfg, [("a", 10, 9)], full)
    assert chunks["a"] == [1, 4, 4]
    assert len(outputs) == 4 and outputs[3].scheduled[0].request.request_id == "a"
    assert s.num_free_blocks == 50


def test_async_skips_a_step_it_knows_is_not_needed():
    # No acceptance: 1 token per step. With 1 token left and one step in flight, the in-flight
    # step surely finishes the request, so nothing more is scheduled for it.
    cfg = SchedulerConfig(num_blocks=50, num_spec_tokens=3, async_scheduling=True)
    _, chunks, outputs = drive(cfg, [("a", 10, 4)], none)
    assert chunks["a"] == [1, 1, 1, 1]
    assert len(outputs) == 4


def test_async_placeholders_are_corrected_one_step_later():
    cfg = SchedulerConfig(num_blocks=50, num_spec_tokens=2, async_scheduling=True)
    s = Scheduler(cfg)
    req = Request("a", 8, 100)
    s.add_request(req)
    o0 = s.schedule()                      # prefill: 8 tokens, samples 1
    assert req.num_output_placeholders == 1 and req.num_spec_tokens == 2
    o1 = s.schedule()                      # decode before step 0's output is known: 1 + 2
    assert o1.scheduled[0].num_new_tokens == 3 and req.num_computed_tokens == 11
    assert req.num_output_placeholders == 4
    s.update_from_output(o0, {"a": [5]})
    assert req.num_output_placeholders == 3 and req.num_computed_tokens == 11
    o2 = s.schedule()
    s.update_from_output(o1, {"a": [5, 6]})  # one of two drafts accepted: one rejected
    assert req.num_computed_tokens == 13 and req.num_output_placeholders == 3
    assert req.num_tokens == 11 and o2.scheduled[0].num_new_tokens == 3


def test_chunked_prefill_splits_long_prompts_and_samples_once():
    cfg = SchedulerConfig(num_blocks=50, max_num_batched_tokens=32, num_spec_tokens=0)
    _, chunks, outputs = drive(cfg, [("a", 100, 2)], full)
    assert [o.scheduled[0].num_new_tokens for o in outputs] == [32, 32, 32, 4, 1]
    assert [o.scheduled[0].samples for o in outputs] == [False, False, False, True, True]
    assert chunks["a"] == [1, 1]


def test_max_num_seqs_caps_the_batch():
    cfg = SchedulerConfig(num_blocks=500, max_num_seqs=3)
    _, _, outputs = drive(cfg, [(f"r{i}", 4, 5) for i in range(10)], full)
    assert max(o.num_reqs for o in outputs) == 3


@pytest.mark.parametrize("async_", [False, True])
def test_preemption_by_recompute_when_blocks_run_out(async_):
    # 6 requests of up to 64 tokens in 12 blocks of 16: they cannot all stay resident.
    reqs = [(f"r{i}", 20, 40) for i in range(6)]
    # (without prefix caching: a resumed request recomputes its whole prompt; with it, it
    # finds its own blocks again, tests/test_engine_prefix_cache.py)
    cfg = SchedulerConfig(num_blocks=12, num_spec_tokens=2, async_scheduling=async_,
                          enable_prefix_caching=False)
    s, chunks, outputs = drive(cfg, reqs, seeded(1))
    assert s.num_preemptions > 0
    assert {rid: sum(c) for rid, c in chunks.items()} == {rid: 40 for rid, _, _ in reqs}
    assert s.num_free_blocks == 12
    resumed = [x for o in outputs for x in o.scheduled if x.fresh and x.request.num_preemptions]
    assert resumed and all(x.num_new_tokens >= x.request.num_prompt_tokens for x in resumed)


def test_requests_that_cannot_fit_are_rejected_with_their_id():
    s = Scheduler(SchedulerConfig(num_blocks=4, max_model_len=2048))
    with pytest.raises(UserError, match="request 'big' needs 7 KV blocks"):
        s.add_request(Request("big", 90, 10))
    with pytest.raises(UserError, match="exceeds --max-model-len"):
        s.add_request(Request("long", 2000, 100))


def test_bad_config_names_the_field():
    with pytest.raises(UserError, match="num_spec_tokens"):
        SchedulerConfig(num_blocks=4, num_spec_tokens=-1)
    with pytest.raises(UserError, match="max_num_batched_tokens"):
        SchedulerConfig(num_blocks=4, max_num_batched_tokens=2, num_spec_tokens=4)


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("k", [0, 3])
def test_aborted_requests_stop_streaming_and_give_their_blocks_back(async_, k):
    # r0 aborted while running (at step 3, with a step in flight under async), r5 while still
    # waiting (max_num_seqs 2 holds it back): neither streams again, the others get exactly
    # their tokens, and every block comes back.
    reqs = [(f"r{i}", 12 + 5 * i, 30) for i in range(6)]
    cfg = SchedulerConfig(num_blocks=100, max_num_seqs=2, num_spec_tokens=k,
                          async_scheduling=async_)
    s, chunks, outputs = drive(cfg, reqs, seeded(k), aborts={3: ["r0", "r5"]})
    assert 0 < sum(chunks["r0"]) < 30 and chunks["r5"] == []
    assert {rid: sum(c) for rid, c in chunks.items() if rid not in ("r0", "r5")} == \
        {f"r{i}": 30 for i in range(1, 5)}
    assert s.num_free_blocks == 100 and not s.running and not s.waiting and not s.requests
    after = [x.request.request_id for o in outputs[3:] for x in o.scheduled]
    assert "r0" not in after and "r5" not in after
    told = [rid for o in outputs for rid in o.finished]
    assert told.count("r0") == 1 and told.count("r5") == 1  # the worker drops their state


def test_abort_of_a_request_the_scheduler_does_not_hold_is_a_no_op():
    s = Scheduler(SchedulerConfig(num_blocks=10))
    s.add_request(Request("a", 4, 2))
    assert not s.abort_request("nope")
    assert s.abort_request("a") and not s.abort_request("a")
    assert s.num_free_blocks == 10 and not s.has_unfinished()


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("k", [0, 3])
def test_a_request_with_an_eos_token_stops_there_and_keeps_it(async_, k):
    # Every token is 7 until a request holds 10, then the eos token 2: each stops at 11
    # tokens (the eos included), whatever it asked for, and discards what follows it.
    cfg = SchedulerConfig(num_blocks=100, max_num_seqs=4, num_spec_tokens=k,
                          async_scheduling=async_)
    s, chunks, _ = drive(cfg, [(f"r{i}", 9 + i, 40) for i in range(3)], full, eos=2)
    assert {rid: sum(c) for rid, c in chunks.items()} == {f"r{i}": 11 for i in range(3)}
    assert s.num_free_blocks == 100 and not s.requests
