"""`stepgap run`: measure a trace on the real engine.

Its options are `stepgap simulate`'s and vLLM's (common/options.py), the engine's own shared
with `stepgap serve` (engine/options.py, whose `engine_args_from` turns them into the one
EngineArgs that every engine user builds from). `register` adds the engine's commands.
"""

from __future__ import annotations

import sys

from stepgap.common.errors import UserError
from stepgap.common.options import add_command, add_load_args, add_result_args
from stepgap.engine.options import add_run_args, engine_args_from

RUN_DESCRIPTION = (
    "Run a workload through the reference engine (a Llama target, an EAGLE-3 head, a paged KV "
    "cache, the shared vLLM V1 scheduler) and measure what `vllm bench serve` measures, plus "
    "the step timeline and its gaps.")

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

def register(sub) -> None:
    """The engine's commands: `run`, and `serve` (engine/serve.py)."""
    from stepgap.engine import serve
    register_run(sub)
    serve.register(sub)


def register_run(sub) -> None:
    p = add_command(sub, "run", description=RUN_DESCRIPTION, epilog=RUN_EPILOG, allow_abbrev=False,
                    help="run a trace through the real torch engine and measure it")
    add_run_args(p)
    add_load_args(p)
    add_result_args(p, timeline_help="write the spans as JSON lines")
    p.add_argument("--chrome-trace", default=None, metavar="PATH",
                   help="spans as Chrome-trace JSON (open in ui.perfetto.dev)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_run, vllm_options=True)


def cmd_run(args) -> int:
    from stepgap.common.formats import format_summary, save_chrome_trace, save_result, save_timeline
    from stepgap.common.options import (check_outputs, note, percentiles_from_args, result_path,
                                workload_from_args)
    from stepgap.engine.executor import WorkerDied
    from stepgap.engine.loop import config_summary, run_trace

    ea = engine_args_from(args)
    setup = ea.create_engine_config()   # a head that does not fit fails here, before any work
    # (also fills the unset load options: seed); generated token ids within the target's vocab
    requests = workload_from_args(args, vocab_size=setup.vocab_size)
    if ea.sampling.replay and not any(r.accepted for r in requests):
        raise UserError("--synthetic-acceptance replay: the trace has no `accepted` lists")
    out_path = result_path(args, "stepgap-engine", ea.model)
    check_outputs(args, out_path, args.timeline and (args.timeline,), args.chrome_trace)
    cfg = setup.engine_config()
    for r in requests:   # before the worker is built: a request that cannot run fails now
        cfg.scheduler_config().check_fits(r.request_id, r.prompt_len, r.output_len)
    note(args, f"building the {ea.executor} worker on {ea.device} ...")
    try:
        with setup.make_executor() as ex:
            info = ex.info()
            note(args, f"{len(requests)} requests, mode {ea.mode}, k {ea.k}, "
                       f"{cfg.num_blocks} KV blocks of {ea.block_size}")
            config = config_summary(
                cfg, ea.executor, info, cuda_graphs=ea.cuda_graphs and ea.device == "cuda",
                request_rate=args.request_rate if args.request_rate else "inf",
                burstiness=args.burstiness, max_concurrency=args.max_concurrency,
                trace=args.trace or "mtbench", seed=args.seed)
            out = run_trace(ex, requests, cfg, vocab_size=setup.vocab_size,
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
