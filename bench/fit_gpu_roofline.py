"""The roofline's efficiencies fitted per GPU on measured operator tables (docs/reference/gpus.md).

    python bench/fit_gpu_roofline.py            # fit A100 and H100, print the fit and residuals
    python bench/fit_gpu_roofline.py --json F   # ... and write them as JSON

Each GEMM the tables timed is a point (its shape per rank: m tokens, inner k, outer n; its
flops 2mkn and bytes 2kn + 2m(k + n)), priced by the roofline of sim/roofline.py,
t = max(flops / (peak x flop_eff), bytes / (bandwidth x bw_eff)) + kernel_us, on the catalog's
datasheet peaks. The three numbers are fitted separately, each where it decides the time:

1. memory-bound: the GEMMs of at most MEMORY_M tokens (a decode's weight streaming):
   t = bytes / (bandwidth x bw_eff) + kernel_us, least squares on the relative error, gives
   bw_eff and kernel_us;
2. compute-bound: the GEMMs of at least COMPUTE_M tokens whose flops take more than three times
   their bytes at the fitted rates: with kernel_us fixed, flop_eff by least squares on the
   relative error.

The fit interpolates across model shapes in the only way the tables allow: one set of numbers
for every shape measured (hidden 2560 to 8192, TP 1 to 8), the fixed kernel_us carrying what
small GEMMs lose. Its residuals are then taken on every kernel the tables timed as vLLM runs it
(GEMMs, and the norms, rotary and SiLU that Vidur timed with vLLM's kernels), and on each
layer's sum at each measured token count (Vidur's tables, which time a whole layer but its
attention). The layer sums' spread in each regime of a step (REGIMES: decode, the knee between
memory- and compute-bound, prefill; their 5th to 95th percentile, the widest ends over the
regimes) is the GPU's `device` band input (sim/bands.py), as a factor on the roofline's
device time. No attention kernel is fitted: none of the tables timed the one vLLM runs.

The numbers printed are what sim/hardware.py's catalog holds for the GPU (its `source` names
this script); tests/test_gpus.py fits again from the committed tables and checks them.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEERS = ROOT / "traces" / "peers"
BUNDLES = {  # GPU -> the bundles fitted on (variant folders under traces/peers/)
    "a100": sorted((PEERS / "vidur" / "profiler" / "perf" / "A100").glob("*/*/fp16")),
    "h100": sorted((PEERS / "vidur" / "profiler" / "perf" / "H100").glob("*/*/fp16"))
    + sorted((PEERS / "llmservingsim" / "at-9e3f0ec" / "profiler" / "perf" / "H100")
             .glob("*/*/bf16")),
}
MEMORY_M = 8
COMPUTE_M = 1024
GEMMS = ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "gate_proj",
         "up_proj", "down_proj")
STREAMING = ("layernorm", "rotary_emb", "act_fn")   # Vidur's, vLLM's own kernels
# a step's token count: decode (a batch of requests), the knee between the two bounds, prefill
REGIMES = {"decode": (1, 64), "knee": (65, 1024), "prefill": (1025, 10 ** 9)}
LAYER = ("layernorm", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn",
         "down_proj")


@dataclass(frozen=True)
class Shot:
    bundle: str
    tp: int
    name: str
    m: int
    flops: float
    nbytes: float
    us: float


@dataclass
class Fit:
    gpu: str
    bw_eff: float
    flop_eff: float
    kernel_us: float
    points_memory: int
    points_compute: int
    kernels: int
    kernel_error: tuple      # 5th, 50th, 95th percentile of (fitted - measured) / measured
    layers: int
    layer_error: dict        # the same over one layer's kernels summed, by regime (REGIMES)
    device_low: float        # the device band: true time = roofline x [low, high]
    device_high: float


def read_rows(path: Path, key: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            out.setdefault(r["layer"], {})[int(r[key])] = float(r["time_us"])
    return out


def shapes(meta: dict, tp: int) -> dict:
    s = meta["model_shapes"]
    h, heads, kv = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"]
    hd = h // heads
    q, kvw = heads * hd // tp, max(1, kv // tp) * hd
    inter = s["intermediate_size"] // tp
    vocab = -(-(-(-s["vocab_size"] // 64) * 64) // tp)
    return {"h": h, "q": q, "kv": kvw, "inter": inter, "vocab": vocab,
            "heads": heads // tp, "kvh": max(1, kv // tp), "hd": hd}


def gemm_shape(name: str, s: dict) -> tuple[int, int] | None:
    """(inner, outer) of a GEMM the tables timed (LLMServingSim's transformers modules are
    named hf_*: each its own GEMM, as timed), or None for another kernel."""
    h, q, kv, i = s["h"], s["q"], s["kv"], s["inter"]
    name = name.removeprefix("hf_")
    return {"qkv_proj": (h, q + 2 * kv), "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv),
            "o_proj": (q, h), "gate_up_proj": (h, 2 * i), "gate_proj": (h, i),
            "up_proj": (h, i), "down_proj": (i, h), "lm_head": (h, s["vocab"])}.get(name)


def stream_bytes(name: str, m: int, s: dict) -> float:
    h = s["h"]
    return 2 * m * {"layernorm": 2 * h, "rotary_emb": 2 * (s["q"] + s["kv"]),
                    "act_fn": 3 * s["inter"]}[name]


def shots(gpu: str) -> tuple[list[Shot], list[tuple]]:
    """(the GEMMs and the streaming kernels vLLM runs as timed, each layer's sum)."""
    kernels, layers = [], []
    for root in BUNDLES[gpu]:
        meta = yaml.safe_load((root / "meta.yaml").read_text())
        vidur = "vidur" in root.parts
        for tpdir in sorted(root.glob("tp*")):
            tp = int(tpdir.name[2:])
            s = shapes(meta, tp)
            dense = read_rows(tpdir / "dense.csv", "tokens")
            seq = read_rows(tpdir / "per_sequence.csv", "sequences") \
                if (tpdir / "per_sequence.csv").is_file() else {}
            label = f"{root.relative_to(PEERS)}/tp{tp}"
            for name, by_m in {**dense, **seq}.items():
                ks = gemm_shape(name, s)
                for m, t in by_m.items():
                    if ks is not None:
                        k, n = ks
                        kernels.append(Shot(label, tp, name, m, 2.0 * m * k * n,
                                            2.0 * k * n + 2.0 * m * (k + n), t))
                    elif vidur and name in STREAMING:
                        kernels.append(Shot(label, tp, name, m, 0.0, stream_bytes(name, m, s), t))
            if vidur:
                for m in sorted(set.intersection(*(set(dense[n]) for n in set(LAYER)))):
                    layers.append((label, tp, m, s, sum(dense[n][m] for n in LAYER)))
    return kernels, layers


def roofline(shot: Shot, peak: float, bw: float, fe: float, be: float, kus: float) -> float:
    return max(shot.flops / (peak * fe), shot.nbytes / (bw * be)) + kus


def pct(errors) -> tuple:
    return tuple(round(float(x), 4) for x in np.percentile(errors, [5, 50, 95]))


def fit(gpu: str) -> Fit:
    from stepgap.sim.hardware import CATALOG
    hw = CATALOG[gpu]
    peak, bw = hw.flops / 1e6, hw.mem_bw / 1e6   # per microsecond
    kernels, layers = shots(gpu)
    gemms = [k for k in kernels if k.flops]
    mem = [k for k in gemms if k.m <= MEMORY_M]
    # 1. t/T = a (bytes/T) + c (1/T), least squares: a = 1/(bw be), c = kernel_us
    t = np.array([k.us for k in mem])
    a_col = np.array([k.nbytes for k in mem]) / t
    c_col = 1.0 / t
    (a, c), *_ = np.linalg.lstsq(np.stack([a_col, c_col], 1), np.ones_like(t), rcond=None)
    be, kus = 1.0 / (a * bw), float(c)
    # 2. compute-bound: (flops/(peak fe) + kus)/t = 1, x = 1/fe
    comp = [k for k in gemms if k.m >= COMPUTE_M
            and k.flops / peak > 3 * k.nbytes / (bw * be)]
    t = np.array([k.us for k in comp])
    f = np.array([k.flops / peak for k in comp]) / t
    x = float(np.sum(f * (1 - kus / t)) / np.sum(f * f))
    fe = 1.0 / x
    err = [roofline(k, peak, bw, fe, be, kus) / k.us - 1 for k in kernels]
    lay = []
    for label, tp, m, s, total in layers:
        pred = 0.0
        for n in LAYER:
            ks = gemm_shape(n, s)
            if ks is not None:
                k, nn = ks
                shot = Shot(label, tp, n, m, 2.0 * m * k * nn, 2.0 * k * nn + 2.0 * m * (k + nn), 0)
            else:
                shot = Shot(label, tp, n, m, 0.0, stream_bytes(n, m, s), 0)
            pred += roofline(shot, peak, bw, fe, be, kus)
        lay.append((m, pred / total - 1))
    regimes = {name: pct([e for m, e in lay if lo <= m <= hi])
               for name, (lo, hi) in REGIMES.items()}
    lo = min(r[0] for r in regimes.values())
    hi = max(r[2] for r in regimes.values())
    # the roofline's time x 1/(1 + error) is the measured one
    return Fit(gpu, round(be, 3), round(fe, 3), round(kus, 2), len(mem), len(comp), len(kernels),
               pct(err), len(lay), regimes, round(1 / (1 + hi), 3), round(1 / (1 + lo), 3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the fits to this JSON file")
    args = ap.parse_args(argv)
    fits = [fit(gpu) for gpu in BUNDLES]
    for f in fits:
        print(f"{f.gpu}: bw_eff {f.bw_eff}, flop_eff {f.flop_eff}, kernel_us {f.kernel_us} "
              f"({f.points_memory} memory-bound GEMMs, {f.points_compute} compute-bound)")
        print(f"  kernels ({f.kernels}): error p5/p50/p95 {f.kernel_error}")
        for name, e in f.layer_error.items():
            print(f"  layers, {name} ({REGIMES[name][0]}-{REGIMES[name][1]} tokens): error "
                  f"p5/p50/p95 {e}")
        print(f"  -> device band: the measured time is the roofline's x{f.device_low} .. "
              f"x{f.device_high} ({f.layers} layer sums)")
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in fits], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
