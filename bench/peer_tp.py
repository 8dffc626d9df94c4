"""What tensor parallelism over PCIe costs in a real vLLM run, read from the run itself.

    python bench/peer_tp.py          # the Qwen3-32B TP 2 run on two RTX PRO 6000s

The operator tables price every kernel of a step. What a TP 2 step takes beyond them is its
collectives (an all-reduce after the embedding and after every layer's attention and MLP, 2L + 1
in all, and the logits' all-gather) and whatever else tensor parallelism costs. Two stretches
of the run time its steps with no simulation at all:

- the pure-decode plateau: series ticks with no prompt tokens and max_num_seqs requests
  running. Every step is one token per running request, so a step takes running / generation
  throughput; the batch is rebuilt from requests.jsonl (each decoding request's context at the
  tick's middle, its tokens spread evenly between its first and last token).
- the ramp: the first seconds, while requests wait and fewer than max_num_seqs run. Every step
  is max_num_batched_tokens tokens, and ends some prompt's prefill (ShareGPT prompts are shorter
  than a step), so the run's distinct first-token stamps are its step ends; the step holds the
  requests then decoding, and prompt chunks for the rest (priced at no history).

Each step's time less its kernels (the tables, with the skew correction the bundle measured) is
set beside the collectives each of LLMServingSim's hardware.yaml measurements of the same GPU
pair prices for that step, with the all-reduce vLLM issues at each size. The first two steps of
the server (warm-up) are left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.calibrate.peers import load_peers, peer_config  # noqa: E402
from stepgap.common.peer_run import load_peer_requests, load_timeseries  # noqa: E402
from stepgap.sim.plan import resolve  # noqa: E402
from stepgap.sim.costs import Batch  # noqa: E402
from stepgap.sim.hardware import all_reduce_path  # noqa: E402
from stepgap.sim.hardware_file import load_collectives  # noqa: E402

FOLDER = ROOT / "traces" / "peers" / "llmservingsim"
RUN = "rtxpro6000-qwen3-32b-tp2"
LINKS = (("1b2cc02 (measured 2026-09-26)", "profiler/perf/RTXPRO6000/hardware.yaml"),
         ("e08dc38 (measured 2026-09-08)", "at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml"))
WARMUP_STEPS = 2
TICK = 1e-3   # stamps of one engine-core step differ by less than this (s)


def decoding_at(reqs: list[dict], t: float) -> list[float]:
    """The contexts of the requests decoding at engine time t (tokens)."""
    out = []
    for r in reqs:
        if r["first_token_ts"] <= t <= r["last_token_ts"]:
            span = max(r["last_token_ts"] - r["first_token_ts"], 1e-9)
            out.append(r["input_toks"] + 1 + (t - r["first_token_ts"]) / span
                       * (r["output_toks"] - 1))
    return out


def kernels_us(costs, prefill: int, contexts: list[float]) -> float:
    """The tables' step without its collectives: target forward, sampler, copy."""
    n, kv = prefill + len(contexts), int(sum(contexts))
    rows = len(contexts) + (1 if prefill else 0)
    b = Batch(n, rows, rows, rows, 0, kv, 0, num_decode=len(contexts), decode_kv=kv,
              decode_kv_min=int(min(contexts, default=0)),
              decode_kv_max=int(max(contexts, default=0)),
              prefills=[(prefill, 0)] if prefill else [])
    return costs.target_forward(b) - costs._collectives(n, rows, costs.t) \
        + costs.rejection_sample(b) + costs.d2h(b)


def plateau_steps(reqs, series, seqs: int) -> list[tuple[float, list[float]]]:
    t0 = min(r["queued_ts"] for r in reqs)
    out = []
    for i, t in enumerate(series["t"]):
        if series["prompt_throughput"][i] == 0 and series["running"][i] == seqs \
                and series["gen_throughput"][i] > 0:
            out.append((seqs / series["gen_throughput"][i] * 1e6,
                        decoding_at(reqs, t0 + t - 0.5)))
    return out


def ramp_steps(reqs, seqs: int) -> list[tuple[float, list[float]]]:
    ends = sorted({r["first_token_ts"] for r in reqs})
    out = []
    # The step between ends a and b was scheduled one step before (async scheduling), at p:
    # it took the whole token budget where requests were waiting then.
    for p, a, b in zip(ends[WARMUP_STEPS - 2:], ends[WARMUP_STEPS - 1:], ends[WARMUP_STEPS:]):
        waiting = sum(1 for r in reqs if r["queued_ts"] <= p + TICK < r["scheduled_ts"])
        running = decoding_at(reqs, a)
        if len(running) >= seqs:
            break
        if waiting:
            out.append(((b - a) * 1e6, running))
    med = float(np.median([d for d, _ in out]))
    return [(d, c) for d, c in out if d < 1.6 * med]   # two steps with no first token between


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=FOLDER)
    args = ap.parse_args(argv)
    _, runs = load_peers(args.folder)
    run = next(r for r in runs if r.name == RUN)
    cfg, _ = peer_config(run)
    costs = resolve(cfg).device_costs
    layers, hidden, tp = costs.t.num_layers, costs.t.hidden_size, cfg.tensor_parallel_size
    vocab = costs.t.vocab_size
    reqs = load_peer_requests(run.requests)
    series = load_timeseries(run.requests.with_name("timeseries.csv"))
    links = [(label, load_collectives(args.folder / rel)) for label, rel in LINKS]
    regimes = (("decode plateau", plateau_steps(reqs, series, cfg.max_num_seqs), 0),
               ("ramp", ramp_steps(reqs, cfg.max_num_seqs), 1))
    print(f"# What TP {tp} over PCIe costs in {run.name}, from the run's own times\n")
    print("| stretch | steps | tokens a step | all-reduce (MB) | vLLM's all-reduce | step, "
          "measured (ms) | its kernels, tables (ms) | left (ms) | left per all-reduce (us) | "
          + " | ".join(f"hardware.yaml {label}: collectives (ms), per all-reduce (us)"
                       for label, _ in links) + " |")
    print("|---" * (9 + len(links)) + "|")
    for name, steps, prefill in regimes:
        left, tokens = [], []
        for dur, contexts in steps:
            chunk = cfg.max_num_batched_tokens - len(contexts) if prefill else 0
            tokens.append(chunk + len(contexts))
            left.append((dur, kernels_us(costs, chunk, contexts), len(contexts)))
        n = int(np.median(tokens))
        rows = int(np.median([r for *_, r in left])) + prefill
        nbytes = 2 * n * hidden
        meas = float(np.median([d for d, _, _ in left]))
        kern = float(np.median([k for _, k, _ in left]))
        rest = float(np.median([d - k for d, k, _ in left]))
        path = all_reduce_path(nbytes, tp, False, True)
        cells = []
        for _, link in links:
            ar = link.all_reduce_us(nbytes, tp)
            coll = (2 * layers + 1) * ar + link.all_gather_us(2 * rows * vocab, tp)
            cells.append(f"{coll / 1e3:.1f}, {ar:.0f}")
        per_ar = (rest - links[0][1].all_gather_us(2 * rows * vocab, tp)) / (2 * layers + 1)
        print(f"| {name} | {len(steps)} | {n} | {nbytes / 1e6:.2f} | {path} | {meas / 1e3:.1f} | "
              f"{kern / 1e3:.1f} | {rest / 1e3:.1f} | {per_ar:.0f} | " + " | ".join(cells) + " |")
    print("\n(left: the step less its kernels; per all-reduce: that, less the logits' "
          f"all-gather as 1b2cc02 measured it, over the {2 * layers + 1} all-reduces; medians "
          "over the stretch's steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
