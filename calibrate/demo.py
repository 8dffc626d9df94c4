"""`stepgap demo`: the question stepgap answers, on the seed's setup; then the engine on the
committed trained pair, next to the simulator's prediction.

0. The headline (`headline`): `stepgap advise` on the seed's setup (vLLM PR #25872: one L20,
   Llama-3.1-8B + EAGLE-3, MT-bench, concurrency 1), its answer in words, and the PR's own k
   in both modes next to what the PR measured. Seconds, and no engine (`--no-advise` skips it).
1. This machine is measured on the spot (`--profile measure`, the default): the measurement
   harness (calibrate/harness.py) runs a small plan in one engine worker, a short
   microbenchmark grid and one calibration run on prompts cut from the corpus's *training*
   files (calibrate/pair.py), and fits a profile from them (calibrate/fit.py), as `stepgap
   profile` does at length. Then, in the same worker, the engine (the `process` executor,
   engine and worker pinned to a CPU each; CPU, float32, greedy) runs the pair's held-out
   workload (prompts cut from Python stdlib files the pair never trained on) with k draft
   tokens per step and measures what `vllm bench serve` measures, with real acceptance.
2. The simulator runs the same trace with the same k, concurrency, mode, scheduler limits and
   topology (`executor=process`, `device=cpu`: the device is the worker's own CPU) on that
   profile, replaying the engine's accepted count of every decode step, so both see the same
   acceptance.
3. Both are printed side by side, with the simulator's error. Because the costs were measured
   here, a moment before, the error means the same on every machine: how well the step-loop
   model predicts, not how far this machine's speed is from another's.

`--profile committed` takes the profile committed with the CPU validation instead
(traces/measured/cpu/profile.json, measured on the machine of docs/explanation/validation.md), and
`--profile PATH` any other: then the error also holds how much faster or slower this machine
is. Why the process executor: it is the topology the profiles are calibrated on, and the one
where the modes differ on a CPU (inline, the engine's thread computes everything, and async
hides nothing).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stepgap.calibrate.pair import PAIR, ROOT, load_heldout, pair_paths
from stepgap.common.errors import UserError
from stepgap.common.limits import MAX_K
from stepgap.common.options import add_command, add_option, at_most, positive_int
from stepgap.sim.profile import Profile

if TYPE_CHECKING:   # (`stepgap --help` need not load the result types)
    from stepgap.common.run_result import RunResult

PROFILE = ROOT / "traces" / "measured" / "cpu" / "profile.json"
MEASURE = "measure"
CALIBRATION_PROMPTS = 16      # one calibration run of 16 prompts (fewer for a shorter trace)
# A short grid: one request, the pair's context range, prefill chunks and the decode shape.
QUICK_GRID = dict(reqs=(1,), contexts=(64, 160, 240), queries=(16, 64), repeats=3)

DESCRIPTION = (
    "Run the reference engine on the committed trained target + EAGLE-3 head over held-out "
    "Python code, print its measured acceptance, TPOT and ITL, and the simulator's prediction "
    "for the same trace and acceptance.")

EPILOG = """\
examples:
  stepgap demo                                  # k = 4, 48 held-out prompts, concurrency 1
  stepgap demo --k 2 --max-concurrency 4 --num-prompts 16 --mode async
  stepgap demo --profile committed      # the profile of docs/explanation/validation.md's machine

The pair (checkpoints/pystdlib) was trained by `stepgap train`; docs/explanation/training.md
tells how.
"""


def register(sub) -> None:
    p = add_command(sub, "demo", description=DESCRIPTION, epilog=EPILOG,
                    help="the engine on the trained pair, next to the simulator's prediction")
    p.add_argument("--pair", default=str(PAIR), metavar="DIR",
                   help="folder with target/, eagle3/ and heldout.jsonl (default: the committed "
                        "checkpoints/pystdlib)")
    p.add_argument("--k", type=at_most(positive_int, MAX_K), default=4,
                   help="draft tokens per step (default 4)")
    add_option(p, "num_prompts", metavar="N",
               help="the first N requests of the trace (default: all)")
    add_option(p, "max_concurrency", default=1, metavar="N",
               help="requests in flight (default 1, as the seed run)")
    add_option(p, "mode", default="sync", help="step scheduling, both halves (default sync)")
    p.add_argument("--profile", default=MEASURE, metavar="measure|committed|PATH",
                   help="the simulator's measured costs: measure (default) measures this machine "
                        "on the spot, in seconds, before the engine runs; committed takes "
                        "traces/measured/cpu/profile.json (another machine's, docs/"
                        "validation.md); or a profile file of `stepgap profile`")
    p.add_argument("--no-advise", dest="advise", action="store_false",
                   help="skip the headline: stepgap advise on the seed's setup")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_demo)


SEED = "seed-l20"


def headline(out=print, **settings):
    """`stepgap advise` on the seed's setup (`settings` change it: tests make it small), told
    in words: its verdict, and the PR's k in sync and async next to what the PR measured.
    The Advice."""
    import os
    from stepgap.sim.advise import DEFAULT_MAX_K, advise, depths, loads_of
    from stepgap.sim.advise_report import verdict
    from stepgap.sim.config import SimConfig
    from stepgap.sim.presets import get_preset
    preset = get_preset(SEED)
    base = SimConfig(**{**preset.settings, **settings}).to_dict()
    advice = advise(base, loads_of([base["max_concurrency"]], None),
                    depths(base, DEFAULT_MAX_K), jobs=min(2, os.cpu_count() or 1))
    a, k = advice.answers[0], preset.settings["k"]
    sync, asyn = a.modes["sync"].grid[k], a.modes["async"].grid[k]
    tpot = {mode: preset.measured[mode]["mean_tpot_ms"] for mode in ("sync", "async")}
    out(f"stepgap demo: does async scheduling pay, and which k? On the seed's setup "
        f"({preset.description})")
    out(f"  {verdict(a)}")
    out(f"  at the PR's k={k}: sync {sync:.2f} ms, async {asyn:.2f} ms mean TPOT (async saves "
        f"{100 * (1 - asyn / sync):.1f} %); the PR measured {tpot['sync']:.2f} "
        f"and {tpot['async']:.2f} ms (saves {100 * (1 - tpot['async'] / tpot['sync']):.1f} %)")
    out(f"  ({advice.sims} simulations in {advice.seconds:.1f} s; `stepgap advise --preset "
        f"{SEED}` prints the whole answer: its bands, what it rests on, your own k)")
    return advice


def pair_args(pair, requests, k: int, max_concurrency: int | None, mode: str = "sync",
              dtype: str = "float32"):
    """The demo's engine: the pair, greedy, on the CPU, the process executor (pinned), with
    scheduler limits that fit the trace (the simulator takes the same)."""
    from stepgap.calibrate.harness import limits
    from stepgap.engine.args import EngineArgs
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
    from stepgap.engine.loop import run_trace

    setup = pair_args(pair, requests, k, max_concurrency, mode, dtype).create_engine_config()
    cfg, vocab = setup.engine_config(), setup.vocab_size
    if progress:
        print(f"  engine: {len(requests)} requests ...", file=sys.stderr)
    with setup.make_executor() as ex:
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
                   device_costs=None, mode: str = "sync", profile=None,
                   lim: dict | None = None) -> dict:
    """The simulator on the same trace and topology, replaying the engine's accepted counts.

    `profile` (a path or a Profile; default the committed CPU profile when it is there) gives
    the device op and CPU costs; without one the device is the roofline over the `cpu` catalog
    entry (a placeholder). `device_costs` (a sim.costs.DeviceCosts) overrides the device side.
    `lim`: the engine's scheduler limits (default: those run_engine gives it).
    """
    from stepgap.calibrate.harness import limits
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate

    paths = pair_paths(pair)
    lim = lim or limits(requests, k, max_concurrency)
    if profile is None and PROFILE.is_file():
        profile = PROFILE
    measured = profile if isinstance(profile, Profile) else None
    cfg = SimConfig(mode=mode, k=k, gpu="cpu", model=paths["target"], draft=paths["eagle3"],
                    executor="process", device="cpu", replay=True,
                    profile=str(profile) if profile and measured is None else None,
                    max_num_seqs=lim["max_num_seqs"],
                    max_num_batched_tokens=lim["max_num_batched_tokens"],
                    max_model_len=lim["max_model_len"],
                    num_gpu_blocks_override=lim["num_blocks"],
                    max_concurrency=max_concurrency)
    reqs = [replace(r, accepted=list(accepted.get(r.request_id, []))) for r in requests]
    result, _ = simulate(cfg, reqs, device_costs, measured)
    return result


ROWS = (("Acceptance length", "acceptance_length", "{:.2f}"),
        ("Mean TPOT (ms)", "mean_tpot_ms", "{:.2f}"), ("P99 TPOT (ms)", "p99_tpot_ms", "{:.2f}"),
        ("Mean ITL (ms)", "mean_itl_ms", "{:.2f}"), ("P99 ITL (ms)", "p99_itl_ms", "{:.2f}"),
        ("Mean step gap (us)", "step_gap", "{:.0f}"), ("Duration (s)", "duration", "{:.2f}"))


def _value(res: RunResult, key: str):
    if key == "acceptance_length":
        return res.spec_decode.acceptance_length if res.spec_decode else None
    if key == "step_gap":
        return res.step_gaps.mean_us
    return res.metrics.get(key)


def side_by_side(engine: RunResult, sim: RunResult) -> str:
    lines = [f"{'':28}{'engine (measured)':>20}{'sim (predicted)':>18}{'sim error':>12}"]
    for label, key, fmt in ROWS:
        e, s = _value(engine, key), _value(sim, key)
        err = f"{100 * (s - e) / e:+.1f} %" if e and s is not None else "-"
        lines.append(f"{label:28}{fmt.format(e) if e is not None else '-':>20}"
                     f"{fmt.format(s) if s is not None else '-':>18}{err:>12}")
    per = engine.spec_decode.acceptance_rate_per_pos if engine.spec_decode else None
    if per:
        lines.append(f"{'Per-position acceptance (%)':28}  "
                     + ", ".join(f"{100 * r:.1f}" for r in per))
    return "\n".join(lines)


def sample_text(pair, request, output_ids: list[int], lines: int = 4) -> str:
    """The end of a prompt and the start of its greedy continuation, decoded."""
    from stepgap.engine.tokenizer import load_tokenizer
    tok = load_tokenizer(pair_paths(pair)["target"])
    prompt = tok.decode(request.prompt_token_ids).splitlines()[-lines:]
    cont = tok.decode(output_ids).splitlines()[:lines]
    cut = [s if len(s) <= 92 else s[:91] + "…" for s in prompt + ["----- generated -----"] + cont]
    return "\n".join("    " + s for s in cut)


def measure_and_run(pair, requests, k: int, max_concurrency: int | None, mode: str,
                    progress: bool):
    """This machine measured on the spot, then the engine on `requests`, in one worker: (the
    engine's result, its output ids in trace order, the fitted profile, the scheduler
    limits)."""
    from stepgap.calibrate.fit import GridShape
    from stepgap.calibrate.harness import Plan, cell_name, run_plan
    from stepgap.calibrate.pair import calibration_trace
    from stepgap.calibrate.validate import pair_engine

    n = calibration_size(requests)
    calibration = calibration_trace(pair, n)
    plan = Plan(pair_engine(pair), [mode], [k], [max_concurrency], requests, calibration,
                repeats=1, slice=len(requests), calibration_slice=n,
                grid=GridShape(**QUICK_GRID), judged_name="held-out prompts",
                calibration_name=f"{n} prompts cut from the corpus's training files",
                device_name="this machine")
    m = run_plan(plan, progress=progress, desc="measure this machine, then run")
    name = cell_name(mode, k, max_concurrency)
    return m.runs[name][0], m.outputs[name], m.profile, plan.limits()


def calibration_size(requests) -> int:
    """Calibration prompts: as many as the demo's, from 4 to CALIBRATION_PROMPTS."""
    return min(CALIBRATION_PROMPTS, max(4, len(requests)))


def resolve_profile(profile: str | None) -> str | None:
    """--profile: `measure` (None: measured on the spot), `committed`, or a path, checked
    before anything runs."""
    from stepgap.sim.profile import load_profile
    if profile in (None, MEASURE):
        return None
    path = str(PROFILE) if profile == "committed" else profile
    load_profile(path)   # a missing or broken profile fails now, not after the engine ran
    return path


def run_demo(pair=PAIR, k: int = 4, num_prompts: int | None = None,
             max_concurrency: int | None = 1, progress: bool = True, device_costs=None,
             out=print, mode: str = "sync", profile=MEASURE, advise: bool = False) \
        -> tuple[dict, dict]:
    from stepgap.common.model_presets import load_draft_config, load_model_config
    if k < 1:
        raise UserError(f"--k must be >= 1, got {k}")
    if max_concurrency is not None and max_concurrency < 1:
        raise UserError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    if num_prompts is not None and num_prompts < 1:
        raise UserError(f"--num-prompts must be >= 1, got {num_prompts}")
    path = resolve_profile(profile)
    paths = pair_paths(pair)
    reqs = load_heldout(pair, num_prompts)
    tcfg = load_model_config(paths["target"])
    dcfg = load_draft_config(paths["eagle3"], tcfg)
    p_lens = [r.prompt_len for r in reqs]
    o_lens = [r.output_len for r in reqs]
    if advise:
        headline(out)
        out("")
        out("Then the simulator held to a real engine, measured here:")
    out("stepgap demo: a trained Llama target and its EAGLE-3 head on held-out Python code")
    out(f"  target  {_show(paths['target'])}: {tcfg.num_layers} layers, hidden {tcfg.hidden_size}, "
        f"vocab {tcfg.vocab_size}, {tcfg.num_params / 1e6:.2f} M parameters")
    out(f"  draft   {_show(paths['eagle3'])}: EAGLE-3, aux layers "
        f"{','.join(map(str, dcfg.aux_layers_for(tcfg)))}, draft vocab {dcfg.draft_vocab_size}, "
        f"{dcfg.num_params / 1e6:.2f} M parameters")
    out(f"  trace   {len(reqs)} held-out prompts of {min(p_lens)}-{max(p_lens)} tokens, "
        f"outputs of {min(o_lens)}-{max(o_lens)}; k={k}, greedy, max concurrency "
        f"{max_concurrency}, {mode}, process worker, CPU float32")
    if path is None:
        engine, outputs, prof, lim = measure_and_run(pair, reqs, k, max_concurrency, mode,
                                                     progress)
        first = outputs[0]   # in trace order
        accepted = dict(zip(engine.requests.ids, engine.requests.accepted))
        sim = simulate_trace(pair, reqs, accepted, k, max_concurrency, device_costs, mode,
                             prof, lim)
        costs = ("costs: measured on this machine just before, in the same worker (a short\n"
                 f"  microbenchmark grid and a calibration run of {calibration_size(reqs)} other "
                 "prompts, cut from the\n  corpus's training files)")
    else:
        if progress:
            print(f"  engine: {len(reqs)} requests ...", file=sys.stderr)
        run = run_engine(pair, reqs, k, max_concurrency, False, mode=mode)
        engine, accepted = run.result, run.accepted
        first = run.output_token_ids[reqs[0].request_id]
        sim = simulate_trace(pair, reqs, accepted, k, max_concurrency, device_costs, mode, path)
        costs = (f"costs: the measured profile {_show(path)}"
                 + ("\n  (measured on the machine of docs/explanation/validation.md, not this one)"
                    if Path(path).resolve() == PROFILE.resolve() else ""))
    out("")
    out(side_by_side(engine, sim))
    out("")
    out("  sim: same trace, k, concurrency, mode, scheduler and topology (process worker, CPU")
    out("  device); the engine's accepted counts replayed;")
    out(f"  {costs}.")
    out("")
    out(f"  {reqs[0].request_id}, the end of its prompt and the start of its greedy output:")
    out(sample_text(pair, reqs[0], first))
    return engine, sim


def _show(path) -> str:
    import os
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def cmd_demo(args) -> int:
    run_demo(args.pair, args.k, args.num_prompts, args.max_concurrency, not args.quiet,
             mode=args.mode, profile=args.profile, advise=args.advise)
    return 0
