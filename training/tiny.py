"""Tiny checkpoints for demos and tests: the random tiny pair of engine/tiny.py, its head distilled.

`stepgap make-tiny OUT` writes
- OUT/target: a Hugging Face Llama folder (config.json + model.safetensors; transformers loads it),
- OUT/eagle3-yuhuili: the head in the yuhuili layout (`midlayer.*`, LlamaForCausalLMEagle3),
- OUT/eagle3-speculators: the same head in the speculators layout (`layers.0.*`).

With random weights a head agrees with its target about as often as chance, so nothing would be
accepted. `distill` trains the head on the target's own greedy predictions for a few hundred
steps (seconds on a CPU): a random tiny Llama is nearly a bigram model (its residual stream is
dominated by the current token's embedding), so the head learns it well, and acceptances happen
at every draft position. The draft vocabulary is the target's most often predicted tokens, as
EAGLE-3 chooses its own from training data.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from stepgap.common.modelcfg import ModelConfig
from stepgap.engine.checkpoint import save_draft, save_target
from stepgap.engine.eagle3 import Eagle3Head
from stepgap.engine.model import Llama
from stepgap.engine.tiny import TINY_TARGET, build_tiny


@torch.no_grad()
def greedy_trajectories(target: Llama, gen: torch.Generator, seqs: int, prompt_len: int,
                        new_tokens: int):
    """Random prompts continued greedily by the target (dense path, all sequences at once).

    Returns ids [S, T], aux hidden [S*T, 3H] and the target's argmax [S, T] at every position.
    """
    v = target.cfg.vocab_size
    ids = torch.randint(0, v, (seqs, prompt_len), generator=gen)
    for _ in range(new_tokens):
        t = ids.shape[1]
        hidden, _ = target(ids.flatten(), torch.arange(t).repeat(seqs), return_aux=False)
        nxt = target.compute_logits(hidden.view(seqs, t, -1)[:, -1]).argmax(-1)
        ids = torch.cat([ids, nxt.unsqueeze(1)], dim=1)
    t = ids.shape[1]
    hidden, aux = target(ids.flatten(), torch.arange(t).repeat(seqs))
    return ids, aux, target.compute_logits(hidden).argmax(-1).view(seqs, t)


def choose_draft_vocab(pred: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """d2t offsets for the `size` target ids the target predicts most often."""
    counts = torch.bincount(pred.flatten(), minlength=vocab_size).float()
    ids = counts.argsort(descending=True, stable=True)[:size].sort().values
    return ids - torch.arange(size)


def distill(target: Llama, head: Eagle3Head, steps: int = 200, seed: int = 0,
            lr: float = 3e-3, unroll: int = 3) -> list[float]:
    """Train the head on the target's greedy trajectories; returns its top-1 agreement with
    the target at each unrolled draft step, over the last training steps.

    Step 1 is EAGLE-3's: at position p the head sees the embedding of token p+1 and the target's
    fused hidden states at p, and predicts token p+2. Steps 2..`unroll` feed the head its own
    pre-norm output back, as drafting does (a simple form of EAGLE-3's training-time test), with
    the trajectory's tokens as inputs: on a greedy trajectory they are what an accepted draft
    would have been.
    """
    gen = torch.Generator().manual_seed(seed + 7)
    ids, aux, pred = greedy_trajectories(target, gen, 64, 8, 40)
    seqs, t = ids.shape
    with torch.no_grad():
        head.d2t.copy_(choose_draft_vocab(pred, target.cfg.vocab_size, head.cfg.draft_vocab_size))
    t2d = torch.full((target.cfg.vocab_size,), -100, dtype=torch.long)  # -100: not drafted
    t2d[torch.arange(head.cfg.draft_vocab_size) + head.d2t] = \
        torch.arange(head.cfg.draft_vocab_size)
    aux = aux.view(seqs, t, -1)
    # label[j][s, p]: the target's argmax after step j+1's input, valid while the inputs along
    # the unroll are the target's own greedy tokens.
    greedy = torch.cat([torch.zeros(seqs, 1, dtype=torch.bool), ids[:, 1:] == pred[:, :-1]], 1)
    for p in target.parameters():
        p.requires_grad_(False)
    params = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    batch = 16
    n = t - unroll - 1                        # positions p with tokens up to p + unroll + 1
    pos = torch.arange(n)
    agree = [0.0] * unroll
    window = max(1, min(20, steps // 5))
    head.train()
    for step in range(steps):
        rows = torch.randint(0, seqs, (batch,), generator=gen)
        hidden = head.combine(aux[rows, :n].reshape(batch * n, -1))
        loss = 0.0
        valid = torch.ones(batch, n, dtype=torch.bool)
        for j in range(unroll):
            tok = ids[rows, 1 + j:1 + j + n]                  # input: token p + 1 + j
            label = pred[rows, 1 + j:1 + j + n]               # the target's next token
            if j:
                valid = valid & greedy[rows, 1 + j:1 + j + n]
            pre = head(tok.flatten(), (pos + j).repeat(batch), hidden)
            logits = head.draft_logits(pre)
            target_ids = torch.where(valid, t2d[label], torch.full_like(label, -100)).flatten()
            loss = loss + torch.nn.functional.cross_entropy(logits.float(), target_ids,
                                                            ignore_index=-100)
            if step >= steps - window:
                with torch.no_grad():
                    best = logits.argmax(-1)
                    hit = ((best + head.d2t[best]) == label.flatten())[valid.flatten()]
                    agree[j] += hit.float().mean().item() / window
            hidden = pre
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return agree


def make_tiny(out, seed: int = 0, train_steps: int = 0,
              target_cfg: ModelConfig = TINY_TARGET) -> dict:
    """Write OUT/target, OUT/eagle3-yuhuili and OUT/eagle3-speculators. Returns their paths."""
    out = Path(out)
    target, head = build_tiny(target_cfg, seed)
    agreement = distill(target, head, train_steps, seed) if train_steps else None
    paths = {"target": out / "target", "eagle3-yuhuili": out / "eagle3-yuhuili",
             "eagle3-speculators": out / "eagle3-speculators"}
    save_target(target, paths["target"])
    save_draft(head, paths["eagle3-yuhuili"], "yuhuili")
    head.cfg = replace(head.cfg, layout="speculators")
    save_draft(head, paths["eagle3-speculators"], "speculators")
    return {**{k: str(v) for k, v in paths.items()}, "agreement": agreement}
