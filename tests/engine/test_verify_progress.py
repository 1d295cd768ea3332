"""verify's wait shown: each check of the in-image suite is announced as it starts, read live from the running
container's stderr (not after it exits), and shown as stage i of N with the elapsed time.

Real: a throwaway container of the offline Debian base on the real engine writes the suite's progress lines
with pauses between them; the host's follower must hand each over while the container still runs."""

from __future__ import annotations

import subprocess
import time

import pytest

from sparkforge import engine
from sparkforge.console import Stages
from sparkforge.imagebuild.hostsetup import base_image_name
from sparkforge.verify.suite import suite_progress

SCRIPT = (
    "echo 'SPARKFORGE-PROGRESS: 1/3 registry' >&2; sleep 1.5; "
    "echo 'not a progress line' >&2; echo 'SPARKFORGE-PROGRESS: 2/3 versions' >&2; sleep 1.5; "
    "echo 'SPARKFORGE-PROGRESS: 3/3 pip-check' >&2; sleep 1.5; echo done"
)


@pytest.fixture(scope="module")
def base() -> str:
    name = base_image_name("linux/amd64")
    if subprocess.run(["/usr/bin/docker", "image", "inspect", name], capture_output=True).returncode != 0:
        pytest.skip(f"offline base {name} missing; run 'invoke engine.bases --platform linux/amd64'")
    return name


def test_each_check_is_shown_as_it_starts_while_the_container_runs(base: str) -> None:
    shown: list[tuple[float, str]] = []
    start = time.monotonic()
    with Stages(
        "verify: in-image suite", 3, live=False, echo=lambda line: shown.append((time.monotonic(), line))
    ) as stages:
        result = engine.run_container(
            base, ["-c", SCRIPT], entrypoint=["sh"], timeout_s=60, on_stderr_line=suite_progress(stages)
        )
    ended = time.monotonic()
    assert result.exit_code == 0 and result.stdout.strip() == "done", result
    lines = [line for _, line in shown]
    assert lines[:3] == [
        "verify: in-image suite: 1/3 registry (at " + lines[0].split("(at ", 1)[1],
        "verify: in-image suite: 2/3 versions (at " + lines[1].split("(at ", 1)[1],
        "verify: in-image suite: 3/3 pip-check (at " + lines[2].split("(at ", 1)[1],
    ]
    assert lines[3].startswith("verify: in-image suite: done in ")
    assert not any("not a progress line" in line for line in lines)
    # Live: the first check was shown seconds before the container ended, the stages in their real rhythm.
    first, second = shown[0][0], shown[1][0]
    assert ended - first > 3.0, (start, first, ended)
    assert 1.0 < second - first < 3.0, (first, second)
    # The elapsed time printed is the stage's start, not the end.
    assert float(lines[1].split("(at ", 1)[1].removesuffix(" s)")) >= 1.4
