"""Overlays on the real CI wheels image (vLLM 0.33.0 from PyPI, tests/recipes/ci-wheels-amd64.yaml).

The fix applied is patches/overlay-vllm/0001-sampling-params-name-the-parameter.patch: a small Python-only vLLM
frontend change (SamplingParams' range errors name their parameter), written for these tests against vLLM 0.33.0's
installed vllm/sampling_params.py in the shape of upstream's own fixes; its header says so. The overlay recipe is
written at test time by `invoke overlay --pr N --checkout DIR` from a local git repository holding the image's own
file and that change as a squash commit, because a fresh CI machine builds the base image anew (another image ID).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import RecipeError
from sparkforge.imagebuild.overlay.build import OverlayBuildOptions, build_overlay
from sparkforge.imagebuild.overlay.model import load_overlay
from sparkforge.imagebuild.overlay.preflight import run_overlay_preflight
from sparkforge.imagebuild.overlay.write import OverlayRequest, OverlaySource, write_overlay
from sparkforge.recipe import plan
from sparkforge.recipe.loader import PATCHES_DIR, REPO_ROOT, load_recipe

pytestmark = pytest.mark.engine
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
FIX = PATCHES_DIR / "overlay-vllm" / "0001-sampling-params-name-the-parameter.patch"
OLDER = REPO_ROOT / "tests" / "overlay" / "sampling-params-older-vllm.patch"
CSRC = REPO_ROOT / "tests" / "overlay" / "csrc-and-python.patch"
SITE = "/opt/venv/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def wheels_image(base_amd64: str, canary_secrets, tmp_path_factory) -> str:
    """The CI wheels image's ID: the local candidate when present (test_build_verify built it), else built."""
    recipe = load_recipe(CI_RECIPE)
    tag = plan.candidate_tag(recipe, "linux/amd64")
    if not engine.image_exists(tag):
        from sparkforge.imagebuild.pipeline import build
        from sparkforge.imagebuild.stage import BuildOptions

        ca, token = canary_secrets
        tmp = tmp_path_factory.mktemp("wheels")
        build(recipe, BuildOptions(platform="linux/amd64", base_image=base_amd64, ca_bundle=ca,
                                   secrets=(f"id=hf_token,src={token}",), gpus="none", log_root=tmp))  # fmt: skip
    return str(engine.inspect_image(tag)["Id"])


def _session(tmp_path: Path) -> Session:
    return Session(echo=print, runner=Runner(stream=False, log_dir=tmp_path / "logs"))


def _write(tmp_path: Path, image_id: str, source: OverlaySource, name: str) -> Path:
    recipe = load_recipe(CI_RECIPE)
    base = f"sparkforge-candidate/ci-wheels-amd64@{image_id}"
    request = OverlayRequest(recipe, base, "vllm", source, name, tmp_path / f"{name}.yaml")
    written = write_overlay(_session(tmp_path), request)
    return written.path


@pytest.fixture
def cleanup_patches():
    made: list[Path] = []
    yield made
    for path in made:
        path.unlink(missing_ok=True)


def test_a_patch_that_does_not_apply_at_the_images_version_is_refused_in_seconds(
    wheels_image: str, tmp_path: Path, cleanup_patches: list[Path]
) -> None:
    name = f"ci-overlay-older-{time.time_ns()}"
    path = _write(tmp_path, wheels_image, OverlaySource(patch=OLDER), name)
    cleanup_patches.append(PATCHES_DIR / "overlay-vllm" / f"{name}.patch")
    started = time.monotonic()
    report = run_overlay_preflight(_session(tmp_path), load_overlay(path)).report
    took = time.monotonic() - started
    checks = {c.name: c for c in report.checks}
    assert report.status == "failed" and checks["apply"].status == "failed"
    assert checks["patches"].status == checks["base"].status == checks["versions"].status == "passed"
    reason = checks["apply"].reason
    assert "does not apply to vllm 0.33.0" in reason and "hunk 1" in reason and "rebase the patch" in reason
    assert took < 30, took  # measured 2 s: one created container, two files read


def test_a_csrc_patch_is_refused_before_anything_is_read(wheels_image: str, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"csrc/activation_kernels\.cu is a compiled source.*source recipe"):
        _write(tmp_path, wheels_image, OverlaySource(patch=CSRC), "ci-overlay-csrc")
    assert not (PATCHES_DIR / "overlay-vllm" / "ci-overlay-csrc.patch").exists()
    # Hand-written into an overlay file anyway: preflight refuses it, naming the file and the fix.
    sha = __import__("hashlib").sha256(CSRC.read_bytes()).hexdigest()
    target = PATCHES_DIR / "overlay-vllm" / "ci-overlay-csrc-by-hand.patch"
    target.write_bytes(CSRC.read_bytes())
    try:
        overlay = tmp_path / "by-hand.yaml"
        overlay.write_text(
            "kind: overlay\ndescription: by hand\nbase:\n"
            f"  image: sparkforge-candidate/ci-wheels-amd64@{wheels_image}\n  recipe: {CI_RECIPE}\npatches:\n"
            f"  - file: patches/overlay-vllm/{target.name}\n    package: vllm\n    sha256: {sha}\n"
        )
        report = run_overlay_preflight(_session(tmp_path), load_overlay(overlay)).report
    finally:
        target.unlink()
    checks = {c.name: c for c in report.checks}
    assert checks["patches"].status == "failed" and "use the source recipe" in checks["patches"].reason
    assert "apply" not in checks  # nothing was applied


def _git(cwd: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(cwd)}  # fmt: skip
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.mark.slow(
    cost_s=360,
    reason="an overlay of the CI wheels image built (5 s) and verified like any image (95 s), its fix run in the "
    "image (40 s), then the diff of base and overlay (both images read); measured 260 s and 362 s on this machine",
)
def test_overlay_from_a_pull_request_built_verified_and_diffed(
    wheels_image: str, tmp_path: Path, cleanup_patches: list[Path]
) -> None:
    # A local clone standing in for vLLM's: the image's own file, then the fix as a squash-merged pull request
    # that also touches an upstream test (not installed: left out).
    repo = tmp_path / "vllm"
    (repo / "vllm").mkdir(parents=True)
    (repo / "tests").mkdir()
    original = engine.read_image_files(wheels_image, [f"{SITE}/vllm/sampling_params.py"])
    (repo / "vllm" / "sampling_params.py").write_bytes(original[f"{SITE}/vllm/sampling_params.py"] or b"")
    (repo / "tests" / "test_sampling_params.py").write_text("def test_range():\n    pass\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "v0.33.0")
    _git(repo, "apply", str(FIX))
    (repo / "tests" / "test_sampling_params.py").write_text("def test_range():\n    assert True\n")
    _git(repo, "commit", "-qam", "[Frontend] name the parameter in SamplingParams range errors (#31337)")
    name = f"ci-overlay-pr-{time.time_ns()}"
    path = _write(tmp_path, wheels_image, OverlaySource(pr=31337, checkout=repo), name)
    cleanup_patches.append(PATCHES_DIR / "overlay-vllm" / f"{name}.patch")
    text = path.read_text()
    assert "Left out (not installed in the image): tests/test_sampling_params.py" in text
    overlay = load_overlay(path)

    started = time.monotonic()
    result = build_overlay(
        _session(tmp_path), overlay, OverlayBuildOptions(gpus="none", out_root=tmp_path / "build")
    )
    took = time.monotonic() - started
    assert result.verify is not None and result.verify.status == "passed", (
        result.verify and result.verify.to_dict()
    )
    checks = {c.name: c for c in result.verify.checks}
    for check in ("labels", "lock", "versions", "registry", "pip-check", "kernels"):
        assert checks[check].status == "passed", (check, checks[check].reason)
    assert took < 600, took
    image = result.tagged[0]
    labels = engine.image_labels(image)
    assert labels["dev.sparkforge.recipe-hash"] == overlay.hash
    assert labels["dev.sparkforge.overlay.base"] == f"sparkforge-candidate/ci-wheels-amd64@{wheels_image}"
    assert labels["dev.sparkforge.overlay.patch.1"] == f"vllm:{overlay.model.patches[0].sha256}"
    assert labels["dev.sparkforge.pin.vllm"] == engine.image_labels(wheels_image)["dev.sparkforge.pin.vllm"]
    lock = json.loads(engine.read_image_file(image, "/opt/sparkforge/lock.json") or b"{}")
    assert lock["overlay"]["base"]["image_id"] == wheels_image
    # The fix is live in the image: the error names its parameter (the base's says None).
    probe = (
        "from vllm.sampling_params import SamplingParams\n"
        "try:\n    SamplingParams(presence_penalty=3.0)\nexcept Exception as e:\n    print('PARAM', e.parameter)\n"
    )
    out = subprocess.run(
        ["/usr/bin/docker", "run", "--rm", "--entrypoint", "python3", image, "-c", probe],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "PARAM presence_penalty" in out.stdout, out.stderr[-2000:]

    from sparkforge.registry.diff import diff

    report = diff(wheels_image, image)
    rows = report.to_dict()["changes"]
    lock_rows = {r["item"]: r for r in rows if r["section"] == "lock"}
    assert lock_rows["overlay.patches[0].sha256"]["b"] == overlay.model.patches[0].sha256
    assert (
        lock_rows["overlay.files.vllm/sampling_params.py.before"]["b"]
        != (lock_rows["overlay.files.vllm/sampling_params.py.after"]["b"])
    )
    assert {c.name: c.reason for c in report.checks}[
        "versions"
    ] == "same"  # same pins: only the patch differs
    for tag in (
        *result.tagged,
        result.plan.candidate,
        result.plan.base_tag,
    ):  # tags this test made (not the base)
        engine.remove_image(tag)


def test_import_carries_a_patch_mod_as_an_overlay_that_applies_and_refuses_a_script_mod(
    wheels_image: str, tmp_path: Path, cleanup_patches: list[Path]
) -> None:
    from sparkforge.imagebuild.overlay.mods import carry_mods
    from sparkforge.recipe.community.formats import read_community
    from sparkforge.recipe.yamlfile import read_yaml

    root = tmp_path / "spark-vllm-docker"
    (root / "recipes").mkdir(parents=True)
    (root / "mods" / "fix-sampling-params").mkdir(parents=True)
    (root / "mods" / "fix-sampling-params" / "fix.patch").write_text(
        FIX.read_text().replace(" a/vllm/", " a/usr/local/lib/python3.12/dist-packages/vllm/")
    )
    (root / "mods" / "run-me").mkdir()
    (root / "mods" / "run-me" / "run.sh").write_text("#!/bin/sh\npip install something-unreviewed\n")
    recipe_file = root / "recipes" / "arena.yaml"
    recipe_file.write_text(
        "recipe_version: 2\nmodel: Qwen/Qwen3.5-35B-A3B-FP8\nruntime: vllm\ncontainer: x\n"
        "mods: [mods/fix-sampling-params, mods/run-me]\ncommand: vllm serve {model}\n"
    )
    recipe = read_community(read_yaml(recipe_file), str(recipe_file))
    name = f"ci-import-{time.time_ns()}"
    base = load_recipe(CI_RECIPE)
    # The recipe's candidate tag names the wheels image: the overlay pins it by digest.
    carried = carry_mods(recipe, recipe_file, base, name)
    cleanup_patches.extend(carried.patches)
    assert [v.kind for v in carried.verdicts] == ["patch", "script"]
    assert "pip install something-unreviewed" in carried.refused[0].reason
    assert carried.overlay is not None
    overlay = load_overlay(carried.overlay)
    cleanup_patches.append(carried.overlay)
    assert (
        overlay.model.base.image.endswith(wheels_image)
        and overlay.model.patches[0].origin == "mod mods/fix-sampling-params"
    )
    report = run_overlay_preflight(_session(tmp_path), overlay).report
    assert report.status == "passed", report.to_dict()
