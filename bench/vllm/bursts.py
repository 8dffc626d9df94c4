"""Does the benchmark client read vLLM's stream as the server writes it? One sync k=2 server,
short runs of `vllm bench serve` with the client at normal and at real-time priority.

    python bench/vllm/bursts.py --out out/bursts        # about 2 minutes

A client that is woken late reads many SSE events in one read: their ITLs come out under 50 us (no
engine streams two steps that close), and a whole response can arrive in one burst at its end (TPOT
near 0). This prints, per client setting and concurrency, the share of such ITLs
(common/vllm_bench.bursty_share) and the run's mean TPOT and ITL. docs/explanation/vllm.md has what
it showed on this VM, and why bench/vllm/measure.py runs the client at SCHED_FIFO 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measure as M  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bursts")
    ap.add_argument("--venv", default=str(M.ROOT / ".vllm"))
    ap.add_argument("--num-prompts", type=int, default=8)
    args = ap.parse_args(argv)
    from stepgap.calibrate.pair import load_heldout
    venv, out = Path(args.venv), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "heldout.jsonl"
    M.write_dataset(load_heldout(M.PAIR), data)
    cpus = {"host": 0, "worker": 1, "client": 0, "client_rt": False}
    server = M.Server(venv, "sync", 2, M.BASE_PORT + 90, out, cpus)
    rows = []
    try:
        server.wait_ready()
        M.bench(venv, server, data, 4, out, "warmup", cpus, args.num_prompts)
        for rt in (False, True, False, True):
            for conc in (1, 4):
                c = dict(cpus, client_rt=rt)
                name = f"{'rt' if rt else 'normal'}-c{conc}-{len(rows)}"
                r = M.bench(venv, server, data, conc, out, name, c, args.num_prompts)
                rows.append((rt, conc, r))
                print(f"client {'SCHED_FIFO 1' if rt else 'normal     '}  concurrency {conc}: "
                      f"{r['bursty_share']:6.1%} of ITLs under 50 us, mean TPOT "
                      f"{r['mean_tpot_ms']:.3f} ms, mean ITL {r['mean_itl_ms']:.3f} ms "
                      f"(load {r['load_avg_1m']})", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
