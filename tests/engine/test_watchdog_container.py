"""The serve watchdog against a real container under a memory limit: stopped cleanly (docker stop) before the limit,
with a clear message and the container's last log lines. Cheap: the offline Debian base image, seconds."""

from __future__ import annotations

import subprocess

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.run.memory.serving import watch_container
from sparkforge.run.nodes import LOCAL, NodeEngine
from tests.memory_grower import grower

IMAGE = "sparkforge-base/debian-bookworm:amd64"  # built by 'invoke engine.bases' (python3 inside)
GROWER = grower(4, 0.1, 400)


def test_the_watchdog_stops_a_container_before_its_memory_limit() -> None:
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"{IMAGE} is not built here ('invoke engine.bases')")
    name = "sparkforge-test-watchdog"
    subprocess.run(["docker", "rm", "--force", name], capture_output=True)
    subprocess.run(
        ["docker", "run", "--detach", "--init", "--name", name, "--memory", "256m", "--memory-swap", "256m",
         "--network", "none", IMAGE, "python3", "-c", GROWER],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        engine = NodeEngine(LOCAL)
        stopped = watch_container(
            Session(echo=print, runner=Runner(stream=False)), engine, name, floor=96 << 20, interval=0.2
        )
        state = engine.state(name)
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True)
    assert stopped is not None, "the container ended before the watchdog stopped it"
    assert (
        state.status == "exited" and state.exit_code == 143
    )  # SIGTERM from docker stop (through --init), not the OOM killer's 137
    assert stopped.reading.source == "cgroup limit - usage" and stopped.reading.available < 96 << 20
    assert "allocated" in stopped.last_lines
    assert "stopped cleanly before the host ran out of memory" in stopped.message
