"""The offline bases are made once per machine and made again when what makes them changes (their inputs label,
sparkforge/imagebuild/hostsetup.py): decided against a real engine with stand-in images of a test suite's name
(an image with the current inputs is kept; one without the label is kept and says so; one with other inputs is
made again: here debootstrap is asked for a suite Debian does not have, and its failure is what proves the
attempt)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import SparkforgeError
from sparkforge.imagebuild.hostsetup import BASE_INPUTS_LABEL, base_image_name, base_inputs, build_base

pytestmark = pytest.mark.engine
SUITE = "sparkforge-test-suite"
DOCKER = "/usr/bin/docker"


@pytest.fixture
def stand_in(engine_ready: None, tmp_path: Path) -> Iterator[callable]:
    name = base_image_name("linux/amd64", SUITE)

    def make(label: str | None) -> str:
        lines = ["FROM scratch"] + ([f'LABEL {BASE_INPUTS_LABEL}="{label}"'] if label is not None else [])
        (tmp_path / "Dockerfile").write_text("\n".join(lines) + "\n")
        subprocess.run([DOCKER, "build", "-q", "-t", name, str(tmp_path)], check=True, capture_output=True,
                       env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
        return name

    yield make
    subprocess.run([DOCKER, "rmi", "--force", name], capture_output=True)


def test_a_base_with_its_inputs_is_kept_and_one_with_others_is_made_again(stand_in) -> None:
    session = Session(echo=print, runner=Runner(stream=False))
    inputs = base_inputs("linux/amd64", SUITE)
    stand_in(inputs)
    step = build_base(session, "linux/amd64", suite=SUITE)
    assert step.done.endswith(f"already exists (inputs {inputs})"), step
    stand_in(None)
    assert (
        "inputs not recorded; --force makes it again" in build_base(session, "linux/amd64", suite=SUITE).done
    )
    stand_in("0" * 16)
    with pytest.raises(SparkforgeError) as failed:
        build_base(session, "linux/amd64", suite=SUITE)  # made again: debootstrap knows no such suite
    assert "debootstrap" in str(failed.value), failed.value
    # The inputs name what makes a base: another suite or architecture is another base.
    assert base_inputs("linux/arm64", SUITE) != inputs != base_inputs("linux/amd64")
