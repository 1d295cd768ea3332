"""An image that forges the suite's report, for real: a .pth file in the image's own interpreter registers an
atexit hook that prints a GPU-verified report (every check passed on a GB10), through a real container.

Before, the host took the last report marker and the GPU the suite named, so `verify --gpus none` of this image
recorded it GPU-verified. Now the host refuses a second marker, requires its per-run nonce, and counts only the
GPU it passed in and read itself. An image that lies in its own suite with a GPU passed in is beyond what
verify can catch (docs/trust.md): signatures and provenance take over there.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from signing_fixtures import docker_build

from sparkforge import engine
from sparkforge.errors import SparkforgeError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import load_recipe
from sparkforge.verify import verified
from sparkforge.verify.suite import VerifyOptions, verify_recorded
from tests.recipe_files import SMOKE
from tests.unit.test_evidence import GB10, passing_checks

pytestmark = pytest.mark.engine

# The forger: in every Python process of the image, at exit, print a report of a perfect GB10 run.
# `quiet` also swallows the real suite's own report, so that only the forged one is left (with the nonce).
HOOK = """
import atexit, json, os, sys
FORGED = {forged!r}
MARKER = "SPARKFORGE-CHECKS-JSON:"
if {quiet!r}:
    class _Drop:
        def __init__(self, out): self.out = out
        def write(self, text): return len(text) if MARKER in text else self.out.write(text)
        def flush(self): self.out.flush()
    sys.stdout = _Drop(sys.stdout)
def _forge():
    document = json.loads(FORGED)
    document["nonce"] = os.environ.get("SPARKFORGE_NONCE", "")
    sys.__stdout__.write(MARKER + json.dumps(document) + "\\n")
    sys.__stdout__.flush()
atexit.register(_forge)
"""


def _forging_image(base: str, folder: Path, quiet: bool) -> str:
    recipe = load_recipe(SMOKE)
    forged = json.dumps({"checks": passing_checks(), "gpu": GB10})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "forge_report.py").write_text(HOOK.format(forged=forged, quiet=quiet))
    (folder / "forge.pth").write_text("import forge_report\n")  # run at every interpreter start
    (folder / "lock.json").write_text(json.dumps({"recipe_hash": recipe.hash}))
    labels = "".join(f"LABEL {k}={json.dumps(v)}\n" for k, v in plan.labels(recipe).items())
    tag = f"sparkforge-trust-test/forged-report-{'quiet' if quiet else 'loud'}-{os.getpid()}"  # removed by the test itself
    dockerfile = (
        f"FROM {base}\nRUN python3 -m venv /opt/venv\n"
        "COPY forge_report.py forge.pth /opt/venv/lib/python3.11/site-packages/\n"
        f"COPY lock.json /opt/sparkforge/lock.json\n{labels}"
    )
    docker_build(dockerfile, "linux/amd64", tag, folder)
    return tag


@pytest.mark.parametrize("quiet", [False, True], ids=["two-markers", "only-the-forged-marker"])
def test_a_forged_report_never_makes_a_gpu_verified_record(
    base_amd64: str, tmp_path: Path, quiet: bool
) -> None:
    recipe = load_recipe(SMOKE)
    image = _forging_image(base_amd64, tmp_path / "image", quiet)
    try:
        report = verify_recorded(
            recipe, image, VerifyOptions("none", kernels=False, directory=tmp_path / "verified")
        )
    finally:
        engine.remove_image(image)
    record = verified.read_record(str(report.extra["image_id"]), tmp_path / "verified")
    assert not verified.is_gpu_verified(record, recipe.model.gpu)
    assert report.extra["gpu_verified"]["verified"] is False and report.extra["gpu"] is None
    by_name = {c.name: c for c in report.checks}
    assert by_name["gpu-host"].status == "skipped" and "no GPU was passed" in by_name["gpu-host"].reason
    if quiet:  # one marker, this run's nonce: the suite's claim is read, and ignored (no GPU was passed in)
        assert report.extra["suite_gpu"] == GB10
        assert "no GPU was used" in report.extra["gpu_verified"]["reason"]
    else:  # the suite's report and the forged one: nothing in the output is trusted
        assert (
            by_name["image-suite"].status == "failed" and "2 report markers" in by_name["image-suite"].reason
        )
        assert report.status == "failed"


def test_a_verify_that_raises_records_a_failure(base_amd64: str, tmp_path: Path) -> None:
    # Hole 4: a verify that ended in an exception wrote no record, so an earlier pass of the image stayed.
    recipe = load_recipe(SMOKE)
    image_id = str(engine.inspect_image(base_amd64)["Id"])
    earlier = {"status": "passed", "checks": passing_checks(), "gpu": GB10, "gpus": {"used": True}}
    verified.write_record(image_id, earlier, tmp_path)
    assert verified.is_gpu_verified(verified.read_record(image_id, tmp_path), recipe.model.gpu)
    before = _suite_containers(base_amd64)
    with pytest.raises(
        SparkforgeError
    ):  # the base image has no /opt/venv: the suite's container cannot start
        verify_recorded(recipe, base_amd64, VerifyOptions("none", kernels=False, directory=tmp_path))
    # A container that could not start was left behind in state Created (a fresh CI run kept one).
    assert _suite_containers(base_amd64) - before == set()
    record = verified.read_record(image_id, tmp_path)
    assert record["status"] == "failed" and "verify did not finish" in record["checks"][0]["reason"]
    assert not verified.is_gpu_verified(record, recipe.model.gpu)


def _suite_containers(image: str) -> set[str]:
    """Containers of `image` that ran (or were made to run) the in-image suite, in any state."""
    argv = ["/usr/bin/docker", "ps", "-a", "--no-trunc", "--filter", f"ancestor={image}"]
    listed = subprocess.run([*argv, "--format", "{{.ID}} {{.Command}}"], capture_output=True, text=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if "run_checks.py" in line}
