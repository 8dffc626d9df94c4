"""`stepgap run` (measure a trace on the real engine) and `stepgap make-tiny` (tiny checkpoints)."""

from __future__ import annotations

import argparse
import sys

from common.errors import UserError
from common.workloads import add_load_args, positive_int

RUN_EPILOG = """\
examples:
  stepgap make-tiny out/tiny
  stepgap run --target out/tiny/target --draft out/tiny/eagle3-yuhuili --k 4 \\
      --trace mtbench --num-prompts 8 --output-len 64 --max-concurrency 4 --result-json r.json
  stepgap run --target out/tiny/target --draft out/tiny/eagle3-speculators --k 3 \\
      --mode zero-bubble --executor process --timeline t.jsonl --chrome-trace t.json
  stepgap run --target llama-3.1-8b --draft llama-3.1-8b-eagle3 --device cuda --k 4 \\
      --mode async --synthetic-acceptance mtbench --max-concurrency 1 --num-prompts 16

Presets (llama-3.1-8b, llama-3.2-1b, llama-3.2-3b; drafts llama-3.1-8b-eagle3, or eagle3 for a
head shaped like the target) build random weights directly on the device: use them with
--synthetic-acceptance to time full-size models. `--target tiny --draft tiny-eagle3` is the
random make-tiny pair, built in memory. Times are wall clock: TTFT, TPOT, ITL and E2EL
in ms as `vllm bench serve` reports them; step gaps in microseconds.
"""


def _rates(text: str):
    if text in ("mtbench", "replay"):
        return text
    try:
        rates = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'mtbench', 'replay' or comma-separated rates like 0.8,0.6,0.4; "
            f"got {text!r}") from None
    return rates


def _unit(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    return v


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a trace through the real torch engine and measure it",
        description="Run a workload through the reference engine (a Llama target, an EAGLE-3 "
                    "head, a paged KV cache, the shared vLLM V1 scheduler) and measure what "
                    "`vllm bench serve` measures, plus the step timeline and its gaps.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("models")
    m.add_argument("--target", required=True, metavar="DIR|PRESET",
                   help="Hugging Face Llama folder (config.json + safetensors) or a preset")
    m.add_argument("--draft", default=None, metavar="DIR|PRESET",
                   help="EAGLE-3 head folder (yuhuili or speculators layout), a preset, or "
                        "'eagle3' (random, shaped like the target); needed when --k > 0")
    m.add_argument("--k", type=int, default=0,
                   help="speculative tokens per step, the draft length (default 0: no drafting)")
    m.add_argument("--random-weights", action="store_true",
                   help="build the target and draft from their config.json with random weights "
                        "(for timing; no safetensors read). Presets always are random")
    m.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16", "float64"),
                   help="weights and KV cache dtype (default: bfloat16 on cuda, float32 on cpu)")
    e = p.add_argument_group("engine")
    e.add_argument("--mode", default="sync", choices=("sync", "async", "zero-bubble"),
                   help="step scheduling (DESIGN.md §1; default sync)")
    e.add_argument("--executor", default="inline", choices=("inline", "process"),
                   help="worker in the engine process, or in its own process (default inline)")
    e.add_argument("--no-pin", dest="pin", action="store_false",
                   help="with --executor process, do not pin the engine to one CPU and the "
                        "worker to another (pinned by default when there are two or more)")
    e.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="default cpu")
    e.add_argument("--no-cuda-graphs", action="store_true",
                   help="on cuda, run decode steps eagerly instead of replaying CUDA graphs")
    s = p.add_argument_group("scheduler (as vLLM V1)")
    s.add_argument("--max-num-seqs", type=positive_int, default=256,
                   help="most requests in one step (default 256)")
    s.add_argument("--max-num-batched-tokens", type=positive_int, default=8192,
                   help="token budget of one step; longer prefills are chunked (default 8192)")
    s.add_argument("--max-model-len", type=positive_int, default=2048,
                   help="longest prompt + output, in tokens (default 2048)")
    s.add_argument("--num-blocks", type=positive_int, default=None,
                   help="KV cache blocks of 16 tokens (default: enough for max-num-seqs requests "
                        "of max-model-len, capped by --kv-cache-gib)")
    s.add_argument("--kv-cache-gib", type=_unit, default=4.0,
                   help="cap of the default KV cache size in GiB (default 4)")
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=_unit, default=0.0,
                   help="0 is greedy, as `vllm bench serve` defaults (default 0)")
    g.add_argument("--top-k", type=int, default=0, help="0 is off (default)")
    g.add_argument("--top-p", type=_unit, default=1.0, help="default 1.0 (off)")
    g.add_argument("--synthetic-acceptance", type=_rates, default=None, metavar="RATES",
                   help="accept drafts by per-position rates P(accepted > j), e.g. "
                        "0.74,0.54,0.41, or 'mtbench' (DESIGN.md §6), or 'replay' (each "
                        "request's `accepted` list from the trace); the models still run")
    add_load_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--result-json", default=None, metavar="PATH",
                   help="write the run result (vllm bench serve keys + step_gaps, spec_decode, "
                        "config)")
    o.add_argument("--detailed", action="store_true",
                   help="per-request lists in the result, with output_token_ids and accepted")
    o.add_argument("--timeline", default=None, metavar="PATH", help="spans as JSON lines")
    o.add_argument("--chrome-trace", default=None, metavar="PATH",
                   help="spans as Chrome-trace JSON (open in ui.perfetto.dev)")
    o.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_run)


def sampling_from_args(args):
    from engine.sampler import MTBENCH_ACCEPTANCE, SamplingConfig
    syn = args.synthetic_acceptance
    rates = MTBENCH_ACCEPTANCE if syn == "mtbench" else None if syn in (None, "replay") else syn
    return SamplingConfig(args.temperature, args.top_k, args.top_p, rates, syn == "replay",
                          args.seed)


def default_num_blocks(max_num_seqs: int, max_model_len: int, k: int, cap_bytes: float,
                       bytes_per_block: int) -> int:
    from common.scheduler import cdiv
    want = max_num_seqs * cdiv(max_model_len + k, 16)
    return max(1, min(want, int(cap_bytes // bytes_per_block)))


def cmd_run(args) -> int:
    from engine.checkpoint import check_draft_fits, draft_config, target_config
    from engine.loop import EngineConfig, config_summary, run_trace
    from engine.executor import WorkerDied, make_executor
    from engine.worker import WorkerSpec
    from common.formats import format_summary, save_chrome_trace, save_result, save_timeline
    from common.workloads import workload_from_args

    if args.k < 0:
        raise UserError(f"--k must be >= 0, got {args.k}")
    if args.k > 0 and not args.draft:
        raise UserError(f"--k {args.k} needs a draft head: give --draft")
    requests = workload_from_args(args)  # also fills the unset load options (seed)
    sampling = sampling_from_args(args)
    if sampling.replay and not any(r.accepted for r in requests):
        raise UserError("--synthetic-acceptance replay: the trace has no `accepted` lists")
    target_cfg = target_config(args.target)
    if args.draft:
        check_draft_fits(draft_config(args.draft, target_cfg), target_cfg, args.draft)
    num_blocks = args.num_blocks
    if num_blocks is None:
        import torch
        from engine.kv_cache import kv_cache_bytes_per_block
        from engine.worker import DTYPES
        dtype = DTYPES[args.dtype] if args.dtype else \
            (torch.bfloat16 if args.device == "cuda" else torch.float32)
        per_block = kv_cache_bytes_per_block(target_cfg.num_layers + (1 if args.draft else 0),
                                             target_cfg.num_kv_heads, target_cfg.head_dim, dtype)
        num_blocks = default_num_blocks(args.max_num_seqs, args.max_model_len, args.k,
                                        args.kv_cache_gib * 2 ** 30, per_block)
    spec = WorkerSpec(args.target, args.draft, args.device, args.dtype, num_blocks,
                      args.max_model_len, args.max_num_seqs, max(args.k, 1),
                      not args.no_cuda_graphs, args.seed, random_weights=args.random_weights)
    cfg = EngineConfig(args.mode, args.k, num_blocks, args.max_num_seqs,
                       args.max_num_batched_tokens, args.max_model_len, sampling)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    say(f"stepgap run: building the {args.executor} worker on {args.device} ...")
    try:
        with make_executor(args.executor, spec, args.pin) as ex:
            info = ex.info()
            say(f"stepgap run: {len(requests)} requests, mode {args.mode}, k {args.k}, "
                f"{num_blocks} KV blocks")
            config = {**config_summary(cfg), "executor": args.executor, **info,
                      "cuda_graphs": spec.cuda_graphs and args.device == "cuda",
                      "request_rate": args.request_rate if args.request_rate else "inf",
                      "burstiness": args.burstiness, "max_concurrency": args.max_concurrency,
                      "trace": args.trace or "mtbench", "seed": args.seed}
            out = run_trace(ex, requests, cfg, vocab_size=target_cfg.vocab_size,
                            max_concurrency=args.max_concurrency, seed=args.seed,
                            detailed=args.detailed, config=config)
    except WorkerDied as e:
        print(f"stepgap run: error: {e}", file=sys.stderr)
        return 1
    if args.result_json:
        save_result(args.result_json, out.result)
    if args.timeline:
        save_timeline(args.timeline, out.spans)
    if args.chrome_trace:
        save_chrome_trace(args.chrome_trace, out.spans, "stepgap engine")
    if not args.quiet:
        print(format_summary(out.result, "Engine Benchmark Result"))
    return 0
