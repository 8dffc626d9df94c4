"""A GPU described in a YAML file (`--gpu FILE.yaml`), and the collectives measured on it.

One reader for two kinds of file, which may also stand in one file (stepgap's fields win):

- **LLMServingSim's hardware.yaml**, read as it is (its profiler writes
  `profiler/perf/<GPU>/hardware.yaml`): `hardware` (the label), `spec` (`gpu_name` as CUDA
  names the device, `memory_total_gib`, `memory_bw_gbps`) and `measured.interconnect`: the
  collectives NCCL ran over `npus` GPUs, as `samples` of `collective` (all_reduce,
  all_gather, reduce_scatter), `bytes` and `us_graphed` (replayed from a CUDA graph, as an
  engine issues them) or `us`. It records no peak FLOP/s: those come from the catalog entry
  of the same device (`spec.gpu_name`), or from stepgap's fields below.
- **stepgap's fields**, for a GPU the catalog lacks or to change an entry: `base` (a catalog
  entry to start from), `name`, `bf16_tflops` and `fp8_tflops` (dense peaks), `memory_gb`,
  `memory_bw_gbps`, `flop_eff`, `bw_eff`, `kernel_us`, `d2h_us`, `interconnect` (a catalog
  interconnect's name, or `{bw_gbps, latency_us, fully_connected, p2p}`), `source`.

Measured collectives replace the interconnect model (sim/hardware.py `MeasuredLink`) when the
file gives them; a perf bundle's own hardware.yaml (`collectives_beside`) is found the same way
by `--device-profile`. Every error names the file and the field.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from stepgap.common.errors import UserError, shown, where
from stepgap.common.fileio import parsed_once, read_yaml
from stepgap.common.limits import is_finite
from stepgap.sim.hardware import (CATALOG, GB, GIB, INTERCONNECTS, Hardware, Interconnect,
                                  MeasuredLink, catalog_entry, get_hardware, is_gpu_file)

WHAT = "a GPU file: stepgap's fields, or LLMServingSim's hardware.yaml"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
NEEDED = ("all_reduce", "all_gather")   # what tensor parallelism issues every step
# stepgap's own fields: the Hardware field each sets, and its unit
FIELDS = {"bf16_tflops": ("flops", 1e12), "fp8_tflops": ("fp8_flops", 1e12),
          "memory_gb": ("mem_bytes", GB), "memory_bw_gbps": ("mem_bw", GB),
          "flop_eff": ("flop_eff", 1.0), "bw_eff": ("bw_eff", 1.0),
          "kernel_us": ("kernel_us", 1.0), "d2h_us": ("d2h_us", 1.0)}
REQUIRED = {"flops": "bf16_tflops", "mem_bw": "memory_bw_gbps", "mem_bytes": "memory_gb"}
# A GPU the catalog does not know takes the catalog's GPU defaults for what it does not give.
DEFAULTS = {"flop_eff": 0.70, "bw_eff": 0.80, "kernel_us": 2.0, "d2h_us": 15.0}
# What each number may be (low, high; low itself only where zero is allowed below): wide
# enough for any device from a laptop CPU to ten B200s (2,250 dense bf16 TFLOP/s, 192 GB,
# 8 TB/s each), narrow enough that a typo of 1e-300 or 1e308 is refused before it makes
# every time infinite or every KV cache NaN. An efficiency is a fraction of the peak that a
# kernel reaches (the catalog's, fitted or not, are 0.4 to 0.93): below 1 % it is a typo (1e-300
# made every ITL's spread inf, with exit 0). No device adds 10 ms to every kernel (the catalog's
# CPU adds 10 us; 0.9 s a kernel gave Llama-3.1-8B a mean TPOT of 293 s, with exit 0).
RANGES = {"bf16_tflops": (1e-3, 1e5), "fp8_tflops": (0.0, 1e5), "memory_gb": (1e-3, 1e5),
          "memory_total_gib": (1e-3, 1e5), "memory_bw_gbps": (1e-3, 1e6),
          "flop_eff": (0.01, 1.0), "bw_eff": (0.01, 1.0), "kernel_us": (0.0, 1e4),
          "d2h_us": (0.0, 1e6), "bw_gbps": (1e-3, 1e6), "latency_us": (0.0, 1e6),
          "bytes": (0.0, 2.0 ** 50), "us": (0.0, 1e9), "us_graphed": (0.0, 1e9),
          "npus": (1.0, 1024.0)}
# What a collective of a node's GPUs may take, by physics and by the slowest link there is: no
# link moves a GPU's bytes faster than 100 TB/s (NVLink 5 moves 1.8 TB/s a GPU; the committed
# hardware.yaml files reach 0.036 TB/s over PCIe), and none is slower than a 1 GB/s link with
# 10 ms of latency (their slowest sample: 13 us for 4 KiB). Past either, the sample is a unit
# error or a broken recorder (every sample at 10^9 us gave Llama-3.1-8B at TP 2 a mean TPOT of
# 6.6 x 10^7 ms, with exit 0).
LINK_MAX_BYTES_PER_US = 1e8
LINK_MIN_BYTES_PER_US, LINK_MAX_LATENCY_US = 1e3, 1e4


def _number(path, field: str, v, zero: bool = False, integer: bool = False) -> float:
    """A finite number in RANGES[its last dotted part] (or above 0), at the low end too only
    where `zero`; the error names the file and field."""
    low, high = RANGES.get(field.rpartition(".")[2], (0.0, math.inf))
    if not is_finite(v) or v < low or (v == low and not zero) or v > high \
            or (integer and v != int(v)):
        what = "an integer" if integer else "a number"
        upto = f" and <= {high:g}" if math.isfinite(high) else ""
        raise UserError(f"{where(path, field=field)}: expected {what} {'>=' if zero else '>'} "
                        f"{low:g}{upto}, got {shown(v)}")
    return float(v)


def _text(path, doc: dict, key: str, at: str = "") -> str | None:
    """A name the file gives (YAML may read `4090` as a number), or None where it gives none."""
    v = doc.get(key)
    if v is None or v == "":
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise UserError(f"{where(path, field=at + key)}: expected a name, got {shown(v)}")
    return str(v)


def _mapping(path, doc: dict, key: str, at: str = "") -> dict:
    v = doc.get(key) or {}
    if not isinstance(v, dict):
        raise UserError(f"{where(path, field=at + key)}: expected a mapping, got {shown(v)}")
    return v


def load_collectives(path, fully_connected: bool = False, p2p: bool = True,
                     doc: dict | None = None, model: Interconnect | None = None
                     ) -> MeasuredLink | None:
    """The collectives a hardware.yaml measured (`measured.interconnect`), or None where it
    measured none. A block without its GPU count, or without the all_reduce or all_gather
    samples tensor parallelism needs, is an error naming the field; with an interconnect
    `model`, all_reduce alone will do (the model prices vLLM's own all-reduce kernel and the
    all-gather, MeasuredLink)."""
    path = Path(path)
    doc = read_yaml(path, WHAT) if doc is None else doc
    block = _mapping(path, _mapping(path, doc, "measured"), "interconnect", "measured.")
    if not block:
        return None
    base = "measured.interconnect"
    if block.get("npus") is None:
        raise UserError(f"{where(path, field=base + '.npus')}: missing (the number of GPUs the "
                        "collectives were measured over)")
    npus = int(_number(path, f"{base}.npus", block["npus"], integer=True))
    samples = block.get("samples")
    if not isinstance(samples, list) or not samples:
        raise UserError(f"{where(path, field=base + '.samples')}: missing (a list of "
                        "collective, bytes, us)")
    points: dict[str, dict[float, float]] = {c: {} for c in COLLECTIVES}
    for i, s in enumerate(samples):
        at = f"{base}.samples[{i}]"
        if not isinstance(s, dict):
            raise UserError(f"{where(path, field=at)}: expected a mapping, got {shown(s)}")
        c = s.get("collective")
        if c not in COLLECTIVES:
            raise UserError(f"{where(path, field=at + '.collective')}: expected one of "
                            f"{', '.join(COLLECTIVES)}, got {shown(c)}")
        size = _number(path, f"{at}.bytes", s.get("bytes"), integer=True)
        times = {key: _number(path, f"{at}.{key}", s[key])
                 for key in ("us_graphed", "us") if s.get(key) is not None}
        if not times:
            raise UserError(f"{where(path, field=at + '.us')}: missing (the time, in us)")
        t = times.get("us_graphed", times.get("us"))
        if size / t > LINK_MAX_BYTES_PER_US:   # (t > 0: RANGES)
            raise UserError(f"{where(path, field=at)}: {c} of {size:g} bytes in {t:g} us is "
                            f"{size / t / 1e6:g} TB/s, past any link "
                            f"({LINK_MAX_BYTES_PER_US / 1e6:g} TB/s)")
        if t > LINK_MAX_LATENCY_US + size / LINK_MIN_BYTES_PER_US:
            raise UserError(f"{where(path, field=at)}: {c} of {size:g} bytes in {t:g} us, "
                            f"slower than a {LINK_MIN_BYTES_PER_US / 1e3:g} GB/s link with "
                            f"{LINK_MAX_LATENCY_US / 1e3:g} ms of latency: not a measurement "
                            "of a node's GPUs (us for ns or ms?)")
        if size in points[c]:
            raise UserError(f"{where(path, field=at + '.bytes')}: {c} at {size:g} bytes twice")
        points[c][size] = t
    for c in NEEDED if model is None else ("all_reduce",):
        if not points[c]:
            raise UserError(f"{where(path, field=base + '.samples')}: no {c} samples "
                            "(tensor parallelism all-reduces the hidden states and all-gathers "
                            "the logits)")
    measured = {c: p for c, p in points.items() if p}
    from stepgap.sim.tables import repo_relative
    label = _text(path, doc, "hardware") or path.parent.name
    at = repo_relative(path)
    return MeasuredLink(
        f"measured ({at})", npus,
        {c: tuple(sorted(p)) for c, p in measured.items()},
        {c: tuple(p[x] for x in sorted(p)) for c, p in measured.items()},
        fully_connected, p2p,
        f"{at}: {label}'s {', '.join(measured)} measured over {npus} GPUs "
        f"({block.get('communicator') or 'NCCL'}; {doc['measured'].get('at') or 'undated'})"
        + (f"; what it did not measure from the interconnect model ({model.name})"
           if model is not None and "all_gather" not in measured else ""),
        model if "all_gather" not in measured else None, str(path))


def _interconnect(path, v) -> Interconnect:
    if isinstance(v, str):
        if v not in INTERCONNECTS:
            raise UserError(f"{where(path, field='interconnect')}: unknown {shown(v)} (known: "
                            f"{', '.join(INTERCONNECTS)}, or a mapping of bw_gbps, "
                            "latency_us, fully_connected, p2p)")
        return INTERCONNECTS[v]
    if not isinstance(v, dict):
        raise UserError(f"{where(path, field='interconnect')}: expected a name or a mapping, "
                        f"got {shown(v)}")
    for key in ("fully_connected", "p2p"):
        if not isinstance(v.get(key, False), bool):
            raise UserError(f"{where(path, field='interconnect.' + key)}: expected true or "
                            f"false, got {shown(v[key])}")
    return Interconnect(
        f"{path}'s interconnect", _number(path, "interconnect.bw_gbps", v.get("bw_gbps")) * GB,
        _number(path, "interconnect.latency_us", v.get("latency_us"), zero=True),
        v.get("fully_connected", False), str(path), v.get("p2p", True))


def load_gpu_file(path) -> Hardware:
    """The GPU a YAML file describes (module docstring): a catalog entry (`base`, or the one
    of `spec.gpu_name`) with what the file gives in its place."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--gpu {path}: no such file (a GPU file: stepgap's fields, or "
                        "LLMServingSim's hardware.yaml; or a catalog entry: "
                        f"{', '.join(CATALOG)})")
    doc = read_yaml(path, WHAT)
    spec = _mapping(path, doc, "spec")
    gpu_name = _text(path, spec, "gpu_name", "spec.")
    base_name = _text(path, doc, "base") or catalog_entry(gpu_name or "")
    if base_name is not None and base_name not in CATALOG:
        raise UserError(f"{where(path, field='base')}: unknown catalog entry {base_name!r} "
                        f"(known: {', '.join(CATALOG)})")
    base = CATALOG.get(base_name)
    values = {f.name: getattr(base, f.name) for f in base.__dataclass_fields__.values()} \
        if base is not None else {"kind": "gpu", "fp8_flops": 0.0, "gpus_per_node": 8,
                                  "interconnect": None, **DEFAULTS}
    taken = []
    if spec.get("memory_total_gib") is not None:
        values["mem_bytes"] = _number(path, "spec.memory_total_gib",
                                      spec["memory_total_gib"]) * GIB
        taken.append(f"memory {spec['memory_total_gib']} GiB")
    if spec.get("memory_bw_gbps") is not None:
        values["mem_bw"] = _number(path, "spec.memory_bw_gbps", spec["memory_bw_gbps"]) * GB
        taken.append(f"memory bandwidth {spec['memory_bw_gbps']} GB/s")
    for key, (field, unit) in FIELDS.items():
        if doc.get(key) is not None:
            values[field] = _number(path, key, doc[key],
                                    zero=field in ("kernel_us", "d2h_us", "fp8_flops")) * unit
            taken.append(f"{key} {doc[key]}")
            if field in ("flops", "mem_bw", "flop_eff", "bw_eff", "kernel_us"):
                values["device_band"] = None   # the base's fitted band was of its own roofline
    for field, key in REQUIRED.items():
        if field not in values:
            why = f"spec.gpu_name {gpu_name!r} is not in the catalog" \
                if gpu_name else "the file names no catalog entry (base)"
            raise UserError(f"{where(path, field=key)}: missing ({why}: give {key}, or base: a "
                            "catalog entry to start from)")
    if doc.get("interconnect") is not None:
        values["interconnect"] = _interconnect(path, doc["interconnect"])
    model = values["interconnect"]
    link = load_collectives(path, model.fully_connected if model is not None else False,
                            model.p2p if model is not None else True, doc,
                            model if isinstance(model, Interconnect) else None)
    if link is not None:
        values["interconnect"] = link
    values["name"] = _text(path, doc, "name") or _text(path, doc, "hardware") or path.stem
    values["source"] = _text(path, doc, "source") or (
        f"{path}" + (f": {', '.join(taken)}" if taken else "")
        + (f"; the rest from the catalog's {base_name} ({base.source})" if base is not None
           else "; efficiencies and per-kernel costs: the catalog's GPU defaults"))
    values["device_names"] = (gpu_name,) if gpu_name else ()
    return Hardware(**values)


def load_gpu(name: str) -> Hardware:
    """`--gpu`: a catalog entry by name, or the GPU a YAML file describes."""
    return load_gpu_file(name) if is_gpu_file(name) else get_hardware(name)


def bundle_collectives(root: Path) -> Path | None:
    """The measured collectives beside a bundle, of the GPU its meta.yaml's `hardware` names
    (`collectives_beside`), or None."""
    from stepgap.sim.tables import read_meta
    label = read_meta(root).get("hardware")
    return collectives_beside(root, str(label)) if label else None


def collectives_beside(bundle: Path, label: str) -> Path | None:
    """The hardware.yaml of a perf bundle's GPU, where LLMServingSim keeps it:
    profiler/perf/<label>/hardware.yaml, above the bundle's <model>/<variant> folders."""
    for folder in bundle.resolve().parents:
        if folder.name == label and (folder / "hardware.yaml").is_file():
            return folder / "hardware.yaml"
        if folder.name == "perf":
            break
    return None


def with_link(hw: Hardware, link: MeasuredLink) -> Hardware:
    """`hw` with measured collectives in place of its interconnect model (which says whether
    its GPUs are fully connected and have peer access, for vLLM's choice of all-reduce)."""
    model = hw.interconnect
    if isinstance(model, MeasuredLink):
        model = model.model
    if model is not None:
        link = replace(link, fully_connected=model.fully_connected, p2p=model.p2p,
                       model=link.model if "all_gather" in link.sizes else model)
    return replace(hw, interconnect=link)


# The collectives measured on a catalog GPU's node that this repository commits
# (traces/peers/, bench/convert_peer_tables.py): a folder of tp<N>.yaml files, one a group
# size. The H200's node is the H100's NVLink 4 and NVSwitch: measured on H100s.
COMMITTED_LINKS = {"h100": "vidur/network/h100_dgx", "h200": "vidur/network/h100_dgx",
                   "a100": "vidur/network/a100_dgx"}


def committed_link(gpu: str, npus: int) -> Path | None:
    """The committed measurement of catalog GPU `gpu`'s collectives over `npus` GPUs, or None:
    COMMITTED_LINKS' file, else a peer's profiler/perf/<GPU>/hardware.yaml of the same device
    (its newest commit's, under traces/peers/<peer>/, before older ones kept under at-*/)."""
    from stepgap.sim.tables import PEERS
    folder = COMMITTED_LINKS.get(gpu)
    path = PEERS / folder / f"tp{npus}.yaml" if folder else None
    if path is not None and path.is_file():
        return path
    names = {n.lower() for n in CATALOG[gpu].device_names} if gpu in CATALOG else set()
    for f in sorted(_peer_hardware_files(), key=lambda f: ("/at-" in str(f), str(f))):
        key = link_key(f)
        if key is not None and key[0].lower() in names and key[1] == npus:
            return f
    return None


def _peer_hardware_files() -> list[Path]:
    from stepgap.sim.tables import PEERS
    return sorted(PEERS.glob("*/**/profiler/perf/*/hardware.yaml"))


def link_key(path) -> tuple[str, int] | None:
    """What a measurement of collectives is of: (the GPU as CUDA names it, the GPU count)."""
    path = Path(path)
    return parsed_once(("link_key",), [path], lambda: _link_key(path))


def _link_key(path: Path) -> tuple[str, int] | None:
    doc = read_yaml(path, WHAT)
    block = _mapping(path, _mapping(path, doc, "measured"), "interconnect", "measured.")
    name = _text(path, _mapping(path, doc, "spec"), "gpu_name", "spec.")
    return (name, int(block["npus"])) if name and block.get("npus") is not None else None


def other_measurements(path) -> list[Path]:
    """The committed measurements of the same link as `path` (the same GPU over as many GPUs,
    link_key) that this repository holds besides it: LLMServingSim's profiler/perf/<GPU>/
    hardware.yaml under traces/peers/ (at each commit kept) and COMMITTED_LINKS' files. Two
    measurements of one link that disagree are the `collectives` band input (sim/bands.py)."""
    from stepgap.sim.tables import PEERS
    key = link_key(path)
    if key is None:
        return []
    files = set(_peer_hardware_files())
    files |= {PEERS / f / f"tp{key[1]}.yaml" for f in set(COMMITTED_LINKS.values())}
    here = Path(path).resolve()
    return sorted(f for f in files if f.is_file() and f.resolve() != here
                  and link_key(f) == key)
