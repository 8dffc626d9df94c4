"""The commands of the layer that uses both halves, each registered by its own module: `demo`,
`profile` (profile_cli.py), `validate`, `validate-gpu` (validate_gpu.py), `ingest`
(calibrate/vllm.py), `calibrate` (vllm_fit.py; bench files alone: bench_fit.py) and
`calibrate-served` (serve_fit.py)."""

from __future__ import annotations

from stepgap.calibrate import (bench_fit, demo, profile_cli, serve_fit, validate, validate_gpu,
                               vllm, vllm_fit)


def register(sub) -> None:
    for module in (demo, profile_cli, validate, validate_gpu, vllm, vllm_fit, serve_fit):
        module.register(sub)
    bench_fit.extend(sub.choices["calibrate"])   # calibrate on a GPU run's bench files alone
    bench_fit.extend_advise(sub.choices["advise"])   # advise names the next run to make
