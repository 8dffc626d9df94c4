"""The worker (model runner): models, KV cache, per-request state, and the step's device work.

A step is `execute` (prepare_inputs, then launch) and, later, `collect`:

- prepare_inputs: build the flattened batch on the host from the scheduler's step and the
  worker's own per-request state (tokens, true num_computed, drafts). A request whose previous
  step is still in flight gets its input ids from that step's device outputs instead (async
  modes), so step N+1 never waits for N's tokens on the host.
- launch: one H2D copy of the packed inputs; in zero-bubble the `fixup` corrects positions (and so
  slot mapping and masks) from N's on-device accepted counts; then target_forward,
  rejection_sample, the D2H of accepted counts (the event `async` waits on), k draft_forward
  passes, and the D2H of tokens and drafts. On CUDA the D2H copies run on their own stream into
  pinned buffers, with events as the only sync points, and decode forwards replay CUDA graphs.
- collect: wait for the D2H, hand back each sampling request's 1 + accepted tokens, and fold them
  into the per-request state.

Modes (docs/explanation/design.md §1): `sync` collects each step before the next; `async` waits for
the previous step's accepted counts before preparing (they fix positions on the host); `zero-bubble`
never waits, prepares as if every draft were accepted, and lets the device fix it up.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np
import torch

from stepgap.common.errors import UserError
from stepgap.common.formats import MODES, Span
from stepgap.common.scheduler import MAX_MODEL_LEN, MAX_NUM_SEQS
from stepgap.engine.checkpoint import load_draft, load_target
from stepgap.engine.drafter import Eagle3Drafter
from stepgap.engine.graphs import DecodeGraphs, GraphPlan, capture
from stepgap.engine.kv_cache import BLOCK_SIZE, KVCache, attention_context, make_context
from stepgap.engine.sampler import SamplingConfig, rejection_sample
from stepgap.engine.timing import DeviceTimer, HostSpans

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the worker builds once: models, KV cache, device."""

    target: str                   # HF Llama folder, or a preset name (random weights)
    draft: str | None = None      # EAGLE-3 folder (either layout), preset, or 'eagle3'
    device: str = "cpu"
    dtype: str | None = None      # default: bfloat16 on CUDA, float32 on the CPU
    num_blocks: int = 1024
    max_model_len: int = MAX_MODEL_LEN
    max_num_seqs: int = MAX_NUM_SEQS
    max_k: int = 8
    cuda_graphs: bool = True      # on CUDA: replay decode steps from CUDA graphs
    block_size: int = BLOCK_SIZE  # tokens per KV block
    seed: int = 0
    num_threads: int | None = None
    emulate_graphs: bool = False  # tests: the graphs' padded, bucketed path, run eagerly
    random_weights: bool = False  # build folders' configs with random weights (no tensors read)

    def __post_init__(self):
        # (its settings come from an EngineArgs, which checked them: engine/args.py)
        if self.device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is available to torch here")

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype:
            return DTYPES[self.dtype]
        return torch.bfloat16 if self.device == "cuda" else torch.float32


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What may change from run to run on the same worker."""

    mode: str = "sync"
    k: int = 0
    sampling: SamplingConfig = SamplingConfig()

    def __post_init__(self):
        if self.mode not in MODES:
            raise UserError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 0 <= self.k:
            raise UserError(f"--num-speculative-tokens must be >= 0, got {self.k}")


class ReqRow(NamedTuple):
    """One request's share of a step, as the engine core sends it to the worker."""

    request_id: str
    num_new: int                  # tokens this step computes for it
    num_spec: int                 # draft tokens among them, verified this step
    samples: bool                 # the chunk reaches the end of its known tokens
    start: int                    # the scheduler's num_computed_tokens before this step
    block_ids: list[int]
    token_ids: list[int] | None = None   # fresh rows only: prompt and outputs so far
    accepted: list[int] | None = None    # fresh rows only: forced accepted count per decode step


@dataclass(slots=True)
class StepMsg:
    """One scheduled step, as the engine core sends it to the worker."""

    step: int
    reqs: list[ReqRow]
    preempted: list[str]
    finished: list[str]


@dataclass(slots=True)
class StepResult:
    step: int
    sampled: dict[str, list[int]]  # request id -> 1 + accepted tokens
    spans: list[Span]


@dataclass(slots=True)
class ReqState:
    tokens: list[int]          # tokens known on the host: prompt + collected outputs
    num_computed: int = 0      # tokens whose KV is in the cache (optimistic until corrected)
    drafts: list[int] = field(default_factory=list)  # the last collected step's drafts
    # (handle, row) of its sampling steps not yet collected, oldest first (at most 2 in flight)
    pending: list = field(default_factory=list)

    def in_flight(self, h: "StepHandle") -> bool:
        return any(ph is h for ph, _ in self.pending)


@dataclass(slots=True)
class StepInputs:
    """One step's flattened inputs over N tokens in B rows: numpy arrays on the host, then
    views of one device buffer after their one H2D copy (`to_device`)."""

    ids: np.ndarray          # [N] token ids (those patched on the device: 0 here)
    pos: np.ndarray          # [N] positions
    rows: np.ndarray         # [N] the row of each token
    unpad: np.ndarray        # [N] each token's slot in the padded [B, Q] grid
    pad: np.ndarray          # [B, Q] the token of each grid slot (a row's last, past its end)
    tables: np.ndarray       # [B, W] block tables, padded with the scratch block
    verify: np.ndarray       # [B, 1 + k] the flat index of each token a row verifies
    num_spec: np.ndarray     # [B] drafts each row verifies
    samples: np.ndarray      # [B] 1 where the row samples
    fallback: np.ndarray     # [B] a row that does not sample: its next prompt token
    forced: np.ndarray       # [B] the forced accepted count (synthetic acceptance)
    patch_dst: np.ndarray    # [P] input ids that come from the previous step's outputs ...
    patch_row: np.ndarray    # [P] ... its row there
    patch_col: np.ndarray    # [P] ... and column (0: its sampled token, 1..k: its drafts)
    fix_row: np.ndarray      # [F] rows whose positions the zero-bubble fixup corrects ...
    fix_prev: np.ndarray     # [F] ... and their row in the previous step

    def to_device(self, device: torch.device) -> "StepInputs":
        """One H2D copy of every array, packed; the same fields as device views."""
        arrays = [getattr(self, f.name) for f in fields(self)]
        packed = torch.from_numpy(np.concatenate([a.ravel() for a in arrays]))
        if device.type == "cuda":
            packed = packed.pin_memory().to(device, non_blocking=True)
        views, off = [], 0
        for a in arrays:
            views.append(packed[off:off + a.size].view(a.shape))
            off += a.size
        return StepInputs(*views)


@dataclass(slots=True)
class PreparedBatch:
    """One step's flattened inputs on the host, before their one H2D copy."""

    num_reqs: int
    num_tokens: int
    max_query: int            # the longest chunk: the padded query grid's width
    width: int                # the widest block table
    uniform: bool             # every row verifies 1 + k tokens: a CUDA-graph shape
    shape: dict               # what the device ops work on, for their spans (sim/costs.py Batch)
    num_patched: int          # input ids that come from the previous step's device outputs
    num_fixed: int            # rows whose positions the zero-bubble fixup corrects
    inputs: StepInputs


@dataclass(slots=True, eq=False)
class StepHandle:
    """A launched step: its rows, device outputs, host copies, events, and timing records."""

    step: int
    rows: list[tuple[str, int, bool]]        # (request id, num_spec, samples) per row
    # num_computed corrected by the true accepted counts (nothing to correct without drafts)
    corrected: bool
    records: list = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    next_token: torch.Tensor | None = None   # [B] the token each row feeds the next step
    num_accepted: torch.Tensor | None = None  # [B]
    num_spec: torch.Tensor | None = None     # [B] drafts each row verified
    tokens: torch.Tensor | None = None       # [B, 1 + k] sampled tokens
    drafts: torch.Tensor | None = None       # [B, k] the next step's drafts (k > 0)
    acc_host: torch.Tensor | None = None     # accepted counts on the host (pinned on CUDA)
    acc_event: object = None                 # CUDA: acc_host has landed
    out_host: torch.Tensor | None = None     # [B, 1 + k + 1 + k] tokens, count, drafts
    out_event: object = None                 # CUDA: out_host has landed
    packed: torch.Tensor | None = None       # the device buffer out_host copies from

    @classmethod
    def of(cls, msg: StepMsg) -> "StepHandle":
        rows = [(r.request_id, r.num_spec, r.samples) for r in msg.reqs]
        return cls(msg.step, rows, corrected=not any(r.num_spec for r in msg.reqs))

    def ready(self) -> bool:
        return self.out_event is None or self.out_event.query()


# A CPU worker's torch threads (docs/explanation/engine.md, "Threads on a shared machine"): one per
# CPU the process may run on, as vLLM's CPU worker binds one OpenMP thread per core it owns, except
# for a model narrower than this, whose matrix products take microseconds: split over threads, each
# costs a wake-up and a barrier more than it saves, and a barrier waits for the slowest thread,
# which on a shared machine is the one whose core another process holds.
SMALL_HIDDEN = 1024


def cpu_threads(hidden_size: int) -> int:
    """Torch threads for a CPU worker of a model this wide, unless the user set them."""
    import os
    if "OMP_NUM_THREADS" in os.environ:
        return torch.get_num_threads()
    if hidden_size < SMALL_HIDDEN:
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1


class Worker:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        if spec.num_threads:
            torch.set_num_threads(spec.num_threads)
        self.device = torch.device(spec.device)
        self.dtype = spec.torch_dtype
        self.cuda = self.device.type == "cuda"
        max_pos = spec.max_model_len + spec.max_k + spec.block_size
        self.target, self.target_cfg = load_target(spec.target, self.device, self.dtype, max_pos,
                                                   seed=spec.seed,
                                                   random_weights=spec.random_weights)
        if not spec.num_threads and not self.cuda:
            torch.set_num_threads(cpu_threads(self.target_cfg.hidden_size))
        self.draft = self.draft_cfg = None
        if spec.draft:
            self.draft, self.draft_cfg = load_draft(spec.draft, self.target, self.device,
                                                    self.dtype, max_pos, seed=spec.seed,
                                                    random_weights=spec.random_weights)
        layers = self.target.attention_layers() + (self.draft.attention_layers()
                                                   if self.draft else [])
        hkv = {a.hkv for a in layers}
        dims = {a.d for a in layers}
        if len(hkv) != 1 or len(dims) != 1:
            raise UserError("the draft head's KV heads / head_dim differ from the target's; "
                            "the shared paged KV cache needs them equal")
        self.kv = KVCache(len(layers), spec.num_blocks, hkv.pop(), dims.pop(), self.dtype,
                          self.device, spec.block_size)
        for i, attn in enumerate(layers):
            attn.k_cache, attn.v_cache = self.kv.layer(i)
        self.scratch = self.kv.scratch_block
        self.drafter = Eagle3Drafter(self.draft, self.target_cfg.hidden_size, self._context) \
            if self.draft else None
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.target_graphs: DecodeGraphs | None = None
        self.graphs_k: int | None = None   # the k the graphs were captured for
        self.graph_pool = None
        self.graph_error: str | None = None
        self.run = None

    def info(self) -> dict:
        return {"target": self.target_cfg.name, "draft": self.draft_cfg.name if self.draft_cfg
                else None, "device": str(self.device), "dtype": str(self.dtype).split(".")[-1],
                "target_params": sum(p.numel() for p in self.target.parameters()),
                "kv_cache_bytes": self.kv.nbytes, "num_blocks": self.spec.num_blocks,
                "graph_error": self.graph_error,
                "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                "gpu": torch.cuda.get_device_name(self.device) if self.cuda else None}

    # -- runs ---------------------------------------------------------------------------------

    def configure(self, run: RunConfig) -> None:
        """Start a run: drop all request state, seed sampling, capture graphs for this k."""
        if run.k > 0 and self.draft is None:
            raise UserError(f"--num-speculative-tokens {run.k} needs a draft head (--draft)")
        if run.k > self.spec.max_k:
            raise UserError(f"--num-speculative-tokens {run.k} exceeds the worker's max_k "
                            f"{self.spec.max_k}")
        self.run = run
        self.k = run.k
        self.states: dict[str, ReqState] = {}
        self.replay: dict[str, list[int]] = {}
        self.decode_steps: dict[str, int] = {}
        self.prev: StepHandle | None = None
        self.gen = torch.Generator(self.device).manual_seed(run.sampling.seed)
        if ((self.cuda and self.spec.cuda_graphs) or self.spec.emulate_graphs) \
                and self.graphs_k != run.k:
            try:
                self._capture_graphs(run.k)
            except Exception as e:  # run eagerly rather than not at all; say so
                self._drop_graphs()
                self.graph_error = f"{type(e).__name__}: {e}"
                warnings.warn(f"CUDA graph capture failed, running eagerly: {self.graph_error}")
        self.host = HostSpans("cpu.worker")
        self.timer = DeviceTimer(self.device)

    @torch.inference_mode()
    def _capture_graphs(self, k: int) -> None:
        """The decode forwards' graphs at depth k over every (batch, window) bucket: the
        target's (1 + k tokens per row) here, the drafter's passes in the drafter. On the CPU
        they are emulated (the padded path, run eagerly)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            if self.graph_pool is None:
                self.graph_pool = torch.cuda.graph_pool_handle()
        spec = self.spec
        plan = GraphPlan.of(self.device, self.dtype, self.scratch, self.kv.block_size,
                            spec.max_num_seqs, spec.max_model_len + spec.max_k, self.graph_pool)
        self.target_graphs = capture(plan, self._target_pass, 1 + k)
        if self.drafter:
            self.drafter.capture(k, plan)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.graphs_k = k

    def _drop_graphs(self) -> None:
        self.target_graphs, self.graphs_k = None, None
        if self.drafter:
            self.drafter.capture(0, None)

    def _target_pass(self, ids, pos, _hidden=None) -> tuple[torch.Tensor, ...]:
        """The target over a uniform batch, as its graphs capture it: logits of every token
        (all are verified) and, with drafts, the aux hidden states."""
        hidden, aux = self.target(ids, pos, return_aux=self.k > 0)
        logits = self.target.compute_logits(hidden)
        return (logits, aux) if aux is not None else (logits,)

    # -- execute --------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, msg: StepMsg) -> StepHandle:
        for rid in msg.preempted:
            self.states.pop(rid, None)
        for rid in msg.finished:
            self.states.pop(rid, None)
            self.replay.pop(rid, None)
            self.decode_steps.pop(rid, None)
        prev = self.prev
        if self.run.mode == "async" and prev is not None and not prev.corrected:
            with self.host.span("wait", msg.step):
                if prev.acc_event is not None:
                    prev.acc_event.synchronize()
            self._correct(prev, prev.acc_host.tolist())
        h = StepHandle.of(msg)
        with self.host.span("prepare_inputs", msg.step, reqs=len(msg.reqs),
                            tokens=sum(r.num_new for r in msg.reqs)):
            batch = self._prepare(msg, h)
        with self.host.span("launch", msg.step, reqs=batch.num_reqs, tokens=batch.num_tokens):
            self._launch(batch, h, prev)
        h.spans = self.host.take()
        self.prev = h
        return h

    def _prepare(self, msg: StepMsg, h: StepHandle) -> PreparedBatch:
        k, sync = self.k, self.run.mode == "sync"
        reqs = msg.reqs
        b = len(reqs)
        n_tok = sum(r.num_new for r in reqs)
        qmax = max(r.num_new for r in reqs)
        width = max(len(r.block_ids) for r in reqs)
        ids = np.zeros(n_tok, np.int64)
        pos = np.zeros(n_tok, np.int64)
        rows = np.zeros(n_tok, np.int64)
        unpad = np.zeros(n_tok, np.int64)
        pad = np.zeros((b, qmax), np.int64)
        tables = np.full((b, width), self.scratch, np.int64)
        verify = np.zeros((b, k + 1), np.int64)
        num_spec = np.zeros(b, np.int64)
        samples = np.zeros(b, np.int64)
        fallback = np.zeros(b, np.int64)
        forced = np.zeros(b, np.int64)
        patch_dst, patch_row, patch_col, fix_row, fix_prev = [], [], [], [], []
        off = kv = 0
        for i, (rid, n, ns, samp, sched_start, blocks, token_ids, accepted) in enumerate(reqs):
            if token_ids is not None:   # fresh: its first sched_start tokens' KV is in its
                # first blocks already (a prefix-cache hit, docs/explanation/engine.md)
                self.states[rid] = ReqState(list(token_ids), num_computed=sched_start)
                if accepted is not None:
                    self.replay[rid] = list(accepted)
            st = self.states[rid]
            start = st.num_computed
            if start > sched_start or (sync and start != sched_start):
                raise RuntimeError(f"worker: request {rid!r} has {start} computed tokens but the "
                                   f"scheduler counts {sched_start} (step {msg.step})")
            pos[off:off + n] = np.arange(start, start + n)
            rows[off:off + n] = i
            kv += start + n
            if st.pending:  # its latest step is in flight: its inputs come from the device
                ph, prow = st.pending[-1]
                if ph is not self.prev:  # the engine keeps at most one step uncollected
                    raise RuntimeError(f"worker: request {rid!r} depends on step {ph.step}, "
                                       f"which is not the previous step")
                patch_dst.extend(range(off, off + n))
                patch_row.extend([prow] * n)
                patch_col.extend(range(n))
                if not ph.corrected:
                    fix_row.append(i)
                    fix_prev.append(prow)
            else:
                seq = st.tokens
                end = start + n
                chunk = seq[start:end]
                if len(chunk) < n:
                    chunk = chunk + st.drafts[:n - len(chunk)]
                ids[off:off + n] = chunk
            if not samp:
                fallback[i] = st.tokens[start + n]  # the next prompt token, for the draft's shift
            pad[i, :n] = np.arange(off, off + n)
            pad[i, n:] = off + n - 1
            unpad[off:off + n] = i * qmax + np.arange(n)
            tables[i, :len(blocks)] = blocks
            verify[i, :ns + 1] = np.arange(off + n - 1 - ns, off + n)
            verify[i, ns + 1:] = off + n - 1
            num_spec[i], samples[i] = ns, samp
            if ns and self.run.sampling.forced:
                step_i = self.decode_steps.get(rid, 0)
                plan = self.replay.get(rid, [])
                forced[i] = plan[step_i] if step_i < len(plan) else 0
                self.decode_steps[rid] = step_i + 1
            st.num_computed = start + n
            if samp:
                st.pending.append((h, i))
            off += n
        uniform = all(r.num_new == 1 + k and r.num_spec == k and r.samples for r in reqs)
        # What the device ops work on, for their spans (the simulator's Batch, sim/costs.py).
        shape = {"q": qmax, "kv": kv, "sampling": int(samples.sum()),
                 "drafts": int(num_spec.sum())}
        inputs = StepInputs(ids, pos, rows, unpad, pad, tables, verify, num_spec, samples,
                            fallback, forced, *(np.asarray(a, np.int64) for a in (
                                patch_dst, patch_row, patch_col, fix_row, fix_prev)))
        return PreparedBatch(b, n_tok, qmax, width, uniform, shape, len(patch_dst), len(fix_row),
                             inputs)

    def _launch(self, batch: PreparedBatch, h: StepHandle, prev: StepHandle | None) -> None:
        k, step, rec = self.k, h.step, h.records
        b, n, width = batch.num_reqs, batch.num_tokens, batch.width
        d = batch.inputs.to_device(self.device)
        ids, pos, samples = d.ids, d.pos, d.samples.bool()
        if batch.num_patched:
            prev_table = prev.next_token.unsqueeze(1) if prev.drafts is None else \
                torch.cat([prev.next_token.unsqueeze(1), prev.drafts], dim=1)
            ids = ids.index_put((d.patch_dst,), prev_table[d.patch_row, d.patch_col])
        if batch.num_fixed:
            with self.timer.op(rec, "fixup", step, reqs=batch.num_fixed):
                rejected = prev.num_spec - prev.num_accepted
                adj = torch.zeros(b, dtype=torch.long, device=self.device)
                adj[d.fix_row] = rejected[d.fix_prev]
                pos = pos - adj[d.rows]
        g = self.target_graphs
        key = g.bucket(b, width) if batch.uniform and g is not None else None
        shape = batch.shape
        ctx = None
        with self.timer.op(rec, "target_forward", step, tokens=n, reqs=b, blocks=width,
                           graph=key is not None, **shape):
            if key is not None:
                outs = g.run(key, ids, pos, d.tables)
                logits, aux = outs[0].view(b, k + 1, -1), (outs[1] if k else None)
            else:
                ctx = self._context(pos, d.tables, d.pad, d.unpad)
                with attention_context(ctx):
                    hidden, aux = self.target(ids, pos, return_aux=k > 0)
                logits = self.target.compute_logits(hidden[d.verify.flatten()])
                logits = logits.view(b, k + 1, -1)
        with self.timer.op(rec, "rejection_sample", step, reqs=b, tokens=n, **shape):
            drafts_in = ids[d.verify[:, 1:]]
            forced = d.forced if self.run.sampling.forced else None
            tokens, num_accepted = rejection_sample(logits, drafts_in, d.num_spec,
                                                    self.run.sampling, self.gen, forced)
            next_token = tokens.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
            next_token = torch.where(samples, next_token, d.fallback)
        h.next_token, h.num_accepted, h.num_spec, h.tokens = next_token, num_accepted, \
            d.num_spec, tokens
        h.acc_host = self._d2h_accepted(h)
        if k:
            first = {"tokens": n, "reqs": b, "blocks": width}
            later = {"tokens": b, "reqs": b, "blocks": width}

            def timed(i: int, graph: bool):
                return self.timer.op(rec, "draft_forward", step, i=i, **(first if i == 0 else
                                     later), graph=graph, **(shape if i == 0 else {"q": 1}))

            h.drafts = self.drafter.propose(
                k, ids, pos, d.tables, d.verify[:, 0] + num_accepted, next_token, aux, samples,
                batch.uniform,
                lambda: ctx if ctx is not None else self._context(pos, d.tables, d.pad, d.unpad),
                timed)
        self._d2h_outputs(h)

    def _context(self, pos, tables, pad, unpad, write_mask=None):
        return make_context(pos, tables, pad, unpad, self.scratch, self.dtype, write_mask,
                            self.kv.block_size)

    # -- device to host -----------------------------------------------------------------------

    def _d2h_accepted(self, h: StepHandle):
        """Accepted counts to the host, recorded after rejection and before drafting."""
        if not self.cuda:
            return h.num_accepted
        done = torch.cuda.Event()
        done.record()
        host = torch.empty(h.num_accepted.shape, dtype=torch.long, pin_memory=True)
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(done)
            host.copy_(h.num_accepted, non_blocking=True)
            h.acc_event = torch.cuda.Event()
            h.acc_event.record(self.copy_stream)
        return host

    def _d2h_outputs(self, h: StepHandle) -> None:
        parts = [h.tokens, h.num_accepted.unsqueeze(1)] + \
            ([h.drafts] if h.drafts is not None else [])
        if not self.cuda:
            with self.timer.op(h.records, "d2h", h.step, reqs=len(h.rows)):
                h.out_host = torch.cat(parts, dim=1)
            return
        done = torch.cuda.Event()
        done.record()
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(done)
            with self.timer.op(h.records, "d2h", h.step, stream=self.copy_stream,
                               reqs=len(h.rows)):
                packed = torch.cat(parts, dim=1)
                h.out_host = torch.empty(packed.shape, dtype=torch.long, pin_memory=True)
                h.out_host.copy_(packed, non_blocking=True)
            h.out_event = torch.cuda.Event()
            h.out_event.record(self.copy_stream)
            h.packed = packed  # keep it alive until the copy is done

    # -- collect --------------------------------------------------------------------------------

    @torch.inference_mode()
    def collect(self, h: StepHandle) -> StepResult:
        if h.out_event is not None:
            with self.host.span("wait", h.step):
                h.out_event.synchronize()
        out = h.out_host.tolist()
        k = self.k
        acc = [row[k + 1] for row in out]
        if not h.corrected:
            self._correct(h, acc)
        sampled = {}
        for i, (rid, ns, samp) in enumerate(h.rows):
            if not samp:
                continue
            ids = out[i][:acc[i] + 1]
            sampled[rid] = ids
            st = self.states.get(rid)
            if st is not None and st.pending and st.pending[0][0] is h:
                st.pending.pop(0)
                st.tokens.extend(ids)
                st.drafts = out[i][k + 2:]
        spans = h.spans + self.host.take() + self.timer.spans(h.records)
        h.records = []
        if self.prev is h:
            self.prev = None
        return StepResult(h.step, sampled, spans)

    def _correct(self, h: StepHandle, acc: list[int]) -> None:
        """Take a step's rejected drafts back from its requests' num_computed."""
        for i, (rid, ns, samp) in enumerate(h.rows):
            st = self.states.get(rid)
            if samp and ns and st is not None and st.in_flight(h):
                st.num_computed -= ns - acc[i]
        h.corrected = True
