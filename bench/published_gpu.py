"""Published GPU runs, held to the simulator: every point's nominal prediction, its band and a
verdict, then a summary for each half of the evidence.

The points live in `bench/published/*.yaml`, one file per family of evidence. A file is

    sources:
      vllm-20780:                      # a source: one thread, PR, paper table or guide
        url: https://github.com/vllm-project/vllm/pull/20780
        title: "..."                   # what it is, in a few words
        engine: vLLM 0.9.2             # the engine and version that measured it
        date: 2025-07                  # when (optional)
        note: "..."                    # anything a reader must know to use it (optional)
    points:
      - id: vllm-20780/k4              # unique over every file
        source: vllm-20780
        args: >-                       # the run, as `stepgap simulate` takes it
          --model llama-3.1-8b --gpu h100 --draft llama-3.1-8b-eagle3 -k 4 ...
        metric: mean_tpot_ms           # a run result's key, or acceptance_length
        measured: 4.21
        versus: "..."                  # optional: then `measured` is metric(args) / metric(versus)
        sweep: vllm-20780/k            # optional: the points of one k sweep (best k judged)
        dataset: MT-Bench              # optional: the dataset as the source names it
        note: "..."                    # optional: how the number was read off the source

A point's run is its args as written, plus `--vllm-version` from its source's engine where
that names a vLLM version (`vLLM 0.10.1`: the drafter that version ran, sim/drafter_costs.py),
plus `--acceptance-dataset` from its `dataset` where stepgap has that dataset's acceptance
(common/acceptance.py `dataset_name`); either left out where the args give it.

The split, written before any fit: a point belongs to its source's half, and a source is in
the check half when the first byte of the SHA-256 of its id (UTF-8) is odd, else in the
development half. A source's points (a k sweep, a concurrency ladder) stay together. Fit only on
the development half; the check half judges.

The verdicts:
- a point is inside its band when measured lies in [low, high] of its band (`--band`, the
  simulator's own bands: each uncertain input at the ends of its range, sim/bands.py);
- its error is (nominal - measured) / measured;
- a k sweep's best k is the k of the lowest measured value (latency metrics) or the highest
  (throughput), and the prediction's is the same over the nominal values: a hit when they are
  within 1.

Usage:
    python bench/published_gpu.py                       # every point, with bands
    (paths in a point's args, such as a --trace, are relative to the repository's root)
    python bench/published_gpu.py --half check          # one half
    python bench/published_gpu.py --only vllm-20780     # points whose id starts so
    python bench/published_gpu.py --no-band --jobs 2    # nominal only, two processes
    python bench/published_gpu.py --json out.json --report docs/reports/DATE-published-gpu.md

Not a test: tests/test_published_gpu.py checks the files and the judging, not the numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import re
import shlex
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import redirect_stderr
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "published"
THROUGHPUT = ("output_throughput", "request_throughput", "total_token_throughput")
METRICS = ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
           "mean_ttft_ms", "median_ttft_ms", "mean_e2el_ms", "median_e2el_ms",
           "acceptance_length", *THROUGHPUT)
SOURCE_FIELDS = {"url": str, "title": str, "engine": str}
SOURCE_OPTIONAL = {"date": (str,), "note": (str,)}
POINT_FIELDS = {"id": str, "source": str, "args": str, "metric": str, "measured": (int, float)}
POINT_OPTIONAL = {"versus": (str,), "sweep": (str,), "dataset": (str,), "note": (str,)}


class BadFile(ValueError):
    """A data file that does not hold its schema: the message names the file and the field."""


@dataclass(frozen=True)
class Point:
    id: str
    source: str
    args: str
    metric: str
    measured: float
    file: str
    versus: str | None = None
    sweep: str | None = None
    dataset: str | None = None
    note: str | None = None
    engine: str | None = None   # its source's

    @property
    def half(self) -> str:
        return half_of(self.source)

    def run(self, args: str) -> str:
        """`args` with what the point's source and dataset say of the run (the docstring)."""
        from stepgap.common.acceptance import dataset_name
        words = shlex.split(args)
        version = re.match(r"vLLM v?(\d+\.\d+(?:\.\d+)?)", self.engine or "")
        if version and "--vllm-version" not in words:
            args += f" --vllm-version {version.group(1)}"
        ds = dataset_name(self.dataset) if self.dataset else None
        if ds and "--acceptance-dataset" not in words:
            args += f" --acceptance-dataset {ds}"
        return args


def half_of(source: str) -> str:
    """The split rule (the module's docstring): 'check' or 'dev', by the source's id alone."""
    return "check" if hashlib.sha256(source.encode()).digest()[0] % 2 else "dev"


def _check(where: str, d, fields: dict, optional: dict) -> None:
    if not isinstance(d, dict):
        raise BadFile(f"{where}: expected a mapping, got {type(d).__name__}")
    for name, kind in fields.items():
        if name not in d:
            raise BadFile(f"{where}: missing field {name!r}")
        if not isinstance(d[name], kind) or isinstance(d[name], bool):
            raise BadFile(f"{where}.{name}: expected {getattr(kind, '__name__', 'a number')}, "
                          f"got {d[name]!r}")
    for name in d:
        if name not in fields and name not in optional:
            raise BadFile(f"{where}: unknown field {name!r}")
        if name in optional and not isinstance(d[name], optional[name]):
            raise BadFile(f"{where}.{name}: expected text, got {d[name]!r}")


def load(paths=None) -> tuple[dict, list[Point]]:
    """Every source and point of the files (default: bench/published/*.yaml), checked: a field
    missing or of the wrong type, an unknown source, a repeated id, a measured value that is
    not a positive finite number, an unknown metric: BadFile naming the file and the field."""
    files = sorted(DATA.glob("*.yaml")) if paths is None else [Path(p) for p in paths]
    sources: dict[str, dict] = {}
    points: list[Point] = []
    seen: set[str] = set()
    for path in files:
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise BadFile(f"{path}: not YAML: {e}") from None
        if not isinstance(doc, dict) or set(doc) - {"sources", "points"}:
            raise BadFile(f"{path}: expected the keys 'sources' and 'points'")
        for sid, s in (doc.get("sources") or {}).items():
            _check(f"{path}: sources.{sid}", s, SOURCE_FIELDS, SOURCE_OPTIONAL)
            if sid in sources:
                raise BadFile(f"{path}: sources.{sid}: defined twice")
            sources[sid] = {**s, "file": path.name}
        for i, p in enumerate(doc.get("points") or []):
            where = f"{path}: points[{i}]"
            _check(where, p, POINT_FIELDS, POINT_OPTIONAL)
            if p["id"] in seen:
                raise BadFile(f"{where}.id: {p['id']!r} is used twice")
            if p["metric"] not in METRICS:
                raise BadFile(f"{where}.metric: {p['metric']!r} is none of {', '.join(METRICS)}")
            if not (math.isfinite(p["measured"]) and p["measured"] > 0):
                raise BadFile(f"{where}.measured: expected a positive number, got "
                              f"{p['measured']!r}")
            seen.add(p["id"])
            points.append(Point(**p, file=path.name))
    for p in points:
        if p.source not in sources:
            raise BadFile(f"{DATA / p.file}: point {p.id}: source {p.source!r} is not defined")
    return sources, [replace(p, engine=sources[p.source]["engine"]) for p in points]


# ---------------------------------------------------------------------------------------------
# Simulating a point


def settings_of(args: str) -> dict:
    """A point's args as `stepgap simulate` reads them: its SimConfig's fields (a vLLM option
    that stepgap does not model is ignored, as on the command line)."""
    from stepgap.cli import build_parser, check_command_line, vllm_spelling
    from stepgap.common.options import model_tag
    from stepgap.sim.setup_args import config_from_args

    parser = build_parser()
    argv = vllm_spelling(["simulate", *shlex.split(args), "--quiet"])
    with redirect_stderr(io.StringIO()):
        ns, extra = parser.parse_known_args(model_tag(parser, argv))
        check_command_line(parser, ns, extra)
        cfg = config_from_args(ns)
    return {**cfg.to_dict(), "timeline": False, "detailed": False}


def metric_of(res: dict, metric: str) -> float:
    if metric == "acceptance_length":
        return (res.get("spec_decode") or {}).get("acceptance_length", 1.0)
    return res[metric]


@dataclass
class Verdict:
    id: str
    source: str
    half: str
    sweep: str | None
    metric: str
    measured: float
    nominal: float
    low: float | None
    high: float | None
    dominant: list
    k: int
    gpu: str
    model: str
    method: str
    concurrency: int | None
    mode: str
    tp: int
    error: str | None = None   # the simulation failed: why

    @property
    def rel_error(self) -> float:
        return (self.nominal - self.measured) / self.measured

    @property
    def inside(self) -> bool | None:
        if self.low is None:
            return None
        return self.low <= self.measured <= self.high


def evaluate(point: Point, band: bool = True) -> Verdict:
    """Simulate a point (and its `versus` run), with its band where asked: each uncertain input
    of the run at the ends of its range, both runs of a ratio moving together."""
    from stepgap.common.errors import UserError
    from stepgap.sim.bands import band_inputs, combine
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import Recording, simulate

    s = settings_of(point.run(point.args))
    head = dict(id=point.id, source=point.source, half=point.half, sweep=point.sweep,
                metric=point.metric, measured=point.measured, k=s["k"], gpu=s["gpu"],
                model=s["model"], method=s["method"] if s["k"] else "-",
                concurrency=s["max_concurrency"],
                mode=s["mode"], tp=s["tensor_parallel_size"])
    try:
        v = settings_of(point.run(point.versus)) if point.versus else None
        steps = Recording(), Recording()

        def value(a: dict, b: dict | None) -> float:
            with redirect_stderr(io.StringIO()):
                x = metric_of(simulate(SimConfig(**a), recording=steps[0])[0], point.metric)
                if b is None:
                    return x
                return x / metric_of(simulate(SimConfig(**b), recording=steps[1])[0],
                                     point.metric)

        nominal = value(s, v)
        if not band:
            return Verdict(**head, nominal=nominal, low=None, high=None, dominant=[])
        inputs = [i for i in band_inputs(s) if i.applies(s["k"])]
        b = combine(nominal, {i.name: tuple(value(i.settings(s, end),
                                                  v and i.settings(v, end))
                                            for end in ("low", "high")) for i in inputs})
        return Verdict(**head, nominal=nominal, low=b.low, high=b.high, dominant=b.dominant)
    except Exception as e:   # a refusal or a crash: the point failed, named in the summary
        if not isinstance(e, (UserError, KeyError, ValueError)):
            e = RuntimeError(f"stepgap crashed: {type(e).__name__}: {e}")
        return Verdict(**head, nominal=math.nan, low=None, high=None, dominant=[],
                       error=f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# Judging


def best_k(verdicts: list[Verdict], value) -> int:
    """The k of a sweep's best point by `value` (lowest latency, highest throughput)."""
    sign = -1 if verdicts[0].metric in THROUGHPUT else 1
    return min(verdicts, key=lambda v: sign * value(v)).k


def sweeps(verdicts: list[Verdict]) -> dict[str, tuple[int, int]]:
    """Each k sweep of more than one k: (the measured best k, the predicted best k)."""
    groups: dict[str, list[Verdict]] = {}
    for v in verdicts:
        if v.sweep and v.error is None:
            groups.setdefault(v.sweep, []).append(v)
    return {name: (best_k(vs, lambda v: v.measured), best_k(vs, lambda v: v.nominal))
            for name, vs in sorted(groups.items()) if len({v.k for v in vs}) > 1}


@dataclass
class Summary:
    half: str
    points: int
    failed: int
    banded: int
    inside: int
    median_abs_error_drafter: float | None
    median_abs_error_plain: float | None
    sweeps: int
    best_k_hits: int

    def line(self) -> str:
        def pct(x):
            return "-" if x is None else f"{100 * x:.1f} %"
        inside = f"{self.inside}/{self.banded} inside their bands" + (
            f" ({100 * self.inside / self.banded:.0f} %)" if self.banded else "")
        return (f"{self.half:<6} {self.points} points ({self.failed} failed): {inside}; median "
                f"|error| with a drafter {pct(self.median_abs_error_drafter)}, without "
                f"{pct(self.median_abs_error_plain)}; best k within 1 in {self.best_k_hits}/"
                f"{self.sweeps} k sweeps")


def summarize(half: str, verdicts: list[Verdict]) -> Summary:
    ok = [v for v in verdicts if v.error is None]
    banded = [v for v in ok if v.inside is not None]

    def med(vs):
        return statistics.median(abs(v.rel_error) for v in vs) if vs else None
    # acceptance-length points judge the acceptance model, not a drafter's price
    priced = [v for v in ok if v.metric != "acceptance_length"]
    sw = sweeps(ok)
    return Summary(half, len(verdicts), len(verdicts) - len(ok), len(banded),
                   sum(v.inside for v in banded), med([v for v in priced if v.k]),
                   med([v for v in priced if not v.k]), len(sw),
                   sum(abs(m - p) <= 1 for m, p in sw.values()))


def table(verdicts: list[Verdict]) -> str:
    rows = [f"{'point':<34}{'half':<6}{'gpu':<11}{'method':<9}{'k':>2}{'conc':>5} "
            f"{'metric':<18}{'measured':>9}{'nominal':>9}{'error':>8}  band"]
    for v in verdicts:
        if v.error:
            rows.append(f"{v.id:<34}{v.half:<6}failed: {v.error}")
            continue
        dominant = f" ({', '.join(v.dominant)})" if v.dominant else ""
        band = "" if v.low is None else \
            f"[{v.low:.3g}, {v.high:.3g}] {'in' if v.inside else 'OUT'}{dominant}"
        rows.append(f"{v.id:<34}{v.half:<6}{v.gpu[:10]:<11}{v.method[:8]:<9}{v.k:>2}"
                    f"{v.concurrency if v.concurrency is not None else '-':>5} {v.metric:<18}"
                    f"{v.measured:>9.4g}{v.nominal:>9.4g}{100 * v.rel_error:>+7.1f}%  {band}")
    return "\n".join(rows)


def report(verdicts: list[Verdict], sources: dict, command: str) -> str:
    """The run as a dated markdown report (docs/reports/)."""
    from datetime import date
    lines = [f"# Published GPU runs against the simulator ({date.today().isoformat()})", "",
             f"Written by `{command}`. The points and their sources are in "
             "`bench/published/*.yaml`; the split rule is in `bench/published_gpu.py`.", "",
             "## Summary", ""]
    for half in ("dev", "check"):
        vs = [v for v in verdicts if v.half == half]
        if vs:
            lines.append(f"- {summarize(half, vs).line()}")
    sw = sweeps(verdicts)
    if sw:
        lines += ["", "## k sweeps (best k: measured, predicted)", ""]
        lines += [f"- {name}: {m}, {p}" for name, (m, p) in sw.items()]
    lines += ["", "## Points", "", "```", table(verdicts), "```", "", "## Sources", ""]
    for sid in sorted({v.source for v in verdicts}):
        s = sources[sid]
        lines.append(f"- `{sid}` ({half_of(sid)}): {s['title']}; {s['engine']}; {s['url']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="data files (default: bench/published/*.yaml)")
    ap.add_argument("--half", choices=("dev", "check"), help="one half only")
    ap.add_argument("--only", help="points whose id starts with this (comma-separated)")
    ap.add_argument("--no-band", action="store_true", help="nominal predictions only")
    ap.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    ap.add_argument("--json", type=Path, help="write every verdict to this JSON file")
    ap.add_argument("--report", type=Path, help="write a markdown report to this file")
    args = ap.parse_args(argv)
    os.chdir(ROOT)   # the points' paths (their traces) are the repository's
    try:
        sources, points = load(args.files or None)
    except BadFile as e:
        print(f"published_gpu: {e}", file=sys.stderr)
        return 2
    if args.half:
        points = [p for p in points if p.half == args.half]
    if args.only:
        points = [p for p in points if p.id.startswith(tuple(args.only.split(",")))]
    band = not args.no_band
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            verdicts = list(pool.map(evaluate, points, [band] * len(points)))
    else:
        verdicts = []
        for i, p in enumerate(points):
            print(f"\r{i + 1}/{len(points)} {p.id:<40}", end="", file=sys.stderr, flush=True)
            verdicts.append(evaluate(p, band))
        print(file=sys.stderr)
    print(table(verdicts))
    print()
    for half in ("dev", "check"):
        vs = [v for v in verdicts if v.half == half]
        if vs:
            print(summarize(half, vs).line())
    for name, (m, p) in sweeps(verdicts).items():
        print(f"k sweep {name}: best k measured {m}, predicted {p}"
              f"{'' if abs(m - p) <= 1 else '  (miss)'}")
    if args.json:
        args.json.write_text(json.dumps([asdict(v) for v in verdicts], indent=1) + "\n")
    if args.report:
        cmd = "python bench/published_gpu.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
        args.report.write_text(report(verdicts, sources, cmd.strip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
