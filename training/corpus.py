"""The training corpus every machine has offline: the Python standard library's own source.

- `corpus_files`: the stdlib's `.py` files, sorted by relative path, without tests, vendored
  packages, generated tables and documentation blobs (`EXCLUDED_DIRS`);
- `is_heldout`: a file-level split by a hash of the relative path (one file in `HELDOUT_EVERY`),
  so the held-out files never change with the order or number of the other files;
- `train_tokenizer`: a byte-level BPE (the `tokenizers` library, as GPT-2 and Llama 3 use) trained
  on the training files; `<|endoftext|>` (id 0) separates files and is the BOS and EOS token;
- `token_stream`: the training files encoded and concatenated, one `<|endoftext|>` after each;
- `heldout_trace`: prompts cut from held-out files at seeded offsets, as a workload trace with
  `prompt_token_ids` (docs/explanation/design.md §4).

The stdlib differs between Python versions, so `fingerprint` (a hash of every file's path and
bytes) is recorded with a trained pair: equal fingerprints mean an equal corpus.
"""

from __future__ import annotations

import hashlib
import sysconfig
import zlib
from pathlib import Path

import numpy as np

from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest

EXCLUDED_DIRS = frozenset({
    "test", "tests", "site-packages", "dist-packages", "__pycache__", "idlelib", "lib2to3",
    "turtledemo", "ensurepip", "pydoc_data", "encodings", "lib-dynload"})
HELDOUT_EVERY = 20
EOT = "<|endoftext|>"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path | str | None = None) -> list[Path]:
    """The corpus's `.py` files under `root` (default: the stdlib), sorted by relative path."""
    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise UserError(f"--corpus {root}: not a directory")
    files = []
    for p in root.rglob("*.py"):
        parts = p.relative_to(root).parts
        if any(d in EXCLUDED_DIRS or d.startswith("config-") for d in parts[:-1]):
            continue
        if p.is_file():
            files.append(p)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise UserError(f"--corpus {root}: no .py files there")
    return files


def is_heldout(rel_path: str) -> bool:
    return zlib.crc32(rel_path.encode()) % HELDOUT_EVERY == 0


def split(root: Path | str | None = None) -> tuple[Path, list[Path], list[Path]]:
    """(root, training files, held-out files)."""
    root = Path(root) if root is not None else stdlib_dir()
    files = corpus_files(root)
    held = [f for f in files if is_heldout(f.relative_to(root).as_posix())]
    train = [f for f in files if not is_heldout(f.relative_to(root).as_posix())]
    if not train or not held:
        raise UserError(f"--corpus {root}: {len(files)} files give an empty training or held-out "
                        f"split (one file in {HELDOUT_EVERY} is held out); use a larger corpus")
    return root, train, held


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def fingerprint(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE of `vocab_size` tokens (id 0 is `<|endoftext|>`); deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tok.get_vocab_size() != vocab_size:
        raise UserError(f"--vocab-size {vocab_size}: the corpus only supports "
                        f"{tok.get_vocab_size()} tokens")
    return tok


def save_tokenizer(tok, folder: Path, max_length: int) -> None:
    """tokenizer.json plus the small files `transformers.AutoTokenizer` reads."""
    from stepgap.common.fileio import write_json, write_text
    write_text(folder / "tokenizer.json", tok.to_str(pretty=True))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT,
           "unk_token": None, "pad_token": None, "model_max_length": max_length,
           "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    write_json(folder / "tokenizer_config.json", cfg)


def encode_files(tok, files: list[Path]) -> list[np.ndarray]:
    encs = tok.encode_batch([read_text(f) for f in files], add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encs]


def token_stream(tok, files: list[Path]) -> np.ndarray:
    """Every file's tokens followed by `<|endoftext|>`, concatenated (int32)."""
    eot = np.asarray([tok.token_to_id(EOT)], dtype=np.int32)
    return np.concatenate([x for ids in encode_files(tok, files) for x in (ids, eot)])


def heldout_trace(tok, files: list[Path], num_prompts: int, prompt_len: tuple[int, int],
                  output_len: tuple[int, int], seed: int) -> list[TraceRequest]:
    """Prompts of held-out code at seeded offsets, one file after another, round robin.

    Each prompt is `prompt_len` (inclusive range) tokens from a file long enough to hold it;
    output lengths are drawn from `output_len`. All requests arrive at time 0.
    """
    rng = np.random.default_rng(seed)
    lo, hi = prompt_len
    docs = [ids for ids in encode_files(tok, files) if len(ids) >= hi]
    if not docs:
        raise UserError(f"no held-out file has {hi} tokens")
    reqs = []
    for i in range(num_prompts):
        ids = docs[i % len(docs)]
        n = int(rng.integers(lo, hi + 1))
        start = int(rng.integers(0, len(ids) - n + 1))
        out = int(rng.integers(output_len[0], output_len[1] + 1))
        reqs.append(TraceRequest(f"heldout-{i:03d}", 0.0, n, out,
                                 ids[start:start + n].tolist()))
    return reqs
