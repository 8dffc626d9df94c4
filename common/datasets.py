"""`vllm bench serve`'s datasets, sampled as vLLM 0.32 samples them
(vllm/benchmarks/datasets/: random.py, sharegpt.py, huggingface.py), as stepgap workloads.

- `random` (RandomDataset): each request's input length drawn uniformly from the integers
  [floor(n·(1−r)), ceil(n·(1+r))], n = --random-input-len less the tokens the tokenizer adds
  (Llama's BOS), its output length from [max(1, floor(o·(1−r))), ceil(o·(1+r))], then an offset
  per request, all from numpy's default_rng(--seed) in that order: with the same seed, the same
  lengths as vLLM's run. A --random-prefix-len prefix is shared by every request (token ids:
  the prefix the same, the rest each request's own, as vLLM's; their values are not the
  tokenizer's). The server adds the special tokens back: a prompt is prefix + input + them.
- `sharegpt` (ShareGPTDataset): a local ShareGPT JSON (--dataset-path): conversations of two or
  more turns, shuffled by Python's random.seed(--seed) unless --disable-shuffle, the first turn
  the prompt and the second the completion; pairs with a prompt or completion under 4 tokens, a
  prompt over 1024 or both over 2048 skipped (the completion's check off when
  --sharegpt-output-len fixes the outputs); oversampled with random.choice past the file's end.
  Lengths come from the model's tokenizer where one is on this machine (`find_tokenizer`),
  else from an estimate of 4 characters a token, which the run's notes name.
- `hf`: the Hugging Face datasets stepgap has lengths for: philschmid/mt-bench (vLLM's
  MTBenchDataset: the first turns, output 256 unless --hf-output-len) is the built-in `mtbench`.

Nothing is downloaded: a dataset is a local file, or one whose lengths stepgap has.
"""

from __future__ import annotations

import functools
import math
import random
from pathlib import Path

import numpy as np

from stepgap.common.errors import UserError, where
from stepgap.common.formats import TraceRequest

# vLLM's `--dataset-name` values; those stepgap samples, and a line for the rest.
MODELLED = ("random", "sharegpt", "hf", "prefix_repetition", "generated-shared-prefix",
            "multi-turn")
VLLM_DATASETS = ("sharegpt", "burstgpt", "sonnet", "random", "random-mm", "random-rerank", "hf",
                 "custom", "prefix_repetition", "spec_bench", "txt-slices")
HF_DATASETS = {"philschmid/mt-bench": "mtbench"}   # id -> the built-in with its lengths
CHARS_PER_TOKEN = 4.0   # the estimate without a tokenizer: OpenAI's rule of thumb for English
DEFAULT_VOCAB = 32000


def check_dataset_name(name: str, path: str | None) -> None:
    """One line for a --dataset-name stepgap does not sample, or a dataset it has no lengths
    for; what to give instead."""
    instead = ("give the run's requests instead: --dataset-path RESULT.json (a `vllm bench serve "
               "--save-result --save-detailed` file of that dataset) or a trace of JSON lines "
               "{request_id, arrival_s, prompt_len, output_len}, without --dataset-name")
    if name not in MODELLED:
        what = "a vLLM dataset stepgap does not sample" if name in VLLM_DATASETS else \
            "not a dataset of `vllm bench serve`"
        raise UserError(f"--dataset-name {name}: {what} (stepgap: {', '.join(MODELLED)}); "
                        + instead)
    if name == "hf" and path is None:
        raise UserError("--dataset-name hf needs --dataset-path, the dataset's id (stepgap has "
                        f"the lengths of {', '.join(HF_DATASETS)})")
    if name == "hf" and path not in HF_DATASETS:
        raise UserError(f"--dataset-name hf --dataset-path {path}: stepgap has the lengths of "
                        f"{', '.join(HF_DATASETS)} only (nothing is downloaded); " + instead)
    if name == "random" and path is not None:   # vLLM refuses it too
        raise UserError(f"--dataset-name random with --dataset-path {path}: random makes its "
                        "own prompts; give --dataset-name for the file (e.g. sharegpt)")


# ---------------------------------------------------------------------------------------------
# random


def random_lengths(num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                   special: int, vocab_size: int, rng) -> tuple[np.ndarray, ...]:
    """vLLM's RandomDataset.get_sampling_params: input lengths (less the `special` tokens the
    tokenizer adds), output lengths and offsets, drawn in vLLM's order."""
    real = max(0, input_len - special)
    in_lo, in_hi = math.floor(real * (1 - range_ratio)), math.ceil(real * (1 + range_ratio))
    out_lo = max(math.floor(output_len * (1 - range_ratio)), 1)
    out_hi = max(math.ceil(output_len * (1 + range_ratio)), 1)
    inputs = rng.integers(in_lo, in_hi + 1, size=num_prompts)
    outputs = rng.integers(out_lo, out_hi + 1, size=num_prompts)
    offsets = rng.integers(0, vocab_size, size=num_prompts)
    return inputs, outputs, offsets


def random_dataset(num_prompts: int = 1000, output_len: int = 128, seed: int = 0,
                   input_len: int = 1024, range_ratio: float = 0.0, prefix_len: int = 0,
                   special_tokens: int = 0, vocab_size: int = DEFAULT_VOCAB
                   ) -> list[TraceRequest]:
    """`--dataset-name random` (module docstring). Token ids only where a prefix is shared (the
    rest of a prompt is its own, which is all a prefix cache sees)."""
    if not 0 <= range_ratio < 1:
        raise UserError(f"--random-range-ratio {range_ratio}: must be in [0, 1), as vLLM takes it")
    low = prefix_len + math.floor(max(0, input_len - special_tokens) * (1 - range_ratio))
    if low < 1:
        raise UserError(f"--random-input-len {input_len}: with {special_tokens} special token(s) "
                        f"and --random-range-ratio {range_ratio:g} the shortest prompt has no "
                        "tokens; give a longer input, a prefix or a smaller ratio")
    rng = np.random.default_rng(seed)
    inputs, outputs, offsets = random_lengths(num_prompts, input_len, output_len, range_ratio,
                                              special_tokens, vocab_size, rng)
    prefix = rng.integers(0, vocab_size, size=prefix_len).tolist() if prefix_len else []
    out = []
    for i, (n, o, off) in enumerate(zip(inputs.tolist(), outputs.tolist(), offsets.tolist())):
        ids = None
        if prefix:   # the special tokens lead, as the server adds them
            ids = [0] * special_tokens + prefix + \
                ((off + i + np.arange(n)) % vocab_size).tolist()
        out.append(TraceRequest(f"random-{i}", 0.0, special_tokens + prefix_len + n, o, ids))
    return out


# ---------------------------------------------------------------------------------------------
# sharegpt


def find_tokenizer(model: str | None, tokenizer: str | None = None):
    """(the model's tokenizer, where it came from), or (None, why not): --tokenizer (a folder,
    its tokenizer.json, or a Hugging Face id already in this machine's cache), else the model's
    folder (beside its config.json), else the model's id (a preset's, MODEL_IDS) in the cache.
    Nothing is downloaded."""
    from stepgap.common.model_presets import MODEL_IDS, hf_cache_file, preset_of
    candidates = []
    for spec in (tokenizer, model):
        if not spec:
            continue
        p = Path(spec)
        if p.is_file():
            p = p if p.name == "tokenizer.json" else p.parent / "tokenizer.json"
        elif p.is_dir():
            p = p / "tokenizer.json"
        else:
            ids = [spec] if "/" in spec else []
            preset = preset_of(spec)
            ids += [i for i, name in MODEL_IDS.items() if name == preset and i != spec]
            p = next((f for f in map(lambda i: hf_cache_file(i, "tokenizer.json"), ids) if f),
                     None)
        if p is not None and p.is_file():
            candidates.append(p)
        elif spec is tokenizer:
            raise UserError(f"--tokenizer {tokenizer}: no tokenizer.json there, nor in this "
                            "machine's Hugging Face cache (nothing is downloaded)")
    if not candidates:
        return None, (f"no tokenizer of {model} on this machine (give --tokenizer DIR with its "
                      "tokenizer.json)")
    return _load_tokenizer(str(candidates[0])), str(candidates[0])


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str):
    """A tokenizer.json, read once per process (every cell of a sweep asks for it)."""
    return read_tokenizer(path)


def read_tokenizer(path):
    """A tokenizer.json (Hugging Face `tokenizers`), or one line naming the file."""
    from tokenizers import Tokenizer
    from stepgap.common.fileio import read_text
    try:
        return Tokenizer.from_str(read_text(path))
    except Exception as e:   # tokenizers raises its own exception type
        raise UserError(f"{path}: not a tokenizer ({str(e).splitlines()[0][:100]})") from None


def special_tokens(model: str | None, tokenizer: str | None = None) -> int:
    """The tokens the model's tokenizer adds to a prompt (vLLM's num_special_tokens_to_add):
    counted with the tokenizer where there is one, else by family (Llama and DeepSeek add BOS,
    Qwen3 and gpt-oss none)."""
    tok, _ = find_tokenizer(model, tokenizer)
    if tok is not None:
        return len(tok.encode("").ids)
    if model is None:
        return 0
    from stepgap.common.model_presets import load_model_config
    return int(load_model_config(model).model_type in ("llama", "deepseek_v3"))


def _conversations(path: Path) -> list:
    from stepgap.common.fileio import read_json
    data = read_json(path)
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a ShareGPT file (a JSON list of {{\"conversations\": "
                        f"[{{\"from\", \"value\"}}, ...]}}), got {type(data).__name__}")
    out = []
    for i, entry in enumerate(data):
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue   # vLLM keeps the entries of two or more turns
        for j in (0, 1):
            if not (isinstance(conv[j], dict) and isinstance(conv[j].get("value"), str)):
                raise UserError(f"{where(path, field=f'[{i}].conversations[{j}].value')}: "
                                "expected the turn's text")
        out.append((conv[0]["value"], conv[1]["value"]))
    return out


def sharegpt_file(path: str, num_prompts: int = 1000, output_len: int | None = None,
                  seed: int = 0, shuffle: int = 1, model: str | None = None,
                  tokenizer: str | None = None) -> list[TraceRequest]:
    """`--dataset-name sharegpt --dataset-path FILE` (module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--dataset-path {path}: no such file (a ShareGPT JSON, e.g. "
                        "ShareGPT_V3_unfiltered_cleaned_split.json; nothing is downloaded)")
    pairs = _conversations(p)
    random.seed(seed)
    if shuffle:
        random.shuffle(pairs)
    tok, _ = find_tokenizer(model, tokenizer)

    def count(text: str) -> int:
        if tok is None:
            return max(1, round(len(text) / CHARS_PER_TOKEN))
        try:
            return len(tok.encode(text).ids)
        except TypeError:   # a lone surrogate (JSON's "\ud800"), which no UTF-8 text holds
            return len(tok.encode(text.encode("utf-8", "replace").decode()).ids)

    out = []
    for prompt, completion in pairs:
        if len(out) >= num_prompts:
            break
        plen = count(prompt)
        olen = count(completion) if output_len is None else output_len
        if plen < 4 or (output_len is None and olen < 4) or plen > 1024 or plen + olen > 2048:
            continue
        out.append(TraceRequest(f"sharegpt-{len(out)}", 0.0, plen, olen))
    if not out:
        raise UserError(f"--dataset-path {path}: no conversation passes vLLM's length checks "
                        "(prompt 4 to 1024 tokens, output at least 4, both at most 2048)")
    if len(out) < num_prompts:   # vLLM's maybe_oversample_requests
        random.seed(seed)
        out += [TraceRequest(f"sharegpt-{len(out) + i}", 0.0, r.prompt_len, r.output_len)
                for i, r in enumerate(random.choice(out) for _ in range(num_prompts - len(out)))]
    return out
