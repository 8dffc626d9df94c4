"""bench/published_gpu.py: the published points' files hold their schema, the split follows its
written rule, and the judging (band, best k, summaries) says what it should. The numbers
themselves are the benchmark's, not a test's."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "published" / "sample.yaml"

spec = importlib.util.spec_from_file_location("published_gpu", ROOT / "bench" / "published_gpu.py")
pg = importlib.util.module_from_spec(spec)
sys.modules["published_gpu"] = pg   # its dataclasses look their module up
spec.loader.exec_module(pg)


def test_every_committed_point_names_a_source_and_parses_as_a_simulate_command_line(monkeypatch):
    monkeypatch.chdir(ROOT)   # the points' traces are named from the repository's root
    sources, points = pg.load()
    assert len(points) >= 40 and len(sources) >= 5
    for p in points:
        assert sources[p.source]["url"]
        s = pg.settings_of(p.args)
        assert s["gpu"] and s["model"]
        if p.versus:
            pg.settings_of(p.versus)


def test_the_split_is_by_source_on_the_parity_of_the_first_sha256_byte():
    # sha256("vllm-20780")[0] = 76, sha256("made-up-a")[0] = 205
    assert pg.half_of("vllm-20780") == "dev"
    assert pg.half_of("made-up-a") == "check"
    _, points = pg.load([SAMPLE])
    assert {p.half for p in points} == {"check"}


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["points"][0].pop("metric"), "points[0]: missing field 'metric'"),
    (lambda d: d["points"][1].update(measured=-1), "points[1].measured"),
    (lambda d: d["points"][1].update(measured=float("nan")), "points[1].measured"),
    (lambda d: d["points"][0].update(metric="tpot"), "points[0].metric"),
    (lambda d: d["points"][1].update(id="made-up-a/k0"), "points[1].id"),
    (lambda d: d["points"][0].update(source="nobody"), "source 'nobody' is not defined"),
    (lambda d: d["points"][0].update(colour="red"), "unknown field 'colour'"),
    (lambda d: d["sources"]["made-up-a"].pop("url"), "sources.made-up-a: missing field 'url'"),
])
def test_a_broken_file_is_refused_naming_the_file_and_the_field(tmp_path, edit, field):
    import yaml
    doc = yaml.safe_load(SAMPLE.read_text())
    edit(doc)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(pg.BadFile, match="bad.yaml") as e:
        pg.load([bad])
    assert field in str(e.value)


def verdict(k, measured, nominal, metric="mean_tpot_ms", low=None, high=None, half="dev"):
    return pg.Verdict(id=f"s/k{k}", source="s", half=half, sweep="s/k", metric=metric,
                      measured=measured, nominal=nominal, low=low, high=high, dominant=[], k=k,
                      gpu="h100", model="m", method="eagle3" if k else "-", concurrency=1,
                      mode="sync", tp=1)


def test_the_best_k_is_the_lowest_latency_and_the_highest_throughput():
    lat = [verdict(0, 7.0, 7.0), verdict(4, 4.0, 3.0), verdict(7, 4.4, 2.5)]
    assert pg.sweeps(lat) == {"s/k": (4, 7)}
    thr = [verdict(k, m, n, metric="output_throughput") for k, m, n in
           ((0, 100, 100), (2, 180, 150), (5, 160, 170))]
    assert pg.sweeps(thr) == {"s/k": (2, 5)}


def test_a_summary_counts_points_inside_their_bands_and_best_k_within_one():
    vs = [verdict(0, 7.0, 6.3, low=6.0, high=7.5), verdict(4, 4.0, 3.0, low=2.8, high=3.6),
          verdict(7, 4.4, 2.5, low=2.3, high=3.0)]
    s = pg.summarize("dev", vs)
    assert (s.points, s.banded, s.inside) == (3, 3, 1)
    assert s.median_abs_error_drafter == pytest.approx(statistics_median([0.25, 1.9 / 4.4]))
    assert s.median_abs_error_plain == pytest.approx(0.1)
    assert (s.sweeps, s.best_k_hits) == (1, 0)   # measured 4, predicted 7


def statistics_median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def test_a_point_is_simulated_with_its_band_and_a_ratio_moves_both_runs_together():
    _, points = pg.load([SAMPLE])
    by = {p.id: p for p in points}
    v = pg.evaluate(by["made-up-a/k2"])
    assert v.error is None and v.k == 2 and v.method == "eagle3"
    assert v.low < v.nominal < v.high
    r = pg.evaluate(by["made-up-a/speedup-k2"])
    assert r.error is None and 1.0 < r.nominal < 3.0   # EAGLE-3 at k = 2 beats k = 0
    # the same band inputs move both runs of a ratio: its band is far narrower than a run's
    assert (r.high - r.low) / r.nominal < (v.high - v.low) / v.nominal
    assert math.isfinite(r.rel_error)


def test_a_points_run_takes_its_sources_vllm_version_and_its_dataset_unless_its_args_say():
    p = pg.Point(id="s/a", source="s", args="--model llama-3.1-8b -k 2", metric="mean_tpot_ms",
                 measured=1.0, file="f.yaml", dataset="GSM8K", engine="vLLM 0.9.2 (V1)")
    assert p.run(p.args).split()[-4:] == ["--vllm-version", "0.9.2", "--acceptance-dataset",
                                          "math"]
    given = "--model llama-3.1-8b --vllm-version 0.11.0 --acceptance-dataset code"
    assert p.run(given) == given
    other = pg.Point(id="s/b", source="s", args="--model x", metric="mean_tpot_ms", measured=1.0,
                     file="f.yaml", dataset="a dataset stepgap lacks", engine="SGLang 0.4.6")
    assert other.run(other.args) == "--model x"
