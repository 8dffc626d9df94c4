"""stepgap: where do the step gaps go?

This package is the command line only (`stepgap ...`, `python -m stepgap`). It sits above every
other layer and imports each command's module when it builds the parser; docs/explanation/design.md
has the map of the layers. Its subpackages are the top-level folders, through the relative symlinks
beside this file (stepgap/sim -> ../sim): a package and its subpackages always load from one folder,
and `one_checkout` refuses a folder other than the one this environment installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

__version__ = "0.1.0"


def installed_from() -> Path | None:
    """The `stepgap` folder this environment installed (the checkout's, for an editable install),
    or None where stepgap is not installed (a plain checkout on sys.path). The first
    `stepgap-*.dist-info` on sys.path is the one importlib.metadata would read, found without
    importing it (it costs the command line's start tens of milliseconds)."""
    for entry in sys.path:
        for info in sorted(Path(entry or ".").glob("stepgap-*.dist-info")):
            url = info / "direct_url.json"
            direct = json.loads(url.read_text()) if url.is_file() else {}
            if direct.get("dir_info", {}).get("editable"):
                return Path(unquote(urlparse(direct["url"]).path)) / "stepgap"
            return info.parent / "stepgap"
    return None


def one_checkout() -> None:
    """Loading one checkout's code with another's installed environment (its entry points, its
    dependencies) fails here, in one line naming both, rather than somewhere later."""
    here, there = Path(__file__).resolve().parent, installed_from()
    if there is not None and there.resolve() != here:
        raise ImportError(f"stepgap is loaded from {here} but this environment installed it "
                          f"from {there}: use the .venv of the checkout you run (make install)")


one_checkout()
