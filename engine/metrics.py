"""`GET /metrics` of `stepgap serve`: Prometheus text, with vLLM's names where vLLM has them.

Names, labels and buckets are vLLM 0.32's (`vllm/v1/metrics/loggers.py`, `buckets.py`): every
engine series carries `engine="0"` and `model_name` (the served name); a counter shows as
`NAME_total` (and `NAME_created`), a histogram as `NAME_bucket{le=...}`, `_count`, `_sum`.

- speculative decoding (only with k > 0, as vLLM): `vllm:spec_decode_num_drafts`,
  `vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens`,
  `vllm:spec_decode_num_accepted_tokens_per_pos{position}`, counted by the engine core as
  vLLM's scheduler counts them (common/formats.py SpecStats), so that `vllm bench serve` reads
  the acceptance from their differences over its run;
- requests and tokens: `vllm:prompt_tokens`, `vllm:generation_tokens`,
  `vllm:request_success{finished_reason}` (length, stop, abort, error), `vllm:num_preemptions`;
  gauges
  `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`;
- latencies, taken in the front end: `vllm:time_to_first_token_seconds` (arrival to first
  chunk), `vllm:inter_token_latency_seconds` (one observation per chunk, i.e. per engine step,
  as vLLM's), `vllm:e2e_request_latency_seconds`, `vllm:request_time_per_output_token_seconds`,
  `vllm:request_prompt_tokens`, `vllm:request_generation_tokens`;
- stepgap's own: `stepgap:step_gap_seconds`, the device idle time before each step
  (docs/explanation/design.md §2), counted only between steps with no wait for work between them.
"""

from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

from stepgap.engine.core_messages import EngineStats, SpecCounts

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_GAP_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
                    5e-2, 0.1, 0.25, 1.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


def token_buckets(max_model_len: int) -> list[int]:
    """vLLM's 1-2-5 series up to max_model_len (buckets.py)."""
    out, m = [], 1
    while True:
        for b in (1, 2, 5):
            if b * m > max_model_len:
                return out
            out.append(b * m)
        m *= 10


class Metrics:
    def __init__(self, model_name: str, k: int, max_model_len: int, num_blocks: int):
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        self.num_blocks = num_blocks
        names = ["engine", "model_name"]
        values = ("0", model_name)

        def counter(name, doc, extra=()):
            c = Counter(name, doc, names + list(extra), registry=r)
            return c if extra else c.labels(*values)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(*values)

        def gauge(name, doc):
            return Gauge(name, doc, names, registry=r).labels(*values)

        self.spec = None
        if k:
            self.spec = (counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                         counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                         counter("vllm:spec_decode_num_accepted_tokens",
                                 "Number of accepted tokens."))
            per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", ["position"])
            self.spec_per_pos = [per_pos.labels(*values, str(i)) for i in range(k)]
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.")
        self.success = counter("vllm:request_success", "Count of successfully processed "
                               "requests.", ["finished_reason"])
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in "
                                      "terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of "
                                   "number of cached tokens.")
        self._last_prefix = (0, 0)
        self.running = gauge("vllm:num_requests_running", "Number of requests in model "
                             "execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent "
                              "usage.")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.",
                              ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS)
        tb = token_buckets(max_model_len)
        self.req_prompt = histogram("vllm:request_prompt_tokens",
                                    "Number of prefill tokens processed.", tb)
        self.req_generation = histogram("vllm:request_generation_tokens",
                                        "Number of generation tokens processed.", tb)
        self.step_gap = histogram("stepgap:step_gap_seconds",
                                  "Device idle time before each engine step "
                                  "(docs/explanation/design.md §2), "
                                  "between steps with no wait for work.", STEP_GAP_BUCKETS)
        self._last_spec = SpecCounts(accepted_per_pos=(0,) * k)
        self._last_preemptions = 0

    def on_step(self, stats: EngineStats, gap_us: float | None) -> None:
        """The engine's state after a step: gauges, and the counters' growth."""
        spec, preemptions = stats.spec, stats.preemptions
        prefix = (stats.prefix_cache_queries, stats.prefix_cache_hits)
        for c, new, old in zip((self.prefix_queries, self.prefix_hits), prefix,
                               self._last_prefix):
            if new > old:
                c.inc(new - old)
        self._last_prefix = prefix
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_usage.set(1.0 - stats.free_blocks / self.num_blocks)
        if preemptions > self._last_preemptions:
            self.preemptions.inc(preemptions - self._last_preemptions)
            self._last_preemptions = preemptions
        if self.spec is not None and spec.num_drafts > self._last_spec.num_drafts:
            for c, new, old in zip(self.spec, spec[:3], self._last_spec[:3]):
                c.inc(new - old)
            for c, new, old in zip(self.spec_per_pos, spec.accepted_per_pos,
                                   self._last_spec.accepted_per_pos):
                if new > old:
                    c.inc(new - old)
            self._last_spec = spec
        if gap_us is not None:
            self.step_gap.observe(gap_us / 1e6)

    def on_chunk(self, num_tokens: int, since_last_s: float, first: bool,
                 prompt_tokens: int) -> None:
        self.generation_tokens.inc(num_tokens)
        if first:
            self.ttft.observe(since_last_s)
            self.prompt_tokens.inc(prompt_tokens)
        else:
            self.itl.observe(since_last_s)

    def on_finish(self, reason: str, prompt_tokens: int, output_tokens: int, e2e_s: float,
                  decode_s: float) -> None:
        self.success.labels("0", self.model_name, reason).inc()
        if reason not in ("length", "stop"):   # abort, error: no latency to speak of
            return
        self.e2e.observe(e2e_s)
        self.req_prompt.observe(prompt_tokens)
        self.req_generation.observe(output_tokens)
        if output_tokens > 1:
            self.tpot.observe(decode_s / (output_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
