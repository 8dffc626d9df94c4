"""The hardware catalog: what a device can do, for the roofline in `sim/roofline.py`.

Peaks are datasheet numbers (dense bf16 and fp8 tensor FLOP/s, memory bandwidth;
docs/explanation/design.md §6). The efficiencies are the fractions of those peaks that real kernels
reach, and `kernel_us` is the fixed cost each kernel adds (the gap between graph-launched kernels
plus a memory-bound kernel's ramp and drain). Each GPU names the interconnect between the GPUs of
its node, which prices tensor parallelism's collectives (`Interconnect`).
docs/explanation/device-costs.md gives the source of every number and how sensitive the predictions
are to each.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from stepgap.common.errors import UserError

GB = 1e9
GIB = 2 ** 30


CUSTOM_AR_MAX_BYTES = 8 * 2 ** 20   # vLLM's CustomAllreduce max_size


def all_reduce_path(nbytes: float, n: int, fully_connected: bool, p2p: bool) -> str:
    """Which all-reduce vLLM issues for `nbytes` over n GPUs (its custom_all_reduce.py and
    csrc/custom_all_reduce.cuh): its own kernel where the GPUs have peer access and are 2, or 4,
    6 or 8 fully connected (NVLink), for inputs under 8 MiB: one-shot (every GPU reads its
    peers' whole buffers) on 2 GPUs, and on NVLink under 512 KiB up to 4 GPUs or 256 KiB up to
    8; two-shot (reduce-scatter, then all-gather) above those; NCCL otherwise.
    (Symmetric-memory and FlashInfer all-reduces, which newer vLLM tries on Hopper and
    Blackwell NVLink first, are not modelled.)"""
    if n in (2, 4, 6, 8) and p2p and (n == 2 or fully_connected) \
            and nbytes < CUSTOM_AR_MAX_BYTES:
        if n == 2 or (n <= 4 and nbytes < 512 * 1024) or nbytes < 256 * 1024:
            return "one_shot"
        return "two_shot"
    return "nccl"


@dataclass(frozen=True, slots=True)
class Interconnect:
    """GPU-to-GPU links of one node, as tensor parallelism's collectives see them.

    An all-reduce of B bytes over N GPUs is the one vLLM issues (`all_reduce_path`): its
    one-shot kernel, every GPU reading the N-1 others' buffers, latency + (N-1)·B / bw; its
    two-shot kernel (reduce-scatter, then all-gather), 2·latency + 2·(N-1)/N·B / bw; or NCCL's
    ring, latency + 2·(N-1)/N·B / bw. An all-gather of B bytes in all, and a reduce-scatter of
    B bytes on each GPU, cost latency + (N-1)/N·B / bw. `latency_us` is a small message's time in a CUDA graph, and
    dominates at decode (16 KiB per token of a 70B model); `bw` is what one GPU moves in one
    direction, after protocol overhead. `fully_connected`: NVLink between every pair (vLLM's
    custom all-reduce at 4 to 8 GPUs); `p2p`: the GPUs can read each other's memory (over PCIe:
    vLLM's custom all-reduce at 2 GPUs; GeForce cards have none).
    """

    name: str
    bw: float            # bytes/s one GPU sends (or receives) to its peers, effective
    latency_us: float    # one small collective, in a CUDA graph
    fully_connected: bool
    source: str
    p2p: bool = True

    def __post_init__(self):
        if not (self.bw > 0 and self.latency_us >= 0):
            raise UserError(f"interconnect {self.name!r}: bw must be > 0 and latency >= 0")

    def all_reduce_us(self, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        bw = self.bw / 1e6   # bytes per microsecond
        path = all_reduce_path(nbytes, n, self.fully_connected, self.p2p)
        if path == "one_shot":
            return self.latency_us + (n - 1) * nbytes / bw
        ring = self.latency_us + 2 * (n - 1) / n * nbytes / bw
        return ring + self.latency_us if path == "two_shot" else ring

    def all_gather_us(self, nbytes: float, n: int) -> float:
        return 0.0 if n <= 1 else self.latency_us + (n - 1) / n * nbytes / (self.bw / 1e6)

    def reduce_scatter_us(self, nbytes: float, n: int) -> float:
        """A ring reduce-scatter of B bytes on each GPU moves what a ring all-gather of B bytes
        in all moves."""
        return self.all_gather_us(nbytes, n)


def axis_interp(xs: list[float], f, x: float) -> float:
    """f along one measured axis at x (a collective's message size, an attention table's
    axis): linear between the measured points xs (sorted, distinct), the first point's value
    below them, and linear from the top two above them."""
    if len(xs) == 1 or x <= xs[0]:
        return f(xs[0])
    j = bisect.bisect_right(xs, x)
    if j >= len(xs):
        j = len(xs) - 1
    x0, x1 = xs[j - 1], xs[j]
    y0, y1 = f(x0), f(x1)
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class MeasuredLink:
    """Collectives measured on a node's GPUs (LLMServingSim's hardware.yaml, read by
    sim/hardware_file.py): per collective, microseconds by message size over `npus` GPUs,
    linear between sizes, the smallest size's time below them and the top two sizes' slope
    above. The all-reduce vLLM issues (`all_reduce_path`) is priced from what was measured:
    NCCL's all_reduce as measured; vLLM's one-shot kernel, where every GPU reads its peers'
    whole buffers, as the all_gather of the same bytes per GPU, which moves exactly that; its
    two-shot kernel as a reduce_scatter and an all_gather of a 1/N share each. Samples are in
    bytes of one GPU's all-reduce input, all-gather input and reduce-scatter output, as
    LLMServingSim's profiler records them."""

    name: str
    npus: int
    sizes: dict   # collective -> (bytes, ...), ascending
    times: dict   # collective -> (us, ...)
    fully_connected: bool
    p2p: bool
    source: str
    # what prices a collective that was not measured (NCCL's all_reduce alone, as Vidur
    # measured it: vLLM's own all-reduce kernel and the all-gather from the GPU's interconnect
    # model); None: every collective used must have been measured
    model: Interconnect | None = None
    path: str = ""   # the file it was read from

    def at(self, collective: str, nbytes: float) -> float:
        xs, ys = self.sizes[collective], self.times[collective]
        return axis_interp(xs, lambda x: ys[xs.index(x)], nbytes)

    def all_reduce_us(self, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        path = all_reduce_path(nbytes, n, self.fully_connected, self.p2p)
        if path != "nccl" and "all_gather" not in self.sizes and self.model is not None:
            return self.model.all_reduce_us(nbytes, n)   # vLLM's own kernel, not measured
        if path == "one_shot":
            return self.at("all_gather", nbytes)
        if path == "two_shot":
            return self.at("reduce_scatter", nbytes / n) + self.at("all_gather", nbytes / n)
        return self.at("all_reduce", nbytes)

    def all_gather_us(self, nbytes: float, n: int) -> float:
        if n > 1 and "all_gather" not in self.sizes and self.model is not None:
            return self.model.all_gather_us(nbytes, n)
        return 0.0 if n <= 1 else self.at("all_gather", nbytes / n)

    def reduce_scatter_us(self, nbytes: float, n: int) -> float:
        """B bytes on each GPU reduced, 1/n of them to each: the measured reduce_scatter of
        that output, else (none measured) the all_gather that moves the same bytes."""
        if n <= 1:
            return 0.0
        if "reduce_scatter" not in self.sizes and "all_gather" not in self.sizes \
                and self.model is not None:
            return self.model.reduce_scatter_us(nbytes, n)
        return self.at("reduce_scatter" if "reduce_scatter" in self.sizes else "all_gather",
                       nbytes / n)


# docs/explanation/device-costs.md has the measurements behind these numbers.
NVLINK4 = Interconnect(
    "nvlink4", bw=370 * GB, latency_us=6.0, fully_connected=True,
    source="NVLink 4 (H100/H200 SXM): 450 GB/s per direction, NCCL reaches ~370 GB/s "
           "(nccl-tests #212); vLLM's custom all-reduce on H100 fits latency 6 us (vLLM "
           "#24111, #24532)")
INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in (
    Interconnect("nvlink3", bw=246 * GB, latency_us=6.0, fully_connected=True,
                 source="NVLink 3 (A100 SXM): 300 GB/s per direction at NVLink 4's 82 % "
                        "efficiency (one 8-GPU node measured ~200 GB/s busbw, nccl-tests#149); "
                        "latency as NVLink 4"),
    NVLINK4,
    Interconnect("nvlink5", bw=740 * GB, latency_us=6.0, fully_connected=True,
                 source="NVLink 5 (B200): 900 GB/s per direction (1.8 TB/s bidirectional) at "
                        "NVLink 4's 82 % efficiency; vLLM ca_1stage 7 us at 16 KiB on "
                        "B300 (#37756)"),
    Interconnect("nvlink-bridge", bw=246 * GB, latency_us=6.0, fully_connected=False,
                 source="NVLink bridge of an H100 NVL pair: 600 GB/s (300 per direction) at "
                        "NVLink 4's 82 %; past the pair, NCCL's ring is priced at the same "
                        "rate (optimistic: it crosses PCIe)"),
    Interconnect("xgmi", bw=367 * GB, latency_us=6.0, fully_connected=True,
                 source="AMD Infinity Fabric (MI300X platform): 7 links of 64 GB/s per "
                        "direction to the other 7 GPUs, 448 GB/s, at NVLink 4's 82 %; latency "
                        "as NVLink (no measurement read); vLLM's ROCm quick all-reduce is not "
                        "modelled"),
    Interconnect("pcie5", bw=50 * GB, latency_us=20.0, fully_connected=False,
                 source="PCIe Gen5 x16 (RTX PRO 6000 Blackwell): 64 GB/s per direction at "
                        "PCIe 4's ~80 %; latency as PCIe 4 (no measurement found)"),
    Interconnect("pcie4", bw=25 * GB, latency_us=20.0, fully_connected=False,
                 source="PCIe Gen4 x16 (L20, L40S-class): 32 GB/s per direction at ~80 %; "
                        "NCCL ring, 19.4 us at 4 KB on 4 PCIe GPUs behind one switch in a CUDA "
                        "graph (haohervchb/sglang-V100#2, a V100 proxy: no L20 measurement "
                        "found)"),
)}


@dataclass(frozen=True, slots=True)
class Hardware:
    name: str
    kind: str          # "gpu": runs asynchronously to the CPU; "cpu": the worker's own cores
    flops: float       # peak dense bf16 FLOP/s
    mem_bw: float      # peak memory bandwidth, bytes/s
    flop_eff: float    # fraction of `flops` a large GEMM reaches
    bw_eff: float      # fraction of `mem_bw` a weight-streaming (GEMV-like) kernel reaches
    kernel_us: float   # fixed cost added to every kernel, microseconds
    d2h_us: float      # a small device-to-host copy (sampled and draft ids), microseconds
    mem_bytes: float   # memory for weights and KV cache
    source: str
    fp8_flops: float = 0.0     # peak dense fp8 FLOP/s; 0: no fp8 tensor cores (fp8 weights are
                               # dequantized and multiplied at the bf16 rate)
    interconnect: Interconnect | MeasuredLink | None = None   # between a node's GPUs
    gpus_per_node: int = 8
    device_names: tuple[str, ...] = ()   # as CUDA names the device (a file's spec.gpu_name)
    # the range of the true device time over this roofline's (the `device` band input,
    # sim/bands.py), where the efficiencies were fitted on measured tables: None takes the
    # datasheet GPUs' range
    device_band: tuple[float, float] | None = None
    device_band_source: str = ""

    def __post_init__(self):
        if self.kind not in ("gpu", "cpu"):
            raise UserError(f"hardware {self.name!r}: kind must be 'gpu' or 'cpu'")
        for f in ("flops", "mem_bw", "mem_bytes"):
            if not getattr(self, f) > 0:
                raise UserError(f"hardware {self.name!r}: {f} must be > 0")
        for f in ("flop_eff", "bw_eff"):
            if not 0 < getattr(self, f) <= 1:
                raise UserError(f"hardware {self.name!r}: {f} must be in (0, 1]")
        for f in ("kernel_us", "d2h_us"):
            if getattr(self, f) < 0:
                raise UserError(f"hardware {self.name!r}: {f} must be >= 0")

    @property
    def flops_eff(self) -> float:
        return self.flops * self.flop_eff

    @property
    def fp8_flops_eff(self) -> float:
        return (self.fp8_flops or self.flops) * self.flop_eff

    @property
    def bw(self) -> float:
        return self.mem_bw * self.bw_eff


# Every GPU entry: d2h_us 15 (two small pinned copies over PCIe or NVLink-C2C, about 7 us each
# with their stream synchronisation).
# A GPU known by its datasheet alone (no operator table fitted): kernel_us 2.0 (graph-launched
# kernels: about 1 us between kernels plus about 1 us of ramp/drain for a memory-bound kernel),
# and the efficiencies of its kind of memory (the L20's for GDDR).
DATASHEET_EFFICIENCIES = {"gddr": (0.70, 0.80), "hbm": (0.75, 0.85)}   # flop_eff, bw_eff


def datasheet_gpu(name: str, device_name: str, memory: str, **peaks) -> Hardware:
    """A catalog GPU from its datasheet peaks (`flops`, `mem_bw`, `mem_bytes`, `fp8_flops`),
    interconnect and source; `memory` ("gddr" or "hbm") picks its efficiencies."""
    flop_eff, bw_eff = DATASHEET_EFFICIENCIES[memory]
    return Hardware(name, "gpu", flop_eff=flop_eff, bw_eff=bw_eff, kernel_us=2.0, d2h_us=15.0,
                    device_names=(device_name,), **peaks)


H100 = Hardware("h100", "gpu", flops=989e12, mem_bw=3350 * GB, flop_eff=0.76, bw_eff=0.934,
                kernel_us=4.89, d2h_us=15.0, mem_bytes=80 * GB, fp8_flops=1979e12,
                interconnect=NVLINK4,
                source="NVIDIA H100 SXM datasheet (3350 GB/s HBM3, 989 TFLOP/s dense bf16); "
                       "efficiencies and per-kernel cost fitted on Vidur's and LLMServingSim's "
                       "H100 operator tables (8 models, TP 1-8; bench/fit_gpu_roofline.py)",
                device_names=("NVIDIA H100 80GB HBM3",), device_band=(0.875, 1.586),
                device_band_source="the fitted roofline against Vidur's H100 tables: a layer's "
                                   "time -7 to +14 % at decode, -37 to -6 % at the knee, -21 "
                                   "to -6 % at prefill (bench/fit_gpu_roofline.py)")

CATALOG: dict[str, Hardware] = {h.name: h for h in (
    # GDDR6 with ECC: copy bandwidth about 83% of peak (the L40S, same memory system, is
    # validated against 0.72 TB/s = 83% of 864 GB/s); GEMV-like streaming ~96% of copy.
    datasheet_gpu("l20", "NVIDIA L20", "gddr", flops=119.5e12, mem_bw=864 * GB,
                  mem_bytes=48 * GB, fp8_flops=239e12,
                  interconnect=INTERCONNECTS["pcie4"],
                  source="NVIDIA L20 datasheet: 864 GB/s GDDR6, 119.5 TFLOP/s dense bf16, 48 GB"),
    # The A100's and H100's efficiencies and per-kernel cost are fitted on the measured
    # operator tables of traces/peers/ (bench/fit_gpu_roofline.py, which prints these numbers;
    # tests/test_gpus.py fits them again): bw_eff and kernel_us on the GEMMs of at most 8
    # tokens, flop_eff on those of at least 1024; the band is the spread of a layer's fitted
    # time over its measured one (5th to 95th percentile, the widest over decode, the knee
    # between the bounds and prefill), docs/reference/gpus.md.
    Hardware("a100", "gpu", flops=312e12, mem_bw=2039 * GB, flop_eff=0.719, bw_eff=0.786,
             kernel_us=4.55, d2h_us=15.0, mem_bytes=80 * GB, interconnect=INTERCONNECTS["nvlink3"],
             source="NVIDIA A100-80GB SXM datasheet (2039 GB/s HBM2e, 312 TFLOP/s bf16); "
                    "efficiencies and per-kernel cost fitted on Vidur's A100 operator tables "
                    "(7 models, TP 1-8; bench/fit_gpu_roofline.py)",
             device_names=("NVIDIA A100-SXM4-80GB",), device_band=(0.961, 1.392),
             device_band_source="the fitted roofline against Vidur's A100 tables: a layer's "
                                "time -7 to +4 % at decode, -28 to +0 % at the knee, -10 to "
                                "+2 % at prefill (bench/fit_gpu_roofline.py)"),
    H100,
    # Measured on one H200 (docs/explanation/design.md §6): 4.3 TB/s copy (0.90), 790 TFLOP/s
    # GEMM (0.80).
    # No operator table of an H200 was found: its own two measurements; the H100's peaks (the
    # same Hopper die), fitted per-kernel cost (the same kernels and clocks), NVLink, and its
    # band, as wide as the H100's fitted one and the datasheet GPUs' together.
    replace(H100, name="h200", mem_bw=4800 * GB, flop_eff=0.80, bw_eff=0.86, mem_bytes=141 * GB,
            source="NVIDIA H200 SXM datasheet: 4800 GB/s HBM3e, 989 TFLOP/s; "
                   "docs/explanation/design.md §6 (one H200's copy bandwidth and GEMM rate); "
                   "per-kernel cost the H100's fitted one",
            device_names=("NVIDIA H200",),
            device_band_source="no H200 table: the H100's fitted band (the same kernels), "
                               "which holds the datasheet GPUs' range"),
    datasheet_gpu("b200", "NVIDIA B200", "hbm", flops=2250e12, mem_bw=8000 * GB,
                  mem_bytes=180 * GB, fp8_flops=4500e12,
                  interconnect=INTERCONNECTS["nvlink5"],
                  source="NVIDIA B200 datasheet: 8 TB/s HBM3e, 2.25 PFLOP/s dense bf16"),
    # Two GDDR cards of the peer runs (docs/explanation/measured-tables.md, "Measured operator
    # tables"): datasheet peaks, the L20's efficiencies (the same kind of memory system); memory as
    # CUDA reports it.
    datasheet_gpu("rtx4090", "NVIDIA GeForce RTX 4090", "gddr", flops=165.2e12, mem_bw=1008 * GB,
                  mem_bytes=25_250_627_584, fp8_flops=330.3e12,
                  interconnect=replace(INTERCONNECTS["pcie4"], name="pcie4, no P2P", p2p=False),
                  source="NVIDIA Ada architecture whitepaper, GeForce RTX 4090: 1008 GB/s GDDR6X, "
                         "165.2 TFLOP/s dense bf16 (FP32 accumulate), 330.3 fp8; 24 GB "
                         "(25,250,627,584 bytes as CUDA reports it in the peer run's meta.json); "
                         "GeForce cards have no peer-to-peer access"),
    datasheet_gpu("rtxpro6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "gddr",
                  flops=500e12, mem_bw=1792 * GB, mem_bytes=96 * GIB, fp8_flops=1000e12,
                  interconnect=INTERCONNECTS["pcie5"],
                  source="NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 1792 GB/s "
                         "GDDR7, 96 GB, 4000 AI TOPS (fp4, sparse): 1000 TFLOP/s dense fp8, "
                         "500 dense bf16"),
    # GPUs people serve on, so that their command lines name a modelled GPU: datasheet peaks,
    # dense (NVIDIA prints the sparse rate first; half of it is the dense one); the
    # efficiencies of their kind of memory (DATASHEET_EFFICIENCIES; HBM: the H100's before its
    # roofline was fitted, docs/reference/gpus.md).
    datasheet_gpu("l40s", "NVIDIA L40S", "gddr", flops=362.05e12, mem_bw=864 * GB,
                  mem_bytes=48 * GB, fp8_flops=733e12,
                  interconnect=INTERCONNECTS["pcie4"],
                  source="NVIDIA L40S datasheet: 864 GB/s GDDR6, 48 GB, 362.05 TFLOP/s bf16 (733 "
                         "with sparsity), 733 fp8; PCIe Gen4 x16, no NVLink"),
    datasheet_gpu("l4", "NVIDIA L4", "gddr", flops=121e12, mem_bw=300 * GB,
                  mem_bytes=24 * GB, fp8_flops=242.5e12,
                  interconnect=INTERCONNECTS["pcie4"],
                  source="NVIDIA L4 datasheet: 300 GB/s GDDR6, 24 GB, 242 TFLOP/s bf16 and 485 fp8 "
                         "with sparsity (121 and 242.5 dense); PCIe Gen4 x16"),
    datasheet_gpu("a10g", "NVIDIA A10G", "gddr", flops=70e12, mem_bw=600 * GB,
                  mem_bytes=24 * GB,
                  interconnect=INTERCONNECTS["pcie4"],
                  source="AWS's A10G (G5 instances; no NVIDIA datasheet): 600 GB/s GDDR6, 24 "
                         "GB, 70 TFLOP/s bf16 tensor (Baseten, 'NVIDIA A10 vs A10G for ML "
                         "model inference'); Ampere: no fp8"),
    datasheet_gpu("h100-pcie", "NVIDIA H100 PCIe", "hbm", flops=756e12, mem_bw=2000 * GB,
                  mem_bytes=80 * GB, fp8_flops=1513e12,
                  interconnect=INTERCONNECTS["pcie5"],
                  source="NVIDIA H100 PCIe datasheet: 2 TB/s HBM2e, 80 GB, 1513 TFLOP/s bf16 and "
                         "3026 fp8 with sparsity (756 and 1513 dense); PCIe Gen5 (the optional "
                         "NVLink bridge is not modelled)"),
    datasheet_gpu("h100-nvl", "NVIDIA H100 NVL", "hbm", flops=835e12, mem_bw=3900 * GB,
                  mem_bytes=94 * GB, fp8_flops=1670e12,
                  interconnect=INTERCONNECTS["nvlink-bridge"],
                  source="NVIDIA H100 NVL datasheet (per GPU): 3.9 TB/s HBM3, 94 GB, 1671 TFLOP/s "
                         "bf16 and 3341 fp8 with sparsity (835 and 1670 dense); pairs joined by an "
                         "NVLink bridge"),
    datasheet_gpu("h20", "NVIDIA H20", "hbm", flops=148e12, mem_bw=4000 * GB,
                  mem_bytes=96 * GB, fp8_flops=296e12,
                  interconnect=NVLINK4,
                  source="NVIDIA H20 (HGX H20 datasheet): 4.0 TB/s HBM3, 96 GB, 148 TFLOP/s dense "
                         "bf16, 296 fp8; NVLink 900 GB/s"),
    datasheet_gpu("mi300x", "AMD Instinct MI300X", "hbm", flops=1307.4e12, mem_bw=5300 * GB,
                  mem_bytes=192 * GB, fp8_flops=2614.9e12,
                  interconnect=INTERCONNECTS["xgmi"],
                  source="AMD Instinct MI300X datasheet: 5.3 TB/s HBM3, 192 GB, 1307.4 TFLOP/s "
                         "dense bf16, 2614.9 fp8; the H100's efficiencies (no ROCm kernel "
                         "measurement read)"),
    # A generic 16-core AVX-512 server socket running torch eagerly: ~2.5 TFLOP/s fp32 peak,
    # ~100 GB/s DRAM; kernel_us is torch's per-op dispatch overhead on the CPU. A placeholder
    # until the engine's measured CPU profile replaces it.
    Hardware("cpu", "cpu", flops=2.5e12, mem_bw=100 * GB, flop_eff=0.4, bw_eff=0.6,
             kernel_us=10.0, d2h_us=0.0, mem_bytes=64 * GIB,
             source="generic 16-core AVX-512 server; placeholder for a measured profile"),
)}


def catalog_entry(device_name: str) -> str | None:
    """The catalog entry of a device as CUDA names it (nvidia-smi, torch, a hardware.yaml's
    spec.gpu_name), or None."""
    name = device_name.strip().lower()
    for key, hw in CATALOG.items():
        if name in (n.lower() for n in hw.device_names):
            return key
    return None


def is_gpu_file(name: str) -> bool:
    return name.lower().endswith((".yaml", ".yml"))


def get_hardware(name: str) -> Hardware:
    """A catalog entry by name (sim/hardware_file.py `load_gpu` also takes a GPU file)."""
    try:
        return CATALOG[name.lower()]
    except KeyError:
        raise UserError(f"gpu: unknown device {name!r} (known: {', '.join(CATALOG)}; or a "
                        "YAML file: your own GPU's fields, or LLMServingSim's hardware.yaml)") \
            from None
