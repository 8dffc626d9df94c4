"""How far one run result is from another (`stepgap compare`, stepgap/compare.py).

Both sides are run results (`common.run_result.RunResult`): the engine's, the simulator's,
one saved by `vllm bench serve --save-result` (no step gaps) or a peer's vLLM run. The
table has the mean, median and P99 of TPOT, ITL, TTFT and E2EL, each simulated against measured
with the error in % of measured, and the step-gap distributions: median, P90 and mean, and the
Kolmogorov-Smirnov distance between the two when both results carry every gap (`values_us`,
written with `--detailed`).

`pool_results` makes one result out of repeated runs of one configuration, as if they were one
longer benchmark: every request of every run counts once.
"""

from __future__ import annotations

import math

import numpy as np

from stepgap.common.formats import METRICS, SpecStats, compute_metrics
from stepgap.common.run_result import Metrics, RunResult, SpecDecode, StepGaps

STATS = ("mean", "median", "p99")
GAP_STATS = (("median", "median_us"), ("P90", "p90_us"), ("mean", "mean_us"))


def rel_err(sim: float | None, meas: float | None) -> float | None:
    """(simulated - measured) / measured, or None when it cannot be taken (a missing or NaN
    side: a metric the run did not measure)."""
    if sim is None or meas is None or not meas or math.isnan(sim) or math.isnan(meas):
        return None
    return (sim - meas) / meas


def ks_distance(a: list[float], b: list[float]) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two CDFs."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def percentiles_in(*records: RunResult) -> list[str]:
    """The percentile stats ('p90', 'p99', ...) every record carries for some metric, in order
    (p99 always: a record without it shows '-')."""
    have = [{k.split("_", 1)[0] for k in r.metrics if k.startswith("p") and k.endswith("_ms")
             and k.split("_", 1)[0][1:].replace(".", "", 1).isdigit()} for r in records]
    common = set.intersection(*have) | {"p99"}
    return sorted(common - {"p50"}, key=lambda s: float(s[1:]))


def compare(measured: RunResult, simulated: RunResult) -> dict:
    """{"rows": [(label, measured, simulated, error)], "gaps": [...], "ks": float | None}.
    Rows: the mean, median and every percentile both records carry, of each metric."""
    rows = []
    stats = ["mean", "median", *percentiles_in(measured, simulated)]
    for m in METRICS:
        for stat in stats:
            key = f"{stat}_{m}_ms"
            a, b = measured.metrics.get(key), simulated.metrics.get(key)
            label = stat.capitalize() if stat in STATS[:2] else stat.upper()
            rows.append((f"{label} {m.upper()} (ms)", a, b, rel_err(b, a)))
    ga, gb = measured.step_gaps, simulated.step_gaps
    gaps = []
    for label, key in GAP_STATS:
        a, b = getattr(ga, key), getattr(gb, key)
        gaps.append((f"{label.capitalize() if label != 'P90' else label} step gap (us)", a, b,
                     rel_err(b, a)))
    va, vb = ga.values_us, gb.values_us
    ks = ks_distance(va, vb) if va and vb else None
    return {"rows": rows, "gaps": gaps, "ks": ks, "gap_counts": (ga.count, gb.count)}


# What must match for two results to be of the same run: the trace (its size, its tokens) and
# the configuration. A record's attributes, then its config's keys; a key either lacks is not
# compared (a vLLM result has no config).
SAME_TRACE = ("num_prompts", "total_input_tokens")
SAME_CONFIG = ("max_concurrency", "request_rate", "burstiness")
SAME_CONFIG_KEYS = ("mode", "k", "executor", "device", "block_size", "max_num_seqs",
                    "max_num_batched_tokens")


def mismatches(a: RunResult, b: RunResult) -> list[str]:
    """Why two results may not be comparable (they ran different traces or configs, or one
    finished no request), one line each; [] when nothing says so."""
    out = []
    for name, res in (("MEASURED", a), ("SIMULATED", b)):
        if res.metrics.completed == 0:
            out.append(f"{name} completed no request: its metrics are zeros, not measurements")

    def differ(keys, get):
        return [f"{k} {get(a, k)!r} vs {get(b, k)!r}" for k in keys
                if get(a, k) is not None and get(b, k) is not None and get(a, k) != get(b, k)]

    trace = differ(SAME_TRACE, lambda r, k: r.metrics.get(k, getattr(r, k, None)))
    if trace:
        out.append("the two results ran different traces (" + "; ".join(trace) + ")")
    config = differ(SAME_CONFIG, getattr) + differ(SAME_CONFIG_KEYS, lambda r, k: r.config.get(k))
    if config:
        out.append("the two results ran different configurations (" + "; ".join(config) + ")")
    return out


def _fmt(v, width: int = 12) -> str:
    ok = isinstance(v, (int, float)) and not math.isnan(v)
    return f"{v:>{width}.3f}" if ok else f"{'-':>{width}}"


def format_compare(cmp: dict, names: tuple[str, str] = ("measured", "simulated")) -> str:
    lines = [f"{'metric':<26}{names[0]:>12}{names[1]:>12}{'error %':>10}"]
    for label, a, b, e in cmp["rows"] + cmp["gaps"]:
        err = f"{100 * e:>+10.1f}" if e is not None else f"{'-':>10}"
        lines.append(f"{label:<26}{_fmt(a)}{_fmt(b)}{err}")
    na, nb = cmp["gap_counts"]
    if cmp["ks"] is not None:
        lines.append(f"step gaps: {na} and {nb} values; KS distance {cmp['ks']:.3f} "
                     "(0: the same distribution, 1: disjoint)")
    elif not na or not nb:
        lines.append("step gaps: " + ("not in the measured result" if not na else
                                      "not in the simulated result") + " (vllm bench serve "
                     "does not record them)")
    else:
        lines.append("step gaps: no KS distance (rerun with --detailed to keep every gap)")
    return "\n".join(lines)


def cmp_to_json(cmp: dict) -> dict:
    def row(label, a, b, e):
        return {"metric": label, "measured": a, "simulated": b, "error": e}
    return {"metrics": [row(*r) for r in cmp["rows"]], "step_gaps": [row(*r) for r in cmp["gaps"]],
            "step_gap_ks": cmp["ks"]}


# -------------------------------------------------------------------------------------------
# Repeated runs as one


POOLED_HEAD = ("backend", "request_rate", "burstiness", "max_concurrency", "num_prompts")


def pool_results(results: list[RunResult]) -> RunResult:
    """Repeated runs of one configuration as one result: requests and step gaps concatenated,
    durations added, acceptance counters summed; the config is the first run's."""
    if len(results) == 1:
        return results[0]
    timings, gaps = [], []
    for n, r in enumerate(results):
        timings += r.timings(f"#{n}")
        gaps += r.step_gaps.values_us or []
    first = results[0]
    spec = None
    specs = [r.spec_decode for r in results if r.spec_decode]
    if specs:
        s = SpecStats(specs[0].k)
        s.num_drafts = sum(x.num_drafts for x in specs)
        s.num_draft_tokens = sum(x.num_draft_tokens for x in specs)
        s.num_accepted_tokens = sum(x.num_accepted_tokens for x in specs)
        s.accepted_per_pos = [round(sum(x.acceptance_rate_per_pos[i] * x.num_drafts
                                        for x in specs)) for i in range(s.k)]
        spec = SpecDecode.of(s)
    pooled = RunResult(
        backend=first.backend, request_rate=first.request_rate, burstiness=first.burstiness,
        max_concurrency=first.max_concurrency,
        num_prompts=sum(r.num_prompts or len(r.requests.ttfts) for r in results),
        metrics=Metrics.from_dict(compute_metrics(timings,
                                                  sum(r.metrics.duration for r in results))),
        step_gaps=StepGaps.of(gaps, detailed=True), spec_decode=spec,
        config={**first.config, "pooled_runs": len(results)}, resolved=first.resolved)
    # written as pooled results always were: the load before the prompts, the plan before the
    # count of runs
    pooled.order = (*POOLED_HEAD, *(k for k in pooled.to_dict() if k not in POOLED_HEAD))
    pooled.config_order = (*(first.config_order or (*first.config, "resolved")), "pooled_runs")
    return pooled
