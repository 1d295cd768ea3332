"""Bad input gets a one-paragraph error (what, where, fix) before anything runs, and nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import RecipeError, SparkforgeError, VerifyError
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions
from sparkforge.preflight.patches import check_patches, escaping_paths, prepare_scratch
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.report import Check
from tests.recipe_files import write_recipe_file

WHEELS = REPO_ROOT / "recipes" / "vllm-qwen35-wheels.yaml"
SOURCE = REPO_ROOT / "recipes" / "vllm-qwen35.yaml"


def _recipe(tmp_path: Path, body: str, base: Path = WHEELS) -> Path:
    return write_recipe_file(tmp_path / "variant.yaml", body, extends=base)


@pytest.mark.parametrize(
    "key", ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "LD_AUDIT"]
)
def test_env_keys_that_change_code_loading_are_refused(key: str, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=rf"env: not on the image allow-list: {key}: refused") as info:
        load_recipe(_recipe(tmp_path, f"env:\n  {key}: /tmp/evil\n"))
    assert "variant.yaml:" in str(info.value) and "fix:" in str(info.value)


def test_ordinary_env_keys_still_work(tmp_path: Path) -> None:
    assert (
        load_recipe(_recipe(tmp_path, "env:\n  VLLM_LOGGING_LEVEL: INFO\n")).model.env["VLLM_LOGGING_LEVEL"]
        == "INFO"
    )


@pytest.mark.parametrize(
    "tag", ["{vllm", "vllm}", "{vllm}}", "{{vllm}", "{vllm!r}", "{vllm:>9}", "{hash[0]}"]
)
def test_tag_templates_with_stray_braces_are_a_recipe_error(tag: str, tmp_path: Path) -> None:
    # Before: '{vllm' passed the recipe check and crashed str.format later with a ValueError traceback.
    with pytest.raises(RecipeError, match=r"publish\.tags") as info:
        load_recipe(_recipe(tmp_path, f"publish:\n  tags: ['{tag}']\n"))
    assert "fix:" in str(info.value)


@pytest.mark.parametrize(
    "patch",
    ["patches/../x.patch", "patches/vllm/../../x.patch", "patches/./vllm.patch", "patches/vllm/..patch"],
)
def test_patch_paths_with_dot_segments_are_refused(patch: str, tmp_path: Path) -> None:
    path = _recipe(tmp_path, f"components:\n  vllm:\n    patches: ['{patch}']\n", SOURCE)
    with pytest.raises(RecipeError, match=r"no '\.' or '\.\.' segments"):
        load_recipe(path)


ESCAPING = """diff --git a/../../outside.txt b/../../outside.txt
--- a/../../outside.txt
+++ b/../../outside.txt
@@ -1 +1 @@
-secret
+changed
"""


def test_patch_contents_that_escape_the_tree_fail_preflight(tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret\n")  # what the scratch copy would have read
    root = tmp_path / "a" / "b" / "src"
    root.mkdir(parents=True)
    patch = tmp_path / "0001-escape.patch"
    patch.write_text(ESCAPING)
    assert escaping_paths(ESCAPING) == ["../../outside.txt"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    check = Check("patches", "passed")
    check_patches(
        Session(echo=print, runner=Runner(stream=False)),
        check,
        root,
        [patch],
        scratch,
        subject="vLLM",
        repo_root=tmp_path,
    )
    assert check.status == "failed" and "names paths outside the source tree" in check.reason
    assert list(scratch.iterdir()) == []  # nothing was copied from outside the tree
    with pytest.raises(ValueError, match="outside the source tree"):
        prepare_scratch(root, [patch], scratch)
    absolute = ESCAPING.replace("../../outside.txt", "/etc/passwd")
    assert escaping_paths(absolute) == ["/etc/passwd"]


def _session(dry: bool) -> Session:
    return Session(echo=lambda _: None, runner=Runner(dry=dry, stream=False))


def test_platform_not_in_the_recipe_is_refused_before_anything(tmp_path: Path) -> None:
    options = BuildOptions(platform="linux/amd64", preflight=False, log_root=tmp_path)
    with pytest.raises(
        SparkforgeError, match=r"--platform linux/amd64: recipe vllm-qwen35-wheels builds linux/arm64"
    ):
        build(_session(dry=True), load_recipe("vllm-qwen35-wheels"), options)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_gpus_mode_is_checked_before_the_build(tmp_path: Path) -> None:
    # Before: a bad --gpus surfaced only in verify, after the (hour-long) build.
    options = BuildOptions(gpus="some", preflight=False, log_root=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="--gpus 'some': use all, none or auto"):
        build(_session(dry=False), load_recipe("vllm-qwen35-wheels"), options)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_source_for_a_component_the_recipe_does_not_build_is_refused(tmp_path: Path) -> None:
    options = BuildOptions(
        preflight=False, log_root=tmp_path, sources={"vllm": "http://127.0.0.1:8000/v.tar.gz"}
    )
    with pytest.raises(SparkforgeError, match="wheels only"):
        build(_session(dry=True), load_recipe("vllm-qwen35-wheels"), options)
