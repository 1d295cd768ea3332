"""Rollback judges an earlier release by the recipe at the revision its signed provenance names (git history),
so a release built from an older recipe is judged by that recipe, from any clone."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkforge.commands import Runner
from sparkforge.errors import SparkforgeError
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.registry.earlier import _without_signing, recipe_at

REVISION = "48c0c9a514df01d18a21c5ff6d3e570024b69818"  # vllm-qwen35-wheels before a recipe bump


def _hash_at(revision: str, name: str, tmp: Path) -> str:
    """The recipe's hash at `revision`, read the long way (git show of each file) to compare against."""
    folder = tmp / "recipes"
    folder.mkdir()
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", revision, "recipes/"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for path in listed:
        shown = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "show", f"{revision}:{path}"], capture_output=True
        )
        (folder / Path(path).name).write_bytes(shown.stdout)
        _without_signing(folder / Path(path).name)
    return load_recipe(folder / f"{name}.yaml").hash


def test_a_release_of_an_older_recipe_is_judged_by_that_recipe(tmp_path: Path) -> None:
    probe = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", REVISION], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"this clone lacks revision {REVISION[:12]} (shallow)")
    try:
        old_hash = _hash_at(REVISION, "vllm-qwen35-wheels", tmp_path)
    except SparkforgeError as exc:  # the schema has moved on since: that recipe no longer loads here
        pytest.skip(f"the recipe at {REVISION[:12]} no longer loads under today's schema ({str(exc)[:120]})")
    today = load_recipe("vllm-qwen35-wheels")
    assert old_hash != today.hash  # today's recipe would refuse that release's claims
    tools = SimpleNamespace(runner=Runner(stream=False))
    old = recipe_at(today, REVISION, old_hash, tools)  # type: ignore[arg-type]
    assert old is not None and old.hash == old_hash and old.name == today.name
    assert recipe_at(today, REVISION, "0" * 64, tools) is None  # a provenance naming another hash: not loaded
    assert recipe_at(today, "not-a-revision;rm", old_hash, tools) is None  # type: ignore[arg-type]
    assert recipe_at(today, REVISION[:7] + "f" * 33, old_hash, tools) is None  # type: ignore[arg-type]
    assert recipe_at(today, "", today.hash, tools) is today  # today's hash: today's recipe
