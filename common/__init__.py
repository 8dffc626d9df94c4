"""common: the shared core that both halves import, and nothing of the project below it.

- `formats`: workload traces, the timeline vocabulary (modes, lanes, ops) and spans, run results
  and the `vllm bench serve` metrics;
- `workloads`: built-in traces and the load generator (request rate, burstiness, concurrency);
- `modelcfg`: a model's configuration (`ModelConfig`) and what one GPU of it holds;
  `model_families` reads each family's config.json, `model_fields` checks single fields,
  `model_heads` the EAGLE heads, `model_presets` the named models and the loaders by name or
  path, `drafters` what drafts for each speculation method;
- `scheduler`: the vLLM V1 continuous-batching scheduler, with async placeholder accounting;
- `acceptance`: how many drafts the target accepts (rates, per-request spread, replay);
- `options`: the command-line vocabulary, spelled as `vllm serve` and `vllm bench serve` do;
- `timeline_plots`: step timelines as figures and Chrome-trace panels (any timeline);
- `compare`: one run result against another, repeated runs pooled (`stepgap compare` is
  stepgap/compare.py's);
- `fileio`: reading and atomic writing of files; `errors`: `UserError`.
"""
