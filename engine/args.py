"""EngineArgs: one engine's whole setup in one place, as vLLM's EngineArgs is.

Everything that runs the engine builds it from one of these: `stepgap run` and `stepgap serve`,
the demo, validation and profiling (calibrate/), the GPU driver, training's greedy data, and
the tests. It makes the three parts of a run:

- `worker_spec()`: what the worker builds once (models, KV cache, device);
- `engine_config(mode, k)`: one run's scheduling (a worker serves runs of any mode and any
  k up to its `max_k`);
- `make_executor()`: the worker inline or in its own process.

Field names follow `vllm serve` (`docs/design.md`, "One vocabulary"); errors name the option.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from stepgap.common.errors import UserError
from stepgap.common.formats import MODES
from stepgap.common.options import DEVICES, EXECUTORS, MAX_K
from stepgap.common.scheduler import cdiv
from stepgap.engine.kv_cache import BLOCK_SIZE
from stepgap.engine.loop import EngineConfig
from stepgap.engine.sampler import SamplingConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
RESERVED_BYTES = 2 * 2 ** 30   # CUDA context, graphs and activations, kept out of the KV cache


@dataclass(slots=True)
class EngineArgs:
    model: str                       # target: a Llama folder, a preset, or `tiny`
    draft: str | None = None         # EAGLE-3 head: a folder, a preset, `eagle3`, `tiny-eagle3`
    k: int = 0                       # --num-speculative-tokens
    mode: str = "sync"
    executor: str = "inline"
    pin: bool = True                 # process executor: engine and worker on a core each
    device: str = "cpu"
    dtype: str | None = None         # default: bfloat16 on cuda, float32 on the cpu
    block_size: int = BLOCK_SIZE
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float | None = None   # size the KV cache from device memory
    kv_cache_gib: float = 4.0        # otherwise: room for every sequence, capped at this
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    max_k: int | None = None         # deepest k this worker serves (default: k, at least 1)
    cuda_graphs: bool = True
    emulate_graphs: bool = False     # tests: the graphs' padded path, run eagerly on the CPU
    random_weights: bool = False
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0
    num_threads: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise UserError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.executor not in EXECUTORS:
            raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, "
                            f"got {self.executor!r}")
        if self.device not in DEVICES:
            raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype is not None and self.dtype not in DTYPE_BYTES:
            raise UserError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if not isinstance(self.k, int) or not 0 <= self.k <= MAX_K:
            raise UserError(f"--num-speculative-tokens must be an integer from 0 to {MAX_K}, "
                            f"got {self.k!r}")
        if self.k > 0 and not self.draft:
            raise UserError(f"--num-speculative-tokens {self.k} needs a draft head: give "
                            "--speculative-config's model (or --draft)")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise UserError("--num-gpu-blocks-override must be >= 1, "
                            f"got {self.num_gpu_blocks_override}")
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise UserError(f"--gpu-memory-utilization must be in (0, 1], got {u}")
        if not (math.isfinite(self.kv_cache_gib) and self.kv_cache_gib > 0):
            raise UserError(f"--kv-cache-gib must be a finite number > 0, got {self.kv_cache_gib}")
        if self.max_k is not None and self.max_k < self.k:
            raise UserError(f"max_k {self.max_k} is below k {self.k}")

    @property
    def dtype_name(self) -> str:
        return self.dtype or ("bfloat16" if self.device == "cuda" else "float32")

    def target_config(self):
        from stepgap.engine.checkpoint import target_config
        return target_config(self.model)

    def draft_config(self, target=None):
        from stepgap.engine.checkpoint import check_draft_fits, draft_config
        if not self.draft:
            return None
        target = target or self.target_config()
        cfg = draft_config(self.draft, target)
        check_draft_fits(cfg, target, self.draft)
        return cfg

    def num_blocks(self) -> int:
        """--num-gpu-blocks-override; else what --gpu-memory-utilization of the device's memory
        holds after the weights; else room for max_num_seqs sequences of max_model_len, capped
        at --kv-cache-gib."""
        if self.num_gpu_blocks_override is not None:
            return self.num_gpu_blocks_override
        target = self.target_config()
        draft = self.draft_config(target)
        nbytes = DTYPE_BYTES[self.dtype_name]
        layers = target.num_layers + (1 if draft is not None else 0)
        per_block = layers * 2 * self.block_size * target.num_kv_heads * target.head_dim * nbytes
        if self.gpu_memory_utilization is not None:
            weights = nbytes * (target.num_params + (draft.num_params if draft else 0))
            free = device_memory(self.device) * self.gpu_memory_utilization - weights
            free -= RESERVED_BYTES if self.device == "cuda" else 0
            blocks = int(free // per_block)
            if blocks < 1:
                raise UserError(f"--gpu-memory-utilization {self.gpu_memory_utilization}: the "
                                f"weights ({weights / 1e9:.2f} GB) leave no room for a KV cache")
            return blocks
        want = self.max_num_seqs * cdiv(self.max_model_len + self.k, self.block_size)
        return max(1, min(want, int(self.kv_cache_gib * 2 ** 30 // per_block)))

    def check_memory(self, num_blocks: int) -> None:
        """What the worker will allocate (weights, the KV cache, the RoPE tables) fits the
        device's memory: a typo such as --num-gpu-blocks-override 1e9 fails here, naming the
        options, not in the kernel's out-of-memory killer."""
        target = self.target_config()
        draft = self.draft_config(target)
        nbytes = DTYPE_BYTES[self.dtype_name]
        layers = target.num_layers + (1 if draft is not None else 0)
        kv = num_blocks * layers * 2 * self.block_size * target.num_kv_heads * \
            target.head_dim * nbytes
        weights = nbytes * (target.num_params + (draft.num_params if draft else 0))
        positions = self.max_model_len + (self.max_k or max(self.k, 1)) + self.block_size
        rope = 2 * 2 * 4 * positions * target.head_dim   # cos and sin, target and head
        have = device_memory(self.device)
        if weights + kv + rope > have:
            gib = 2 ** 30
            raise UserError(
                f"the {self.device} worker would need {(weights + kv + rope) / gib:.1f} GiB "
                f"(weights {weights / gib:.1f}, KV cache of {num_blocks} blocks {kv / gib:.1f}, "
                f"RoPE tables for --max-model-len {self.max_model_len} {rope / gib:.1f}) but the "
                f"{self.device} has {have / gib:.1f} GiB; lower --num-gpu-blocks-override, "
                "--max-model-len or --kv-cache-gib")

    def worker_spec(self):
        from stepgap.engine.worker import WorkerSpec
        blocks = self.num_blocks()
        self.check_memory(blocks)
        return WorkerSpec(self.model, self.draft, self.device, self.dtype,
                          num_blocks=blocks, max_model_len=self.max_model_len,
                          max_num_seqs=self.max_num_seqs, max_k=self.max_k or max(self.k, 1),
                          cuda_graphs=self.cuda_graphs, block_size=self.block_size,
                          seed=self.seed, num_threads=self.num_threads,
                          emulate_graphs=self.emulate_graphs,
                          random_weights=self.random_weights)

    def engine_config(self, mode: str | None = None, k: int | None = None,
                      num_blocks: int | None = None) -> EngineConfig:
        return EngineConfig(mode or self.mode, self.k if k is None else k,
                            num_blocks or self.num_blocks(), self.max_num_seqs,
                            self.max_num_batched_tokens, self.max_model_len, self.sampling,
                            self.block_size, self.target_config().max_position_embeddings)

    def make_executor(self):
        from stepgap.engine.executor import make_executor
        return make_executor(self.executor, self.worker_spec(), self.pin)

    def with_(self, **changes) -> "EngineArgs":
        return replace(self, **changes)


def device_memory(device: str) -> float:
    """Bytes of the device's memory: the GPU's, or the host's RAM for the CPU (as vLLM's CPU
    backend reads --gpu-memory-utilization)."""
    if device == "cuda":
        import torch
        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
