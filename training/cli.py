"""`stepgap train` (the trained pair: a small Llama target and its EAGLE-3 head on the Python
stdlib) and `stepgap make-tiny` (tiny random checkpoints, the head distilled)."""

from __future__ import annotations

import sys

from stepgap.common.options import add_command, nonneg_int, positive_int

DESCRIPTION = (
    "Train a byte-level BPE tokenizer, a small Llama target and its EAGLE-3 head (training-time "
    "test, soft cross-entropy over the draft vocabulary) on the Python standard library's "
    "source, offline and deterministically.")

EPILOG = """\
examples:
  stepgap train checkpoints/pystdlib            # the committed pair (8-13 min on 2 cores)
  stepgap train out/smoke --preset smoke        # seconds: a tiny pair, for checking the code

OUT/target is a Hugging Face Llama folder with its tokenizer (transformers loads it), OUT/eagle3
an EAGLE-3 head in the yuhuili layout (the engine loads it), OUT/heldout.jsonl prompts from the
held-out files as a workload trace, OUT/train.json the log (config, corpus fingerprint, losses,
times). The same seed, corpus, torch and --threads give the same bytes; docs/explanation/training.md
has the recipe.
"""


def register(sub) -> None:
    p = add_command(sub, "train", description=DESCRIPTION, epilog=EPILOG,
                    help="train a small Llama target and its EAGLE-3 head on the Python stdlib")
    p.add_argument("out", metavar="OUT", help="output folder")
    p.add_argument("--preset", default="pystdlib", choices=("pystdlib", "smoke"),
                   help="sizes and steps (default pystdlib: the committed pair)")
    p.add_argument("--seed", type=nonneg_int, default=None, help="default: the preset's (0)")
    p.add_argument("--target-steps", type=positive_int, default=None, metavar="N",
                   help="optimizer steps of the target (default: the preset's)")
    p.add_argument("--head-steps", type=positive_int, default=None, metavar="N",
                   help="optimizer steps of the head (default: the preset's)")
    p.add_argument("--corpus", default=None, metavar="DIR",
                   help="a folder of .py files instead of this Python's standard library")
    p.add_argument("--threads", type=positive_int, default=2,
                   help="torch threads (default 2, whatever the core count: the head's bytes "
                        "depend on it)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    t = add_command(
        sub, "make-tiny", help="write a tiny random Llama target and a matching EAGLE-3 head",
        description="Write OUT/target (a Hugging Face Llama folder), OUT/eagle3-yuhuili and "
                    "OUT/eagle3-speculators (the same head in both layouts). The head is "
                    "distilled from the target for --train-steps steps, so that drafts are "
                    "accepted; 0 leaves it random.",
        epilog="example:\n  stepgap make-tiny out/tiny && stepgap run --model out/tiny/target "
               "--draft out/tiny/eagle3-yuhuili --num-speculative-tokens 3 --num-prompts 4 "
               "--output-len 32")
    t.add_argument("out", metavar="OUT", help="output folder")
    t.add_argument("--train-steps", type=nonneg_int, default=200,
                   help="distillation steps for the head (default 200, a few seconds; 0: random)")
    t.add_argument("--seed", type=nonneg_int, default=0, help="default 0")
    t.set_defaults(func=cmd_make_tiny)


def cmd_train(args) -> int:
    # (OMP_WAIT_POLICY=PASSIVE is set by stepgap/cli.py, before torch loads OpenMP.)
    from dataclasses import replace

    from stepgap.common.fileio import check_writable
    from stepgap.training.train import PRESETS, train_pair
    check_writable(args.out, "OUT", folder=True)
    cfg = PRESETS[args.preset]
    overrides = {k: v for k, v in (("seed", args.seed), ("target_steps", args.target_steps),
                                   ("head_steps", args.head_steps)) if v is not None}
    cfg = replace(cfg, **overrides)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    out = train_pair(args.out, cfg, args.corpus, args.threads, progress=not args.quiet, log=say)
    for name in ("target", "eagle3", "heldout", "log"):
        print(f"{name:8} {out[name]}")
    t = out["times"]
    print(f"time     {t['total_wall']:.0f} s wall, {t['total_cpu']:.0f} s CPU")
    return 0


def cmd_make_tiny(args) -> int:
    from stepgap.common.fileio import check_writable
    from stepgap.training.tiny import make_tiny
    check_writable(args.out, "OUT", folder=True)
    paths = make_tiny(args.out, seed=args.seed, train_steps=args.train_steps)
    for name in ("target", "eagle3-yuhuili", "eagle3-speculators"):
        print(f"{name:20} {paths[name]}")
    if paths["agreement"]:
        per = ", ".join(f"{100 * a:.0f}%" for a in paths["agreement"])
        print(f"draft agreement with the target, draft steps 1..{len(paths['agreement'])}: {per}")
    return 0
