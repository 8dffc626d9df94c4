"""What each CPU op of the step loop costs (docs/explanation/design.md §3).

Each CPU op costs a + b·num_reqs + c·num_tokens microseconds (`OpCost`), plus three
latencies: launch (CPU launch start to the first kernel running), wake (a blocking wait
returning after its event fires) and IPC (one message between engine and a `process` worker).
A `process` worker on a synchronous device (the CPU) computes each step itself and then sends
its result, so two more terms, also a + b·num_reqs + c·num_tokens, describe it: the result's
latency to the engine and the worker's own turnaround before it can prepare the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from stepgap.common.errors import UserError, shown
from stepgap.common.limits import MAX_US, is_finite, is_number

CPU_OPS = ("schedule", "update_from_output", "prepare_inputs", "launch")
# Terms of the same form that are not ops (no span): a `process` worker on a synchronous device
# (the CPU) computes a step, then collects and sends its result. `result_latency` runs from the
# step's last device op to the engine's update_from_output; `worker_turnaround` is the time the
# worker then spends (collect, send, receive the next step) before it can prepare the next one.
CPU_TERMS = ("result_latency", "worker_turnaround")
# Ops of some methods and topologies only (spans on the worker lane): an n-gram proposer's
# matching on the host (its tokens argument: the context tokens searched), and with tensor
# parallelism the multiprocess executor's step reaching every rank (dequeue and unpickle of the
# broadcast, the slowest rank's) and rank 0 sending its output back.
CPU_EXTRA_OPS = ("propose", "broadcast", "collect")
# vLLM's topology (`--topology vllm`, docs/explanation/vllm.md): terms of its RPC structure and of
# its API server. None where absent (stepgap's engine sends one message per step and has no server).
# `rpc_mid`: the worker idle between its execute_model and sample_tokens RPCs (it answers one and
# takes the next off the shared-memory queue); `rpc_drafts`: in sync with drafts, the engine core's
# take_draft_token_ids round trip after update_from_output; `process_outputs`: the API server's work
# on one step's outputs (num_reqs = the chunks); `add_request`: the API server taking in one request
# (num_tokens = its prompt). The engine core and the API server share one core: their work is
# serialised (the `host` core of sim/core.py).
VLLM_TERMS = ("rpc_mid", "rpc_drafts", "process_outputs", "add_request")
# What vLLM's async path costs beyond its sync path for the same step (docs/explanation/vllm.md,
# "What vLLM's async path costs"), each a + b·num_reqs + c·draft tokens of the step (not its
# tokens): `async_schedule` the engine core's AsyncScheduler (placeholders for the tokens and drafts
# in flight) on top of schedule; `async_prepare` the worker placing the previous step's sampled
# tokens and drafts into the inputs (GPUModelRunner._prepare_input_ids: a Python loop over the
# requests in common with the previous step, the index tensors, two scatters) on top of
# prepare_inputs; `async_output` the output thread (WorkerAsyncOutputCopy, serialising each step's
# output while the main thread goes on) on the worker's core and GIL, after the step.
VLLM_ASYNC_TERMS = ("async_schedule", "async_prepare", "async_output")
# Data parallelism of a MoE target (sim/data_parallel.py): `dp_sync`, the ranks' all-reduce of
# their token counts before each forward (vLLM's coordinate_batch_across_dp), from the last
# rank's arrival to their release. None: data_parallel.py's estimate (DP_SYNC_US); left out of
# to_dict while None, so that a run without data parallelism writes what it wrote before.
DP_TERMS = ("dp_sync",)
CPU_COSTS = CPU_OPS + CPU_TERMS + CPU_EXTRA_OPS + VLLM_TERMS + VLLM_ASYNC_TERMS + DP_TERMS
LATENCIES = ("launch_latency_us", "wake_us", "ipc_us", "client_latency_us")


@dataclass(frozen=True, slots=True)
class OpCost:
    """a + b·num_reqs + c·num_tokens microseconds."""

    a: float
    b: float = 0.0
    c: float = 0.0

    def __post_init__(self):
        for f in ("a", "b", "c"):
            v = getattr(self, f)
            if not is_number(v) or v < 0:
                raise UserError(f"cpu cost: {f} must be a number >= 0, got {v!r}")

    def __call__(self, num_reqs: int, num_tokens: int) -> float:
        return self.a + self.b * num_reqs + self.c * num_tokens

    def each(self, num_reqs: np.ndarray, num_tokens: np.ndarray) -> list[float]:
        """The cost of each step of many (int arrays): the floats a call gives, in its order
        of operations."""
        return (self.a + self.b * num_reqs + self.c * num_tokens).tolist()


@dataclass(frozen=True, slots=True)
class CpuCosts:
    """The CPU side of the step loop. Defaults: a vLLM V1 engine on one core
    (docs/explanation/cpu-costs.md)."""

    schedule: OpCost = field(default_factory=lambda: OpCost(60.0, 6.0, 0.02))
    update_from_output: OpCost = field(default_factory=lambda: OpCost(60.0, 8.0, 0.05))
    prepare_inputs: OpCost = field(default_factory=lambda: OpCost(200.0, 4.0, 0.05))
    launch: OpCost = field(default_factory=lambda: OpCost(600.0, 2.0, 0.0))
    launch_latency_us: float = 40.0
    wake_us: float = 15.0
    ipc_us: float = 60.0
    # Process worker on a synchronous device only. None: wake_us + ipc_us, as on a GPU host.
    result_latency: OpCost | None = None
    worker_turnaround: OpCost = field(default_factory=lambda: OpCost(0.0))
    propose: OpCost = field(default_factory=lambda: OpCost(20.0, 1.0, 0.002))
    broadcast: OpCost = field(default_factory=lambda: OpCost(15.0, 0.5, 0.0))
    collect: OpCost = field(default_factory=lambda: OpCost(10.0, 0.5, 0.0))
    # vLLM's topology only (VLLM_TERMS); the client's latency: from the API server's processing
    # of a chunk to the benchmark client having it (the HTTP path both ways, lumped).
    rpc_mid: OpCost | None = None
    rpc_drafts: OpCost | None = None
    process_outputs: OpCost | None = None
    add_request: OpCost | None = None
    client_latency_us: float = 0.0
    # vLLM's topology in the async modes only (VLLM_ASYNC_TERMS); None: the sync path's costs
    async_schedule: OpCost | None = None
    async_prepare: OpCost | None = None
    async_output: OpCost | None = None
    dp_sync: OpCost | None = None   # DP_TERMS

    def __post_init__(self):
        for f in LATENCIES:
            v = getattr(self, f)
            if not is_number(v) or v < 0:
                raise UserError(f"cpu cost: {f} must be a number >= 0, got {v!r}")

    def result_latency_us(self, num_reqs: int, num_tokens: int) -> float:
        if self.result_latency is None:
            return self.wake_us + self.ipc_us
        return self.result_latency(num_reqs, num_tokens)

    def scaled(self, s: float) -> CpuCosts:
        """Every op and latency times `s` (the seed calibration fits one such factor)."""
        def mul(c: OpCost | None) -> OpCost | None:
            return None if c is None else OpCost(c.a * s, c.b * s, c.c * s)
        return CpuCosts(*(mul(getattr(self, op)) for op in CPU_OPS),
                        result_latency=mul(self.result_latency),
                        worker_turnaround=mul(self.worker_turnaround),
                        **{op: mul(getattr(self, op))
                           for op in CPU_EXTRA_OPS + VLLM_TERMS + VLLM_ASYNC_TERMS + DP_TERMS},
                        **{lat: getattr(self, lat) * s for lat in LATENCIES})

    def with_ops(self, overrides: dict[str, OpCost]) -> CpuCosts:
        for op in overrides:
            if op not in CPU_COSTS:
                raise UserError(f"cpu cost: unknown op {op!r} (ops: {', '.join(CPU_COSTS)})")
        return replace(self, **overrides)

    def to_dict(self) -> dict:
        d = {op: [c.a, c.b, c.c] if (c := getattr(self, op)) is not None else None
             for op in CPU_COSTS if op not in DP_TERMS or getattr(self, op) is not None}
        d.update({lat: getattr(self, lat) for lat in LATENCIES})
        return d

    @classmethod
    def from_dict(cls, d: dict, base: CpuCosts | None = None) -> CpuCosts:
        """The inverse of to_dict; keys it lacks keep `base`'s values (default: the defaults)."""
        base = base or cls()
        known = set(CPU_COSTS) | set(LATENCIES)
        unknown = set(d) - known
        if unknown:
            raise UserError(f"cpu costs: unknown key {sorted(unknown)[0]!r} "
                            f"(known: {', '.join(sorted(known))})")

        def us(x) -> bool:   # (the limit of the command line's own costs: MAX_US)
            return is_finite(x) and 0 <= x <= MAX_US

        kw = {}
        for key, v in d.items():
            if key in CPU_COSTS:
                if v is not None and (not isinstance(v, (list, tuple)) or not 1 <= len(v) <= 3
                                      or not all(us(x) for x in v)):
                    raise UserError(f"cpu costs: {key}: expected [a, b, c], finite "
                                    f"microseconds from 0 to {MAX_US:g}, got {shown(v)}")
                kw[key] = None if v is None else OpCost(*v)
            else:
                if v is not None and not us(v):
                    raise UserError(f"cpu costs: {key}: expected microseconds from 0 to "
                                    f"{MAX_US:g}, got {shown(v)}")
                kw[key] = v
        return replace(base, **kw)
