"""Reading and writing files, the same way everywhere.

Every loader reads text through `read_text` (UTF-8, a BOM allowed and dropped, anything else a
clear "not UTF-8 text" error), JSON through `read_json` (a `.gz` path is decompressed first) and
JSON lines through `json_lines`; every writer goes through `write_bytes` (and `write_text`,
`write_json`), which write a temporary file beside the target and rename it over, so that an
interrupted or failed write never leaves a torn or empty file. Every command checks its output
paths with `check_writable` before it starts its work, so that a wrong path or a full disk is
found before a measurement, not after it. Errors name the path (docs/reference/robustness.md).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import gzip
import io
import json
import math
import os
import re
import stat
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Iterator

from stepgap.common.errors import UserError
from stepgap.common.limits import (MAX_CSV_FIELD, MAX_DECOMPRESSED_BYTES, MAX_YAML_DEPTH,
                                   MAX_YAML_NODES)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

MIN_FREE_BYTES = 1 << 20      # less free space than this on an output's disk: "disk full"
_UMASK = os.umask(0)          # read once: files are created with the mode open() would give
os.umask(_UMASK)


# -------------------------------------------------------------------------------------------
# Reading


def not_a_file(path) -> str | None:
    """Why `path` (links followed) is no file to read, or None when it is one: it is missing, a
    folder, a FIFO or a device (a read would block, or never end), or a link that loops."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "not found"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link that loops"
        return f"cannot read ({e.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a file"
    kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) \
        else "a device"
    return f"{kind}, not a regular file"


def check_file(path, what: str = "file") -> Path:
    """`path` if it is a file to read; else one line naming it (`what`: "trace file", ...)."""
    why = not_a_file(path)
    if why == "not found":
        raise UserError(f"{path}: {what} not found")
    if why:
        raise UserError(f"{path}: {why}")
    return Path(path)


def input_files(paths, pattern: str = "*", what: str = "input") -> list[tuple[Path, bool]]:
    """The files a command takes from `paths`: each file given, checked (`check_file`), and the
    files matching `pattern` in each folder given, walked in sorted order; with, for each,
    whether it was found in a folder. A file given twice, or given and inside a folder also
    given, is refused naming both, so that no input counts twice."""
    out, given = [], {}
    for p in map(Path, paths):
        found = [(q, True) for q in sorted(p.rglob(pattern)) if q.is_file()] if p.is_dir() \
            else [(check_file(p, what), False)]
        for q, walked in found:
            key = os.path.realpath(q)
            if key in given:
                raise UserError(f"{q}: given twice (from {given[key]} and from {p}); give each "
                                f"{what} once")
            given[key] = p
            out.append((q, walked))
    return out


# The files this command has read (device, inode), for `write_bytes` to refuse to write over
# one: an input it found rather than was given (a peer run's meta.json beside its requests, a
# bundle's hardware.yaml) is not on the command line for `check_not_input` to see. Kept while
# a command of the command line runs (`reading_inputs`, in stepgap/cli.py main), else None.
# A file the command wrote itself (WRITTEN) stays its own to write again (`train` writes a
# config.json, reads it back, and writes it again).
READ: set[tuple[int, int]] | None = None
WRITTEN: set[tuple[int, int]] = set()


@contextlib.contextmanager
def reading_inputs():
    """Count the files read in this block as inputs that no output may replace (READ)."""
    global READ
    READ = set()
    WRITTEN.clear()
    try:
        yield
    finally:
        READ = None
        WRITTEN.clear()


def _inode(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def mark_input(path) -> None:
    """Count `path` among the command's inputs (READ) without reading it: a file of an input it
    was given, which it does not need this time (a peer run's timeseries.csv, a bundle's
    hardware.yaml at TP 1), but which an output must not replace."""
    if READ is not None and os.path.exists(path):
        READ.add(_inode(path))


# What parsing an input gave, by what was parsed and the bytes it was parsed from: a grid's
# cells each read the same perf bundle (its meta.yaml several times over), and parsing it costs
# more than simulating the cell. Keyed by the files' contents, not their times, so that an
# edited file is parsed again; what is kept is shared, and read only.
_PARSED: dict = {}


def parsed_once(what: tuple, paths: list, parse):
    """`parse()`, or what it gave for the same `what` and the same bytes of `paths` earlier in
    this process (a forked worker has what its parent parsed). Every path is read either way,
    and so counted among the command's inputs (READ)."""
    import hashlib
    key = (what, tuple((str(p), hashlib.blake2b(read_bytes(p), digest_size=16).digest())
                       for p in paths))
    if key not in _PARSED:
        _PARSED[key] = parse()
    return _PARSED[key]


def read_bytes(path) -> bytes:
    path = Path(path)
    why = not_a_file(path)
    if why:
        raise UserError(f"{path}: {why}")
    try:
        if READ is not None:
            READ.add(_inode(path))
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None


def decode_text(data: bytes, source) -> str:
    """UTF-8 text; a leading byte-order mark is dropped."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{source}: not UTF-8 text (byte {e.start})") from None


def gunzip(data: bytes, source) -> bytes:
    """gzip-compressed `data`, decompressed a piece at a time up to MAX_DECOMPRESSED_BYTES
    (common/limits.py): a gzip bomb (gigabytes of zeros packed into megabytes) is named when it
    passes the limit, never inflated whole into the memory."""
    pieces, total = [], 0
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            while piece := f.read(1 << 20):
                total += len(piece)
                if total > MAX_DECOMPRESSED_BYTES:
                    raise UserError(f"{source}: decompresses to more than "
                                    f"{MAX_DECOMPRESSED_BYTES >> 20} MiB (a gzip bomb?); "
                                    "stepgap reads no larger input")
                pieces.append(piece)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        raise UserError(f"{source}: not a gzip file (or a truncated one)") from None
    return b"".join(pieces)


def read_text(path) -> str:
    """A file's UTF-8 text; a `.gz` file is decompressed first (`gunzip`)."""
    data = read_bytes(path)
    if str(path).endswith(".gz"):
        data = gunzip(data, path)
    return decode_text(data, path)


def parse_json(text: str, source, lineno: int | None = None) -> object:
    """JSON from `text`; errors say `source:line` (`lineno`: the line `text` is, in a file of
    JSON lines)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        line = lineno if lineno is not None else e.lineno
        raise UserError(f"{source}:{line}: not valid JSON ({e.msg}, column {e.colno})") \
            from None
    except RecursionError:
        at = f":{lineno}" if lineno is not None else ""
        raise UserError(f"{source}{at}: not valid JSON (nested too deeply)") from None
    except ValueError:   # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise UserError(_long_integer(text, source, lineno)) from None


def _long_integer(text: str, source, lineno: int | None) -> str:
    limit = sys.get_int_max_str_digits()
    m = re.search(r"\d{%d,}" % (limit + 1), text)
    if m is None:
        return f"{source}: not valid JSON (an integer too long to read)"
    line = lineno if lineno is not None else text.count("\n", 0, m.start()) + 1
    column = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    return (f"{source}:{line}: not valid JSON (an integer of {len(m[0])} digits, column "
            f"{column}; more than {limit} digits is no number a field can hold)")


def read_json(path) -> object:
    return parse_json(read_text(path), path)


def read_json_object(path, what: str) -> dict:
    """A JSON file that must hold an object (`what` names it in the error)."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a JSON object ({what}), got {type(doc).__name__}")
    return doc


def json_lines(path) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-blank line of a JSON-lines file."""
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            yield lineno, parse_json(line, path, lineno)


def read_toml(path) -> dict:
    text = read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None
    except RecursionError:
        raise UserError(f"{path}: not valid TOML (nested too deeply)") from None
    except ValueError:   # an integer longer than Python converts, as in JSON
        raise UserError(_long_integer(text, path, None).replace("JSON", "TOML")) from None


def read_yaml(path, what: str) -> dict:
    """A YAML file whose top level is a mapping (`what` says whose format, for the error):
    LLMServingSim's meta.yaml and hardware.yaml, a GPU file. Its nesting and its size with
    every alias expanded are counted on PyYAML's event stream (which keeps its own stack) before
    the document is built (which recurses): past MAX_YAML_DEPTH or MAX_YAML_NODES it is refused,
    naming the line."""
    import yaml
    text = read_text(path)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml's, where PyYAML has it
    try:
        _yaml_size(path, yaml.parse(text, Loader=loader), yaml)
        doc = yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", e)
        if "maximum nesting depth" in str(problem):   # libyaml's own limit, past ours
            problem = f"nested more than {MAX_YAML_DEPTH} deep"
        raise UserError(f"{path}{line}: not valid YAML ({problem})") from None
    except RecursionError:
        raise UserError(f"{path}: not valid YAML (nested too deeply)") from None
    except ValueError:   # an integer longer than Python converts, as in JSON
        raise UserError(_long_integer(text, path, None).replace("JSON", "YAML")) from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a mapping ({what})")
    return doc


def _yaml_size(path, events, yaml) -> None:
    """Refuse a YAML event stream nested past MAX_YAML_DEPTH, or holding more than
    MAX_YAML_NODES values once its aliases are expanded (each alias counts as its anchor's
    node, whole)."""
    sizes: dict[str, int] = {}    # anchor: its node's values, expanded
    open_: list[list] = []        # the collections open: [anchor, values so far]
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            open_.append([event.anchor, 1])
            if len(open_) > MAX_YAML_DEPTH:
                raise UserError(f"{path}:{event.start_mark.line + 1}: not valid YAML "
                                f"(nested more than {MAX_YAML_DEPTH} deep)")
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, n = open_.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, n = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            anchor, n = None, sizes.get(event.anchor, 1)
        else:
            continue
        if anchor is not None:
            sizes[anchor] = n
        if open_:
            open_[-1][1] += n
            if open_[-1][1] > MAX_YAML_NODES:
                raise UserError(f"{path}:{event.start_mark.line + 1}: refused: its aliases "
                                f"expand to more than {MAX_YAML_NODES:,} values")


def csv_rows(path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each line of a CSV file (a perf bundle's tables, a peer run's
    timeseries.csv); a field longer than MAX_CSV_FIELD, or any line the csv module cannot
    split, is one line naming the file and line."""
    csv.field_size_limit(MAX_CSV_FIELD)   # the module's default: held here, in one place
    reader = csv.reader(read_text(path).splitlines())
    try:
        for row in reader:
            yield reader.line_num, row
    except csv.Error as e:
        raise UserError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None


# -------------------------------------------------------------------------------------------
# Writing


def _nearest_folder(path: Path) -> Path:
    """The closest ancestor of `path` that exists (where its missing folders would be made)."""
    p = path.absolute().parent
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path, option: str, folder: bool = False) -> Path:
    """Fail now, naming `option` and the path, if a file (or with `folder`, a folder) cannot be
    written there: it is a folder (a file), a missing folder cannot be made under a file, the
    folder is not writable, or its disk is full. Creates nothing."""
    path = Path(path)
    what = f"{option} {path}"
    if path.is_symlink() and not_a_file(path) == "a symbolic link that loops":
        raise UserError(f"{what}: a symbolic link that loops; nothing can be written through it")
    if folder:
        if path.exists() and not path.is_dir():
            raise UserError(f"{what}: is a file, not a folder")
    elif path.is_dir():
        raise UserError(f"{what}: is a folder; give a file name")
    elif path.exists() and not path.is_file():
        raise UserError(f"{what}: not a regular file")
    base = path if folder and path.is_dir() else _nearest_folder(path)
    if not base.is_dir():
        raise UserError(f"{what}: {base} is a file, so no folder can be made under it")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".stepgap-probe-")
        os.close(fd)
        os.unlink(probe)
        st = os.statvfs(base)
    except OSError as e:
        raise UserError(f"{what}: cannot write in {base} ({e.strerror})") from None
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_BYTES:
        raise UserError(f"{what}: the disk is full ({free} bytes free in {base})")
    return path


def check_distinct(outputs) -> None:
    """Every output of a command is a file of its own: two options naming one file (`--result-json
    x --timeline x`) would have the second write replace the first. `outputs`: (option, path)
    pairs, None paths skipped. Links and `./` spellings are seen through."""
    seen: dict[str, tuple[str, object]] = {}
    for option, path in outputs:
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            first, first_path = seen[key]
            raise UserError(f"{option} {path}: the same file as {first} {first_path}; give "
                            "each output a path of its own")
        seen[key] = (option, path)


def check_not_input(outputs, inputs) -> None:
    """No output overwrites an input of the same command: `--timeline` naming the `--trace`,
    a `--result-json` linking to it, `serve --result-json` naming the model's config.json.
    `outputs` and `inputs`: (option, path) pairs, None paths skipped. Only an output that exists
    can be an input; one inside an input folder (a checkpoint, a measured folder) is refused
    too, as the command may read it. An output folder (its path ends in `/`) may not be an
    input folder. Links and hard links are seen through."""
    for option, out in outputs:
        if out is not None and str(out).endswith("/") and os.path.isdir(out):
            for source, src in inputs:
                if src is not None and os.path.isdir(src) and os.path.samefile(out, src):
                    raise UserError(f"{option} {str(out).rstrip('/')}: the input {source} {src}, "
                                    "whose files the outputs would overwrite; give the output "
                                    "another folder")
            continue
        if out is None or not os.path.isfile(out):
            continue
        for source, src in inputs:
            if src is None or not os.path.exists(src):
                continue
            if os.path.isdir(src):
                clash = os.path.realpath(out).startswith(os.path.realpath(src) + os.sep)
                what = "a file in"
            else:
                clash = os.path.samefile(out, src)
                what = "the same file as"
            if clash:
                raise UserError(f"{option} {out}: {what} the input {source} {src}, which the "
                                "output would overwrite; give the output another path")


def check_not_walked(option: str, out, paths) -> None:
    """An output file inside a folder the command walks for its inputs (`input_files`: calibrate's
    folders of bench files and timelines) is refused whether or not it exists yet: the next run
    would read it as an input (`calibrate DIR --out DIR/p.json` read p.json back as a bench
    file)."""
    for src in paths:
        if os.path.isdir(src) and os.path.realpath(out).startswith(
                os.path.realpath(src).rstrip(os.sep) + os.sep):
            raise UserError(f"{option} {out}: inside {src}, a folder this command reads every "
                            "file of: the next run would read the output as an input; give the "
                            "output a path outside it")


def write_bytes(path, data: bytes) -> None:
    """Write atomically: a temporary file in the same folder, then a rename over `path`."""
    path = Path(path)
    if path.is_symlink():
        try:
            path = path.resolve()   # write through the link, keep it
        except (OSError, RuntimeError):   # RuntimeError: a link that loops (Python < 3.13)
            raise UserError(f"{path}: cannot write (a symbolic link that loops)") from None
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        what = "a folder" if path.is_dir() else "not a regular file"
        raise UserError(f"{path}: cannot write ({what})")
    if READ and path.exists() and _inode(path) in READ - WRITTEN:
        raise UserError(f"{path}: an input this command read (found beside one it was given), "
                        "which the output would overwrite; give the output another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(data)
        os.replace(tmp, path)
        if READ is not None:
            WRITTEN.add(_inode(path))
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write ({e.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> None:
    write_bytes(path, text.encode())


# JSON has no NaN and no infinities (RFC 8259): Python's json writes them as the bare words
# NaN and Infinity, which no conformant reader takes. Every JSON stepgap writes goes through
# `dumps_json`, which writes a non-finite float as one of these strings instead; the loaders of
# numbers that may be non-finite (run results, sweep tables) read them back as floats.
NONFINITE = ("nan", "inf", "-inf")


def jsonable(x):
    """`x` with every non-finite float as its NONFINITE string and numpy scalars as Python's."""
    if isinstance(x, float):
        return x if math.isfinite(x) else "inf" if x > 0 else "-inf" if x < 0 else "nan"
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and type(x).__module__ == "numpy":   # a numpy scalar
        return jsonable(x.item())
    return x


def dumps_json(obj, **kwargs) -> str:
    """`json.dumps`, writing only valid JSON (non-finite floats as NONFINITE strings)."""
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)


def write_json(path, obj, indent: int | None = 1) -> None:
    """JSON (`dumps_json`), `indent`ed with a final newline; a `.gz` path gets compact JSON,
    gzip-compressed with no timestamp (the same object gives the same bytes)."""
    if str(path).endswith(".gz"):
        text = dumps_json(obj, separators=(",", ":"))
        write_bytes(path, gzip.compress(text.encode(), mtime=0))
    else:
        write_text(path, dumps_json(obj, indent=indent) + "\n")
