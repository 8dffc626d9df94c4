"""`stepgap run`: measure a trace on the real engine.

Its options are `stepgap simulate`'s and vLLM's (common/options.py); `engine_args_from` turns
them into the one EngineArgs that every engine user builds from.
"""

from __future__ import annotations

import argparse
import sys

from stepgap.common.errors import UserError
from stepgap.common.options import (MAX_SPREAD, add_engine_args, add_load_args, add_model_args,
                            add_result_args, add_scheduler_args, at_most, nonneg_float,
                            nonneg_int, positive_float, rates_arg)

RUN_EPILOG = """\
examples:
  stepgap make-tiny out/tiny
  stepgap run --model out/tiny/target --speculative-config \\
      '{"method": "eagle3", "model": "out/tiny/eagle3-yuhuili", "num_speculative_tokens": 4}' \\
      --trace mtbench --num-prompts 8 --output-len 64 --max-concurrency 4 --result-json r.json
  stepgap run --model checkpoints/pystdlib/target --draft checkpoints/pystdlib/eagle3 \\
      --num-speculative-tokens 4 --trace checkpoints/pystdlib/heldout.jsonl \\
      --max-concurrency 4 --async-scheduling --executor process --timeline t.jsonl
  stepgap run --model llama-3.1-8b --draft llama-3.1-8b-eagle3 --device cuda -k 4 \\
      --mode async --synthetic-acceptance mtbench --max-concurrency 1 --num-prompts 16

Presets (llama-3.1-8b, llama-3.2-1b, llama-3.2-3b; drafts llama-3.1-8b-eagle3, or eagle3 for a
head shaped like the target) build random weights directly on the device: use them with
--synthetic-acceptance to time full-size models. `--model tiny --draft tiny-eagle3` is the
random make-tiny pair, built in memory. Times are wall clock: TTFT, TPOT, ITL and E2EL
in ms as `vllm bench serve` reports them; step gaps in microseconds. A pasted vLLM option that
the engine does not model is named and ignored.
"""

ACCEPTANCE_HELP = (
    "accept drafts by an acceptance profile instead of by the target, while the models still "
    "run: a named one (mtbench: DESIGN.md §6 with the simulator's per-request spread), "
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


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a trace through the real torch engine and measure it",
        description="Run a workload through the reference engine (a Llama target, an EAGLE-3 "
                    "head, a paged KV cache, the shared vLLM V1 scheduler) and measure what "
                    "`vllm bench serve` measures, plus the step timeline and its gaps.",
        epilog=RUN_EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p)
    add_load_args(p)
    add_result_args(p, timeline_help="write the spans as JSON lines")
    p.add_argument("--chrome-trace", default=None, metavar="PATH",
                   help="spans as Chrome-trace JSON (open in ui.perfetto.dev)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_run, vllm_options=True)


def sampling_from_args(args):
    from stepgap.common.acceptance import PROFILES, AcceptanceProfile
    from stepgap.engine.sampler import SamplingConfig
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
          "max_num_batched_tokens", "max_model_len")


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
    if settings.get("device") == "cuda":
        check_cuda()
    return EngineArgs(model=args.model, seed=args.seed or 0, sampling=sampling_from_args(args),
                      **settings)


def check_cuda() -> None:
    """--device cuda needs a CUDA build of torch and a device it can see: say which is missing
    now, not in an assertion of torch's when the worker is built."""
    import torch
    if torch.cuda.is_available():
        return
    why = f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None \
        else f"torch (CUDA {torch.version.cuda}) sees no CUDA device (the driver, " \
             "CUDA_VISIBLE_DEVICES)"
    raise UserError(f"--device cuda: {why}; run with --device cpu")


def cmd_run(args) -> int:
    from stepgap.common.fileio import check_distinct
    from stepgap.common.formats import format_summary, save_chrome_trace, save_result, save_timeline
    from stepgap.common.options import (check_outputs, note, percentiles_from_args, result_path,
                                workload_from_args)
    from stepgap.engine.executor import WorkerDied
    from stepgap.engine.loop import config_summary, run_trace

    ea = engine_args_from(args)
    requests = workload_from_args(args)  # also fills the unset load options (seed)
    if ea.sampling.replay and not any(r.accepted for r in requests):
        raise UserError("--synthetic-acceptance replay: the trace has no `accepted` lists")
    target = ea.target_config()
    ea.draft_config(target)    # a head that does not fit fails here, before any work
    out_path = result_path(args, "stepgap-engine", ea.model)
    check_distinct([("--result-json" if args.result_json else "--save-result", out_path),
                    ("--timeline", args.timeline), ("--chrome-trace", args.chrome_trace)])
    check_outputs(args, out_path, args.timeline and (args.timeline,), args.chrome_trace)
    cfg = ea.engine_config()
    for r in requests:   # before the worker is built: a request that cannot run fails now
        cfg.scheduler_config().check_fits(r.request_id, r.prompt_len, r.output_len)
    note(args, f"building the {ea.executor} worker on {ea.device} ...")
    try:
        with ea.make_executor() as ex:
            info = ex.info()
            note(args, f"{len(requests)} requests, mode {ea.mode}, k {ea.k}, "
                       f"{cfg.num_blocks} KV blocks of {ea.block_size}")
            config = {**config_summary(cfg), "executor": ea.executor, **info,
                      "cuda_graphs": ea.cuda_graphs and ea.device == "cuda",
                      "request_rate": args.request_rate if args.request_rate else "inf",
                      "burstiness": args.burstiness, "max_concurrency": args.max_concurrency,
                      "trace": args.trace or "mtbench", "seed": args.seed}
            out = run_trace(ex, requests, cfg, vocab_size=target.vocab_size,
                            max_concurrency=args.max_concurrency, seed=args.seed,
                            detailed=bool(args.detailed), config=config,
                            **percentiles_from_args(args))
    except WorkerDied as e:
        print(f"stepgap run: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(format_summary(out.result, "Engine Benchmark Result"))
        sys.stdout.flush()   # a stdout that cannot take it fails here, before any file is written
    if out_path:
        save_result(out_path, out.result)
    if args.timeline:
        save_timeline(args.timeline, out.spans)
    if args.chrome_trace:
        save_chrome_trace(args.chrome_trace, out.spans, "stepgap engine")
    if not args.quiet and out_path:
        print(f"result: {out_path}")
    return 0
