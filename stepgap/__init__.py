"""stepgap: where do the step gaps go?

The shared core of both halves. `sim/` (a SimPy model) and `engine/` (a real torch engine) import
from here and nowhere else for the things they must agree on:

- `formats`: workload traces, timeline spans, run results and the `vllm bench serve` metrics;
- `workloads`: built-in traces and the load generator (request rate, burstiness, max concurrency);
- `modelcfg`: model configurations (Hugging Face config.json, EAGLE-3 heads, named presets);
- `scheduler`: the vLLM V1 continuous-batching scheduler, with async placeholder accounting;
- `errors`: `UserError`, the one exception the CLI turns into a clean message.
"""

__version__ = "0.1.0"
