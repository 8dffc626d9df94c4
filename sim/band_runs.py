"""A run's bands (sim/bands.py has the inputs and their ranges): the run simulated at the nominal
inputs and again at each input's low and high end, the same requests each time; the bands as a
result records them and as `stepgap simulate --band` prints them; the band of a difference of
two runs.
"""

from __future__ import annotations

from stepgap.sim.bands import Band, BandInput, band_inputs, combine


BAND_METRICS = ("mean_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "mean_e2el_ms",
                "output_throughput")


def run_bands(settings: dict, requests=None, metrics=BAND_METRICS, profile=None):
    """One run and its bands: (the run result at the nominal inputs, the inputs, metric ->
    Band, the run's spans); the same requests at every input end."""
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import Recording, build_workload, simulate

    cfg = SimConfig(**settings)
    reqs = requests if requests is not None else build_workload(cfg)
    steps = Recording()   # the CPU and device ends take the nominal run's steps
    res, spans = simulate(cfg, reqs, profile=profile, recording=steps)
    inputs = [i for i in band_inputs(settings) if i.applies(cfg.k)]
    ends = {}
    for inp in inputs:
        ends[inp.name] = tuple(
            simulate(SimConfig(**{**inp.settings(settings, end), "timeline": False,
                                  "detailed": False}), reqs, profile=profile,
                     recording=steps)[0]
            for end in ("low", "high"))
    bands = {m: combine(res[m], {n: (lo[m], hi[m]) for n, (lo, hi) in ends.items()})
             for m in metrics if res.get(m) is not None}
    return res, inputs, bands, spans


def bands_doc(inputs: list[BandInput], bands: dict) -> dict:
    """A run result's `bands`: the inputs with their ranges and sources, each metric's band."""
    return {"inputs": [i.to_dict() for i in inputs],
            "metrics": {m: b.to_dict() for m, b in bands.items()}}


def format_bands(inputs: list[BandInput], bands: dict) -> str:
    """The bands as `stepgap simulate --band` prints them, after the run's summary."""
    lines = [f"{' Bands (each input at the ends of its range) ':-^72}"]
    for m, b in bands.items():
        lines.append(f"{m:<22}{b.value:>10.2f}   {b.low:.2f} .. {b.high:.2f}   "
                     f"{', '.join(b.dominant) or '-'}")
    lines.append("inputs:")
    for i in inputs:
        lines.append(f"  {i.name:<11}{i.low:.3g} .. {i.high:.3g} {i.unit} (nominal "
                     f"{i.nominal:.3g}): {i.what}; {i.source}")
    return "\n".join(lines)


def difference_band(a: dict, b: dict, metric: str = "mean_itl_ms") -> tuple[Band, list]:
    """The band of metric(run a) - metric(run b), each input end moving both runs together
    (what async saves over sync: a the sync run, b the async one), and the inputs."""
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import Recording, simulate

    steps = Recording(), Recording()   # each run's steps, for its CPU and device ends

    def value(sa, sb):
        return simulate(SimConfig(**sa), recording=steps[0])[0][metric] \
            - simulate(SimConfig(**sb), recording=steps[1])[0][metric]
    inputs = [i for i in band_inputs(a) if i.applies(a.get("k", 0))]
    return combine(value(a, b), {i.name: tuple(value(i.settings(a, end), i.settings(b, end))
                                               for end in ("low", "high"))
                                 for i in inputs}), inputs
