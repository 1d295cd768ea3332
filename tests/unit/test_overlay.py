"""Overlays without an engine: the strict diff applier, the path rules, the overlay file, the writer's selection
of a pull request's installed files (from a real local git repository), the rendered context."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import InputError, RecipeError
from sparkforge.imagebuild.lint import hadolint_argv
from sparkforge.imagebuild.overlay import unidiff
from sparkforge.imagebuild.overlay.build import (
    OverlayBuildOptions,
    overlay_labels,
    plan_overlay,
    render_overlay,
    verify_view,
)
from sparkforge.imagebuild.overlay.model import load_overlay
from sparkforge.imagebuild.overlay.preflight import Installed, PreflightResult, judge_diff, judge_path
from sparkforge.imagebuild.overlay.write import pr_diff, select_installed
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.report import Report

FIX = REPO_ROOT / "patches" / "overlay-vllm" / "0001-sampling-params-name-the-parameter.patch"
CSRC = REPO_ROOT / "tests" / "overlay" / "csrc-and-python.patch"
OLDER = REPO_ROOT / "tests" / "overlay" / "sampling-params-older-vllm.patch"
OVERLAY = REPO_ROOT / "tests" / "recipes" / "overlays" / "ci-wheels-overlay.yaml"
ORIGINAL = """class SamplingParams:
    def _verify_args(self) -> None:
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise VLLMValidationError(
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}."
            )
"""
CHANGED = ORIGINAL.replace(
    'got {self.presence_penalty}."\n',
    'got {self.presence_penalty}.",\n                parameter="presence_penalty",\n',
)


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "HOME": str(cwd)}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _diff(tmp_path: Path, old: str, new: str, name: str = "vllm/sampling_params.py") -> str:
    repo = tmp_path / "repo"
    (repo / Path(name).parent).mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q")
    (repo / name).write_text(old)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    (repo / name).write_text(new)
    return _git(repo, "diff")


def test_git_diff_applies_exactly_and_the_same_text_comes_out(tmp_path: Path) -> None:
    diff = unidiff.parse(_diff(tmp_path, ORIGINAL, CHANGED))
    assert diff.paths == ["vllm/sampling_params.py"]
    assert unidiff.apply_hunks(ORIGINAL, diff.changes[0]) == CHANGED


def test_a_line_offset_is_tolerated_but_changed_context_is_not(tmp_path: Path) -> None:
    change = unidiff.parse(_diff(tmp_path, ORIGINAL, CHANGED)).changes[0]
    shifted = "import math\n\n\n" + ORIGINAL
    assert (
        unidiff.apply_hunks(shifted, change) == "import math\n\n\n" + CHANGED
    )  # lines moved: git apply's offset
    drifted = ORIGINAL.replace("got {self.presence_penalty}.", "got {self.presence_penalty!r}.")
    with pytest.raises(unidiff.PatchError, match=r"hunk 1 .* does not match"):
        unidiff.apply_hunks(drifted, change)  # no fuzz: a context line differs
    with pytest.raises(unidiff.PatchError, match="does not exist at this version"):
        unidiff.apply_hunks(None, change)


def test_the_committed_fix_parses_as_one_file_two_hunks_and_the_older_one_differs_only_in_context() -> None:
    fix, older = unidiff.parse(FIX.read_text()), unidiff.parse(OLDER.read_text())
    assert [len(c.hunks) for c in fix.changes] == [2] and fix.paths == ["vllm/sampling_params.py"]
    assert (
        fix.changes[0].hunks[1] == older.changes[0].hunks[1]
        and fix.changes[0].hunks[0] != older.changes[0].hunks[0]
    )


def test_apply_to_tree_in_the_image_form_writes_and_byte_compiles(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "sampling_params.py").write_text(ORIGINAL)
    patch = tmp_path / "fix.patch"
    patch.write_text(_diff(tmp_path, ORIGINAL, CHANGED))
    # As the overlay's build context carries them: the in-image applier and the preflight's own module beside it.
    files = tmp_path / "files"
    files.mkdir()
    (files / "unidiff.py").write_bytes(Path(unidiff.__file__).read_bytes())
    (files / "apply-patches.py").write_bytes(
        (REPO_ROOT / "dockerfiles" / "files" / "apply-patches.py").read_bytes()
    )
    run = [sys.executable, str(files / "apply-patches.py"), str(site), str(patch)]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (site / "vllm" / "sampling_params.py").read_text() == CHANGED
    pycs = list((site / "vllm" / "__pycache__").glob("sampling_params.*.pyc"))
    assert len(pycs) == 1 and pycs[0].read_bytes()[4:8] == b"\x03\x00\x00\x00"  # checked-hash bytecode flags
    again = subprocess.run(run, capture_output=True, text=True)  # applied already: refused, file unchanged
    assert again.returncode == 1 and "does not apply" in again.stderr
    assert (site / "vllm" / "sampling_params.py").read_text() == CHANGED


@pytest.mark.parametrize(
    ("path", "package", "kind"),
    [
        ("vllm/sampling_params.py", "vllm", "python"),
        ("src/transformers/generation/utils.py", "transformers", "python"),
        ("flashinfer/jit/core.py", "flashinfer", "python"),
        ("csrc/activation_kernels.cu", "vllm", "compiled"),
        ("CMakeLists.txt", "vllm", "compiled"),
        ("cmake/utils.cmake", "vllm", "compiled"),
        ("setup.py", "vllm", "compiled"),
        ("vllm/model_executor/layers/fused_moe/configs/E=8.json", "vllm", "compiled"),
        ("tests/test_sampling_params.py", "vllm", "outside"),
        ("docs/usage.md", "vllm", "outside"),
        (
            "transformers/generation/utils.py",
            "transformers",
            "outside",
        ),  # transformers keeps its code under src/
    ],
)
def test_path_rules(path: str, package: str, kind: str) -> None:
    verdict = judge_path(path, package)
    assert verdict.kind == kind and (verdict.refusal is None) == (kind == "python")
    if kind == "compiled":
        assert "use the source recipe" in (verdict.refusal or "")


def test_a_csrc_patch_is_refused_with_the_source_recipe_as_fix() -> None:
    verdicts = judge_diff(unidiff.parse(CSRC.read_text()), "vllm")
    refused = [v for v in verdicts if v.refusal]
    assert [v.path for v in refused] == ["csrc/activation_kernels.cu"] and "source: git" in refused[0].refusal
    with pytest.raises(
        RecipeError, match=r"csrc/activation_kernels.cu is a compiled source.*use the source recipe"
    ):
        select_installed(CSRC.read_text(), "vllm")


def test_a_pull_request_keeps_its_installed_files_and_drops_upstream_tests(tmp_path: Path) -> None:
    repo = tmp_path / "vllm"
    (repo / "vllm").mkdir(parents=True)
    (repo / "tests").mkdir()
    _git(repo, "init", "-q")
    (repo / "vllm" / "sampling_params.py").write_text(ORIGINAL)
    (repo / "tests" / "test_sampling_params.py").write_text("def test_x():\n    pass\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    (repo / "vllm" / "sampling_params.py").write_text(CHANGED)
    (repo / "tests" / "test_sampling_params.py").write_text("def test_x():\n    assert True\n")
    _git(repo, "commit", "-qam", "[Frontend] name the parameter (#31337)")
    session = Session(echo=print, runner=Runner(stream=False))
    text, commit = pr_diff(session, repo, 31337)
    assert len(commit) == 40 and "Subject: [PATCH] [Frontend] name the parameter (#31337)" in text
    kept_text, kept, dropped = select_installed(text, "vllm")
    assert kept == ["vllm/sampling_params.py"] and dropped == ["tests/test_sampling_params.py"]
    assert unidiff.apply_hunks(ORIGINAL, unidiff.parse(kept_text).changes[0]) == CHANGED
    # A merge commit ("Merge pull request #N"): the pull request's diff against the first parent.
    _git(repo, "checkout", "-qb", "feature", "HEAD~1")
    (repo / "vllm" / "sampling_params.py").write_text(
        ORIGINAL.replace("class SamplingParams:", "class SamplingParams:  # x")
    )
    _git(repo, "commit", "-qam", "feature")
    _git(repo, "checkout", "-q", "-")
    _git(repo, "merge", "-q", "--no-ff", "feature", "-m", "Merge pull request #42 from me/feature")
    text, _ = pr_diff(session, repo, 42)
    assert "# x" in text and "parameter=" not in text
    with pytest.raises(InputError, match=r"no commit .* names pull request #7"):
        pr_diff(session, repo, 7)


def test_the_ci_overlay_loads_pins_its_patch_and_refuses_a_changed_one(tmp_path: Path) -> None:
    overlay = load_overlay(OVERLAY)
    assert overlay.base_recipe.name == "ci-wheels-amd64" and overlay.base_digest.startswith("sha256:")
    [(patch, data)] = overlay.patch_bytes()
    assert patch.sha256 == hashlib.sha256(data).hexdigest() == hashlib.sha256(FIX.read_bytes()).hexdigest()
    changed = tmp_path / "o.yaml"
    changed.write_text(
        OVERLAY.read_text()
        .replace(patch.sha256, "ab" * 32)
        .replace("../ci-wheels-amd64.yaml", str(OVERLAY.parent.parent / "ci-wheels-amd64.yaml"))
    )
    with pytest.raises(RecipeError, match="changed since it was reviewed"):
        load_overlay(changed).patch_bytes()
    bad = tmp_path / "bad.yaml"
    bad.write_text(changed.read_text().replace("kind: overlay", "kind: overlay\nmods: []"))
    with pytest.raises(RecipeError, match="mods"):
        load_overlay(bad)


def test_verify_judges_by_the_base_pins_under_the_overlays_name_and_hash() -> None:
    overlay = load_overlay(OVERLAY)
    view = verify_view(overlay)
    assert view.hash == overlay.hash != overlay.base_recipe.hash and view.name == "ci-wheels-overlay"
    labels = {
        **plan.labels(overlay.base_recipe),
        **overlay_labels(overlay),
    }  # the base's labels plus the overlay's
    assert plan.label_drift(view, labels) == {}
    assert labels["dev.sparkforge.overlay.patch.1"] == f"vllm:{overlay.model.patches[0].sha256}"
    assert labels["dev.sparkforge.overlay.base"] == overlay.model.base.image


def test_the_rendered_context_is_the_same_bytes_twice(tmp_path: Path) -> None:
    overlay = load_overlay(OVERLAY)
    site = "/opt/venv/lib/python3.11/site-packages"
    pre = PreflightResult(
        Report(command="preflight", subject="x"),
        image_id=overlay.base_digest,
        base_lock=json.dumps({"recipe": "ci-wheels-amd64", "recipe_hash": overlay.base_recipe.hash}).encode(),
        installed=Installed(
            site, {"vllm/sampling_params.py": ORIGINAL}, {"vllm/sampling_params.py": CHANGED}
        ),
        patches=overlay.patch_bytes(),
    )
    texts = []
    for out in ("one", "two"):
        built = plan_overlay(overlay, pre, "linux/amd64", OverlayBuildOptions(out_root=tmp_path / out))
        render_overlay(overlay, pre, built.labels, built.lock, built.context, built.base_tag)
        texts.append(
            {
                p.relative_to(built.context).as_posix(): p.read_bytes()
                for p in built.context.rglob("*")
                if p.is_file()
            }
        )
    assert texts[0] == texts[1]
    files = texts[0]
    assert set(files) == {
        "Dockerfile",
        "lock.json",
        "files/apply-patches.py",
        "files/unidiff.py",
        f"patches/{FIX.name}",
    }
    dockerfile = files["Dockerfile"].decode()
    assert (
        f'ARG BASE_IMAGE="sparkforge-overlay-base/ci-wheels-overlay:{overlay.base_digest[7:19]}"'
        in dockerfile
    )
    assert f'"{site}", "/opt/sparkforge/imagebuild/overlay/patches/{FIX.name}"]' in dockerfile
    assert f'dev.sparkforge.recipe-hash="{overlay.hash}"' in dockerfile
    lock = json.loads(files["lock.json"])
    assert (
        lock["recipe_hash"] == overlay.hash
        and lock["overlay"]["base"]["recipe_hash"] == overlay.base_recipe.hash
    )
    assert (
        lock["overlay"]["files"]["vllm/sampling_params.py"]["after"]
        == hashlib.sha256(CHANGED.encode()).hexdigest()
    )
    assert files["files/unidiff.py"] == Path(unidiff.__file__).read_bytes()
    lint = subprocess.run(list(hadolint_argv(built.context / "Dockerfile")), capture_output=True, text=True)
    assert lint.returncode == 0, (
        lint.stdout + lint.stderr
    )  # the same hadolint rules as every recipe's Dockerfile


def test_transformers_repository_paths_become_installed_paths(tmp_path: Path) -> None:
    text = _diff(tmp_path, ORIGINAL, CHANGED, "src/transformers/generation/utils.py")
    kept_text, kept, dropped = select_installed(text, "transformers")
    assert kept == ["transformers/generation/utils.py"] and dropped == []
    assert unidiff.parse(kept_text).paths == ["transformers/generation/utils.py"]  # what the image applies
    # In an overlay's patch, the repository layout is refused with the installed path as the fix.
    [verdict] = judge_diff(unidiff.parse(text), "transformers", installed=True)
    assert verdict.refusal and "'transformers/generation/utils.py'" in verdict.refusal
    [ok] = judge_diff(unidiff.parse(kept_text), "transformers", installed=True)
    assert ok.refusal is None and ok.installed == "transformers/generation/utils.py"
