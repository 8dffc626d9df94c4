"""Reading and writing files, the same way everywhere.

Every loader reads text through `read_text` (UTF-8, a BOM allowed and dropped, anything else a
clear "not UTF-8 text" error) and JSON through `read_json`; every writer goes through
`write_text`/`write_bytes`, which write a temporary file beside the target and rename it over,
so that an interrupted or failed write never leaves a torn file. Errors name the path.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from common.errors import UserError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def read_bytes(path) -> bytes:
    path = Path(path)
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, not a file") from None
    except FileNotFoundError:
        raise UserError(f"{path}: not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None


def read_text(path) -> str:
    """UTF-8 text; a leading byte-order mark is dropped."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None


def parse_json(text: str, source) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{source}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") \
            from None
    except RecursionError:
        raise UserError(f"{source}: not valid JSON (nested too deeply)") from None


def read_json(path) -> object:
    return parse_json(read_text(path), path)


def read_toml(path) -> dict:
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None


def write_bytes(path, data: bytes) -> None:
    """Write atomically: a temporary file in the same folder, then a rename over `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write ({e.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> None:
    write_bytes(path, text.encode())
