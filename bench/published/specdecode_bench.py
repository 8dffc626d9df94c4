"""What this project takes from SpecDecode-Bench's published profile of Llama-3.1-8B-Instruct on
one H100 (github.com/SpecDecode-Bench/simulator, `data/llama3.1-8B/combined_<dataset>.jsonl`,
arXiv:2601.11580): the per-position acceptance rates of a chain of k drafts by dataset, and the
request lengths of the traces in bench/published/traces/.

Each request of the profile lists, for every generated position p, `acc_len[p]`: the tokens one
step starting at p emits when the proposer drafts as many tokens as it can (its accepted run plus
the target's own token). A chain of k drafts emits min(acc_len[p], k + 1) tokens and moves on by
as many, so walking each request from p = 0 gives the steps of a fixed-k run; the rate at
position i is the share of steps that accepted at least i drafts, and the acceptance length is
the tokens per step. The files are not in this repository (they stay with their source): give
the folder of a local copy.

Usage:
    python bench/published/specdecode_bench.py acceptance DATA_DIR      # the tables of acceptance.md
    python bench/published/specdecode_bench.py traces DATA_DIR OUT_DIR   # the traces' lengths
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DATASETS = {"sharegpt": "sharegpt", "cnn": "cnndailymail", "gsm8k": "gsm8k",
            "instructcoder": "instructcoder"}   # the profile's file name -> the trace's
PROPOSERS = ("acc_eagle", "acc_ngram")


def requests(data_dir: Path, name: str) -> list[dict]:
    path = data_dir / f"combined_{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def chain(acc_lens: list[list[int]], k: int) -> tuple[float, list[float]]:
    """(acceptance length, per-position rates) of a fixed chain of k drafts over the requests."""
    steps = tokens = 0
    accepted = [0] * k
    for acc in acc_lens:
        p = 0
        while p < len(acc):
            emitted = min(acc[p], k + 1)
            steps += 1
            tokens += emitted
            for i in range(emitted - 1):
                accepted[i] += 1
            p += emitted
    return tokens / steps, [a / steps for a in accepted]


def acceptance(data_dir: Path, ks=(1, 3, 5, 7)) -> None:
    for name in DATASETS:
        reqs = requests(data_dir, name)
        for proposer in PROPOSERS:
            acc = [r[proposer]["acc_len"] for r in reqs]
            for k in ks:
                length, rates = chain(acc, k)
                print(f"{name:<14}{proposer:<10} k={k}  AL {length:.3f}  rates "
                      + ", ".join(f"{r:.3f}" for r in rates))
        print(f"{name:<14}{len(reqs)} requests, mean prompt "
              f"{sum(len(r['prompt_token_ids']) for r in reqs) / len(reqs):.0f} tokens")


def traces(data_dir: Path, out: Path, first: int = 50, copies_of: int = 8,
           batch: int = 64) -> None:
    """The first `first` requests of each dataset as a trace, and the first `copies_of` of them
    `batch` times in a row (the study runs one prompt replicated batch-size times)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, trace in DATASETS.items():
        rows = [{"request_id": f"{trace}-{r['id']}", "arrival_s": 0.0,
                 "prompt_len": len(r["prompt_token_ids"]),
                 "output_len": len(r["generated_token_ids"])}
                for r in requests(data_dir, name)[:first]]
        (out / f"specdecode-bench-{trace}-{first}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
        (out / f"specdecode-bench-{trace}-{copies_of}x{batch}.jsonl").write_text(
            "".join(json.dumps({**r, "request_id": f"{r['request_id']}-{c}"}) + "\n"
                    for r in rows[:copies_of] for c in range(batch)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("acceptance")
    a.add_argument("data_dir", type=Path)
    t = sub.add_parser("traces")
    t.add_argument("data_dir", type=Path)
    t.add_argument("out_dir", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "acceptance":
        acceptance(args.data_dir)
    else:
        traces(args.data_dir, args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
