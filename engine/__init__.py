"""engine: the reference torch engine (docs/explanation/engine.md).

A Llama target and an EAGLE-3 head in plain torch, a paged KV cache, the shared vLLM V1 scheduler
(`common.scheduler`), a rejection sampler, and the step loop in the modes of
docs/explanation/design.md §1 (sync, async, zero-bubble), with the worker inline or in its own
process. It runs the same traces as the simulator and writes the same run results and timelines.
"""
