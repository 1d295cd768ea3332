"""The watchdog bound to a served container: its node's memory read through the engine, the stop through it too.

A container sees its host's /proc/meminfo (no lxcfs on a Spark), so `docker exec NAME cat /proc/meminfo` reads
the node's MemAvailable wherever the node is (unix://, ssh://, tcp://). A container started with a memory limit
is watched against that limit instead (cgroup v2 memory.max - memory.current, or v1's limit/usage files).
The stop is `docker stop --time 30`: SIGTERM, vLLM's own shutdown, SIGKILL only after 30 s; the stopped
container and its log stay for `serve.down`.
"""

from __future__ import annotations

from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.run.memory.watchdog import (
    DEFAULT_FLOOR,
    DEFAULT_INTERVAL,
    MemoryReading,
    WatchdogStop,
    parse_cgroup,
    parse_meminfo,
    watch,
)
from sparkforge.run.nodes import NodeEngine

CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.max"),  # v2
    ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # v1
)
STOP_GRACE_S = 30
LAST_LINES = 40


def _exec(engine: NodeEngine, container: str, *argv: str) -> tuple[int, str]:
    result = engine.runner.capture(
        engine.command("exec", container, *argv), "watchdog", check=False, timeout=20
    )
    return result.returncode, result.output


def memory_limit(engine: NodeEngine, container: str) -> int:
    """The container's memory limit in bytes (0: none)."""
    text = engine.call(
        "inspect", "inspect", "--format", "{{.HostConfig.Memory}}", container, timeout=20
    ).strip()
    return int(text) if text.isdigit() else 0


def container_reading(engine: NodeEngine, container: str, cgroup: bool) -> MemoryReading | None:
    """One reading, None once the container no longer runs."""
    if cgroup:
        for usage, limit in CGROUP_FILES:
            code, out = _exec(engine, container, "cat", usage, limit)
            if code == 0 and len(out.split()) == 2:
                return parse_cgroup(*out.split())
    else:
        code, out = _exec(engine, container, "cat", "/proc/meminfo")
        if code == 0:
            return parse_meminfo(out)
    if engine.state(container).status != "running":
        return None
    raise RunError(
        f"{engine.node.label}: the watchdog cannot read {container}'s memory: {out.strip()[-300:]}"
    )


def watch_container(
    session: Session,
    engine: NodeEngine,
    container: str,
    *,
    floor: int = DEFAULT_FLOOR,
    interval: float = DEFAULT_INTERVAL,
) -> WatchdogStop | None:
    """Watch a running server until it exits (None) or memory runs low (stopped; the stop returned)."""
    cgroup = memory_limit(engine, container) > 0
    session.echo(
        f"watchdog: watching {'the container memory limit' if cgroup else 'MemAvailable'} of {container} on "
        f"{engine.node.label} every {interval:g} s (floor {floor / (1 << 30):.2f} GiB); Ctrl-C stops watching and "
        "leaves the server running"
    )
    stopped = watch(
        lambda: container_reading(engine, container, cgroup),
        lambda: engine.call(
            "stop", "stop", "--time", str(STOP_GRACE_S), container, timeout=STOP_GRACE_S + 30
        ),
        lambda: engine.logs(container, tail=LAST_LINES),
        floor=floor,
        interval=interval,
        name=f"the server {container}",
    )
    if stopped is not None:
        session.echo(stopped.message)
    return stopped
