"""Named scenarios: each sets every option of a run at once; the command line still overrides.

A preset may carry the measured values it reproduces, which `stepgap simulate` prints beside
the simulated ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepgap.common.errors import UserError

SEED_COLUMNS = ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    settings: dict                      # SimConfig fields
    measured: dict = field(default_factory=dict)   # mode -> {metric: value}, vLLM's names
    source: str = ""


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "seed-l20",
        "vLLM PR #25872 on one L20: Llama-3.1-8B + EAGLE-3 head, k=4, MT-bench 80 prompts, "
        "output 256, max-concurrency 1",
        settings=dict(gpu="l20", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=4,
                      acceptance="mtbench", max_model_len=2048,
                      workload="mtbench", num_prompts=80, output_len=256, max_concurrency=1,
                      # Fitted on the sync row's mean ITL only (bench/seed_calibration.py).
                      cpu_scale=2.42),
        measured={
            "sync": dict(mean_tpot_ms=9.91, p99_tpot_ms=14.94, mean_itl_ms=28.14,
                         p99_itl_ms=28.52),
            "async": dict(mean_tpot_ms=9.57, p99_tpot_ms=14.42, mean_itl_ms=27.17,
                          p99_itl_ms=28.15),
        },
        source="vLLM PR #25872 (docs/explanation/design.md §6): main = sync, the PR = async"),
    Preset(
        "sharegpt-h100",
        "Llama-3.1-8B + EAGLE-3 head on one H100, k=4, async, 10,000 ShareGPT-like requests "
        "at max-concurrency 64 (the simulator's speed benchmark)",
        settings=dict(gpu="h100", model="llama-3.1-8b", draft="llama-3.1-8b-eagle3", k=4,
                      mode="async", acceptance="mtbench", workload="sharegpt",
                      num_prompts=10000, max_concurrency=64)),
)}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"--preset: unknown preset {name!r} (known: {', '.join(PRESETS)})") \
            from None


def comparison_table(metrics, measured: dict, title: str) -> str:
    """The seed's four columns: simulated (a RunResult's metrics), measured and the error of
    each."""
    lines = [f"{' ' + title + ' ':-^50}",
             f"{'':<18}{'simulated':>11}{'measured':>11}{'error':>9}"]
    labels = {"mean_tpot_ms": "Mean TPOT (ms)", "p99_tpot_ms": "P99 TPOT (ms)",
              "mean_itl_ms": "Mean ITL (ms)", "p99_itl_ms": "P99 ITL (ms)"}
    for key in SEED_COLUMNS:
        if key in measured:
            sim, meas = metrics.get(key), measured[key]
            lines.append(f"{labels[key]:<18}{sim:>11.2f}{meas:>11.2f}"
                         f"{100 * (sim - meas) / meas:>+8.1f}%")
    return "\n".join(lines)
