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
            raise UserError(f"{where(self.path, lineno, 'metrics')}: expected an object of "
                            f"numbers, got {str(metrics)[:60]!r}; delete the line, or rerun "
                            "with --fresh")
        return d["cell"]

    def add(self, cell: GridCell, metrics: dict) -> None:
        if self._file is None:
            self._file = self.path.open("ab")
            if self.cut_at is not None:
                self._file.truncate(self.cut_at)
            elif self.newline_due:
                self._file.write(b"\n")
        self._file.write((dumps_json({"cell": cell.key, "values": cell.values,
                                      "metrics": metrics}) + "\n").encode())
        self._file.flush()
        self.done[cell.key] = metrics

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
