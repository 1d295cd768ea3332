"""One rule in one place: the seams' small shared pieces (daemons, build metadata, reports, output streams)."""

from __future__ import annotations

import time
from pathlib import Path

from sparkforge.commands import Command, Runner


def test_runner_start_detaches_a_daemon_and_appends_its_output(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    log.write_text("earlier\n")
    Runner().start(Command.of("sh", "-c", 'echo "up $WHO"', env={"WHO": "dockerd"}), log)
    deadline = time.monotonic() + 10
    while "up dockerd" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text() == "earlier\nup dockerd\n"


def test_runner_start_dry_prints_the_detached_line(tmp_path: Path) -> None:
    lines: list[str] = []
    log = tmp_path / "d.log"
    Runner(dry=True, echo=lines.append).start(Command.of("dockerd", "--host", "x y", env={"PATH": "/b"}), log)
    assert lines == [f"PATH=/b setsid dockerd --host 'x y' >{log} 2>&1 &"]
    assert not log.exists()
