"""The engine's command-line options, shared by `stepgap run` and `stepgap serve`, and the one
EngineArgs they make (`engine_args_from`), as vLLM's `EngineArgs.from_cli_args`. The options
are `stepgap simulate`'s and vLLM's spellings (common/options.py).
"""

from __future__ import annotations

import argparse

from stepgap.common.errors import UserError
from stepgap.common.limits import MAX_SPREAD
from stepgap.common.options import (add_engine_args, add_model_args, add_scheduler_args, at_most,
                                    nonneg_float, nonneg_int, positive_float, rates_arg)

ACCEPTANCE_HELP = (
    "accept drafts by an acceptance profile instead of by the target, while the models still "
    "run: a named one (mtbench: docs/design.md §6 with the simulator's per-request spread), "
    "per-position rates P(accepted > j) such as 0.74,0.54,0.41, or 'replay' (each request's "
    "`accepted` list from the trace). The simulator draws the same counts for the same trace "
    "and seed")


def acceptance_arg(text: str):
    from stepgap.common.acceptance import PROFILES
    if text == "replay" or text in PROFILES:
        return text
    try:
        return rates_arg(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a profile ({', '.join(PROFILES)}), 'replay' or comma-separated rates "
            f"like 0.8,0.6,0.4; got {text!r}") from None


def add_run_args(p) -> None:
    """The engine's options: shared with `stepgap serve`."""
    from stepgap.engine.args import EngineArgs
    d = EngineArgs(model="")
    g = add_model_args(p, d)
    g.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"),
                   help="weights and KV cache (default: bfloat16 on cuda, float32 on cpu)")
    g.add_argument("--random-weights", action="store_true", default=None,
                   help="build the target and draft from their config.json with random weights "
                        "(for timing; no safetensors read). Presets always are random")
    g = add_engine_args(p, d)
    g.add_argument("--no-cuda-graphs", "--enforce-eager", dest="cuda_graphs",
                   action="store_false", default=None,
                   help="on cuda, run decode steps eagerly instead of replaying CUDA graphs "
                        "(vLLM's --enforce-eager)")
    g.add_argument("--no-pin", dest="pin", action="store_false", default=None,
                   help="with --executor process, do not pin the engine to one CPU and the "
                        "worker to another (pinned by default when there are two or more)")
    g = add_scheduler_args(p, d, blocks_help=" (default: room for --max-num-seqs requests of "
                                             "--max-model-len, capped by --kv-cache-gib)")
    g.add_argument("--kv-cache-gib", type=positive_float, metavar="GIB",
                   help=f"cap of the default KV cache size (default {d.kv_cache_gib:g})")
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=nonneg_float, default=0.0,
                   help="0 is greedy, as `vllm bench serve` defaults (default 0)")
    g.add_argument("--top-k", type=nonneg_int, default=0, help="0 is off (default)")
    g.add_argument("--top-p", type=positive_float, default=1.0, help="default 1.0 (off)")
    g.add_argument("--synthetic-acceptance", type=acceptance_arg, metavar="PROFILE|RATES",
                   help=ACCEPTANCE_HELP)
    g.add_argument("--acceptance-spread", type=at_most(nonneg_float, MAX_SPREAD),
                   metavar="SIGMA",
                   help="with --synthetic-acceptance: std of each request's logit shift of the "
                        "rates (default: the profile's; 0 for rates)")


def sampling_from_args(args):
    from stepgap.common.acceptance import PROFILES, AcceptanceProfile
    from stepgap.engine.sampling_params import SamplingConfig
    syn = args.synthetic_acceptance
    profile = None
    if syn not in (None, "replay"):
        profile = PROFILES[syn] if isinstance(syn, str) else \
            AcceptanceProfile("custom", syn, 0.0, "--synthetic-acceptance")
        if args.acceptance_spread is not None:
            profile = AcceptanceProfile(profile.name, profile.rates, args.acceptance_spread,
                                        profile.source)
    return SamplingConfig(args.temperature, args.top_k, args.top_p, profile, syn == "replay",
                          args.seed or 0)


FIELDS = ("dtype", "random_weights", "cuda_graphs", "pin", "device", "block_size",
          "num_gpu_blocks_override", "gpu_memory_utilization", "kv_cache_gib", "max_num_seqs",
          "max_num_batched_tokens", "max_model_len", "enable_prefix_caching",
          "scheduler_reserve_full_isl")


def engine_args_from(args):
    """The EngineArgs of a command line (run, serve): what it gives, else the defaults."""
    from stepgap.common.options import (check_tensor_parallel, executor_from_args, mode_from_args,
                                        speculative_from_args)
    from stepgap.engine.args import EngineArgs
    if not args.model:
        raise UserError("--model is required (a Llama folder, a preset, or tiny)")
    check_tensor_parallel(args, who="the engine (one device)")
    method, draft, k = speculative_from_args(args)
    if method not in (None, "eagle3"):
        given = "--spec-method" if getattr(args, "method", None) else \
            "--speculative-config method"
        raise UserError(f"{given} {method}: the engine drafts with EAGLE-3 heads only (method "
                        "eagle3); `stepgap simulate` models the others")
    settings = {name: getattr(args, name) for name in FIELDS
                if getattr(args, name, None) is not None}
    mode, executor = mode_from_args(args), executor_from_args(args)
    settings.update({key: v for key, v in (("mode", mode), ("executor", executor),
                                           ("draft", draft), ("k", k)) if v is not None})
    return EngineArgs(model=args.model, seed=args.seed or 0, sampling=sampling_from_args(args),
                      **settings)
