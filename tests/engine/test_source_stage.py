"""The source-build path up to patching, for real: vLLM's release sdist fetched in a container, its commit
proven, and the recipe's patch series applied. (The compile stage takes about an hour and is not run here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.errors import EngineError
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions, parse_base_image
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from tests.engine.sessions import build_session
from tests.recipe_files import write_recipe_file

pytestmark = pytest.mark.engine
# vllm-qwen35 builds linux/arm64 only; CI's amd64 variant of it (same source, commit and patch series).
CI_SOURCE_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-probe-amd64.yaml"


def _options(base: str, url: str, tmp_path: Path) -> BuildOptions:
    return BuildOptions(
        preflight=False,
        platform="linux/amd64",
        target="source",
        bases=parse_base_image(base),
        sources={"vllm": url},
        network="host",
        verify=False,
        log_root=tmp_path / "logs",
    )


def test_patch_series_applies_in_a_real_container(base_amd64: str, sdist_url: str, tmp_path: Path) -> None:
    recipe = load_recipe(str(CI_SOURCE_RECIPE))
    result = build(build_session(), recipe, _options(base_amd64, sdist_url, tmp_path))
    assert result.candidate.endswith("-source") and engine.image_exists(result.candidate)
    run = engine.run_container(
        result.candidate,
        [
            "-c",
            "cat /opt/sparkforge/source.json /opt/sparkforge/patches-applied.txt; grep -n '12.0;12.1\")' CMakeLists.txt",
        ],
        entrypoint=["/bin/bash"],
    )
    assert run.exit_code == 0, run.stderr
    record = json.loads(run.stdout[: run.stdout.index("}") + 1])
    assert record["commit"] == "db9527a46873454610df6dbedf79a36d6bf1a7f6"
    assert record["verified_by"] == "sdist _version.py commit_id"
    assert "0001-cmake-keep-sm121-on-cuda13.patch" in run.stdout
    assert 'set(CUDA_SUPPORTED_ARCHS "7.5;8.0;8.6;8.7;8.9;9.0;10.0;11.0;12.0;12.1")' in run.stdout


def test_source_of_another_commit_is_refused(base_amd64: str, sdist_url: str, tmp_path: Path) -> None:
    other_commit = "components:\n  vllm:\n    commit: 89a77b10846fd96273cce78d86d2556ea582d26e\n"
    recipe_path = write_recipe_file(tmp_path / "other-commit.yaml", other_commit, extends=CI_SOURCE_RECIPE)
    recipe = load_recipe(str(recipe_path))
    with pytest.raises(EngineError, match=r"stage 'source'.*; nothing was tagged") as info:
        build(build_session(), recipe, _options(base_amd64, sdist_url, tmp_path))
    log = Path(str(info.value).split("Log: ")[1].split(";")[0])
    assert "is commit db9527a46, the recipe pins 89a77b10846fd96273cce78d86d2556ea582d26e" in log.read_text()
