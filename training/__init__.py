"""training: the checkpoints stepgap trains itself, offline and deterministically.

- `corpus`: the Python stdlib corpus, its split, the BPE tokenizer and the held-out trace;
- `train`: the trained pair (a small Llama target and its EAGLE-3 head, training-time test);
- `tiny`: the tiny random pair with its head distilled (`stepgap make-tiny`);
- `cli`: `stepgap train`, `stepgap make-tiny`.
"""
