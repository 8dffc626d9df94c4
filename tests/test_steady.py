"""Steady turns (sim/steady.py) leave the scheduler as its own turns do, and give its results."""

from __future__ import annotations

import json

import pytest

from stepgap.sim import paths, plain_loop, steady
from stepgap.sim.config import SimConfig
from stepgap.sim.loop import simulate
from tests.test_sim_replay import BASE, REPLAYED

CASES = {**REPLAYED,
         # under pressure on the pool: steady turns between preemptions, whose decoded blocks
         # the prefix cache must know when the preempted requests come back
         "preemption at concurrency 96": dict(workload="sharegpt", num_prompts=400,
                                              num_gpu_blocks_override=300, max_concurrency=96),
         "sync under preemption": dict(mode="sync", workload="sharegpt", num_prompts=400,
                                       num_gpu_blocks_override=300, max_concurrency=96)}


def state(sched) -> str:
    """Everything the scheduler holds: each request's counts and blocks, the pool's free list
    and its prefix cache, the counters."""
    pool = sched.pool
    reqs = [(r.request_id, r.status, r.num_computed_tokens, r.num_output_placeholders,
             r.num_spec_tokens, len(r.output_token_ids), r.block_ids, r.num_cached_blocks,
             r.num_preemptions) for r in sched.requests.values()]
    return json.dumps([reqs, [r.request_id for r in sched.running], sched.step, pool.fresh,
                       list(pool.free_ids), sorted(map(list, pool.cached.items())),
                       sorted(map(list, pool.key_of.items())), sorted(pool.refs.items()),
                       sched.num_preemptions, sched.prefix_cache_counts(), sched._finished_ids],
                      default=str)


def run(settings: dict, monkeypatch, on: bool) -> tuple[str, list, int]:
    """The run's result, its scheduler's state and acceptance counts at the end, and how many
    turns were steady."""
    seen, taken = [], []
    real_record, real_take = plain_loop.record, steady.SteadyTurns.take

    def record(core, client, rec):
        real_record(core, client, rec)
        seen.append([state(core.sched), core.steps.accepted_hist, core.steps.num_draft_tokens])

    def take(self, queue, u):
        ok = on and real_take(self, queue, u)
        taken.append(ok)
        return ok
    monkeypatch.setattr(plain_loop, "record", record)
    monkeypatch.setattr(paths, "record", lambda *a: False)   # (the scheduler's turns, here)
    monkeypatch.setattr(steady.SteadyTurns, "take", take)
    settings = {k: v for k, v in settings.items() if not (k == "draft" and v is None)}
    res = simulate(SimConfig(**settings))[0]
    return json.dumps(res, sort_keys=True, default=str), seen[0], sum(taken)


@pytest.mark.parametrize("case", list(CASES))
def test_steady_turns_leave_the_scheduler_as_its_own_turns_do(case, monkeypatch):
    settings = {**BASE, **CASES[case]}
    res, end, steady_turns = run(settings, monkeypatch, True)
    assert steady_turns > 0, "no turn was steady: the case tests nothing"
    assert run(settings, monkeypatch, False) == (res, end, 0)

