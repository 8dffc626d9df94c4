"""Data parallelism as vLLM runs it (`--data-parallel-size N`): N engine cores, each with its own
scheduler, KV cache, worker and GPU(s), behind one front end that routes each request (`Router`);
for a MoE target, the ranks' lockstep (`Lockstep`). docs/explanation/past-one-gpu.md, "Data and
expert parallelism", states and tests/test_sim_dp.py checks each rule.

- Routing (vLLM's DPLBAsyncMPClient): a request goes to the engine core with the lowest
  4 x waiting + running, as the DP coordinator last published the counts, plus one waiting
  for each request the front end has sent it since; ties to the lowest rank. The engine cores
  report their counts after each step where they changed, and the coordinator
  (vllm/v1/engine/coordinator.py) publishes them at most every 100 ms. (Its republication of
  unchanged counts every 4 s is not modelled.)
- A dense target's engine cores run independently (vLLM: "Non-MoE DP ranks are completely
  independent").
- A MoE target's run in lockstep (vLLM's DPEngineCoreProc): every MoE layer gathers the
  tokens of all ranks (sim/expert_parallel.py), so every rank runs every forward. While any
  rank has requests (a wave), a rank with nothing to run in a turn of its loop runs a dummy
  batch (execute_dummy_batch: one token, no logits); a request sent to an idle group starts
  a wave on every rank (START_DP_WAVE); every 32 forwards the ranks check whether any has
  unfinished requests, and pause when none has.
- Before each forward the ranks meet (coordinate_batch_across_dp: an all-reduce of their
  token counts, on the CPU under async scheduling): the last one's arrival plus `dp_sync`
  (a CPU term, our estimate 50 us) releases them all, and each then launches.
- On the device a forward of the group starts when its last rank's can start and lasts as long
  as its slowest rank's: the ranks wait for each other at every MoE layer's collectives. A
  rank's other ops (the sampler, a dense drafter's passes, the copy out) are its own; a MoE
  drafter's passes (MTP of a MoE target) meet like the forward.
- Under CUDA graphs the ranks pad their batches to the largest (vLLM's DP padding): every MoE
  layer sees dp x the largest rank's tokens while each rank's batch is within the graphs'
  sizes (`GRAPH_TOKENS`), else the sum of their tokens (`gathered_rows`).
- The timeline keeps docs/explanation/design.md §2's lanes; every span of a rank carries args.dp
  (its rank); the Chrome trace shows each rank as its own process.

The engine cores are sim/core.py's `EngineCore`s, the front end sim/cluster.py's `DataParallel`;
this module holds what they share: the routing, the lockstep, the dummy batch.
"""

from __future__ import annotations

from stepgap.common.formats import Span
from stepgap.common.scheduler import SchedulerOutput
from stepgap.sim.costs import Batch
from stepgap.sim.device_lane import WORKER


LB_PERIOD_US = 100e3     # the DP coordinator's least interval between publications
WAVE_CHECK = 32          # forwards between the ranks' all-reduce of their unfinished requests
GRAPH_TOKENS = 512       # vLLM's largest CUDA-graph capture size by default
DP_SYNC_US = 50.0        # coordinate_batch_across_dp: our estimate (--cpu-cost dp_sync=A)
SYNCED = ("target_forward", "target_forward+rejection_sample")


def gathered_rows(counts: list[int]) -> int:
    """The rows every rank's MoE layers see: the ranks' batches padded to the largest under
    CUDA graphs (every batch within the graphs' sizes), else their sum."""
    top = max(counts)
    return len(counts) * top if top <= GRAPH_TOKENS else sum(counts)


def dummy_batch(sched) -> tuple[SchedulerOutput, Batch]:
    """vLLM's dummy batch: one decode token of one request, no logits; it takes the step
    number an empty schedule would (the scheduler's counter)."""
    out = SchedulerOutput(sched.step, [], [], [], 1)
    sched.step += 1
    return out, Batch(1, 1, 0, 0, 0, 1, 1.0, 1, 1, 1, 1, 1, 1, [])


class Router:
    """vLLM's DP front end: its view of the ranks' counts, and the coordinator's."""

    def __init__(self, env, n: int):
        self.env = env
        self.view = [[0, 0] for _ in range(n)]      # the front end's: [waiting, running]
        self.counts = [[0, 0] for _ in range(n)]    # the coordinator's, as last reported
        self.sent = [0] * n
        self.last = -LB_PERIOD_US
        self.pending = False

    def choose(self) -> int:
        best = min(range(len(self.view)), key=lambda i: (4 * self.view[i][0] + self.view[i][1],
                                                         i))
        self.view[best][0] += 1
        self.sent[best] += 1
        return best

    def report(self, i: int, waiting: int, running: int) -> None:
        """Rank i's counts after a step; the coordinator publishes changes, at most every
        LB_PERIOD_US."""
        if self.counts[i] == [waiting, running]:
            return
        self.counts[i] = [waiting, running]
        if not self.pending:
            self.pending = True
            delay = max(0.0, self.last + LB_PERIOD_US - self.env.now)
            self.env.timeout(delay).callbacks.append(self._publish)

    def _publish(self, _=None) -> None:
        self.view = [list(c) for c in self.counts]
        self.last, self.pending = self.env.now, False


class Lockstep:
    """A MoE target's DP ranks: their meeting before each forward and the group's device
    timing (module docstring)."""

    def __init__(self, group, dp_sync: float, moe_drafter: bool):
        self.group, self.env = group, group.env
        self.dp_sync, self.moe_drafter = dp_sync, moe_drafter
        self.running = False   # a wave: every rank runs every forward
        self.forwards = 0      # of this wave
        self.arrived: list[tuple] = []   # (rank, step, launch time, latency, its event)

    def start_wave(self) -> None:
        """A request reached an idle group: every rank starts running (START_DP_WAVE)."""
        if not self.running:
            self.running, self.forwards = True, 0
            for rank in self.group.ranks:
                rank.wake_engine()

    def meet(self, rank, step, dur: float, lat: float):
        """Rank `rank` is ready to launch `step` (its launch takes `dur`): it waits for the
        other ranks (a `wait` span on its worker lane), then the group's forward is placed."""
        env, t0 = self.env, self.env.now
        # NOTE: an event of its own for each rank, not one they all wait on: the clock's
        # hold (sim/device_lane.py Clock) may move on only when nothing is queued, and one event's
        # waiters would resume one after another outside the queue
        met = env.event()
        self.arrived.append((rank, step, dur, lat, met))
        if len(self.arrived) == len(self.group.ranks):
            members, self.arrived = self.arrived, []
            env.timeout(self.dp_sync).callbacks.append(lambda _: self._release(members))
        yield met
        if rank.spans is not None:
            rank.spans.append(Span(WORKER, "wait", step.out.step, t0, env.now,
                                   {"on": "dp all-reduce"}))

    def _release(self, members: list[tuple]) -> None:
        self.forwards += 1
        if self.forwards % WAVE_CHECK == 0 and not any(r.unfinished() for r in self.group.ranks):
            self.running = False   # the wave ends: the ranks pause after this forward
        self.place(members)
        for m in members:
            m[4].succeed()

    def place(self, members: list[tuple]) -> None:
        """The group's forward on the ranks' device lanes (module docstring)."""
        steps = [m[1] for m in members]
        rows = gathered_rows([s.batch.num_tokens for s in steps])
        draft_rows = gathered_rows([max(s.batch.num_sampling, 1) for s in steps])
        now, lanes = self.env.now, []
        for rank, step, dur, lat, _ in members:
            b = step.batch
            b.moe_rows, b.draft_moe_rows = rows, draft_rows
            dev = rank.device
            ops, durs, sample, nverify = dev.step_ops(b)
            if step.dummy:   # no output to copy out
                ops, durs = ops[:-1], durs[:-1]
            if dev.jitter is not None:
                f = dev.jitter.factor(max(dev.free, now + lat))
                durs = [d * f for d in durs]
                sample *= f
            start = max(dev.free, now + lat, now + dur + lat - sum(durs))
            lanes.append([rank, step, ops, durs, sample, nverify, start, [], 0])
        self._walk(lanes)
        for rank, step, ops, durs, sample, nverify, start, starts, _ in lanes:
            dev = rank.device
            step.t_accepted = starts[nverify - 1] + durs[nverify - 1]
            step.t_done = dev.free = max(starts[-1] + durs[-1], step.t_accepted)
            if dev.last_end is not None:
                dev.gaps.append(max(0.0, starts[0] - dev.last_end))
            dev.last_end = step.t_done
            if dev.spans is not None:
                dev.record(step.out.step, starts[0], ops, durs, sample, starts)

    def _walk(self, lanes: list[list]) -> None:
        """Each rank's ops in order: its own back to back, the synced ones (the forward; a MoE
        drafter's passes) together, from the last rank's arrival for the slowest's time."""
        synced = SYNCED + (("draft_forward",) if self.moe_drafter else ())
        for lane in lanes:
            lane[8] = lane[6]   # the cursor
        while True:
            for lane in lanes:   # each rank's own ops up to its next synced one
                ops, durs, starts = lane[2], lane[3], lane[7]
                while len(starts) < len(ops) and ops[len(starts)] not in synced:
                    starts.append(lane[8])
                    lane[8] += durs[len(starts) - 1]
            at = [lane for lane in lanes if len(lane[7]) < len(lane[2])]
            if not at:
                return
            begin = max(lane[8] for lane in lanes)
            length = max(lane[3][len(lane[7])] for lane in at)
            for lane in lanes:
                if lane in at:
                    lane[3][len(lane[7])] = length   # it lasts as long as the slowest rank's
                    lane[7].append(begin)
                lane[8] = begin + length
