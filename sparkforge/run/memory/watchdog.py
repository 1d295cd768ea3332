"""The serve watchdog: watch a node's available memory while the server runs; before the host runs out, stop the
server cleanly (SIGTERM, vLLM's own shutdown) and say why, with the server's last log lines.

On GB10 the GPU allocates from the same memory as the OS: when it is exhausted the machine freezes or resets
instead of the kernel's OOM killer ending one process (the field runs earlyoom beside vLLM for that reason).
The watchdog reads MemAvailable (from /proc/meminfo) or, for a server under a memory limit, the limit minus the
cgroup's usage, every `interval` seconds; below `floor` it stops the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

GiB = 1 << 30
DEFAULT_FLOOR = 4 * GiB  # below this, page cache is gone and the next allocation stalls the whole machine
DEFAULT_INTERVAL = 2.0


@dataclass(frozen=True)
class MemoryReading:
    available: int  # bytes the server may still take before the host (or its cgroup) runs out
    total: int
    swap_used: int = 0
    page_cache: int = 0
    source: str = "/proc/meminfo MemAvailable"


def parse_meminfo(text: str) -> MemoryReading:
    """/proc/meminfo -> MemAvailable, MemTotal, swap in use, page cache (Cached), in bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit():
            values[key.strip()] = int(words[0]) * (1024 if len(words) > 1 and words[1] == "kB" else 1)
    if "MemAvailable" not in values or "MemTotal" not in values:
        raise ValueError("no MemAvailable/MemTotal in /proc/meminfo")
    return MemoryReading(
        available=values["MemAvailable"],
        total=values["MemTotal"],
        swap_used=values.get("SwapTotal", 0) - values.get("SwapFree", 0),
        page_cache=values.get("Cached", 0),
    )


def parse_cgroup(usage: str, limit: str) -> MemoryReading:
    """A memory cgroup (v1 memory.usage_in_bytes/limit_in_bytes, v2 memory.current/memory.max) as a reading."""
    used = int(usage.strip())
    cap = limit.strip()
    total = int(cap) if cap.isdigit() else 1 << 62
    return MemoryReading(available=max(0, total - used), total=total, source="cgroup limit - usage")


@dataclass(frozen=True)
class WatchdogStop:
    reading: MemoryReading
    floor: int
    message: str
    last_lines: str


def watch(
    read: Callable[[], MemoryReading | None],
    stop: Callable[[], None],
    last_lines: Callable[[], str],
    *,
    floor: int = DEFAULT_FLOOR,
    interval: float = DEFAULT_INTERVAL,
    name: str = "the server",
) -> WatchdogStop | None:
    """Poll until the server is gone (`read` returns None: None is returned) or memory falls below `floor`: then
    its last log lines are kept, it is stopped, and the stop is returned with a message saying why and what to do."""
    lowest: MemoryReading | None = None
    while True:
        reading = read()
        if reading is None:
            return None
        if lowest is None or reading.available < lowest.available:
            lowest = reading
        if reading.available < floor:
            lines = last_lines()
            stop()
            message = (
                f"watchdog: {reading.source} fell to {reading.available / GiB:.2f} GiB of {reading.total / GiB:.2f} "
                f"GiB (floor {floor / GiB:.2f} GiB, swap in use {reading.swap_used / GiB:.2f} GiB): {name} was "
                "stopped cleanly before the host ran out of memory; fix: lower gpu-memory-utilization, "
                "max-model-len or max-num-seqs ('invoke memory' shows the plan), or free the host's memory; "
                "--watchdog off serves unguarded"
            )
            return WatchdogStop(reading, floor, message, lines)
        time.sleep(interval)
