"""The trained pair (checkpoints/pystdlib: target/, eagle3/, heldout.jsonl) and its two traces.

Judged runs use the held-out prompts (cut from stdlib files the pair never trained on);
calibration runs use prompts cut from the corpus's *training* files, so that what a simulation
is judged on is never what it was fitted on (docs/explanation/validation.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from stepgap.common.errors import UserError
from stepgap.common.fileio import read_json_object
from stepgap.common.formats import TraceRequest, load_trace

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "checkpoints" / "pystdlib"


def pair_paths(pair) -> dict:
    pair = Path(pair)
    paths = {"target": pair / "target", "eagle3": pair / "eagle3",
             "heldout": pair / "heldout.jsonl"}
    for name, path in paths.items():
        if not path.exists():
            raise UserError(f"{path}: missing (the pair's {name}; `stepgap train {pair}` "
                            "makes it)")
    return {k: str(v) for k, v in paths.items()}


def load_heldout(pair, num_prompts: int | None = None) -> list[TraceRequest]:
    reqs = load_trace(pair_paths(pair)["heldout"])
    return reqs[:num_prompts] if num_prompts else reqs


def calibration_trace(pair, num_prompts: int, seed: int = 1) -> list[TraceRequest]:
    """Prompts cut from the corpus's *training* files (never the held-out ones the judged trace
    comes from), tokenized with the pair's tokenizer, lengths as the held-out trace's."""
    from stepgap.engine.tokenizer import load_tokenizer
    from stepgap.training.corpus import heldout_trace, split

    paths = pair_paths(pair)
    log = Path(pair) / "train.json"
    info = read_json_object(log, "the pair's training log") if log.is_file() else {}
    cfg = info.get("config") or {}
    lo, hi = cfg.get("prompt_len", (64, 128))
    out = cfg.get("output_len", (64, 128))
    _, train, _ = split()
    files = train[::8]   # a spread of the training files, enough for any trace size here
    tok = load_tokenizer(paths["target"])
    reqs = heldout_trace(tok, files, num_prompts, (lo, hi), tuple(out), seed)
    return [replace(r, request_id=f"calib-{i:03d}") for i, r in enumerate(reqs)]


def shared_prefix_trace(pair=PAIR, groups: int = 6, per_group: int = 7, prefix_len: int = 64,
                        suffix_len: int = 48, output_len: int = 64) -> list[TraceRequest]:
    """Held-out prompts that share prefixes, for prefix caching: `groups` prefixes, each the first
    prefix_len tokens of one held-out prompt, each followed by the first suffix_len tokens of
    `per_group` other held-out prompts; the groups interleaved (the first prompt of every group,
    then the second, ...), so that each group's later prompts find its prefix cached. Real text
    the pair never trained on, so its acceptance is its own."""
    held = load_heldout(pair)
    if len(held) < groups * (1 + per_group):
        raise UserError(f"{pair}: {len(held)} held-out prompts, a shared-prefix trace of "
                        f"{groups} x {per_group} needs {groups * (1 + per_group)}")
    short = [r for r in held if len(r.prompt_token_ids or []) < max(prefix_len, suffix_len)]
    if short:
        raise UserError(f"{pair}: held-out prompt {short[0].request_id!r} is shorter than "
                        f"{max(prefix_len, suffix_len)} tokens")
    prefixes = [held[g].prompt_token_ids[:prefix_len] for g in range(groups)]
    out = []
    for j in range(per_group):
        for g in range(groups):
            suffix = held[groups + g * per_group + j].prompt_token_ids[:suffix_len]
            ids = prefixes[g] + suffix
            out.append(TraceRequest(f"shared-{g}-{j}", 0.0, len(ids), output_len, ids))
    return out


def write_custom_dataset(requests: list[TraceRequest], path, pair=PAIR) -> None:
    """The requests as a `vllm bench serve --dataset-name custom` file ({"prompt",
    "output_tokens", "request_id"} a line, in trace order). Every prompt's text must encode back
    to its token ids, or the benchmark would send other tokens."""
    from stepgap.common.fileio import dumps_json, write_text
    from stepgap.engine.tokenizer import load_tokenizer
    tok = load_tokenizer(pair_paths(pair)["target"])
    lines, bad = [], []
    for r in requests:
        text = tok.decode(r.prompt_token_ids)
        if tok.encode(text, add_special_tokens=False).ids != r.prompt_token_ids:
            bad.append(r.request_id)
        lines.append(dumps_json({"prompt": text, "output_tokens": r.output_len,
                                 "request_id": r.request_id}) + "\n")
    if bad:
        raise UserError(f"{path}: {len(bad)} prompts do not round-trip through the pair's "
                        f"tokenizer (the first: {bad[0]}); the bench would send other tokens")
    write_text(path, "".join(lines))   # atomically, as every output
