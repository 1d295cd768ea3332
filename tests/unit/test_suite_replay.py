"""The in-image suite's run, replayable by hand: the script beside its log is the container verify started."""

from __future__ import annotations

import shlex
from pathlib import Path

from sparkforge.verify.suite import SuiteRun, _save_replay


def test_the_replay_script_is_the_suite_run(tmp_path: Path) -> None:
    run = SuiteRun(
        "img:1",
        ["/suite/run_checks.py", "--nonce", "n 1"],
        True,
        "linux/arm64",
        {"B": "2", "A": "1"},
        {"/host/suite": "/suite"},
    )
    _save_replay(tmp_path / "logs", run)
    script = tmp_path / "logs" / "image-suite.sh"
    assert script.stat().st_mode & 0o111
    last = script.read_text().splitlines()[-1]
    assert shlex.split(last) == [
        "docker", "run", "--rm", "--entrypoint", "/opt/venv/bin/python3", "--gpus", "all",
        "--platform", "linux/arm64", "--env", "A=1", "--env", "B=2", "--volume", "/host/suite:/suite:ro",
        "img:1", "/suite/run_checks.py", "--nonce", "n 1",
    ]  # fmt: skip
    without = SuiteRun("img:1", [], False, None, {}, {})
    _save_replay(tmp_path / "plain", without)
    assert "--gpus" not in (tmp_path / "plain" / "image-suite.sh").read_text()
