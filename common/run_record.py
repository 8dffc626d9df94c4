"""One run's result, read by attribute: `RunRecord`, the one schema of every result file.

The simulator, the engine (`stepgap run`), `stepgap serve`, `vllm bench serve --save-result`
(as vLLM writes it, or as `stepgap ingest` and a measured folder keep it) and a peer's vLLM run
(its requests.jsonl) all give a run result of docs/explanation/design.md §4: the keys of `vllm bench
serve`, `step_gaps`, `spec_decode` and `config`. They differ in what they hold and where: the
prefix-cache counters sit under `config` in the engine's results and under `config.resolved`
in the simulator's, a vLLM file has no `config` and no step gaps, a run without `--detailed`
no per-request lists. A `RunRecord` reads every layout once, so that no reader looks in two
places:

    rec = RunRecord.load("run.json")       # or RunRecord.of(result) for one in memory
    rec.metrics["mean_tpot_ms"], rec.step_gaps.get("median_us"), rec.prefix_cache
    rec.config["mode"], rec.resolved.get("notes"), rec.requests.ttfts
    rec.save("copy.json")                  # the same bytes as the file it was made from

The record keeps the document it was made from (`doc`) and writes it back unchanged
(`to_json`, `save`): result files keep their bytes, whatever the record reads out of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

from stepgap.common.errors import UserError, shown, where
from stepgap.common.fileio import check_file, read_json_object
from stepgap.common.formats import RequestTiming, check_result, is_metric, save_result
from stepgap.common.limits import is_int
from stepgap.common.vllm_bench import check_details


@dataclass(frozen=True, slots=True)
class Requests:
    """A detailed result's per-request lists, as `vllm bench serve --save-detailed` writes them:
    times in seconds, one entry per request (stepgap adds `chunk_tokens`, the tokens of each
    streamed chunk; the engine `accepted`, the drafts accepted at each step, and
    `output_token_ids`)."""

    ids: list[str] | None
    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    chunk_tokens: list[list[int]] | None = None
    accepted: list[list[int]] | None = None   # the engine's accepted drafts of each step
    output_token_ids: list[list[int]] | None = None   # the engine's tokens

    def timings(self, tag: str = "") -> list[RequestTiming]:
        """The client's view of each request, rebuilt: its chunks at the times they came
        (from a send at 0), with their token counts where known (else the output length
        spread over the chunks)."""
        ids = self.ids or [str(i) for i in range(len(self.ttfts))]
        out = []
        for n, (rid, ttft, itls, plen) in enumerate(zip(ids, self.ttfts, self.itls,
                                                        self.input_lens)):
            t = RequestTiming(f"{rid}{tag}", plen, 0.0)
            times = np.cumsum([ttft, *itls]).tolist()
            tokens = self.chunk_tokens[n] if self.chunk_tokens else [1] * len(times)
            if not self.chunk_tokens:
                tokens[-1] += self.output_lens[n] - len(times)
            for tm, k in zip(times, tokens):
                t.add_chunk(tm, k)
            out.append(t)
        return out


DETAIL_KEYS = ("ttfts", "itls", "input_lens")


def _requests(doc: dict) -> Requests | None:
    if not all(k in doc for k in DETAIL_KEYS):
        return None
    output_lens = doc.get("output_lens")
    return Requests(doc.get("request_ids"), doc["input_lens"],
                    output_lens if output_lens is not None else [], doc["ttfts"], doc["itls"],
                    doc.get("chunk_tokens"), doc.get("accepted"), doc.get("output_token_ids"))


@dataclass(frozen=True)
class RunRecord:
    """One run's result. Its parts:

    - `backend`: who ran it: "stepgap-sim", "stepgap-engine", "stepgap-serve", "vllm-<backend>"
      (a `vllm bench serve` file as stepgap ingests it), vLLM's own backend name (a file as vLLM
      wrote it: "vllm", "openai", ...) or "vllm" (a peer's run);
    - `source`: the file it was read from (None for a result made in this process);
    - `metrics`: the numbers of `vllm bench serve` (`completed`, `duration`, `mean_tpot_ms`,
      `p99_itl_ms`, throughputs, ...), by vLLM's names;
    - `step_gaps`: the device's idle time before each step (`count`, `mean_us`, `median_us`,
      `p90_us`, `p99_us`, `max_us`; every gap in `values_us` with `--detailed`); `{"count": 0}`
      where the run recorded none (vLLM's files);
    - `spec_decode`: the acceptance counters (`k`, `num_drafts`, `acceptance_length`,
      `acceptance_rate_per_pos`, ...), or None;
    - `config`: the run's settings as the run wrote them, without the simulator's plan; {}
      where the file has none;
    - `resolved`: the simulator's plan (`config.resolved`: the hardware, the notes, the
      costs, the steps); {} for a measured run;
    - `prefix_cache`: vLLM's prefix-cache counters (`queries`, `hits`, in tokens), wherever the
      layout put them, or None with prefix caching off;
    - `num_preemptions`: the engine's preemptions (simulated or measured), or None where the
      file does not say;
    - `requests`: the per-request lists (`Requests`) of a detailed result, or None;
    - `doc`: the document itself, written back unchanged by `to_json` and `save`.

    The record is frozen and its sections are read-only views of the document (the lists in them
    are the document's own: a reader that wants to change one copies it).
    """

    backend: str
    source: str | None
    metrics: Mapping[str, float]
    step_gaps: Mapping
    spec_decode: Mapping | None
    config: Mapping
    resolved: Mapping
    prefix_cache: Mapping | None
    num_preemptions: int | None
    requests: Requests | None
    doc: dict = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: dict, source=None) -> RunRecord:
        """The record of a run result already checked (formats.check_result) or just made."""
        config = dict(doc.get("config") or {})
        resolved = config.pop("resolved", None) or {}
        cache = config.get("prefix_cache", resolved.get("prefix_cache"))
        spec = doc.get("spec_decode")
        preempted = config.get("num_preemptions", resolved.get("num_preemptions"))
        return cls(backend=str(doc.get("backend", "")),
                   source=None if source is None else str(source),
                   metrics=MappingProxyType({k: v for k, v in doc.items() if is_metric(k)}),
                   step_gaps=MappingProxyType(doc.get("step_gaps") or {"count": 0}),
                   spec_decode=MappingProxyType(spec) if spec else None,
                   config=MappingProxyType(config), resolved=MappingProxyType(resolved),
                   prefix_cache=None if cache is None else MappingProxyType(cache),
                   num_preemptions=preempted, requests=_requests(doc),
                   doc=doc)

    @classmethod
    def load(cls, path) -> RunRecord:
        """A result file of any layout: stepgap's (`.json`, `.json.gz`: the simulator's, the
        engine's, a served run's, an ingested vLLM run's), one `vllm bench serve --save-result`
        wrote, or a peer's vLLM run (its requests.jsonl, common/peer_run.py)."""
        from stepgap.common.peer_run import is_peer_requests, peer_result
        path = Path(path)
        if is_peer_requests(path):
            return cls.of(peer_result(path), path)
        check_file(path, "result file")
        doc = check_result(read_json_object(path, "a run result"), path)
        if any(key in doc for key in (*DETAIL_KEYS, "output_lens")):   # one entry a prompt
            first = next(doc[k] for k in (*DETAIL_KEYS, "output_lens") if k in doc)
            n = doc.get("num_prompts", len(first) if isinstance(first, list) else None)
            if not (is_int(n) and n >= 0):
                raise UserError(f"{where(path, field='num_prompts')}: expected a count (the "
                                f"per-request lists hold one entry a prompt), got {shown(n)}")
            check_details(doc, path, n)
        return cls.of(doc, path)

    def to_json(self) -> dict:
        """The document, as `save` writes it (formats.save_result: keys in their order)."""
        return self.doc

    def save(self, path) -> None:
        save_result(path, self.doc)

    # -- what readers ask of a record ----------------------------------------------------------

    @property
    def num_prompts(self) -> int | None:
        return self.doc.get("num_prompts")

    @property
    def request_rate(self):
        """The load as `vllm bench serve` gave it: requests per second, "inf", or "trace"."""
        return self.doc.get("request_rate")

    @property
    def burstiness(self) -> float | None:
        return self.doc.get("burstiness")

    @property
    def max_concurrency(self) -> int | None:
        return self.doc.get("max_concurrency")

    @property
    def mode(self) -> str | None:
        """The scheduling mode the run used (the simulator's resolved one where it differs)."""
        return self.resolved.get("mode", self.config.get("mode"))

    @property
    def k(self) -> int:
        return self.config.get("k", 0)

    @property
    def notes(self) -> list[str]:
        """The simulator's notes on what its answer rests on ([] for a measured run)."""
        return list(self.resolved.get("notes") or [])

    def timings(self, tag: str = "") -> list[RequestTiming]:
        """Each request as the client saw it (`Requests.timings`); UserError without the
        per-request lists."""
        if self.requests is None:
            missing = next(k for k in DETAIL_KEYS if k not in self.doc)
            raise UserError(f"result has no {missing!r}: pooling needs detailed results "
                            "(--detailed)")
        return self.requests.timings(tag)
