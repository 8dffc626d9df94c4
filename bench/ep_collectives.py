"""What expert parallelism's dispatch and combine cost on the RTX PRO 6000 pair, measured or modelled.

    python bench/ep_collectives.py       # one markdown table

A MoE layer of Qwen3-30B-A3B at data parallel 2 with expert parallelism (vLLM's
allgather_reducescatter backend) all-gathers rows x (2048 + 128) bf16 over the two ranks and
reduce-scatters rows x 2048 bf16 after its experts (sim/expert_parallel.py `MoeCosts.exchange`).
This prices both, per layer, through each link the simulator may hold: the catalog's
interconnect model of the rtxpro6000 (PCIe 5: 20 us, 50 GB/s) and LLMServingSim's two
measurements of the pair's collectives (its profiler/perf/RTXPRO6000/hardware.yaml at 1b2cc02,
the one found beside the bundles, and at e08dc38).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.common.model_presets import load_model_config  # noqa: E402
from stepgap.sim.expert_parallel import MoeCosts, MoeParallel  # noqa: E402
from stepgap.sim.hardware import get_hardware  # noqa: E402
from stepgap.sim.hardware_file import load_collectives  # noqa: E402

PEERS = ROOT / "traces/peers/llmservingsim"
LINKS = {"model": get_hardware("rtxpro6000").interconnect,
         "measured (1b2cc02)": load_collectives(PEERS / "profiler/perf/RTXPRO6000/hardware.yaml"),
         "measured (e08dc38)": load_collectives(
             PEERS / "at-e08dc38/profiler/perf/RTXPRO6000/hardware.yaml")}
ROWS = (2, 16, 64, 256, 1024, 4096)


def main() -> int:
    c = load_model_config("Qwen/Qwen3-30B-A3B-Instruct-2507")
    plan = MoeParallel(dp=2, tp=1, expert_parallel=True)
    print("| rows gathered (both ranks) | " + " | ".join(
        f"{name}: all-gather + reduce-scatter us" for name in LINKS) + " |")
    print("|---" * (len(LINKS) + 1) + "|")
    for rows in ROWS:
        cells = []
        for link in LINKS.values():
            gather = link.all_gather_us(2 * rows * (c.hidden_size + c.num_experts), 2)
            scatter = link.reduce_scatter_us(2 * rows * c.hidden_size, 2)
            total = MoeCosts(c, None, plan, link).exchange(rows)
            cells.append(f"{gather:.1f} + {scatter:.1f} = {total:.1f}")
        print(f"| {rows} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
