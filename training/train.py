"""`stepgap train`: a small Llama target and its EAGLE-3 head, trained offline on the Python stdlib.

The pair is trained as EAGLE-3 trains its heads (arXiv 2503.01840), with the engine's own modules,
so that what is trained is exactly what the engine runs:

1. a byte-level BPE tokenizer on the training files (`training/corpus.py`);
2. the target: `engine.model.Llama` (tied embedding), next-token cross-entropy on random windows
   of the training token stream, dense causal path (no KV cache); saved in float16, and used from
   then on as saved;
3. the head's data: training prompts continued greedily by the saved target, run by the engine
   (EAGLE-3 trains on the target's own responses);
4. the head: `engine.eagle3.Eagle3Head` over the frozen target's hidden states at three layers.
   Training-time test (TTT) unrolls `ttt_steps` draft steps. Step 0 sees, at every position p,
   the fused target states fc(a_p) and the embedding of token p+1, causally over step 0's keys.
   Step j >= 1 sees the embedding of token p+j+1 and the head's own pre-norm output of step j-1
   at the same base p, at position p+j, and attends to step 0's keys at positions <= p plus its
   own keys of steps 1..j: the draft KV cache the engine holds when it drafts from position p.
   The loss is sum_j decay^j * soft-CE(target distribution over the draft vocabulary at p+j+1,
   draft distribution), over positions whose target argmax is in the draft vocabulary;
5. the draft vocabulary is the `draft_vocab_size` most frequent tokens of the head's training
   data, with `d2t` (and `t2d` in the file), as EAGLE-3 chooses its own.

`ttt_layer` mirrors `Eagle3Layer.forward` with the TTT attention; `tests/test_train.py` checks that
its steps equal the head run the engine's way (step by step, dense path) to 1e-12 in float64.

Outputs: OUT/target, a Hugging Face Llama folder with the tokenizer; OUT/eagle3, the head in the
yuhuili layout (it shares the target's embedding, so it does not store one); both float16.
OUT/heldout.jsonl, prompts from the held-out files as a workload trace; OUT/train.json, the log.
Deterministic for a given seed, corpus and torch build: fixed seeds, deterministic algorithms, one
stream of random numbers for all sampling.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from stepgap.training import corpus
from stepgap.engine.checkpoint import load_target, save_draft, save_target
from stepgap.engine.eagle3 import Eagle3Head
from stepgap.engine.model import Llama, init_weights
from stepgap.common.errors import UserError
from stepgap.common.fileio import read_json, write_json
from stepgap.common.limits import is_int
from stepgap.common.formats import save_trace
from stepgap.common.model_heads import EagleHeadConfig, eagle3_for
from stepgap.common.modelcfg import ModelConfig


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything that decides the trained pair (besides the corpus)."""

    seed: int = 0
    vocab_size: int = 4096
    seq_len: int = 256
    # target
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    target_steps: int = 450
    target_batch: int = 16
    target_lr: float = 3e-3
    # head
    draft_vocab_size: int = 2048
    aux_layers: tuple[int, int, int] = (1, 3, 5)
    head_steps: int = 240
    head_batch: int = 8
    head_lr: float = 3e-3
    ttt_steps: int = 6
    ttt_decay: float = 0.8
    distill_seqs: int = 1024
    distill_prompt_len: tuple[int, int] = (32, 128)
    distill_batch: int = 256
    warmup: int = 30
    # the held-out workload
    heldout_prompts: int = 48
    prompt_len: tuple[int, int] = (64, 128)
    output_len: tuple[int, int] = (64, 128)

    def __post_init__(self):
        for f in ("vocab_size", "seq_len", "hidden_size", "num_layers", "num_heads",
                  "num_kv_heads", "intermediate_size", "target_steps", "target_batch",
                  "draft_vocab_size", "head_steps", "head_batch", "ttt_steps", "distill_seqs",
                  "distill_batch", "heldout_prompts"):
            v = getattr(self, f)
            if not is_int(v) or v < 1:
                raise UserError(f"train: {f} must be an integer >= 1, got {v!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise UserError(f"train: seed must be an integer >= 0, got {self.seed!r}")
        if self.draft_vocab_size > self.vocab_size:
            raise UserError(f"train: draft_vocab_size ({self.draft_vocab_size}) exceeds "
                            f"vocab_size ({self.vocab_size})")
        if len(self.aux_layers) != 3 or len(set(self.aux_layers)) != 3 or \
                not all(0 <= i < self.num_layers for i in self.aux_layers):
            raise UserError(f"train: aux_layers must be three distinct layers of "
                            f"{self.num_layers}, got {self.aux_layers}")
        if self.ttt_steps >= self.seq_len:
            raise UserError(f"train: ttt_steps ({self.ttt_steps}) must be < seq_len")
        if not 0 < self.ttt_decay <= 1:
            raise UserError(f"train: ttt_decay must be in (0, 1], got {self.ttt_decay}")
        for f in ("target_lr", "head_lr"):
            if not getattr(self, f) > 0:
                raise UserError(f"train: {f} must be > 0, got {getattr(self, f)}")
        for f in ("prompt_len", "output_len", "distill_prompt_len"):
            lo, hi = getattr(self, f)
            if not 1 <= lo <= hi:
                raise UserError(f"train: {f} must be a range lo <= hi of lengths >= 1")
        if self.distill_prompt_len[1] >= self.seq_len:
            raise UserError("train: distill_prompt_len must leave room for a continuation")
        if self.prompt_len[1] + self.output_len[1] > self.seq_len:
            raise UserError("train: held-out prompt + output lengths exceed seq_len")

    def target_config(self) -> ModelConfig:
        return ModelConfig(
            "pystdlib-llama", hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
            rope_theta=10000.0, max_position_embeddings=self.seq_len, tie_word_embeddings=True,
            torch_dtype="float16", bos_token_id=0, eos_token_id=0)

    def draft_config(self) -> EagleHeadConfig:
        base = eagle3_for(self.target_config(), self.draft_vocab_size, "pystdlib-eagle3")
        return replace(base, aux_layer_ids=tuple(self.aux_layers))


PRESETS = {
    # The committed pair (checkpoints/pystdlib): about 8 minutes on an idle 2-core machine.
    "pystdlib": TrainConfig(),
    # Seconds: for tests of the training code itself.
    "smoke": TrainConfig(vocab_size=320, seq_len=48, hidden_size=32, num_layers=4, num_heads=2,
                         num_kv_heads=1, intermediate_size=64, target_steps=3, target_batch=2,
                         draft_vocab_size=160, aux_layers=(1, 2, 3), head_steps=3, head_batch=2,
                         ttt_steps=3, distill_seqs=6, distill_prompt_len=(8, 16),
                         distill_batch=4, warmup=1, heldout_prompts=3, prompt_len=(8, 16),
                         output_len=(8, 16)),
}


# -- data ---------------------------------------------------------------------------------------


def windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` random windows of `length` tokens of the stream: [batch, length]."""
    starts = torch.randint(0, len(stream) - length + 1, (batch,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def draft_vocab(tokens: np.ndarray, vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """The most frequent of `tokens`, ascending ids; ties go to the smaller id."""
    counts = np.bincount(tokens, minlength=vocab_size)
    top = np.argsort(-counts, kind="stable")[:draft_vocab_size]
    return torch.from_numpy(np.sort(top)).long()


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def _optimizer(params, lr: float):
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def _set_lr(opt, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def _bar(total: int, desc: str, progress: bool):
    return tqdm(total=total, desc=desc, disable=not progress, dynamic_ncols=True,
                mininterval=0.5, leave=True)


# -- the target ---------------------------------------------------------------------------------


def train_target(model: Llama, stream: torch.Tensor, cfg: TrainConfig, gen: torch.Generator,
                 progress: bool = True) -> list[float]:
    """Next-token cross-entropy on random windows; returns the loss of every step."""
    params = list(model.parameters())
    opt = _optimizer(params, cfg.target_lr)
    pos = torch.arange(cfg.seq_len).repeat(cfg.target_batch)
    losses = []
    model.train()
    with _bar(cfg.target_steps, "target", progress) as bar:
        for step in range(cfg.target_steps):
            _set_lr(opt, lr_at(step, cfg.target_steps, cfg.target_lr, cfg.warmup))
            x = windows(stream, cfg.target_batch, cfg.seq_len + 1, gen)
            hidden, _ = model(x[:, :-1].flatten(), pos, return_aux=False)
            loss = F.cross_entropy(model.compute_logits(hidden), x[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
            bar.update()
    model.eval()
    return losses


# -- the head: training-time test ---------------------------------------------------------------


def ttt_attention(attn, positions: torch.Tensor, x: torch.Tensor, cache: list, b: int,
                  t: int, causal: torch.Tensor) -> torch.Tensor:
    """The head's attention at one TTT step over [b, t] base positions (flattened in x).

    cache[0] holds step 0's keys and values (every position, causal); cache[i >= 1] the keys
    and values of step i at each base position, which only that base position sees (its own
    draft KV). This step's keys and values are appended. Returns o_proj's output [b * t, H].
    """
    n = x.shape[0]
    h, hkv, d = attn.h, attn.hkv, attn.d
    g = h // hkv
    q, k, v = attn.qkv_proj(x).split([h * d, hkv * d, hkv * d], dim=-1)
    q, k = attn.rope(positions, q.view(n, h, d), k.view(n, hkv, d))
    q = q.view(b, t, hkv, g, d).permute(0, 2, 3, 1, 4)          # [b, hkv, g, t, d]
    cache.append((k.view(b, t, hkv, d).transpose(1, 2),          # [b, hkv, t, d]
                   v.view(b, t, hkv, d).transpose(1, 2)))
    k0, v0 = cache[0]
    scores = q @ k0.unsqueeze(2).transpose(-1, -2) * attn.scale + causal   # [b, hkv, g, t, t]
    own = cache[1:]
    if own:
        kd = torch.stack([c[0] for c in own], dim=-2)            # [b, hkv, t, j, d]
        sd = (q.unsqueeze(-2) * kd.unsqueeze(2)).sum(-1) * attn.scale      # [b, hkv, g, t, j]
        scores = torch.cat([scores, sd], dim=-1)
    p = torch.softmax(scores, dim=-1)
    o = p[..., :t] @ v0.unsqueeze(2)                              # [b, hkv, g, t, d]
    if own:
        vd = torch.stack([c[1] for c in own], dim=-2)
        o = o + (p[..., t:].unsqueeze(-1) * vd.unsqueeze(2)).sum(-2)
    return attn.o_proj(o.permute(0, 3, 1, 2, 4).reshape(n, h * d))


def ttt_layer(layer, positions, embeds, hidden, cache, b, t, causal):
    """`Eagle3Layer.forward` with the TTT attention (keep the two in step)."""
    normed = layer.hidden_norm(hidden)
    residual = normed if layer.norm_before_residual else hidden
    x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
    residual = residual + ttt_attention(layer.self_attn, positions, x, cache, b, t, causal)
    return residual + layer.mlp(layer.post_attention_layernorm(residual))


def causal_bias(t: int, dtype=torch.float32) -> torch.Tensor:
    idx = torch.arange(t)
    bias = torch.zeros(t, t, dtype=dtype)
    return bias.masked_fill_(idx.view(1, t) > idx.view(t, 1), float("-inf"))


def ttt_unroll(head: Eagle3Head, ids: torch.Tensor, aux: torch.Tensor, steps: int) -> list:
    """The head's pre-norm outputs of `steps` TTT steps over a batch of windows.

    ids [b, t + 1] (token ids), aux [b * t, 3H] (the target's aux states at positions 0..t-1).
    Step j's output at base p is the draft state after the inputs x_{p+1} .. x_{p+j+1}; its
    logits predict x_{p+j+2}. Returns a list of [b * t, H] tensors.
    """
    b, t = ids.shape[0], ids.shape[1] - 1
    causal = causal_bias(t, aux.dtype)
    base = torch.arange(t).repeat(b)
    hidden = head.combine(aux)
    cache, outs = [], []
    for j in range(steps):
        tok = F.pad(ids[:, j + 1:], (0, j))                      # token p + j + 1, 0-padded
        pre = ttt_layer(head.midlayer, base + j, head.embed_tokens(tok.flatten()), hidden,
                        cache, b, t, causal)
        outs.append(pre)
        hidden = pre
    return outs


@torch.no_grad()
def target_view(target: Llama, ids: torch.Tensor, draft_ids: torch.Tensor):
    """The frozen target over ids [b, t]: aux states [b*t, 3H], its log-distribution over the
    draft vocabulary [b, t, Vd] (renormalized), and whether its argmax is drafted [b, t]."""
    b, t = ids.shape
    hidden, aux = target(ids.flatten(), torch.arange(t).repeat(b))
    logits = target.compute_logits(hidden).float().view(b, t, -1)
    in_draft = torch.zeros(logits.shape[-1], dtype=torch.bool)
    in_draft[draft_ids] = True
    covered = in_draft[logits.argmax(-1)]
    return aux, torch.log_softmax(logits[..., draft_ids], dim=-1), covered


def ttt_loss(head: Eagle3Head, outs: list, logq: torch.Tensor, covered: torch.Tensor,
             decay: float):
    """sum_j decay^j soft-CE(target over the draft vocabulary at p+j+1, draft at step j);
    also the top-1 agreement of each step (the draft's argmax is the target's)."""
    b, t, vd = logq.shape
    total, agree = 0.0, []
    for j, pre in enumerate(outs):
        logp = torch.log_softmax(head.draft_logits(pre).float(), dim=-1).view(b, t, vd)
        tgt = F.pad(logq[:, j + 1:], (0, 0, 0, j + 1))
        mask = F.pad(covered[:, j + 1:], (0, j + 1)).float()
        ce = -(tgt.exp() * logp).sum(-1)
        denom = mask.sum().clamp(min=1.0)
        total = total + decay ** j * (ce * mask).sum() / denom
        with torch.no_grad():
            hit = (logp.argmax(-1) == tgt.argmax(-1)).float()
            agree.append(((hit * mask).sum() / denom).item())
    return total, agree


def train_head(target: Llama, head: Eagle3Head, seqs: torch.Tensor, cfg: TrainConfig,
               gen: torch.Generator, progress: bool = True) -> dict:
    """TTT training of the head on rows of `seqs` [n, seq_len + 1]; the target and the
    (shared) embedding stay frozen."""
    for p in target.parameters():
        p.requires_grad_(False)
    target.eval()
    draft_ids = torch.arange(cfg.draft_vocab_size) + head.d2t
    params = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]
    opt = _optimizer(params, cfg.head_lr)
    losses, agree = [], []
    head.train()
    with _bar(cfg.head_steps, "eagle3", progress) as bar:
        for step in range(cfg.head_steps):
            _set_lr(opt, lr_at(step, cfg.head_steps, cfg.head_lr, cfg.warmup))
            x = seqs[torch.randint(0, len(seqs), (cfg.head_batch,), generator=gen)]
            aux, logq, covered = target_view(target, x[:, :-1], draft_ids)
            outs = ttt_unroll(head, x, aux, cfg.ttt_steps)
            loss, acc = ttt_loss(head, outs, logq, covered, cfg.ttt_decay)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(loss.item())
            agree.append(acc)
            bar.set_postfix(loss=f"{losses[-1]:.3f}",
                            acc="/".join(f"{100 * a:.0f}" for a in acc[:4]), refresh=False)
            bar.update()
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    tail = agree[-max(1, len(agree) // 10):]
    return {"loss": losses, "agreement": [float(np.mean(c)) for c in zip(*tail)]}


class TokenProgress:
    """An executor wrapper that advances a progress bar by the tokens of each collected step."""

    def __init__(self, ex, bar):
        self.ex, self.bar = ex, bar

    def configure(self, run):
        self.ex.configure(run)

    def execute(self, msg):
        return self.ex.execute(msg)

    def collect(self, handle):
        res = self.ex.collect(handle)
        self.bar.update(min(sum(map(len, res.sampled.values())), self.bar.total - self.bar.n))
        return res


def greedy_sequences(target_dir, stream: torch.Tensor, cfg: TrainConfig, gen: torch.Generator,
                     progress: bool = True) -> torch.Tensor:
    """Training prompts continued greedily by the saved target, run by the engine itself:
    [distill_seqs, seq_len + 1]. EAGLE-3 trains its heads on the target's own responses; here
    they are what drafting at temperature 0 sees, so a step whose earlier drafts were accepted
    trains on exactly the inputs it will get."""
    from stepgap.common.formats import TraceRequest
    from stepgap.common.scheduler import cdiv
    from stepgap.engine.args import EngineArgs
    from stepgap.engine.loop import run_trace

    n, t = cfg.distill_seqs, cfg.seq_len + 1
    lo, hi = cfg.distill_prompt_len
    lens = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    starts = torch.randint(0, len(stream) - hi + 1, (n,), generator=gen).tolist()
    reqs = [TraceRequest(f"d{i}", 0.0, p, t - p, stream[s:s + p].tolist())
            for i, (p, s) in enumerate(zip(lens, starts))]
    ea = EngineArgs(model=str(target_dir), dtype="float32",
                    num_gpu_blocks_override=cfg.distill_batch * cdiv(t + 1, 16),
                    max_model_len=t + 1, max_num_seqs=cfg.distill_batch)
    setup = ea.create_engine_config()
    ecfg = setup.engine_config()
    seqs = []
    with _bar(sum(r.output_len for r in reqs), "greedy", progress) as bar:
        ex = TokenProgress(setup.make_executor(), bar)
        # In waves of one batch: every prefill runs first, then decode steps only. Continuous
        # batching would put prefills next to decodes, which the padded query grid makes slow.
        for i in range(0, n, cfg.distill_batch):
            wave = reqs[i:i + cfg.distill_batch]
            out = run_trace(ex, wave, ecfg, vocab_size=cfg.vocab_size)
            seqs += [r.prompt_token_ids + out.output_token_ids[r.request_id] for r in wave]
    return torch.tensor(seqs)


def build_head(target: Llama, cfg: TrainConfig, data: np.ndarray) -> Eagle3Head:
    """A random head whose draft vocabulary is the most frequent tokens of its training data
    `data` and whose output layer starts from the target's rows of them."""
    dcfg = cfg.draft_config()
    head = Eagle3Head(dcfg, target.cfg.hidden_size, max_positions=cfg.seq_len + cfg.ttt_steps)
    init_weights(head, seed=cfg.seed + 1)
    head.embed_tokens = target.embed_tokens
    ids = draft_vocab(data.ravel(), cfg.vocab_size, cfg.draft_vocab_size)
    with torch.no_grad():
        head.d2t.copy_(ids - torch.arange(cfg.draft_vocab_size))
        head.lm_head.weight.copy_(target.embed_tokens.weight[ids])
        head.norm.weight.copy_(target.norm.weight)
    return head


# -- the whole pair -----------------------------------------------------------------------------


@dataclass
class PairLog:
    config: dict
    corpus: dict
    times_s: dict = field(default_factory=dict)
    target: dict = field(default_factory=dict)
    head: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)


def save_target_folder(out: Path, target: Llama, tok, cfg: TrainConfig) -> dict:
    """OUT/target: a Hugging Face Llama folder (float16) with the tokenizer."""
    folder = out / "target"
    save_target(copy.deepcopy(target).half(), folder)
    corpus.save_tokenizer(tok, folder, cfg.seq_len)
    gen_cfg = {"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}
    write_json(folder / "generation_config.json", gen_cfg)
    return {"target": str(folder)}


def save_head_folder(out: Path, head: Eagle3Head, cfg: TrainConfig) -> str:
    """OUT/eagle3: the head in the yuhuili layout (float16), without the shared embedding."""
    folder = out / "eagle3"
    embed, head.embed_tokens = head.embed_tokens, None
    try:
        save_draft(copy.deepcopy(head).half(), folder, "yuhuili", cfg.aux_layers)
    finally:
        head.embed_tokens = embed
    cfg_path = folder / "config.json"
    d = read_json(cfg_path)
    d["torch_dtype"] = "float16"
    write_json(cfg_path, d)
    return str(folder)


def train_pair(out, cfg: TrainConfig = TrainConfig(), corpus_dir=None, threads: int | None = None,
               progress: bool = True, log=print) -> dict:
    """Tokenizer, target, head, held-out trace; everything written under OUT."""
    out = Path(out)
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    times = {}
    try:
        root, train_files, held_files = corpus.split(corpus_dir)
        log(f"corpus: {root}: {len(train_files)} training files, {len(held_files)} held out")
        t = time.perf_counter()
        tok = corpus.train_tokenizer([corpus.read_text(f) for f in train_files], cfg.vocab_size)
        stream_np = corpus.token_stream(tok, train_files)
        times["tokenizer"] = time.perf_counter() - t
        log(f"tokenizer: {cfg.vocab_size} tokens, {len(stream_np):,} training tokens "
            f"({times['tokenizer']:.0f} s)")
        stream = torch.from_numpy(stream_np.astype(np.int64))
        if len(stream) <= cfg.seq_len + 1:
            raise UserError(f"the corpus holds {len(stream)} tokens, fewer than seq_len "
                            f"{cfg.seq_len} + 1")
        tcfg = cfg.target_config()
        target = Llama(tcfg, tuple(cfg.aux_layers), max_positions=cfg.seq_len + cfg.ttt_steps)
        init_weights(target, seed=cfg.seed)
        t = time.perf_counter()
        target_losses = train_target(target, stream, cfg, gen, progress)
        times["target"] = time.perf_counter() - t
        log(f"target: {sum(p.numel() for p in target.parameters()):,} parameters, loss "
            f"{np.mean(target_losses[-20:]):.3f} ({times['target']:.0f} s)")
        # The head learns the target as the engine runs it: the saved (float16) weights.
        paths = save_target_folder(out, target, tok, cfg)
        target, _ = load_target(paths["target"], torch.device("cpu"), torch.float32,
                                cfg.seq_len + cfg.ttt_steps, tuple(cfg.aux_layers))
        t = time.perf_counter()
        seqs = greedy_sequences(paths["target"], stream, cfg, gen, progress)
        times["greedy"] = time.perf_counter() - t
        log(f"greedy: {len(seqs)} training prompts continued by the target "
            f"({times['greedy']:.0f} s)")
        head = build_head(target, cfg, seqs.numpy())
        t = time.perf_counter()
        head_log = train_head(target, head, seqs, cfg, gen, progress)
        times["head"] = time.perf_counter() - t
        agree = ", ".join(f"{100 * a:.0f}%" for a in head_log["agreement"])
        log(f"eagle3: {head.cfg.num_params:,} parameters (without the shared embedding), loss "
            f"{np.mean(head_log['loss'][-20:]):.3f}, top-1 agreement at steps "
            f"0..{cfg.ttt_steps - 1}: {agree} ({times['head']:.0f} s)")
        paths["eagle3"] = save_head_folder(out, head, cfg)
        trace = corpus.heldout_trace(tok, held_files, cfg.heldout_prompts, cfg.prompt_len,
                                     cfg.output_len, cfg.seed)
        save_trace(out / "heldout.jsonl", trace)
        times["total_wall"] = time.perf_counter() - t_wall
        times["total_cpu"] = time.process_time() - t_cpu
        record = PairLog(
            config={**asdict(cfg)},
            corpus={"root": str(root), "train_files": len(train_files),
                    "heldout_files": [f.relative_to(root).as_posix() for f in held_files],
                    "train_tokens": int(len(stream_np)),
                    "fingerprint": corpus.fingerprint(root, train_files + held_files)},
            times_s={k: round(v, 1) for k, v in times.items()},
            target={"loss_first": target_losses[0],
                    "loss_last20": float(np.mean(target_losses[-20:])),
                    "loss_every50": target_losses[::50]},
            head={"loss_first": head_log["loss"][0],
                  "loss_last20": float(np.mean(head_log["loss"][-20:])),
                  "agreement_last10pct": head_log["agreement"],
                  "loss_every50": head_log["loss"][::50]},
            environment={"python": platform.python_version(), "torch": torch.__version__,
                         "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                         "load_avg_1m": _load_avg()})
        write_json(out / "train.json", asdict(record))
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)
    return {**paths, "heldout": str(out / "heldout.jsonl"), "log": str(out / "train.json"),
            "times": times, "agreement": head_log["agreement"]}


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
