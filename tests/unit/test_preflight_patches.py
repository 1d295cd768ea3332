"""Check 3: the patch series on a scratch copy of a real vLLM tree (applies, fails, already applied)."""

from __future__ import annotations

import difflib
import shutil
import subprocess
from pathlib import Path

from preflight_fixtures import (  # noqa: F401 (pytest fixtures)
    CMAKE_PATCH,
    COMMITS,
    SESSION,
    check_named,
    fixture_sdist_0160,
    fixture_sdist_0310,
    write_recipe,
)

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.preflight.checks import PreflightOptions, run_preflight
from sparkforge.preflight.patches import check_patches, explain_failure, hunks, touched_files
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.report import Check


def _check(root: Path, patches: list[Path], tmp_path: Path) -> tuple[Check, Path]:
    scratch = tmp_path / "scratch"
    scratch.mkdir(parents=True)
    check = Check("patches", "passed")
    check_patches(
        Session(echo=print, runner=Runner(stream=False)),
        check,
        root,
        patches,
        scratch,
        subject="vLLM",
        repo_root=REPO_ROOT,
    )
    return check, scratch


def _applied_copy(root: Path, out: Path) -> Path:
    out.mkdir()
    shutil.copy(root / "CMakeLists.txt", out / "CMakeLists.txt")
    subprocess.run(
        ["git", "apply", str(CMAKE_PATCH)], cwd=out, check=True, env={"GIT_CEILING_DIRECTORIES": "/"}
    )
    return out


def test_series_applies_and_the_scratch_copy_is_patched(sdist_0310, tmp_path):
    check, scratch = _check(sdist_0310.tree(), [CMAKE_PATCH], tmp_path)
    assert check.status == "passed", check.reason
    assert check.details["series"] == [
        {
            "patch": "patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch",
            "state": "applies",
            "files": ["CMakeLists.txt"],
        }
    ]
    assert '10.0;11.0;12.0;12.1")' in (scratch / "CMakeLists.txt").read_text()
    assert (
        '10.0;11.0;12.0;12.1")' not in (sdist_0310.tree() / "CMakeLists.txt").read_text()
    )  # cache untouched
    assert [p.name for p in scratch.iterdir()] == ["CMakeLists.txt"]  # only what the series touches


def test_patch_that_does_not_apply_names_file_and_hunk(sdist_0160, tmp_path):
    check, _ = _check(sdist_0160.tree(), [CMAKE_PATCH], tmp_path)
    assert check.status == "failed"
    assert "does not apply" in check.reason
    assert "CMakeLists.txt, hunk #1 (@@ -123,7 +123,8 @@" in check.reason
    assert "fix: rebase the patch" in check.reason


def test_already_applied_patch_is_reported_as_such(sdist_0310, tmp_path):
    root = _applied_copy(sdist_0310.tree(), tmp_path / "applied")
    check, _ = _check(root, [CMAKE_PATCH], tmp_path)
    assert check.status == "failed"
    assert check.details["series"][0]["state"] == "already-applied"
    assert "already applied" in check.reason and "remove it" in check.reason


def test_patches_apply_in_order(sdist_0310, tmp_path):
    # A second patch written against the tree with the first one applied: fine after it, not alone.
    root = sdist_0310.tree()
    applied = _applied_copy(root, tmp_path / "a")
    second = tmp_path / "b"
    shutil.copytree(applied, second)
    text = (second / "CMakeLists.txt").read_text().replace('12.0;12.1")', '12.0;12.1;12.3")', 1)
    (second / "CMakeLists.txt").write_text(text)
    before = (applied / "CMakeLists.txt").read_text().splitlines(keepends=True)
    diff = "".join(
        difflib.unified_diff(before, text.splitlines(keepends=True), "a/CMakeLists.txt", "b/CMakeLists.txt")
    )
    follow_up = tmp_path / "0002-follow-up.patch"
    follow_up.write_text(diff)
    both, scratch = _check(root, [CMAKE_PATCH, follow_up], tmp_path / "both")
    assert both.status == "passed", both.reason
    assert '12.0;12.1;12.3")' in (scratch / "CMakeLists.txt").read_text()
    alone, _ = _check(root, [follow_up], tmp_path / "alone")
    assert alone.status == "failed" and "CMakeLists.txt, hunk #1" in alone.reason


def test_recipe_without_patches_skips_the_check(sdist_0310, tmp_path):
    recipe = write_recipe(tmp_path, {"components": {"vllm": {"patches": []}}})
    assert (
        check_named(run_preflight(SESSION, recipe, PreflightOptions(source="pypi")), "patches").status
        == "skipped"
    )


def test_patch_parsing_helpers():
    text = CMAKE_PATCH.read_text()
    assert touched_files(text) == ["CMakeLists.txt"]
    assert [(h.file, h.number, h.old_start) for h in hunks(text)] == [("CMakeLists.txt", 1, 123)]
    assert explain_failure(text, "error: patch failed: CMakeLists.txt:123\n") == (
        "CMakeLists.txt, hunk #1 (@@ -123,7 +123,8 @@ elseif(DEFINED CMAKE_CUDA_COMPILER_VERSION AND)"
    )
    assert (
        explain_failure(text, "error: csrc/x.cu: No such file or directory\n")
        == "csrc/x.cu: No such file or directory"
    )
