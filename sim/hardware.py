"""The hardware catalog: what a device can do, for the roofline in `sim/roofline.py`.

Peaks are datasheet numbers (dense bf16 and fp8 tensor FLOP/s, memory bandwidth; docs/design.md
§6). The efficiencies are the fractions of those peaks that real kernels reach, and `kernel_us`
is the fixed cost each kernel adds (the gap between graph-launched kernels plus a memory-bound
kernel's ramp and drain). Each GPU names the interconnect between the GPUs of its node, which
prices tensor parallelism's collectives (`Interconnect`). docs/sim.md gives the source of every
number and how sensitive the predictions are to each.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepgap.common.errors import UserError

GB = 1e9
GIB = 2 ** 30


@dataclass(frozen=True, slots=True)
class Interconnect:
    """GPU-to-GPU links of one node, as tensor parallelism's collectives see them.

    An all-reduce of B bytes over N GPUs costs the better of vLLM's two custom all-reduce
    algorithms: one-shot, every GPU reads the N-1 others' buffers, latency + (N-1)·B / bw; and
    two-shot (reduce-scatter, then all-gather), 2·latency + 2·(N-1)/N·B / bw. An all-gather of
    B bytes in all costs latency + (N-1)/N·B / bw. `latency_us` is a small message's time in a
    CUDA graph, and dominates at decode (16 KiB per token of a 70B model); `bw` is what one GPU
    moves in one direction, after protocol overhead. With `one_shot` False (PCIe, no P2P
    fabric: vLLM disables its custom all-reduce past 2 such GPUs) NCCL's ring is used:
    latency + 2·(N-1)/N·B / bw.
    """

    name: str
    bw: float            # bytes/s one GPU sends (or receives) to its peers, effective
    latency_us: float    # one small collective, in a CUDA graph
    one_shot: bool
    source: str

    def __post_init__(self):
        if not (self.bw > 0 and self.latency_us >= 0):
            raise UserError(f"interconnect {self.name!r}: bw must be > 0 and latency >= 0")

    def all_reduce_us(self, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        bw = self.bw / 1e6   # bytes per microsecond
        ring = self.latency_us + 2 * (n - 1) / n * nbytes / bw
        if not self.one_shot:
            return ring
        one = self.latency_us + (n - 1) * nbytes / bw
        return min(one, ring + self.latency_us)

    def all_gather_us(self, nbytes: float, n: int) -> float:
        return 0.0 if n <= 1 else self.latency_us + (n - 1) / n * nbytes / (self.bw / 1e6)


# docs/sim.md has the measurements behind these numbers.
NVLINK4 = Interconnect(
    "nvlink4", bw=370 * GB, latency_us=6.0, one_shot=True,
    source="NVLink 4 (H100/H200 SXM): 450 GB/s per direction, NCCL reaches ~370 GB/s "
           "(nccl-tests #212); vLLM's custom all-reduce on H100 fits latency 6 us (vLLM "
           "#24111, #24532)")
INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in (
    Interconnect("nvlink3", bw=246 * GB, latency_us=6.0, one_shot=True,
                 source="NVLink 3 (A100 SXM): 300 GB/s per direction at NVLink 4's 82 % "
                        "efficiency (one 8-GPU node measured ~200 GB/s busbw, nccl-tests#149); "
                        "latency as NVLink 4"),
    NVLINK4,
    Interconnect("nvlink5", bw=740 * GB, latency_us=6.0, one_shot=True,
                 source="NVLink 5 (B200): 900 GB/s per direction (1.8 TB/s bidirectional) at "
                        "NVLink 4's 82 % efficiency; vLLM ca_1stage 7 us at 16 KiB on "
                        "B300 (#37756)"),
    Interconnect("pcie5", bw=50 * GB, latency_us=20.0, one_shot=False,
                 source="PCIe Gen5 x16 (RTX PRO 6000 Blackwell): 64 GB/s per direction at "
                        "PCIe 4's ~80 %; latency as PCIe 4 (no measurement found)"),
    Interconnect("pcie4", bw=25 * GB, latency_us=20.0, one_shot=False,
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
    interconnect: Interconnect | None = None   # between the GPUs of a node; None: one device
    gpus_per_node: int = 8

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


# Every GPU entry: kernel_us 2.0 (graph-launched kernels: about 1 us between kernels plus about
# 1 us of ramp/drain for a memory-bound kernel) and d2h_us 15 (two small pinned copies over PCIe
# or NVLink-C2C, about 7 us each with their stream synchronisation).
CATALOG: dict[str, Hardware] = {h.name: h for h in (
    # GDDR6 with ECC: copy bandwidth about 83% of peak (the L40S, same memory system, is
    # validated against 0.72 TB/s = 83% of 864 GB/s); GEMV-like streaming ~96% of copy.
    Hardware("l20", "gpu", flops=119.5e12, mem_bw=864 * GB, flop_eff=0.70, bw_eff=0.80,
             kernel_us=2.0, d2h_us=15.0, mem_bytes=48 * GB, fp8_flops=239e12,
             interconnect=INTERCONNECTS["pcie4"],
             source="NVIDIA L20 datasheet: 864 GB/s GDDR6, 119.5 TFLOP/s dense bf16, 48 GB"),
    Hardware("a100", "gpu", flops=312e12, mem_bw=2039 * GB, flop_eff=0.75, bw_eff=0.85,
             kernel_us=2.0, d2h_us=15.0, mem_bytes=80 * GB, interconnect=INTERCONNECTS["nvlink3"],
             source="NVIDIA A100-80GB SXM datasheet: 2039 GB/s HBM2e, 312 TFLOP/s bf16"),
    Hardware("h100", "gpu", flops=989e12, mem_bw=3350 * GB, flop_eff=0.75, bw_eff=0.85,
             kernel_us=2.0, d2h_us=15.0, mem_bytes=80 * GB, fp8_flops=1979e12,
             interconnect=NVLINK4,
             source="NVIDIA H100 SXM datasheet: 3350 GB/s HBM3, 989 TFLOP/s dense bf16"),
    # Measured on one H200 (docs/design.md §6): 4.3 TB/s copy (0.90), 790 TFLOP/s GEMM (0.80).
    Hardware("h200", "gpu", flops=989e12, mem_bw=4800 * GB, flop_eff=0.80, bw_eff=0.86,
             kernel_us=2.0, d2h_us=15.0, mem_bytes=141 * GB, fp8_flops=1979e12,
             interconnect=NVLINK4,
             source="NVIDIA H200 SXM datasheet: 4800 GB/s HBM3e, 989 TFLOP/s; docs/design.md §6"),
    Hardware("b200", "gpu", flops=2250e12, mem_bw=8000 * GB, flop_eff=0.75, bw_eff=0.85,
             kernel_us=2.0, d2h_us=15.0, mem_bytes=180 * GB, fp8_flops=4500e12,
             interconnect=INTERCONNECTS["nvlink5"],
             source="NVIDIA B200 datasheet: 8 TB/s HBM3e, 2.25 PFLOP/s dense bf16"),
    # Two GDDR cards of the peer runs (docs/sim.md, "Measured operator tables"): datasheet peaks,
    # the L20's efficiencies (the same kind of memory system); memory as CUDA reports it.
    Hardware("rtx4090", "gpu", flops=165.2e12, mem_bw=1008 * GB, flop_eff=0.70, bw_eff=0.80,
             kernel_us=2.0, d2h_us=15.0, mem_bytes=25_250_627_584, fp8_flops=330.3e12,
             interconnect=INTERCONNECTS["pcie4"],
             source="NVIDIA Ada architecture whitepaper, GeForce RTX 4090: 1008 GB/s GDDR6X, "
                    "165.2 TFLOP/s dense bf16 (FP32 accumulate), 330.3 fp8; 24 GB "
                    "(25,250,627,584 bytes as CUDA reports it in the peer run's meta.json)"),
    Hardware("rtxpro6000", "gpu", flops=500e12, mem_bw=1792 * GB, flop_eff=0.70, bw_eff=0.80,
             kernel_us=2.0, d2h_us=15.0, mem_bytes=96 * GIB, fp8_flops=1000e12,
             interconnect=INTERCONNECTS["pcie5"],
             source="NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 1792 GB/s GDDR7, "
                    "96 GB, 4000 AI TOPS (fp4, sparse): 1000 TFLOP/s dense fp8, 500 dense bf16"),
    # A generic 16-core AVX-512 server socket running torch eagerly: ~2.5 TFLOP/s fp32 peak,
    # ~100 GB/s DRAM; kernel_us is torch's per-op dispatch overhead on the CPU. A placeholder
    # until the engine's measured CPU profile replaces it.
    Hardware("cpu", "cpu", flops=2.5e12, mem_bw=100 * GB, flop_eff=0.4, bw_eff=0.6,
             kernel_us=10.0, d2h_us=0.0, mem_bytes=64 * GIB,
             source="generic 16-core AVX-512 server; placeholder for a measured profile"),
)}


def get_hardware(name: str) -> Hardware:
    try:
        return CATALOG[name.lower()]
    except KeyError:
        raise UserError(f"gpu: unknown device {name!r} (known: {', '.join(CATALOG)})") from None
