"""The docs hold together: every relative link in README.md and docs/**/*.md leads to a file
(and its #anchor to a heading there), and every `docs/....md` the code cites (in comments,
docstrings, --help texts, printed notes), with the section it names, is there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_DIRS = ("common", "sim", "engine", "calibrate", "training", "stepgap", "bench", "tests",
             "notebooks", "traces")


def prose(text: str) -> str:
    """The text outside code fences and inline code (a link there is not a link)."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def headings(text: str) -> list[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    return [m.group(1).strip() for m in re.finditer(r"(?m)^#{1,6} +(.+?) *#*$", text)]


def plain(heading: str) -> str:
    """A heading's text as rendered: links by their text, no backticks or emphasis."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[`*]", "", heading)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", plain(heading).lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen, out = {}, set()
    for h in headings(path.read_text()):
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):   # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading with that anchor")
    return out


def test_the_slug_is_githubs():
    assert slug("Bands (`sim/bands.py`; `--band`, `stepgap advise`)") == \
        "bands-simbandspy---band-stepgap-advise"
    assert slug("Closed forms the tests pin (constant costs, one request)") == \
        "closed-forms-the-tests-pin-constant-costs-one-request"


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Two words\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#two-words) [gone](c.md) [bad](a.md#three) `[code](x.md)`\n"
                    "```\n[fenced](y.md)\n```\n[web](https://example.com/z.md)\n")
    assert broken_links(page) == ["c.md: no such file", "a.md#three: no heading with that anchor"]


def test_every_relative_link_in_the_readme_and_the_docs_resolves():
    broken = {str(p.relative_to(ROOT)): b for p in PAGES if (b := broken_links(p))}
    assert not broken, broken


def cited_docs() -> list[tuple[str, str, str | None]]:
    """(the citing file, the docs path, the section named after it or None) for each
    `docs/X.md` or `docs/X.md, "Section"` in the code and data files."""
    out = []
    pat = re.compile(r"(?<![\w./-])(docs/[\w./-]+\.md)(?:(?:, *| +)[\"']([^\"'\n]+)[\"'])?")
    for d in CODE_DIRS:
        for f in (ROOT / d).rglob("*"):
            if f.suffix not in (".py", ".toml", ".ipynb", ".json") or not f.is_file() \
                    or ".venv" in f.parts or f.stat().st_size > 2_000_000 \
                    or f.name == "test_docs.py":
                continue
            for m in pat.finditer(f.read_text(errors="replace")):
                if not m.group(1).startswith("docs/docs/") and m.group(1).islower():
                    # (not another project's docs folder, nor a placeholder such as DATE-NAME)
                    out.append((str(f.relative_to(ROOT)), m.group(1), m.group(2)))
    return out


def test_every_docs_page_the_code_cites_is_there_with_its_section():
    missing = []
    for where, doc, section in cited_docs():
        page = ROOT / doc
        if not page.is_file():
            missing.append(f"{where}: {doc}")
        elif section and not any(plain(h).startswith(section.replace("`", ""))
                                 for h in headings(page.read_text())):
            missing.append(f"{where}: {doc}, {section!r}")
    assert not missing, sorted(set(missing))


def test_the_readme_is_a_guide_of_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_reference_names_every_command_and_every_option():
    """docs/reference/commands.md is written from the parsers (bench/docs_reference.py): a
    command or an option added since is missing from it."""
    import argparse
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  ROOT / "bench" / "docs_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (ROOT / "docs" / "reference" / "commands.md").read_text()
    missing = []
    for words, parser in mod.commands():
        if f"## {' '.join(words)}\n" not in text:
            missing.append(" ".join(words))
        section = text.split(f"## {' '.join(words)}\n", 1)[-1].split("\n## ", 1)[0]
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt not in section \
                        and not isinstance(action, argparse._HelpAction):
                    missing.append(f"{' '.join(words)} {opt}")
    assert not missing, f"run `python bench/docs_reference.py`: {missing}"
