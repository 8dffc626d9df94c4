"""Clocks for the timeline: host spans from one monotonic clock, device spans from CUDA events.

`time.perf_counter_ns` is CLOCK_MONOTONIC on Linux, so spans taken in the engine process and in a
worker process share one time base. Spans hold microseconds on that clock; the engine core makes
them relative to the run's start when the run ends.

On a GPU a device op is bracketed by two CUDA events on its stream; after they complete, their
times are mapped onto the host clock through an anchor event recorded on an idle device at a
known host time. On the CPU the device is the worker itself, so a device op is timed on the
host clock around its (synchronous) compute.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from stepgap.common.formats import Span


def now_us(t0_ns: int = 0) -> float:
    return (time.perf_counter_ns() - t0_ns) / 1000.0


class HostSpans:
    """Collects host spans of one lane."""

    def __init__(self, lane: str, t0_ns: int = 0):
        self.lane, self.t0_ns = lane, t0_ns
        self.spans: list[Span] = []

    @contextmanager
    def span(self, op: str, step: int, **args):
        """Time the block as one span. It yields the span's args: the block may add to them
        (what an op worked on is often known only inside it)."""
        start = now_us(self.t0_ns)
        try:
            yield args
        finally:
            self.spans.append(Span(self.lane, op, step, start, now_us(self.t0_ns), args or None))

    def take(self) -> list[Span]:
        out, self.spans = self.spans, []
        return out


class DeviceTimer:
    """Times device ops: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device, t0_ns: int = 0):
        self.cuda = device.type == "cuda"
        self.t0_ns = t0_ns
        self._free: list = []
        if self.cuda:
            torch.cuda.synchronize(device)
            self.anchor = torch.cuda.Event(enable_timing=True)
            self.anchor.record()
            self.anchor_us = now_us(t0_ns)
            torch.cuda.synchronize(device)

    def _event(self):
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    @contextmanager
    def op(self, records: list, name: str, step: int, stream=None, **args):
        """Time the ops enqueued (GPU) or run (CPU) in the block; append a record to `records`."""
        if not self.cuda:
            start = now_us(self.t0_ns)
            yield
            records.append((name, step, args, start, now_us(self.t0_ns)))
            return
        stream = stream or torch.cuda.current_stream()
        a, b = self._event(), self._event()
        a.record(stream)
        yield
        b.record(stream)
        records.append((name, step, args, a, b))

    def spans(self, records: list) -> list[Span]:
        """Resolve records into device spans (on a GPU, after their events have completed)."""
        out = []
        for name, step, args, a, b in records:
            if self.cuda:
                start = self.anchor_us + self.anchor.elapsed_time(a) * 1000.0
                end = self.anchor_us + self.anchor.elapsed_time(b) * 1000.0
                self._free += (a, b)
            else:
                start, end = a, b
            out.append(Span("device", name, step, start, end, args or None))
        return out
