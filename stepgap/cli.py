"""`stepgap`: one command line for both halves.

Each module listed in COMMAND_MODULES (one per package: its cli.py) defines
`register(subparsers)`, which adds the package's subcommands and sets `func` on them.
Registration must stay cheap: modules import torch and other heavy packages inside their
handlers, so that `stepgap --help` and `stepgap simulate` start fast (tests/test_startup.py
checks that --help, simulate, sweep, plot and compare never import torch).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys

# Before anything loads torch (registering the engine's commands does): OpenMP threads that wait at
# a barrier sleep instead of spinning, so that on a shared machine a waiting thread takes no core
# from the one it waits for, nor from another process (docs/explanation/engine.md, "Threads on a
# shared machine"). The user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from stepgap.common.errors import UserError, shown
from stepgap import __version__

COMMAND_MODULES = [   # each package registers its own commands (its cli.py)
    "stepgap.sim.cli",          # simulate, sweep, plot
    "stepgap.engine.cli",       # run, serve
    "stepgap.training.cli",     # train, make-tiny
    "stepgap.calibrate.cli",    # demo, profile, validate, validate-gpu, ingest, calibrate, ...
    "stepgap.compare",          # compare (the shared core's comparison)
]

DESCRIPTION = """\
stepgap: what does async scheduling buy with EAGLE-3 speculative decoding, and where do the
step gaps go? `simulate` predicts a serving run with a SimPy model of the step loop; `run`
measures one with a real torch engine. Both write the same run results and timelines.
`sweep` runs the simulator over a grid of what-ifs; `plot` draws sweeps and step timelines.
`demo` runs both on a small trained Llama + EAGLE-3 pair (`train` makes it). `profile` measures
this machine's costs for the simulator; `validate` runs the engine and the simulator on the same
traces over a grid and reports the errors (`validate-gpu`: the same on a CUDA GPU at Llama-3.1-8B
scale); `compare` sets one run result against another. Options are spelled as `vllm serve` and
`vllm bench serve` spell them.
"""


class Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (with where the options are listed), not the usage
    of every option first: bad input ends in one line (docs/reference/robustness.md). Its
    subcommands'
    parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the "
                     "options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="stepgap", description=DESCRIPTION,
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


# The options (by metavar) whose values are not paths or names: '' may mean something there.
NOT_PATHS = ("KEY=VALUE", "KEY=VALUES", "LIST", "ADDRESS")


def _subcommand(parser, args):
    """The parser of the subcommand that ran (`plot timeline`, `ingest vllm-bench`)."""
    command = parser.commands[args.command]
    while True:
        sub = next((a for a in command._actions
                    if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or getattr(args, sub.dest, None) not in sub.choices:
            return command
        command = sub.choices[getattr(args, sub.dest)]


def path_options(command, args):
    """(action, its name, its values as a list) of every option or argument of `command` whose
    value is a path or a name: untyped, with a metavar other than NOT_PATHS."""
    for action in command._actions:
        if action.type is not None or action.choices is not None or action.nargs == 0 \
                or action.metavar is None or action.metavar in NOT_PATHS:
            continue
        value = getattr(args, action.dest, None)
        name = action.option_strings[0] if action.option_strings else action.metavar
        yield action, name, value if isinstance(value, list) else [value]


NAME_MAX = 255   # the longest file name (one part of a path) Linux's file systems hold, bytes


def bad_path(parser, args):
    """(the command's parser, the option, why) of the first file, folder or name given as ''
    (no path: `if path:` would silently drop the output it asks for), or with a part longer
    than a file name can be (the first stat of it raised OSError ENAMETOOLONG)."""
    command = _subcommand(parser, args)
    for action, name, values in path_options(command, args):
        if "" in values:
            return command, name, "an empty path ('') names no file or folder"
        if action.metavar in ("N", "RPS", "NAME"):   # lists of numbers, names that stay names
            continue
        if action.dest in FILE_OUTPUTS and any(str(v).endswith("/") for v in values):
            return command, name, ("a path ending in '/' names a folder, and this option "
                                   "writes a file: give its name")
        for v in values:
            longest = max((len(part.encode("utf-8", "replace")) for part in str(v).split("/")),
                          default=0)
            if longest > NAME_MAX:
                return command, name, (f"a name of {longest:,} bytes in the path, where a file "
                                       f"name holds at most {NAME_MAX}")
    return None


# Options whose value is a file the command writes (besides `--out FILE`), and those whose value
# is a folder it writes into or a name; every other path option or argument is one it reads.
FILE_OUTPUTS = ("result_json", "timeline", "chrome_trace", "chrome", "trace_out", "plot")
FOLDER_METAVARS = ("DIR", "OUT")
NOT_INPUTS = ("out", "result_dir", "result_filename", "served_model_name")


def command_paths(parser, args) -> tuple[list, list]:
    """(outputs, inputs) of the command that ran: (option, path) pairs of its file outputs and
    of every file or folder it reads (a `ROW=PATH` argument as its PATH)."""
    outputs, inputs = [], []
    for action, name, values in path_options(_subcommand(parser, args), args):
        for v in values:
            if not isinstance(v, str) or not v:
                continue
            if action.dest in FILE_OUTPUTS or action.dest == "out" \
                    and action.metavar not in FOLDER_METAVARS:
                outputs.append((name, v))
            elif action.dest in ("out", "result_dir"):   # a folder it writes into
                outputs.append((name, v.rstrip("/") + "/"))
            elif action.dest not in NOT_INPUTS:
                path = v if os.path.exists(v) or "=" not in v else v.partition("=")[2]
                inputs.append((name, path))
    return outputs, inputs


def output_over_input(parser, args) -> None:
    """An output that names (or links to) an input of the same command is refused before any
    work (common/fileio.py check_not_input); the inputs stay on `args` for the outputs a command
    derives (a timeline's Chrome trace beside it: common/options.py check_outputs)."""
    from stepgap.common.fileio import check_not_input
    outputs, inputs = command_paths(parser, args)
    args.input_paths = inputs
    check_not_input(outputs, inputs)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that it unwinds as from Ctrl-C: every `finally`
    and `with` runs (worker processes are stopped, temporary files removed)."""


def _terminate(signum, frame):
    raise Terminated()


def interruption(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM behind `e`: itself, or one that Python wrapped on its way out (a
    SIGTERM while an import builds a class was once `RuntimeError: Error calling __set_name__
    on 'Field' instance 'base' in 'Grid'`, its cause the Terminated); None for another error."""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, KeyboardInterrupt):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


class StdoutError(UserError):
    """stdout cannot take what the command prints: it is closed (`>&-`) or its disk is full
    (`> /dev/full`). Bad output, as a file that cannot be written is: one line, status 2."""


class CheckedStdout:
    """sys.stdout while a command runs: a write that fails ends the command in one line
    (StdoutError) instead of a traceback; the reader going away stays a BrokenPipeError
    (status 141)."""

    def __init__(self, stream):
        self.stream = stream

    def _do(self, name: str, *args):
        if self.stream is None:
            raise StdoutError("stdout: closed, so nothing can be printed (give it a file, or "
                              "--quiet where the command has it)")
        try:
            return getattr(self.stream, name)(*args)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:   # ValueError: a closed file object
            why = e.strerror if isinstance(e, OSError) and e.strerror else "closed"
            raise StdoutError(f"stdout: cannot write ({why})") from None

    def write(self, text: str) -> int:
        return self._do("write", text)

    def flush(self) -> None:
        if self.stream is not None:   # a closed stdout that was never written to is fine
            self._do("flush")

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _stdout_gone() -> None:
    """The reader of stdout went away (`stepgap compare ... | head`): send whatever is still
    buffered nowhere, so that exiting does not print a BrokenPipeError."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # AttributeError: no stdout at all
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit status: 0, 2 for bad input (one line naming the file, line and
    field; docs/reference/robustness.md) or an output that cannot be written (stdout closed or full
    among them), 1 for a failed run, 130 on Ctrl-C, 143 on SIGTERM, 141 when stdout's reader
    has gone. Ctrl-C or SIGTERM while the parser is built (it imports every command's module)
    is one line too, as anywhere else."""
    on_main_thread = threading_main()
    if on_main_thread:
        old = signal.signal(signal.SIGTERM, _terminate)
        stdout = sys.stdout = CheckedStdout(sys.stdout)
    name = "stepgap"
    try:
        _tolerant_help_streams()
        from stepgap.common.options import model_tag
        parser = build_parser()
        argv = vllm_spelling(sys.argv[1:] if argv is None else argv)
        if argv:
            name = f"stepgap {argv[0]}"
        args, extra = parser.parse_known_args(model_tag(parser, argv))
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        name = f"stepgap {args.command}"
        from stepgap.common.fileio import reading_inputs
        with reading_inputs():
            check_command_line(parser, args, extra)
            code = args.func(args) or 0
        sys.stdout.flush()
        return code
    except UserError as e:
        if isinstance(e, StdoutError):
            _stdout_gone()   # what is still buffered would fail again at exit
        say(f"{name}: error: {e}")
        return 2
    except BrokenPipeError:
        _stdout_gone()
        return 141
    except OSError as e:   # a name too long that reached a stat (a path built from an input)
        if e.errno != errno.ENAMETOOLONG:
            raise
        say(f"{name}: error: {shown(e.filename)}: a file name longer than this system holds")
        return 2
    except (KeyboardInterrupt, RuntimeError) as e:
        stop = interruption(e)
        if stop is None:
            raise
        how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        say(f"{name}: {how}")
        return 143 if isinstance(stop, Terminated) else 130
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)
            if sys.stdout is stdout:
                sys.stdout = stdout.stream


def check_command_line(parser, args, extra: list[str]) -> None:
    """What the parser cannot see alone, before the command runs: an empty path, leftover words
    (a pasted vLLM option is named and ignored), an output naming one of the inputs."""
    bad = bad_path(parser, args)
    if bad:
        bad[0].error(f"argument {bad[1]}: {bad[2]}")
    if extra:
        command = parser.commands[args.command]
        if not getattr(args, "vllm_options", False):
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        from stepgap.common.options import ignore_vllm_options, late_model_tag
        ignore_vllm_options(command, args, late_model_tag(args, extra))
    output_over_input(parser, args)


def say(line: str) -> None:
    """One line to stderr; where stderr is closed (`2>&-`) or fails, nothing: the exit status
    still says what happened."""
    if sys.stderr is None:   # print(file=None) would write to stdout
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _tolerant_help_streams() -> None:
    """A stdout or stderr that cannot encode a character of a help text (an ASCII locale, `µs`)
    writes a replacement for it rather than fail in a UnicodeEncodeError."""
    for stream in (getattr(sys.stdout, "stream", sys.stdout), sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="replace")
            except (OSError, ValueError):
                pass


def threading_main() -> bool:
    """Signal handlers can only be set from the main thread (main() may run in another, as in
    a notebook's or a test's thread)."""
    import threading
    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    raise SystemExit(main())
