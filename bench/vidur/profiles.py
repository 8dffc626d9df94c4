"""The profile data Vidur reads, laid out so that it needs no network: what is needed, the
synthetic attention table, and the offline dataset cache.

Vidur 0.0.26 (the newest on the package index) loads its operator profiles at run time with
huggingface_hub's `snapshot_download(repo_id=DATASET, repo_type="dataset",
cache_dir=CACHE/profiling_data/{compute,network})`; no wheel ships them. With HF_HUB_OFFLINE=1
that call returns CACHE/profiling_data/KIND/datasets--ORG--NAME/snapshots/REV when
refs/main names REV, so `build_cache` writes exactly that: the compute dataset holds
mlp.csv.xz, attention.csv.xz and config.json ({"model", "device_sku"}, which Vidur checks
against its --replica_config_* options), the network one all_reduce.csv.xz, send_recv.csv.xz
and config.json ({"sku"}).

What is real and what is not (docs/explanation/speed.md, "Side by side with Vidur"):
- mlp.csv (H100, Llama-3-8B) and the h100_dgx network tables are Vidur's own measurements,
  from the microsoft/vidur repository on GitHub at commit 25e0082 (PR #56, which added the
  H100 Llama-3-8B profile; a later PR removed it again).
- attention.csv is SYNTHETIC: no attention table of that model on that GPU survives in any
  copy of the repository we could reach. `write_attention` fills Vidur's columns and grid from
  a roofline (below), so Vidur's simulated latencies are approximate; its speed is not
  affected, as the table is only looked up.

Only the standard library: Vidur's venv and stepgap's both run this file.
"""

from __future__ import annotations

import csv
import hashlib
import json
import lzma
import shutil
from pathlib import Path

COMPUTE_DATASET = "local/vidur-llama-3-8b-h100"
NETWORK_DATASET = "local/vidur-h100-dgx"
MODEL, DEVICE, NETWORK = "meta-llama/Llama-3-8B", "h100", "h100_dgx"
REV = "0" * 40   # the snapshot's name; any 40 hex digits that refs/main repeats

# The real tables, where they go under --vidur-profiles DIR, and their sha256: Vidur's
# predictor cache is keyed by its configuration only, not by these files' contents, so the
# bench checks them before it reuses a cache.
REAL = {
    "mlp.csv": ("compute/h100/meta-llama/Meta-Llama-3-8B/mlp.csv",
                "ec48771c9cf51918b89d2ccfcfb5fab4dceef4da3fcdce44c577f039b33a3352"),
    "all_reduce.csv": ("network/h100_dgx/all_reduce.csv",
                       "6d5df9bb9d4a74e490e63f68a8c788ba74e6c5eb84f034973e3bc8776aff9eb1"),
    "send_recv.csv": ("network/h100_dgx/send_recv.csv",
                      "605b758cd4791cbbd1fab8d5d990463b237346e9365823d768299368fc50c4c9"),
}
ATTENTION_SHA256 = "93531e72d0d5577c8551840f9fe643e890cb73764e0fac3e7585fd6d8ff460df"
HOW_TO_GET = """\
They are Vidur's own measurements and are not on the package index. Take them from the
microsoft/vidur repository on GitHub, at commit 25e0082 (PR #56), from a clone or a fork
that has that commit:

  git clone <microsoft/vidur or a fork with commit 25e0082> vidur-src
  for f in compute/h100/meta-llama/Meta-Llama-3-8B/mlp.csv \\
           network/h100_dgx/all_reduce.csv network/h100_dgx/send_recv.csv; do
      mkdir -p DIR/$(dirname $f)
      git -C vidur-src show 25e0082:data/profiling/$f > DIR/$f
  done

then pass --vidur-profiles DIR. (A cache that another run of this bench built, with the
trained predictors in it, can be passed as --vidur-cache instead.)"""

# -- the synthetic attention table (Llama-3-8B on one H100) --------------------------------
# Shape per worker at TP 1, and the H100 SXM figures the roofline assumes.
N_EMBD, N_Q_HEAD, N_KV_HEAD, HEAD_DIM, BLOCK_SIZE = 4096, 32, 8, 128, 16
KV_BYTES = N_KV_HEAD * HEAD_DIM * 2 * 2   # K and V in bf16: bytes per token per layer
HBM_BYTES_PER_S = 2.8e12                  # achieved by decode attention
ATTN_FLOP_PER_S = 300e12                  # achieved by flash-attention prefill
DECODE_FIXED_MS, DECODE_PER_SEQ_MS = 0.008, 0.0003
PREFILL_FIXED_MS, KV_SAVE_FIXED_MS = 0.010, 0.003
OPS = ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode",
       "attn_output_reshape")
KEYS = ("n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
        "max_model_len", "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
        "attention_backend")


def _times(batch: int, chunk: int, kv: int, prefill: bool) -> dict[str, float]:
    """Milliseconds of each attention op of one layer (a roofline, not a measurement)."""
    if prefill:
        flops = 4.0 * chunk * (kv + (chunk + 1) / 2.0) * N_Q_HEAD * HEAD_DIM
        attn = PREFILL_FIXED_MS + flops / ATTN_FLOP_PER_S * 1e3 \
            + (kv + chunk) * KV_BYTES / HBM_BYTES_PER_S * 1e3
        saved = chunk
    else:
        attn = DECODE_FIXED_MS + batch * DECODE_PER_SEQ_MS \
            + batch * kv * KV_BYTES / HBM_BYTES_PER_S * 1e3
        saved = batch
    return {"attn_input_reshape": 0.0,
            "attn_kv_cache_save": KV_SAVE_FIXED_MS + saved * KV_BYTES * 2 / HBM_BYTES_PER_S * 1e3,
            "attn_prefill": attn if prefill else 0.0,
            "attn_decode": 0.0 if prefill else attn,
            "attn_output_reshape": 0.0}


def write_attention(path: Path, max_model_len: int = 4096, max_batch: int = 128) -> int:
    """Vidur's attention table over its grid (prefill chunks x context; decode batch x
    context), from `_times`; min, max, mean and median all the one value, std 0. Rows."""
    kvs = [*range(32, 1025, 32), *range(1088, max_model_len + 1, 64)]
    chunks = [32, 64, 80, 96, 112, *range(128, 1025, 32), *range(1088, max_model_len + 1, 64)]
    rows = [(1, c, kv, True) for c in chunks for kv in [0, *range(64, max_model_len - c + 1, 64)]]
    rows += [(b, 0, kv, False) for b in range(1, max_batch + 1) for kv in kvs]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"time_stats.{op}.{s}" for op in OPS
                    for s in ("min", "max", "mean", "median", "std")] + list(KEYS))
        for batch, chunk, kv, prefill in rows:
            t = _times(batch, chunk, kv, prefill)
            stats = [x for op in OPS for x in (*[round(t[op], 6)] * 4, 0.0)]
            w.writerow(stats + [N_EMBD, N_Q_HEAD, N_KV_HEAD, BLOCK_SIZE, 1, max_model_len,
                                batch, chunk, kv, prefill, "AttentionBackend.SYNTHETIC_ROOFLINE"])
    return len(rows)


# -- the offline dataset cache ---------------------------------------------------------------

def snapshot(cache: Path, kind: str, dataset: str) -> Path:
    return cache / "profiling_data" / kind / ("datasets--" + dataset.replace("/", "--")) \
        / "snapshots" / REV


def sha256(path: Path, xz: bool = False) -> str:
    opener = lzma.open if xz else open
    with opener(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def missing_inputs(profiles: Path) -> list[str]:
    """The real tables that DIR lacks, as DIR/relative paths."""
    return [str(profiles / rel) for rel, _ in REAL.values() if not (profiles / rel).is_file()]


def cache_ready(cache: Path) -> bool:
    names = {"compute": ("mlp.csv.xz", "attention.csv.xz", "config.json"),
             "network": ("all_reduce.csv.xz", "send_recv.csv.xz", "config.json")}
    return all((snapshot(cache, kind, ds) / n).is_file()
               for kind, ds in (("compute", COMPUTE_DATASET), ("network", NETWORK_DATASET))
               for n in names[kind])


def cache_differences(cache: Path) -> list[str]:
    """The tables in the cache that are not the ones this bench's numbers were taken with."""
    out = []
    for name, (_, digest) in REAL.items():
        kind = "compute" if name == "mlp.csv" else "network"
        ds = COMPUTE_DATASET if kind == "compute" else NETWORK_DATASET
        if sha256(snapshot(cache, kind, ds) / f"{name}.xz", xz=True) != digest:
            out.append(name)
    attn = snapshot(cache, "compute", COMPUTE_DATASET) / "attention.csv.xz"
    if sha256(attn, xz=True) != ATTENTION_SHA256:
        out.append("attention.csv")
    return out


def _put(cache: Path, kind: str, dataset: str, files: dict[str, Path], config: dict) -> None:
    root = cache / "profiling_data" / kind / ("datasets--" + dataset.replace("/", "--"))
    shutil.rmtree(root, ignore_errors=True)
    snap = snapshot(cache, kind, dataset)
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REV)
    for name, src in files.items():
        with open(src, "rb") as fi, lzma.open(snap / f"{name}.xz", "wb") as fo:
            shutil.copyfileobj(fi, fo)
    (snap / "config.json").write_text(json.dumps(config, indent=2))


def build_cache(cache: Path, profiles: Path) -> None:
    """Lay the datasets out in CACHE from the real tables under PROFILES and an attention
    table: PROFILES' own compute/h100/meta-llama/Meta-Llama-3-8B/attention.csv if it has one
    (a real measurement wins), else the synthetic one."""
    attn = profiles / "compute/h100/meta-llama/Meta-Llama-3-8B/attention.csv"
    if not attn.is_file():
        attn = cache / "synthetic-attention.csv"
        cache.mkdir(parents=True, exist_ok=True)
        write_attention(attn)
    src = {name: profiles / rel for name, (rel, _) in REAL.items()}
    _put(cache, "compute", COMPUTE_DATASET,
         {"mlp.csv": src["mlp.csv"], "attention.csv": attn},
         {"model": MODEL, "device_sku": DEVICE})
    _put(cache, "network", NETWORK_DATASET,
         {"all_reduce.csv": src["all_reduce.csv"], "send_recv.csv": src["send_recv.csv"]},
         {"sku": NETWORK})
