"""The watchdog against a real process whose memory grows: stopped (SIGTERM) before its limit, with its last lines."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sparkforge.run.memory.watchdog import MemoryReading, parse_cgroup, parse_meminfo, watch
from tests.memory_grower import grower

MiB = 1 << 20
GROWER = grower(16, 0.05, 200)


def _rss(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("VmRSS:"))


def test_the_watchdog_stops_a_growing_process_before_its_limit(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    limit, floor = 400 * MiB, 150 * MiB
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", GROWER], stdout=out, stderr=subprocess.STDOUT)
    try:

        def read() -> MemoryReading | None:
            rss = _rss(proc.pid) if proc.poll() is None else None
            return None if rss is None else MemoryReading(limit - rss, limit, source="limit - VmRSS")

        start = time.monotonic()
        stopped = watch(
            read, proc.terminate, lambda: log.read_text(), floor=floor, interval=0.05, name="grower"
        )
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert stopped is not None, "the process was never stopped"
    assert proc.returncode == -15  # SIGTERM: the clean stop, not a kill
    assert stopped.reading.available < floor and stopped.reading.total - stopped.reading.available <= limit
    assert "allocated" in stopped.last_lines and "never reached the end" not in log.read_text()
    assert "stopped cleanly before the host ran out of memory" in stopped.message
    assert "gpu-memory-utilization" in stopped.message  # the fix is named
    assert time.monotonic() - start < 30


def test_a_process_that_ends_on_its_own_is_not_stopped(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "print('done')"], stdout=subprocess.DEVNULL)
    proc.wait(timeout=30)
    calls: list[str] = []
    result = watch(lambda: None, lambda: calls.append("stop"), lambda: "", floor=MiB, interval=0.01)
    assert result is None and calls == []


def test_readings_from_meminfo_and_a_cgroup() -> None:
    reading = parse_meminfo(Path("/proc/meminfo").read_text())
    assert 0 < reading.available <= reading.total
    text = "MemTotal: 1000 kB\nMemAvailable: 250 kB\nSwapTotal: 100 kB\nSwapFree: 40 kB\nCached: 30 kB\n"
    assert parse_meminfo(text) == MemoryReading(250 * 1024, 1000 * 1024, 60 * 1024, 30 * 1024)
    assert parse_cgroup("300\n", "1000\n").available == 700
    assert parse_cgroup("300", "max").total > 1 << 60  # cgroup v2 without a limit


def test_the_doctors_memory_stage_reads_each_node_against_the_plan() -> None:
    import types

    from sparkforge.report import Check
    from sparkforge.run.facts import NodeFacts
    from sparkforge.run.memory.hoststage import memory_stage

    facts_module = types.ModuleType("cluster_facts")  # the probe's own reader, as the doctor ships it
    source = (Path(__file__).parents[1] / "image" / "cluster_facts.py").read_text()
    exec(compile(source, "cluster_facts.py", "exec"), facts_module.__dict__)
    here = facts_module.meminfo()
    assert here["total"] >= here["available"] > 0
    node = NodeFacts(0, "node0", "10.0.0.1", "test", [], {}, {}, host={"memory": here})
    roomy = {"verdict": "fits", "nodes": [{"node": 0, "budget_gib": 0.01}]}
    check = Check("memory", "passed")
    memory_stage(check, [node], roomy)
    assert check.status != "failed" and "GiB available" in check.reason and "budget 0.01 GiB" in check.reason
    greedy = {"verdict": "fits", "nodes": [{"node": 0, "budget_gib": here["total"] / (1 << 30) + 1}]}
    check = Check("memory", "passed")
    memory_stage(check, [node], greedy)
    assert (
        check.status == "failed"
        and "vLLM's start check refuses less" in check.reason
        and "drop_caches" in check.reason
    )
