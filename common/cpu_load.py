"""What else used the CPU during a measurement: per process from /proc, and the machine's busy
time (Linux). A timing measurement runs alone; these record how alone it was.

On this project's 2-core VMs the load average misleads (idle vLLM servers' threads push it to
30+ while their processes use about 1 % of a core), so a run records CPU time, not load.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def cpu_state(pid: int) -> tuple[str, float] | None:
    """(state letter, CPU seconds used) of a process, from /proc (Linux); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    state = cpu_state(pid)
    if state is None:
        raise OSError(f"no process {pid}")
    return state[1]


def all_cpu() -> dict[int, float]:
    """utime + stime of every process on the machine now, by pid ({} where there is no
    /proc)."""
    out = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return out
    for pid in pids:
        state = cpu_state(pid)   # None: it ended while we looked
        if state is not None:
            out[pid] = state[1]
    return out


def busy_seconds() -> float:
    """The machine's busy CPU time since boot (user, nice, system, irq, softirq; not idle,
    iowait or steal), seconds: /proc/stat's first line (0 where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class OtherCpu:
    """What every process but the measured ones used during a run: the CPU time (utime +
    stime) of each process not measured, from /proc at the start and the end (a process that
    started in between counts whole; the measuring process counts unless named), and the
    machine's busy time less the measured processes' and the waited-for children's (which also
    holds processes that ended in between, kernel threads and interrupts)."""

    def __init__(self):
        self.t0, self.procs, self.busy = time.monotonic(), all_cpu(), busy_seconds()
        self.children = os.times().children_user + os.times().children_system

    def stop(self, measured: set[int]) -> dict:
        wall = time.monotonic() - self.t0
        now, busy = all_cpu(), busy_seconds()
        mine = {p: now[p] - self.procs.get(p, 0.0) for p in measured if p in now}
        others = sum(now[p] - self.procs.get(p, 0.0) for p in now if p not in measured)
        # a child that ended (a bench client): its CPU time is ours, as a waited-for child's
        client = os.times().children_user + os.times().children_system - self.children
        residual = busy - self.busy - sum(mine.values()) - client
        return {"wall_s": round(wall, 3), "others_s": round(others, 3),
                "others_core": round(others / max(wall, 1e-9), 4),
                "residual_s": round(residual, 3), "client_s": round(client, 3),
                "measured_s": round(sum(mine.values()), 3)}


def summary(others: list[dict], **extra) -> dict:
    """A measurement's runs' OtherCpu records in a line: how many, the median and the largest
    share of a core the other processes used, and the largest busy residual (`extra` adds
    fields: a limit, reruns)."""
    import statistics
    cores = sorted(o["others_core"] for o in others)
    return {"runs": len(others),
            "median_core": round(statistics.median(cores), 4) if cores else None,
            "max_core": round(max(cores), 4) if cores else None,
            "residual_max_core": round(max(o["residual_s"] / max(o["wall_s"], 1e-9)
                                           for o in others), 4) if others else None,
            **extra}
