"""`stepgap`: one command line for both halves.

Each module listed in COMMAND_MODULES defines `register(subparsers)`, which adds its subcommands
and sets `func` on them. Registration must stay cheap: modules import torch and other heavy
packages inside their handlers, so that `stepgap --help` and `stepgap simulate` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from common.errors import UserError
from stepgap import __version__

COMMAND_MODULES = [
    "sim.cli",
    "sim.sweep_cli",
    "engine.cli",
    "engine.serve",
    "training.cli",
    "calibrate.demo",
    "calibrate.profile",
    "calibrate.validate",
    "calibrate.gpu",
    "common.compare",
]

DESCRIPTION = """\
stepgap: what does async scheduling buy with EAGLE-3 speculative decoding, and where do the
step gaps go? `simulate` predicts a serving run with a SimPy model of the step loop; `run`
measures one with a real torch engine. Both write the same run results and timelines.
`sweep` runs the simulator over a grid of what-ifs; `plot` draws sweeps and step timelines.
`demo` runs both on a small trained Llama + EAGLE-3 pair (`train` makes it). `profile` measures
this machine's costs for the simulator; `validate` runs the engine and the simulator on the same
traces over a grid and reports the errors; `compare` sets one run result against another.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepgap", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"stepgap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    parser.commands = sub.choices   # name -> its parser, for errors about leftover words
    return parser


def vllm_spelling(argv: list[str]) -> list[str]:
    """vLLM takes `_` for `-` in long option names (`--max_num_seqs`); so does stepgap."""
    def one(word: str) -> str:
        if not word.startswith("--"):
            return word
        name, eq, value = word.partition("=")
        return name.replace("_", "-") + eq + value
    return [one(w) for w in argv]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(vllm_spelling(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if extra:   # a pasted vLLM option is named and ignored; anything else is an error
        command = parser.commands[args.command]
        if not getattr(args, "vllm_options", False):
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        from common.options import ignore_vllm_options
        ignore_vllm_options(command, args, extra)
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"stepgap {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"stepgap {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
