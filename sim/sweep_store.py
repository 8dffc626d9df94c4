"""A sweep's store, OUT/cells.jsonl: every finished cell, appended as it finishes, so that a
rerun skips it."""

from __future__ import annotations

from pathlib import Path

from stepgap.common.errors import UserError, where
from stepgap.common.fileio import NONFINITE, decode_text, dumps_json, parse_json, read_bytes
from stepgap.sim.sweep_grid import GridCell
from stepgap.sim.sweep_table import TEXT_COLUMNS, is_column_value


class CellStore:
    """OUT/cells.jsonl: one line per finished cell, appended as it finishes.

    An interrupted run can leave its last line torn (no newline, not JSON): that cell runs
    again, and the torn line is cut off before the next one is appended. Any other line that is
    not a finished cell is an error naming its line. Every line is JSON (common/fileio.py
    dumps_json: a non-finite metric as "nan", "inf" or "-inf", read back as the float; a store
    of older runs, with Python's bare NaN and Infinity, still reads)."""

    def __init__(self, path: Path, fresh: bool = False):
        self.path = path
        self.done: dict[str, dict] = {}
        self.cut_at: int | None = None   # a torn last line starts at this byte
        self.newline_due = False         # the last line is whole but has no newline
        if fresh and path.is_file():
            path.unlink()
        if path.exists():
            self._read()
        self._file = None

    def _read(self) -> None:
        data = read_bytes(self.path)
        decode_text(data, self.path)   # names the file if it is not UTF-8 text
        lines = data.split(b"\n")
        offset = 0
        for lineno, line in enumerate(lines, 1):
            text = line.decode("utf-8-sig" if lineno == 1 else "utf-8")
            if text.strip():
                try:
                    d = parse_json(text, self.path, lineno)
                except UserError:
                    if lineno < len(lines):
                        raise UserError(f"{where(self.path, lineno)}: not a finished cell (not "
                                        "valid JSON); delete the line, or rerun with --fresh") \
                            from None
                    self.cut_at = offset
                    return
                key = self._cell(d, lineno)
                self.done[key] = d["metrics"]
            offset += len(line) + 1
        self.newline_due = bool(data) and not data.endswith(b"\n")

    def _cell(self, d, lineno: int) -> str:
        if not isinstance(d, dict) or not isinstance(d.get("cell"), str):
            raise UserError(f"{where(self.path, lineno, 'cell')}: expected a cell's hash; is "
                            "this a store of `stepgap sweep`? (rerun with --fresh)")
        metrics = d.get("metrics")
        if isinstance(metrics, dict):   # a non-finite metric, as dumps_json wrote it
            metrics = {k: float(v) if k not in TEXT_COLUMNS and v in NONFINITE else v
                       for k, v in metrics.items()}
            d["metrics"] = metrics
        if not isinstance(metrics, dict) or not all(is_column_value(k, v)
                                                    for k, v in metrics.items()):
            bad = next((k for k, v in metrics.items() if not is_column_value(k, v)), None) \
                if isinstance(metrics, dict) else None
            field = "metrics" if bad is None else f"metrics.{bad}"
            got = metrics if bad is None else metrics[bad]
            raise UserError(f"{where(self.path, lineno, field)}: expected "
                            + ("an object of numbers" if bad is None else
                               "a mode" if bad in TEXT_COLUMNS else "a number >= 0")
                            + f", got {str(got)[:60]!r}; delete the line, or rerun with --fresh")
        return d["cell"]

    def add(self, cell: GridCell, metrics: dict) -> None:
        """Append the cell's line. A disk that fills up (ENOSPC) or a file-size limit
        (`ulimit -f`, EFBIG) ends the sweep in one line: the cells done stay stored, a line
        torn by the failed write is cut off by the next run, which resumes."""
        line = (dumps_json({"cell": cell.key, "values": cell.values, "metrics": metrics})
                + "\n").encode()
        try:
            if self._file is None:
                self._file = open(self.path, "ab", buffering=0)   # each line written at once
                if self.cut_at is not None:
                    self._file.truncate(self.cut_at)
                elif self.newline_due:
                    self._file.write(b"\n")
            view = memoryview(line)
            while view:   # a raw write may take part of the line (a disk filling up)
                view = view[self._file.write(view):]
        except OSError as e:
            raise UserError(f"{self.path}: cannot write ({e.strerror}); the {len(self.done)} "
                            "cells done before it are stored, and the sweep resumes from them "
                            "when run again") from None
        self.done[cell.key] = metrics

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:   # unbuffered: nothing is left to write
                pass
            self._file = None
