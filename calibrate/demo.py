"""`stepgap demo`: the engine on the committed trained pair, next to the simulator's prediction.

1. The engine (the `process` executor, engine and worker pinned to a CPU each; CPU, float32,
   greedy) runs the pair's held-out workload (prompts cut from Python stdlib files the pair never
   trained on) with k draft tokens per step and measures what `vllm bench serve` measures, with
   real acceptance.
2. The simulator runs the same trace with the same k, concurrency, mode, scheduler limits and
   topology (`executor=process`, `device=cpu`: the device is the worker's own CPU), on the
   measured profile committed with the CPU validation (traces/measured/cpu/profile.json: device
   op fits and CPU costs of this kind of machine, docs/validation.md), replaying the engine's
   accepted count of every decode step, so both see the same acceptance.
3. Both are printed side by side, with the simulator's error.

Why the process executor: it is the topology the committed profile was calibrated on, and the
one where the modes differ on a CPU (inline, the engine's thread computes everything, and async
hides nothing). On another machine, `stepgap profile --out P` measures its own profile and
`stepgap demo --profile P` uses it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from calibrate.pair import PAIR, ROOT, load_heldout, pair_paths
from common.errors import UserError
from common.formats import MODES

PROFILE = ROOT / "traces" / "measured" / "cpu" / "profile.json"

EPILOG = """\
examples:
  stepgap demo                                  # k = 4, 48 held-out prompts, concurrency 1
  stepgap demo --k 2 --max-concurrency 4 --num-prompts 16

The pair (checkpoints/pystdlib) was trained by `stepgap train`; docs/training.md tells how.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="the engine on the trained pair, next to the simulator's prediction",
        description="Run the reference engine on the committed trained target + EAGLE-3 head "
                    "over held-out Python code, print its measured acceptance, TPOT and ITL, "
                    "and the simulator's prediction for the same trace and acceptance.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default=str(PAIR), metavar="DIR",
                   help="folder with target/, eagle3/ and heldout.jsonl (default: the committed "
                        "checkpoints/pystdlib)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per step (default 4)")
    p.add_argument("--num-prompts", type=int, default=None, metavar="N",
                   help="the first N requests of the trace (default: all)")
    p.add_argument("--max-concurrency", type=int, default=1, metavar="N",
                   help="requests in flight (default 1, as the seed run)")
    p.add_argument("--mode", default="sync", choices=MODES,
                   help="step scheduling, both halves (default sync)")
    p.add_argument("--profile", default=None, metavar="PROFILE.json",
                   help="the simulator's measured costs (default: the committed CPU profile, "
                        "traces/measured/cpu/profile.json; the roofline if it is missing)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_demo)


def pair_args(pair, requests, k: int, max_concurrency: int | None, mode: str = "sync",
              dtype: str = "float32"):
    """The demo's engine: the pair, greedy, on the CPU, the process executor (pinned), with
    scheduler limits that fit the trace (the simulator takes the same)."""
    from calibrate.harness import limits
    from engine.args import EngineArgs
    paths = pair_paths(pair)
    lim = limits(requests, k, max_concurrency)
    return EngineArgs(model=paths["target"], draft=paths["eagle3"] if k else None, k=k,
                      mode=mode, executor="process", device="cpu", dtype=dtype,
                      num_gpu_blocks_override=lim["num_blocks"],
                      max_num_seqs=lim["max_num_seqs"],
                      max_num_batched_tokens=lim["max_num_batched_tokens"],
                      max_model_len=lim["max_model_len"])


def run_engine(pair, requests, k: int, max_concurrency: int | None = 1, progress: bool = False,
               dtype: str = "float32", mode: str = "sync"):
    """The engine on the pair (process executor, pinned), greedy, on the CPU: its RunOutput."""
    from engine.loop import run_trace

    ea = pair_args(pair, requests, k, max_concurrency, mode, dtype)
    cfg = ea.engine_config()
    vocab = ea.target_config().vocab_size
    if progress:
        print(f"  engine: {len(requests)} requests ...", file=sys.stderr)
    with ea.make_executor() as ex:
        # One short request first: the first forwards pay one-time costs (allocation, kernel
        # selection) that are no part of a step.
        warm = replace(requests[0], request_id="warmup",
                       output_len=min(8, requests[0].output_len))
        run_trace(ex, [warm], cfg, vocab_size=vocab)
        # No progress bar while measuring: the engine process would pay for drawing it.
        return run_trace(ex, requests, cfg, vocab_size=vocab, max_concurrency=max_concurrency,
                         detailed=True, config={"executor": "process", "device": "cpu",
                                                "dtype": dtype, "pinned": ex.pinned,
                                                "max_concurrency": max_concurrency})


def simulate_trace(pair, requests, accepted: dict, k: int, max_concurrency: int | None = 1,
                   device_costs=None, mode: str = "sync", profile=None) -> dict:
    """The simulator on the same trace and topology, replaying the engine's accepted counts.

    `profile` (a path; default the committed CPU profile when it is there) gives the device op
    and CPU costs; without one the device is the roofline over the `cpu` catalog entry (a
    placeholder). `device_costs` (a sim.costs.DeviceCosts) overrides the device side.
    """
    from calibrate.harness import limits
    from sim.config import SimConfig
    from sim.loop import simulate

    paths = pair_paths(pair)
    lim = limits(requests, k, max_concurrency)
    if profile is None and PROFILE.is_file():
        profile = PROFILE
    cfg = SimConfig(mode=mode, k=k, gpu="cpu", model=paths["target"], draft=paths["eagle3"],
                    executor="process", device="cpu", replay=True,
                    profile=str(profile) if profile else None,
                    max_num_seqs=lim["max_num_seqs"],
                    max_num_batched_tokens=lim["max_num_batched_tokens"],
                    max_model_len=lim["max_model_len"],
                    num_gpu_blocks_override=lim["num_blocks"],
                    max_concurrency=max_concurrency)
    reqs = [replace(r, accepted=list(accepted.get(r.request_id, []))) for r in requests]
    result, _ = simulate(cfg, reqs, device_costs)
    return result


ROWS = (("Acceptance length", "acceptance_length", "{:.2f}"),
        ("Mean TPOT (ms)", "mean_tpot_ms", "{:.2f}"), ("P99 TPOT (ms)", "p99_tpot_ms", "{:.2f}"),
        ("Mean ITL (ms)", "mean_itl_ms", "{:.2f}"), ("P99 ITL (ms)", "p99_itl_ms", "{:.2f}"),
        ("Mean step gap (us)", "step_gap", "{:.0f}"), ("Duration (s)", "duration", "{:.2f}"))


def _value(res: dict, key: str):
    if key == "acceptance_length":
        return (res.get("spec_decode") or {}).get(key)
    if key == "step_gap":
        return (res.get("step_gaps") or {}).get("mean_us")
    return res.get(key)


def side_by_side(engine: dict, sim: dict) -> str:
    lines = [f"{'':28}{'engine (measured)':>20}{'sim (predicted)':>18}{'sim error':>12}"]
    for label, key, fmt in ROWS:
        e, s = _value(engine, key), _value(sim, key)
        err = f"{100 * (s - e) / e:+.1f} %" if e and s is not None else "-"
        lines.append(f"{label:28}{fmt.format(e) if e is not None else '-':>20}"
                     f"{fmt.format(s) if s is not None else '-':>18}{err:>12}")
    per = (engine.get("spec_decode") or {}).get("acceptance_rate_per_pos")
    if per:
        lines.append(f"{'Per-position acceptance (%)':28}  "
                     + ", ".join(f"{100 * r:.1f}" for r in per))
    return "\n".join(lines)


def sample_text(pair, request, output_ids: list[int], lines: int = 4) -> str:
    """The end of a prompt and the start of its greedy continuation, decoded."""
    from engine.tokenizer import load_tokenizer
    tok = load_tokenizer(pair_paths(pair)["target"])
    prompt = tok.decode(request.prompt_token_ids).splitlines()[-lines:]
    cont = tok.decode(output_ids).splitlines()[:lines]
    cut = [s if len(s) <= 92 else s[:91] + "…" for s in prompt + ["----- generated -----"] + cont]
    return "\n".join("    " + s for s in cut)


def run_demo(pair=PAIR, k: int = 4, num_prompts: int | None = None,
             max_concurrency: int | None = 1, progress: bool = True, device_costs=None,
             out=print, mode: str = "sync", profile=None) -> tuple[dict, dict]:
    from common.modelcfg import load_draft_config, load_model_config
    if k < 1:
        raise UserError(f"--k must be >= 1, got {k}")
    if max_concurrency is not None and max_concurrency < 1:
        raise UserError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    paths = pair_paths(pair)
    reqs = load_heldout(pair, num_prompts)
    tcfg = load_model_config(paths["target"])
    dcfg = load_draft_config(paths["eagle3"], tcfg)
    p_lens = [r.prompt_len for r in reqs]
    o_lens = [r.output_len for r in reqs]
    out(f"stepgap demo: a trained Llama target and its EAGLE-3 head on held-out Python code")
    out(f"  target  {_show(paths['target'])}: {tcfg.num_layers} layers, hidden {tcfg.hidden_size}, "
        f"vocab {tcfg.vocab_size}, {tcfg.num_params / 1e6:.2f} M parameters")
    out(f"  draft   {_show(paths['eagle3'])}: EAGLE-3, aux layers "
        f"{','.join(map(str, dcfg.aux_layers_for(tcfg)))}, draft vocab {dcfg.draft_vocab_size}, "
        f"{dcfg.num_params / 1e6:.2f} M parameters")
    out(f"  trace   {len(reqs)} held-out prompts of {min(p_lens)}-{max(p_lens)} tokens, "
        f"outputs of {min(o_lens)}-{max(o_lens)}; k={k}, greedy, max concurrency "
        f"{max_concurrency}, {mode}, process worker, CPU float32")
    run = run_engine(pair, reqs, k, max_concurrency, progress, mode=mode)
    engine = run.result
    sim = simulate_trace(pair, reqs, run.accepted, k, max_concurrency, device_costs, mode,
                         profile)
    used = (sim["config"].get("profile") or "")
    out("")
    out(side_by_side(engine, sim))
    out("")
    out("  sim: same trace, k, concurrency, mode, scheduler and topology (process worker, CPU")
    out("  device); the engine's accepted counts replayed; " + (
        f"costs: the measured profile {_show(used)}" if used else
        "device = roofline over the `cpu` catalog entry (no profile), CPU = defaults") + ".")
    if used:
        out("  (measured on the machine of docs/validation.md; `stepgap profile` measures "
            "this one)")
    out("")
    out(f"  {reqs[0].request_id}, the end of its prompt and the start of its greedy output:")
    out(sample_text(pair, reqs[0], run.output_token_ids[reqs[0].request_id]))
    return engine, sim


def _show(path) -> str:
    import os
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def cmd_demo(args) -> int:
    run_demo(args.pair, args.k, args.num_prompts, args.max_concurrency, not args.quiet,
             mode=args.mode, profile=args.profile)
    return 0
