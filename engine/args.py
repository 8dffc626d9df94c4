"""EngineArgs: one engine's whole setup in one place, as vLLM's EngineArgs is.

Everything that runs the engine builds it from one of these: `stepgap run` and `stepgap serve`,
the demo, validation and profiling (calibrate/), the GPU driver, training's greedy data, and
the tests. `create_engine_config()` resolves it once into an `EngineSetup` (the models' configs
read and checked, the KV cache sized, as vLLM's create_engine_config), which makes the three
parts of a run:

- `worker_spec()`: what the worker builds once (models, KV cache, device), its memory checked;
- `engine_config(mode, k)`: one run's scheduling (a worker serves runs of any mode and any
  k up to its `max_k`);
- `make_executor()`: the worker inline or in its own process.

(EngineArgs has the same three as shortcuts, each resolving the args anew.)

Its fields are a RunSpec's (common/run_spec.py), named as `vllm serve` names them, and the
device's; each field's metadata gives its option, limits and help, for the check and for the
command line (engine/options.py); errors name the option.
This module imports no torch (the engine's modules are imported where a run needs them): the
command line builds an EngineArgs for its options' defaults, and must start without torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from stepgap.common.errors import UserError
from stepgap.common.limits import MAX_K
from stepgap.common.memory import RESERVED_BYTES, kv_bytes_per_token, kv_cache_blocks
from stepgap.common.model_heads import EagleHeadConfig
from stepgap.common.modelcfg import ModelConfig
from stepgap.common.run_spec import (LoadSpec, ModelSpec, SchedulerSpec, TopologySpec,
                                     check_fields, opt, same)
from stepgap.common.scheduler import cdiv
from stepgap.common.speculation import METHODS
from stepgap.engine.sampling_params import SamplingConfig

if TYPE_CHECKING:   # engine/loop.py imports torch
    from stepgap.engine.loop import EngineConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


@dataclass(frozen=True)
class EngineArgs(TopologySpec, SchedulerSpec, ModelSpec):
    """A run's model, scheduler and topology settings (common/run_spec.py; the load and the
    outputs are each run's) plus the device's: the worker's dtype, weights, graphs and
    threads, and the KV cache's cap. The engine runs one device, EAGLE-3 heads only."""

    model: str = same(ModelSpec, "model", "")   # a Llama folder, a preset, or `tiny`
    device: str = same(TopologySpec, "device", "cpu")
    gpu_memory_utilization: float | None = same(   # None: size the KV cache by kv_cache_gib
        SchedulerSpec, "gpu_memory_utilization", None)
    dtype: str | None = opt(None, "--dtype", kind="choice", choices=tuple(DTYPE_BYTES),
                            help="weights and KV cache (default: bfloat16 on cuda, float32 on "
                                 "cpu)")
    random_weights: bool = opt(
        False, "--random-weights", kind="bool", action="store_true", shown=False,
        help="build the target and draft from their config.json with random weights (for "
             "timing; no safetensors read). Presets always are random")
    cuda_graphs: bool = opt(
        True, "--no-cuda-graphs", "--enforce-eager", kind="bool", action="store_false",
        shown=False, help="on cuda, run decode steps eagerly instead of replaying CUDA graphs "
                          "(vLLM's --enforce-eager)")
    pin: bool = opt(
        True, "--no-pin", kind="bool", action="store_false", shown=False,
        help="with --executor process, do not pin the engine to one CPU and the worker to "
             "another (pinned by default when there are two or more)")
    kv_cache_gib: float = opt(4.0, "--kv-cache-gib", kind="float", gt=True, metavar="GIB",
                              help="cap of the default KV cache size")
    max_k: int | None = opt(None, kind="int", hi=MAX_K, label="max_k")   # deepest k this
                                                 # worker serves (default: k, at least 1)
    emulate_graphs: bool = opt(False, kind="bool", label="emulate_graphs")   # tests: the
                                                 # graphs' padded path, run eagerly on the CPU
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = same(LoadSpec, "seed")
    num_threads: int | None = opt(None, kind="int", lo=1, label="num_threads")

    def __post_init__(self):
        self.check_topology()
        check_fields(self)
        if self.tensor_parallel_size != 1:
            raise UserError(f"--tensor-parallel-size {self.tensor_parallel_size}: the engine "
                            "(one device) models 1")
        if self.data_parallel_size != 1:
            raise UserError(f"--data-parallel-size {self.data_parallel_size}: the engine (one "
                            "device) runs one engine core (the simulator models data "
                            "parallelism: stepgap simulate)")
        refuse_method(self.method)
        if self.k > 0 and not self.draft:
            raise UserError(f"--num-speculative-tokens {self.k} needs a draft head: give "
                            "--speculative-config's model (or --draft)")
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

    def create_engine_config(self) -> EngineSetup:
        """The setup every part of a run is made from, resolved once (as vLLM's
        create_engine_config): the device checked, the models' configs read and checked, the KV
        cache sized."""
        if self.device == "cuda":
            check_cuda()
        target = self.target_config()
        draft = self.draft_config(target)
        return EngineSetup(self, target, draft, self._num_blocks(target, draft))

    # Shortcuts for a caller that needs one part only: each resolves the args again.
    def engine_config(self, mode: str | None = None, k: int | None = None,
                      num_blocks: int | None = None) -> EngineConfig:
        return self.create_engine_config().engine_config(mode, k, num_blocks)

    def worker_spec(self):
        return self.create_engine_config().worker_spec()

    def make_executor(self):
        return self.create_engine_config().make_executor()

    def with_(self, **changes) -> "EngineArgs":
        return replace(self, **changes)

    def _kv_bytes_per_token(self, target, draft) -> int:
        """The worker's KV cache holds the target's layers and the head's one, in its dtype."""
        return kv_bytes_per_token(target, draft, 1, dtype_bytes=DTYPE_BYTES[self.dtype_name])

    def _weight_bytes(self, target, draft) -> float:
        return DTYPE_BYTES[self.dtype_name] * (target.num_params
                                               + (draft.num_params if draft else 0))

    def _num_blocks(self, target, draft) -> int:
        """--num-gpu-blocks-override; else what --gpu-memory-utilization of the device's memory
        holds after the weights; else room for max_num_seqs sequences of max_model_len, capped
        at --kv-cache-gib."""
        if self.num_gpu_blocks_override is not None:
            return self.num_gpu_blocks_override
        per_token = self._kv_bytes_per_token(target, draft)
        if self.gpu_memory_utilization is not None:
            weights = self._weight_bytes(target, draft)
            blocks = kv_cache_blocks(device_memory(self.device), self.gpu_memory_utilization,
                                     weights, RESERVED_BYTES if self.device == "cuda" else 0,
                                     self.block_size, per_token)
            if blocks < 1:
                raise UserError(f"--gpu-memory-utilization {self.gpu_memory_utilization}: the "
                                f"weights ({weights / 1e9:.2f} GB) leave no room for a KV cache")
            return blocks
        want = self.max_num_seqs * cdiv(self.max_model_len + self.k, self.block_size)
        cap = self.kv_cache_gib * 2 ** 30 / (self.block_size * per_token)   # inf: no cap
        return max(1, want if cap >= want else int(cap))


def refuse_method(method: str | None, option: str = "--speculative-config method") -> None:
    """The engine drafts with EAGLE-3 heads only; `option`: how the command line gave it."""
    if method is not None and not (method in METHODS and METHODS[method].engine):
        raise UserError(f"{option} {method}: the engine drafts with EAGLE-3 heads only (method "
                        "eagle3); `stepgap simulate` models the others")


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """One engine's setup, resolved once from its EngineArgs: the target's and the head's
    configs, read and checked, and the KV cache's size. The three parts of a run are made from
    it: `worker_spec()`, `engine_config(mode, k)` and `make_executor()`."""

    args: EngineArgs
    target: ModelConfig
    draft: EagleHeadConfig | None
    num_blocks: int

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    def check_memory(self) -> None:
        """What the worker will allocate (weights, the KV cache, the RoPE tables) fits the
        device's memory: a typo such as --num-gpu-blocks-override 1e9 fails here, naming the
        options, not in the kernel's out-of-memory killer."""
        a, target = self.args, self.target
        kv = self.num_blocks * a.block_size * a._kv_bytes_per_token(target, self.draft)
        weights = a._weight_bytes(target, self.draft)
        positions = a.max_model_len + (a.max_k or max(a.k, 1)) + a.block_size
        rope = 2 * 2 * 4 * positions * target.head_dim   # cos and sin, target and head
        have = device_memory(a.device)
        if weights + kv + rope > have:
            gib = 2 ** 30
            raise UserError(
                f"the {a.device} worker would need {(weights + kv + rope) / gib:.1f} GiB "
                f"(weights {weights / gib:.1f}, KV cache of {self.num_blocks} blocks "
                f"{kv / gib:.1f}, RoPE tables for --max-model-len {a.max_model_len} "
                f"{rope / gib:.1f}) but the {a.device} has {have / gib:.1f} GiB; lower "
                "--num-gpu-blocks-override, --max-model-len or --kv-cache-gib")

    def worker_spec(self):
        """What the worker builds once (models, KV cache, device), its memory checked."""
        from stepgap.engine.worker import WorkerSpec
        self.check_memory()
        a = self.args
        return WorkerSpec(a.model, a.draft, a.device, a.dtype, num_blocks=self.num_blocks,
                          max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                          max_k=a.max_k or max(a.k, 1), cuda_graphs=a.cuda_graphs,
                          block_size=a.block_size, seed=a.seed, num_threads=a.num_threads,
                          emulate_graphs=a.emulate_graphs, random_weights=a.random_weights)

    def engine_config(self, mode: str | None = None, k: int | None = None,
                      num_blocks: int | None = None) -> EngineConfig:
        """One run's scheduling: the args' mode and k unless given (a worker serves runs of
        any mode and any k up to its max_k), in a KV cache of `num_blocks` (at most the
        worker's) if given."""
        from stepgap.engine.loop import EngineConfig
        a = self.args
        return EngineConfig(mode or a.mode, a.k if k is None else k,
                            num_blocks or self.num_blocks,
                            a.max_num_seqs, a.max_num_batched_tokens, a.max_model_len,
                            a.sampling, a.block_size, self.target.max_position_embeddings,
                            enable_prefix_caching=a.enable_prefix_caching,
                            scheduler_reserve_full_isl=a.scheduler_reserve_full_isl)

    def make_executor(self):
        """The worker inline or in its own process."""
        from stepgap.engine.executor import make_executor
        return make_executor(self.args.executor, self.worker_spec(), self.args.pin)


def check_cuda() -> None:
    """--device cuda needs a CUDA build of torch and a device it can see: say which is missing
    when the setup is resolved (every engine user's: run, serve, the demo, calibrate/, the
    benchmarks), not in an assertion of torch's when the worker is built."""
    import torch
    if torch.cuda.is_available():
        return
    why = f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None \
        else f"torch (CUDA {torch.version.cuda}) sees no CUDA device (the driver, " \
             "CUDA_VISIBLE_DEVICES)"
    raise UserError(f"--device cuda: {why}; run with --device cpu")


def device_memory(device: str) -> float:
    """Bytes of the device's memory: the GPU's, or the host's RAM for the CPU (as vLLM's CPU
    backend reads --gpu-memory-utilization)."""
    if device == "cuda":
        import torch
        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
