"""The machine's own speed noise, as the simulator replays it on the device ops."""

from __future__ import annotations

import math

import numpy as np


class Jitter:
    """The machine's own speed noise, as a factor on the device ops of each step.

    A shared machine does not run a step in the same time twice: other tenants share its caches
    and memory. Measured (calibrate/fit.py `fit_jitter`), the noise has three parts, and so
    does the factor: `level` (a whole run is fast or slow: the machine drifts over seconds and
    minutes), a `trace` of log factors in `bin_us` windows replayed from a seeded offset (bursts
    within a run, with their measured length and height), and an independent per-step part of
    log-std `sigma_step`. The trace and the per-step part are scaled to mean 1, so mean times
    are the fits' times `level`.
    """

    def __init__(self, trace: list[float], bin_us: float, sigma_step: float, level: float = 1.0,
                 seed: int = 0):
        self.rng = np.random.default_rng([seed, 3])
        f = np.exp(np.asarray(trace or [0.0], float))
        self.factors = (f / f.mean()).tolist()
        self.offset = int(self.rng.integers(len(self.factors)))
        self.bin_us, self.sigma_step, self.level = max(bin_us, 1e-9), sigma_step, level
        self.norm = level * math.exp(-sigma_step ** 2 / 2)
        # one factor whatever the time, and no draws: a run's --speed alone
        self.constant = len(self.factors) == 1 and not sigma_step

    def factor(self, t_us: float) -> float:
        """The factor of a step that starts at `t_us`."""
        i = (self.offset + int(t_us // self.bin_us)) % len(self.factors)
        e = self.rng.standard_normal() if self.sigma_step else 0.0
        return self.factors[i] * math.exp(self.sigma_step * e) * self.norm


def run_levels(log_factors: list[float], n: int, seed: int = 0) -> list[float]:
    """Speed levels for n runs: the measured run-level log factors' quantiles at (j + ½)/n,
    dealt out in a seeded order and scaled to mean 1, so that n runs hold the measured spread
    of machine speeds and their mean is the profile's (as common/acceptance.py stratifies the
    requests' acceptance)."""
    if not log_factors or n < 1:
        return [1.0] * max(n, 0)
    q = np.quantile(np.asarray(log_factors, float), (np.arange(n) + 0.5) / n)
    f = np.exp(q)
    f = f / f.mean()
    order = np.random.default_rng([seed, 4]).permutation(n)
    return [float(f[j]) for j in order]
