"""Write docs/reference/commands.md: every command of `stepgap` with its whole --help (options,
defaults, examples), from the parsers themselves, so the reference is the code's.

Usage: python bench/docs_reference.py [--check]   (--check: exit 1 where the page is stale)
tests/test_docs.py holds the page to naming every command and every option.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "commands.md"
WIDTH = "100"

HEAD = """\
# Every command and option

Each command's own `--help`, as `stepgap COMMAND --help` prints it (written by
`python bench/docs_reference.py` from the parsers; run it again after changing an option). The
options are spelled as `vllm serve` and `vllm bench serve` spell them; vLLM's underscores
(`--max_num_seqs`) work too, and a vLLM option stepgap does not model is named and ignored. The
file formats the commands read and write: [formats.md](formats.md).

"""


def commands(parser=None, prefix=("stepgap",)):
    """(the words of a command, its parser) for every command and subcommand, in order."""
    from stepgap.cli import build_parser
    parser = parser or build_parser()
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words = (*prefix, name)
                inner = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
                out.append((words, sub))
                if inner:
                    out += commands(sub, words)
    return out


def page() -> str:
    os.environ["COLUMNS"] = WIDTH
    parts = [HEAD, "| command | what |", "|---|---|"]
    from stepgap.cli import build_parser
    top = build_parser()
    helps = {}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
    found = commands(top)
    for words, sub in found:
        what = helps.get(words[1], "") if len(words) == 2 else \
            (sub.description or "").split(". ")[0].split(" (")[0].replace("\n", " ")
        parts.append(f"| [`{' '.join(words)}`](#{'-'.join(words)}) | {what} |")
    parts.append("")
    for words, sub in found:
        parts += [f"## {' '.join(words)}", "", "```", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    text = page()
    if "--check" in argv:
        stale = not PAGE.is_file() or PAGE.read_text() != text
        print(f"{PAGE.relative_to(ROOT)}: {'stale' if stale else 'fresh'}")
        return int(stale)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
