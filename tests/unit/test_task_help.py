"""`invoke --help TASK` for every task `invoke --list` names: each flag reads `-x VALUE, --long=VALUE` or
`--long=VALUE`, never an empty short flag (`--=STRING, --cache-dir=STRING` once, from Invoke's auto short flags)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Program

ROOT = Path(__file__).resolve().parents[2]


def _every_task() -> list[str]:
    listed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(ROOT), "--list", "--list-format", "flat"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    # `  name [(alias)]  help`; a wrapped help line is indented deeper
    return [
        line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ") and line[2] != " "
    ]


def test_the_list_names_the_tasks_with_the_flags_once_broken() -> None:
    names = _every_task()
    assert {"conform", "cluster.doctor", "serve.serve", "sign.tuf-timestamp", "build"} <= set(names), names


def test_no_task_shows_an_empty_short_flag(capsys: pytest.CaptureFixture[str]) -> None:
    bad = {}
    for name in _every_task():
        Program().run(["invoke", "--search-root", str(ROOT), "--help", name], exit=False)
        shown = capsys.readouterr().out
        assert "--" in shown, (name, shown)  # the help itself was printed, flags and all
        flags = [
            line for line in shown.splitlines() if "--=" in line or " -," in line or line.startswith("  -,")
        ]
        if flags:
            bad[name] = flags
    assert bad == {}
