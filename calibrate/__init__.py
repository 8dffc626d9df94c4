"""calibrate: everything that uses both halves: measure a real engine, fit the simulator to it,
and judge the simulator's predictions.

- `harness`: one plan of engine runs (judged and calibration, interleaved) on any device;
- `samples`: timelines cut into device and CPU samples (stepgap's, vLLM's and a served loop);
- `fit`: a profile (device op fits, CPU terms, the machine's noise) from engine timelines;
- `measured`: the measured-folder format, written by the CPU and the GPU paths alike;
- `judge`: a measured folder re-simulated and held to its bounds and known misses;
- `report`: report.md and the figures of a judged folder;
- `pair`: the trained pair and its held-out and calibration traces;
- `vllm`, `vllm_fit`, `serve_fit`: vLLM's files read, the simulator fitted to vLLM runs and to
  served runs;
- commands (registered by `cli`): `profile`, `validate`, `validate-gpu` (`gpu`), `demo`,
  `ingest` (`vllm`), `calibrate` (`vllm_fit`), `calibrate-served` (`serve_fit`).
"""
