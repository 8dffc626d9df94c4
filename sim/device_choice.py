"""A run's device: the source of its device costs (the roofline, a measured profile's fits,
measured operator tables, the tables committed for a catalog GPU), its collectives and a MoE
target's blocks, and the notes that say what prices what (sim/plan.py `resolve` calls them).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from stepgap.sim.costs import DeviceCosts, LevelCosts
from stepgap.sim.roofline import RooflineCosts
from stepgap.sim.profile import Profile
from stepgap.sim.profile_costs import ProfileCosts
from stepgap.sim.bundle_match import committed_bundle, refuse_another_model
from stepgap.sim.table_costs import TableCosts
from stepgap.sim.tables import bundle_meta, find_bundle, find_variant, load_tables, repo_relative
from stepgap.sim.expert_parallel import MoeCosts, MoeParallel
from stepgap.sim.moe_tables import check_moe_bundle, moe_only, moe_parts
from stepgap.sim.hardware import Hardware, MeasuredLink, is_gpu_file
from stepgap.sim.hardware_file import (bundle_collectives, committed_link, load_collectives,
                                       other_measurements, with_link)
from stepgap.common.errors import UserError, where
from stepgap.common.modelcfg import ModelConfig
from stepgap.common.speculation import METHODS
from stepgap.sim.config import KV_CACHE_DTYPES, SimConfig
from stepgap.sim.table_checks import check_tables

NO_TABLES = "none"   # --device-profile none: the roofline alone, no committed tables


def committed_tables(cfg: SimConfig, hw: Hardware, target: ModelConfig,
                     profile: Profile | None = None) -> Path | None:
    """The operator tables committed under traces/peers/ that price this run by default
    (sim/bundle_match.py committed_bundle): a catalog GPU (not a GPU file) as a CUDA device, no
    --device-profile (`none` refuses them) and no --profile (its fits or level were made over
    the roofline), a bundle of the GPU measured for the model's shapes at the run's TP."""
    if cfg.device_profile is not None or cfg.profile is not None or profile is not None \
            or is_gpu_file(cfg.gpu) or hw.kind != "gpu" or (cfg.device or "cuda") != "cuda":
        return None
    return committed_bundle(hw.name, target, cfg.tensor_parallel_size,
                            target.quantization == "fp8", KV_CACHE_DTYPES[cfg.kv_cache_dtype] == 1)


def with_committed_tables(cfg: SimConfig, hw: Hardware, target: ModelConfig,
                          profile: Profile | None) -> tuple[SimConfig, str | None]:
    """The run's config as it is priced, and the note that says what prices it (for the end of
    the run's notes): --device-profile none as none given; the committed tables of the GPU
    (committed_tables) as if given."""
    if cfg.device_profile == NO_TABLES:
        return replace(cfg, device_profile=None), None
    found = committed_tables(cfg, hw, target, profile)
    if found is None:   # (a fitted roofline says so in the result's device_costs)
        return cfg, None
    return replace(cfg, device_profile=str(found)), (
        f"--gpu {hw.name}: the measured operator tables {repo_relative(found)} price "
        f"{target.name} at TP {cfg.tensor_parallel_size} (committed with their source and "
        "licence; the result's device_costs say which kernels, and what the fitted roofline "
        f"prices; --device-profile {NO_TABLES} for the roofline alone)")


def collectives(cfg: SimConfig, hw: Hardware, notes: list[str], moe: bool) -> Hardware:
    """The collectives of a run over several GPUs, tensor parallelism's (all-reduces, the
    logits' all-gather over the tp GPUs) and a MoE target's under data parallelism (`moe`: its
    dispatch and combine over the dp ranks, sim/expert_parallel.py): measured where a
    hardware.yaml gives them (--collectives; `--gpu FILE.yaml`; the one LLMServingSim keeps
    beside the --device-profile tables, profiler/perf/<GPU>/hardware.yaml; the one committed
    for a catalog GPU, sim/hardware_file.py COMMITTED_LINKS) over as many GPUs as each group
    has, else the --gpu's interconnect model; said in the notes when measured, with the other
    measurements of the same link this repository holds."""
    tp, link = cfg.tensor_parallel_size, hw.interconnect
    dp = cfg.data_parallel_size if moe else 1
    groups = {n: option for n, option in ((dp, "--data-parallel-size"),
                                          (tp, "--tensor-parallel-size")) if n > 1}
    if not groups:
        return hw
    found = None
    if cfg.collectives is not None:
        found = Path(cfg.collectives)
        if not found.is_file():
            raise UserError(f"--collectives {cfg.collectives}: no such file (a hardware.yaml "
                            "with measured.interconnect)")
        measured = load_collectives(found, model=_model_of(hw))
        if measured is None:
            raise UserError(f"{where(found, field='measured.interconnect')}: missing "
                            "(--collectives needs the measured collectives)")
        _check_npus(measured, groups, str(found))
        hw = with_link(hw, measured)
    elif isinstance(link, MeasuredLink):
        _check_npus(link, groups, cfg.gpu)
    else:
        if cfg.device_profile is not None:
            found = bundle_collectives(find_bundle(cfg.device_profile))
        if found is None and len(groups) == 1 and not is_gpu_file(cfg.gpu):
            found = committed_link(hw.name, next(iter(groups)))
        measured = load_collectives(found, model=_model_of(hw)) if found else None
        if measured is None:
            return hw
        if any(measured.npus != n for n in groups):
            notes.append(f"{found} measured its collectives over {measured.npus} GPUs, not "
                         f"{' and '.join(map(str, groups))}: the --gpu's interconnect model "
                         f"({link.name}) prices them")
            return hw
        hw = with_link(hw, measured)
    link = hw.interconnect
    said = [f"collectives: {link.source}"]
    if tp > 1:
        if not link.p2p:
            said.append("each all-reduce is NCCL's (no peer access, so no custom all-reduce)")
        elif "all_gather" in link.sizes:
            said.append("each all-reduce takes vLLM's path (its custom one-shot kernel under "
                        "8 MiB where the GPUs have peer access, priced as the measured "
                        "all_gather of the same bytes; NCCL's measured all_reduce above)")
        else:
            said.append("each all-reduce takes vLLM's path (its custom kernel under 8 MiB "
                        "where the GPUs have peer access, from the interconnect model, which "
                        "no table measured; NCCL's measured all_reduce above)")
    if dp > 1:
        said.append("the MoE layers' dispatch and combine over the DP ranks as the measured "
                    "all_gather and " + ("reduce_scatter" if "reduce_scatter" in link.sizes
                                         else "all_gather of the same bytes (no reduce_scatter "
                                              "samples)"))
    others = other_measurements(link.path) if link.path else []
    if others:
        said.append(f"another measurement of this link: "
                    f"{', '.join(map(repo_relative, others))} (the `collectives` band input "
                    "spans them)")
    notes.append("; ".join(said))
    return hw


def _model_of(hw: Hardware):
    """The GPU's interconnect model (under measured collectives, the model they keep)."""
    link = hw.interconnect
    return link.model if isinstance(link, MeasuredLink) else link


def _check_npus(link: MeasuredLink, groups: dict, source: str) -> None:
    for n, option in groups.items():
        if link.npus != n:
            raise UserError(f"{where(source, field='measured.interconnect.npus')}: the "
                            f"collectives were measured over {link.npus} GPUs; {option} {n} "
                            f"needs them measured over {n} (or a catalog --gpu, whose "
                            "interconnect model prices them)")


def device_costs_of(cfg: SimConfig, target: ModelConfig, draft, hw: Hardware,
                    measured: Profile | None) -> DeviceCosts:
    """The run's source of device costs, behind the DeviceCosts seam (sim/costs.py): the
    roofline of the model on the hardware entry, and over it a measured profile's fits where
    one is given (the roofline answers for the ops it has no fit of). Another source (measured
    operator tables) stands here the same way."""
    costs: DeviceCosts = RooflineCosts(
        target, draft, hw, cfg.k, tp=cfg.tensor_parallel_size, method=cfg.method,
        routing_skew=cfg.moe_routing_skew, max_model_len=cfg.max_model_len,
        kv_bytes=KV_CACHE_DTYPES[cfg.kv_cache_dtype])
    bundle = None   # the --device-profile variant folder the run reads
    if measured is not None:
        if measured.fits and (cfg.tensor_parallel_size > 1 or cfg.data_parallel_size > 1
                              or (cfg.k and not METHODS[cfg.method].profiled)):
            raise UserError(f"--profile {cfg.profile or measured.path}: a measured profile "
                            "times one device running EAGLE-3 drafts; --tensor-parallel-size "
                            "or --data-parallel-size > 1 and other methods use the roofline "
                            "(drop --profile)")
        if measured.fits and (cfg.quantization or
                              cfg.kv_cache_dtype not in ("auto", target.torch_dtype)):
            raise UserError(f"--profile {cfg.profile or measured.path}: a measured profile "
                            "times the weights and KV cache it was measured with; "
                            "--quantization and --kv-cache-dtype use the roofline (drop "
                            "--profile)")
        if measured.roofline_level is not None:   # the device it was measured on, its level
            on = measured.measured_on().get("gpu", "the device measured")
            costs = LevelCosts(costs, measured.roofline_level, "the level `stepgap calibrate` "
                               f"fitted on {on}'s runs", measured.path, measured.draft_level)
        costs = ProfileCosts(measured, cfg.k, costs, cfg.block_size)
    if cfg.device_profile is not None:   # a GPU's measured operator tables (sim/tables.py)
        device = cfg.device or ("cuda" if hw.kind == "gpu" else "cpu")
        if device != "cuda":
            raise UserError(f"--device-profile {cfg.device_profile}: GPU operator tables price "
                            "a GPU's kernels (--device cuda, a --gpu of the catalog); drop "
                            "--device cpu")
        roofline = costs if measured is None else costs.fallback
        fp8_kv = KV_CACHE_DTYPES[cfg.kv_cache_dtype] == 1
        why = " with ".join(x for x in (
            "fp8 weights" if target.quantization == "fp8" else f"{target.torch_dtype} weights",
            f"--kv-cache-dtype {cfg.kv_cache_dtype}" if fp8_kv else None) if x)
        bundle = find_variant(cfg.device_profile, target.quantization == "fp8", fp8_kv,
                              target.torch_dtype, why)
        refuse_another_model(bundle_meta(bundle), target)   # (before reading its tables)
        only = moe_only(bundle, cfg.tensor_parallel_size, target)
        if only is None:
            # the tables price the device; a profile's level was of another device's roofline
            costs = TableCosts(load_tables(bundle, cfg.tensor_parallel_size), target,
                               draft, cfg.k, roofline_of(roofline), cfg.method,
                               cfg.tensor_parallel_size)
        else:   # a MoE target's MoE and MTP tables alone: the roofline prices the rest
            about = check_moe_bundle(bundle, target)
            costs = roofline   # (a profile's level over it, where it has one)
            costs.path = str(bundle)
            sources = costs.sources or {}
            under = sources.get("target_forward", "roofline")
            costs.sources = {**sources,
                             "target_forward": f"{under} (the bundle, {about}: {only})"}
    attach_moe(cfg, target, hw, costs, bundle)
    roofline = roofline_of(costs)
    if bundle is not None and roofline is not None:   # the tables against the model's shapes
        check_tables(costs, roofline, bundle, cfg.tensor_parallel_size)
    src = costs.sources
    if hw.device_band is not None and "target_forward" not in (src or {}):
        costs.sources = {**fitted_sources(hw), **(src or {})}
    return costs


def fitted_sources(hw: Hardware) -> dict[str, str]:
    """What prices each device op of a run on a GPU whose roofline was fitted on measured tables
    (`Hardware.device_band`) and that no table or profile prices (the result's device_costs)."""
    roof = (f"roofline fitted on measured tables ({hw.name}: bw_eff {hw.bw_eff:g}, flop_eff "
            f"{hw.flop_eff:g}, {hw.kernel_us:g} us a kernel; {hw.source}; `stepgap gpus`)")
    return {"target_forward": roof, "rejection_sample": roof, "draft_forward": roof,
            "d2h": f"roofline (the catalog's copy time, {hw.d2h_us:g} us)", "fixup": roof}


def attach_moe(cfg: SimConfig, target: ModelConfig, hw: Hardware, costs,
               bundle: Path | None) -> None:
    """A MoE target's blocks from the bundle's moe.csv (`bundle`: the --device-profile variant
    folder the run reads), or under data or expert parallelism (sim/expert_parallel.py),
    priced by one MoeCosts that the tables and their roofline share; its dispatch and combine
    over `hw.interconnect`, measured where `collectives` found them. A run with neither keeps
    the roofline's own MoE layers, as before."""
    dp, tp = cfg.data_parallel_size, cfg.tensor_parallel_size
    plan = MoeParallel(dp, tp, cfg.enable_expert_parallel and dp * tp > 1)   # vLLM's use_ep
    roofline = roofline_of(costs)
    if not target.is_moe or roofline is None:
        return
    table = mtp = None
    if bundle is not None:
        table, mtp = moe_parts(bundle, tp, plan.moe_tp,
                               cfg.k > 0 and METHODS[cfg.method].uses_mtp_layers)
    if not isinstance(costs, TableCosts) and table is None and mtp is None and plan.dp == 1 \
            and not plan.expert_parallel:
        return
    if plan.dp > 1 and hw.interconnect is None:
        raise UserError(f"--data-parallel-size {plan.dp}: --gpu {hw.name} has no interconnect "
                        "in the catalog to gather the MoE layers' tokens over")
    moe = MoeCosts(target, roofline, plan, hw.interconnect, table, mtp)
    roofline.moe = moe
    if isinstance(costs, TableCosts):
        costs.moe = moe
    sources = costs.sources
    if sources is None:
        costs.sources = sources = {}
    sources["moe"] = moe.source()
    if mtp is not None:
        sources["draft_forward"] = (f"MTP module's own kernels from tables ({bundle}/mtp.csv), "
                                    "its decoder layer as the target's, the rest the roofline")


def roofline_of(costs) -> RooflineCosts | None:
    """The roofline under a run's device costs: itself, the fallback of a profile's fits or of
    measured tables, the roofline a profile's level scales (None: another source)."""
    while not isinstance(costs, RooflineCosts):
        costs = costs.fallback
        if costs is None:
            return None
    return costs


def parallel_notes(cfg: SimConfig, target: ModelConfig, costs) -> list[str]:
    """What a run under data or expert parallelism, or with MoE tables, should be told."""
    notes = []
    dp = cfg.data_parallel_size
    if cfg.enable_expert_parallel and not target.is_moe:
        notes.append(f"--enable-expert-parallel: {target.name} has no experts; it changes "
                     "nothing")
    elif cfg.enable_expert_parallel and dp * cfg.tensor_parallel_size == 1:
        notes.append("--enable-expert-parallel on one GPU: no other GPU to hold experts; it "
                     "changes nothing (vLLM: expert parallelism needs data x tensor parallel "
                     "> 1)")
    if dp > 1:
        notes.append(f"data parallel {dp}: {dp} engine cores, each its own scheduler, KV cache "
                     "and GPU(s), requests routed as vLLM's DP front end routes them "
                     "(docs/explanation/past-one-gpu.md, 'Data and expert parallelism')"
                     + ("; a MoE target: every rank runs each forward in lockstep, a dummy "
                        "batch where it has none" if target.is_moe else
                        "; a dense target: the ranks run independently, as vLLM runs them"))
    roofline = roofline_of(costs)
    moe = roofline.moe if roofline is not None else None
    if moe is None:
        return notes
    plan = moe.plan
    notes.append(moe.source())
    if moe.grid is not None:
        measured = ", ".join(map(str, moe.table.grids))
        if moe.ep != plan.ep:
            notes.append(f"moe.csv has no ep {plan.ep} grid (measured: ep {measured}): the "
                         f"nearest, ep {moe.ep}, prices the MoE blocks")
        bw, tok, active = moe.fastest_read()
        if bw > moe.roof.hw.mem_bw:   # the datasheet peak
            notes.append(f"moe.csv's ep {moe.ep} grid reads {active:g} experts' weights at "
                         f"{tok:g} tokens at {bw / 1e12:.1f} TB/s, past --gpu "
                         f"{moe.roof.hw.name}'s peak {moe.roof.hw.mem_bw / 1e12:.2f} TB/s: "
                         "the table "
                         "likely understates the block (LLMServingSim's output-bundle docs: "
                         "a stack of dense and MoE layers measured before its normalization "
                         "fix understates it; remeasure with slice --group moe --force)")
        rows = cfg.max_num_batched_tokens * (dp if dp > 1 else 1)
        if rows > moe.grid.max_tokens:
            notes.append(f"moe.csv's ep {moe.ep} grid ends at {moe.grid.max_tokens:g} tokens; "
                         f"a MoE block over more (up to {rows}: --max-num-batched-tokens"
                         + (f" x DP {dp}" if dp > 1 else "") + ") grows from its last time as "
                         "the roofline grows (the result counts them)")
    elif cfg.device_profile is not None:
        notes.append(f"--device-profile has no moe.csv for MoE layers split {plan.moe_tp} ways "
                     f"by width (tp{plan.moe_tp}/): the roofline prices the MoE blocks")
    return notes


def table_notes(cfg: SimConfig, costs: DeviceCosts, hw: Hardware,
                measured: Profile | None) -> list[str]:
    """What a run priced from measured tables should be told: a step longer than their grid,
    tables of another GPU than the --gpu entry, a --profile that then gives the CPU only."""
    if not isinstance(costs, TableCosts):
        return []
    tables, notes = costs.tables, []
    if measured is not None:
        notes.append(f"--device-profile prices the device ops; --profile {cfg.profile} "
                     "gives the CPU costs only")
    if cfg.max_num_batched_tokens > tables.max_tokens:
        notes.append(f"--max-num-batched-tokens {cfg.max_num_batched_tokens} is past the "
                     f"tables' {tables.max_tokens:g} tokens: longer steps extrapolated in "
                     "proportion (docs/explanation/measured-tables.md)")
    label = tables.hardware.lower()
    if hw.name.lower() not in (label, label.replace("_", "")):
        notes.append(f"--device-profile was measured on {tables.gpu} ({tables.hardware}); "
                     f"--gpu {cfg.gpu} gives the memory size and the roofline of what the "
                     "tables lack")
    return notes
