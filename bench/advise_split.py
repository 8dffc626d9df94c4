"""Where advise's default question spends its simulations' CPU: each simulation timed in one
process (--jobs 1), summed by mode and by whether it ran live (scheduled, its acceptance drawn)
or replayed a recording of another's steps (sim/steps.py `Recording`), and by load; and the
live runs by what else sets their steps apart (the acceptance band's ends, ...). A benchmark
for one quiet machine, not a test: docs/reports/2026-12-07-simulator-speed.md reads it.

Usage: python bench/advise_split.py
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stepgap.sim.loop as loop  # noqa: E402
from advise_speed import QUESTION  # noqa: E402


def main() -> int:
    runs, cpu, steps = Counter(), defaultdict(float), Counter()
    live: list[dict] = []
    simulate = loop.simulate

    def timed(cfg, requests=None, recording=None, **kw):
        replayed = recording is not None and recording.totals is not None
        c0 = time.process_time()
        res = simulate(cfg, requests, recording=recording, **kw)
        key = (cfg.mode, "replayed" if replayed else "live", cfg.max_concurrency)
        if not replayed:
            live.append(cfg.to_dict())
        runs[key] += 1
        cpu[key] += time.process_time() - c0
        steps[key] += res[0].plan.num_steps
        return res
    loop.simulate = timed   # (advise's Cells import it from sim/loop.py at each run)
    from stepgap.cli import main as cli
    question = list(QUESTION)
    question[question.index("--jobs") + 1] = "1"
    question.append("--no-next-run")
    t0 = time.process_time()
    if cli(question):
        return 1
    total = sum(cpu.values())
    print(f"advise's default question in one process: {time.process_time() - t0:.1f} s CPU, "
          f"{total:.1f} s of it in {sum(runs.values())} simulations")
    print(f"\n{'mode':<13}{'how':<10}{'runs':>6}{'steps':>10}{'CPU s':>8}{'share':>7}"
          f"{'us/step':>9}")
    for mode in ("sync", "async", "zero-bubble"):
        for how in ("live", "replayed"):
            keys = [k for k in cpu if k[:2] == (mode, how)]
            if keys:
                c, n = sum(cpu[k] for k in keys), sum(steps[k] for k in keys)
                print(f"{mode:<13}{how:<10}{sum(runs[k] for k in keys):>6}{n:>10}{c:>8.1f}"
                      f"{100 * c / total:>6.0f}%{1e6 * c / n:>9.1f}")
    print(f"\n{'concurrency':<13}{'steps':>10}{'CPU s':>8}{'share':>7}{'us/step':>9}")
    for conc in sorted({k[2] for k in cpu}):
        keys = [k for k in cpu if k[2] == conc]
        c, n = sum(cpu[k] for k in keys), sum(steps[k] for k in keys)
        print(f"{conc:<13}{n:>10}{c:>8.1f}{100 * c / total:>6.0f}%{1e6 * c / n:>9.1f}")
    print("\nlive runs by the settings, besides mode, k and concurrency, that differ from the "
          "first's:")
    apart = Counter(", ".join(f"{k}={v}" for k, v in sorted(s.items())
                              if k not in ("mode", "k", "max_concurrency") and v != live[0][k])
                    or "none" for s in live)
    for what, n in apart.most_common():
        print(f"{n:>5}  {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
