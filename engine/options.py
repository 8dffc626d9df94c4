"""The engine's command-line options, shared by `stepgap run` and `stepgap serve`, and the one
EngineArgs they make (`engine_args_from`), as vLLM's `EngineArgs.from_cli_args`. The options
are `stepgap simulate`'s and vLLM's spellings (common/options.py).
"""

from __future__ import annotations

import argparse

from stepgap.common.errors import UserError
from stepgap.common.limits import MAX_SPREAD
from stepgap.common.options import (add_engine_args, add_model_args, add_option,
                                    add_scheduler_args, at_most, nonneg_float, nonneg_int,
                                    positive_float, rates_arg)

ACCEPTANCE_HELP = (
    "accept drafts by an acceptance profile instead of by the target, while the models still "
    "run: a named one (mtbench: docs/explanation/design.md §6 with the simulator's per-request "
    "spread), "
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
    add_option(g, "dtype", d)
    add_option(g, "random_weights", d)
    g = add_engine_args(p, d)
    add_option(g, "cuda_graphs", d)
    add_option(g, "pin", d)
    g = add_scheduler_args(p, d, blocks_help=" (default: room for --max-num-seqs requests of "
                                             "--max-model-len, capped by --kv-cache-gib)")
    add_option(g, "kv_cache_gib", d)
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


def engine_args_from(args):
    """The EngineArgs of a command line (run, serve): what it gives, else the defaults."""
    from stepgap.common.options import (drafter_without_k, executor_from_args, mode_from_args,
                                        note, settings_from_args, speculative_from_args)
    from stepgap.engine.args import EngineArgs, refuse_method
    if not args.model:
        raise UserError("--model is required (a Llama folder, a preset, or tiny)")
    given = "--spec-method" if getattr(args, "method", None) else "--speculative-config method"
    args.method, args.draft, args.k = speculative_from_args(args)
    warning = drafter_without_k(args.draft, args.k)
    if warning:
        note(args, f"warning: {warning}")
    refuse_method(args.method, given)   # (EngineArgs would too, naming speculative_config)
    args.mode, args.executor = mode_from_args(args), executor_from_args(args)
    return EngineArgs(sampling=sampling_from_args(args), **settings_from_args(args, EngineArgs))
