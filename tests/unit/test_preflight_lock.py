"""Check 5 offline and `lock` against a git remote served on 127.0.0.1 (real HTTP, real git); the registry
side runs against Debian's docker-registry in tests/engine/test_publish_preflight.py."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from preflight_fixtures import (  # noqa: F401 (pytest fixtures)
    Served,
    check_named,
    fixture_server,
    write_recipe,
)

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import PreflightError
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.images import check_images, parse_image
from sparkforge.preflight.lock import lock_recipe
from sparkforge.recipe.loader import load_recipe
from sparkforge.report import Check

SESSION = Session(echo=print, runner=Runner(stream=False))


def _images_check(recipe, *, offline: bool = False) -> Check:
    check = Check("images", "passed")
    check_images(check, recipe.model, make_fetcher(offline=offline))
    return check


def test_images_offline_or_unreachable_skip(tmp_path):
    # A registry answering for real is tested in tests/engine/test_publish_preflight.py (Debian's docker-registry).
    offline = _images_check(load_recipe("vllm-qwen35"), offline=True)
    assert offline.status == "skipped" and "offline" in offline.reason
    # Unreachable on purpose (nothing listens on port 9 here), not by accident of this machine's network.
    image = "127.0.0.1:9/nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:" + "a" * 64
    path = tmp_path / "unreachable.yaml"
    path.write_text(f"extends: vllm-qwen35\nimages:\n  builder: {image}\n  runtime: {image}\n")
    unreachable = _images_check(load_recipe(path))
    assert unreachable.status == "skipped" and "registry unreachable: 127.0.0.1:9" in unreachable.reason


def test_parse_image_defaults():
    hub = parse_image("nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:" + "a" * 64)
    assert (hub.registry, hub.repository, hub.tag) == (
        "registry-1.docker.io",
        "nvidia/cuda",
        "13.0.2-devel-ubuntu24.04",
    )
    assert parse_image("ubuntu:24.04").repository == "library/ubuntu"
    local = parse_image("127.0.0.1:5000/x/y:t")
    assert (local.registry, local.repository, local.base_url) == (
        "127.0.0.1:5000",
        "x/y",
        "http://127.0.0.1:5000",
    )


def _git_remote(tmp_path: Path, server: Served, tag: str) -> str:
    """A bare repo with an annotated tag, served over git's dumb HTTP protocol; returns the tag's commit."""
    work, bare = tmp_path / "work", tmp_path / "vllm.git"
    env = {"GIT_CEILING_DIRECTORIES": str(tmp_path), "HOME": str(tmp_path)}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", str(work)], check=True, env=env)
    (work / "CMakeLists.txt").write_text("project(vllm)\n")
    subprocess.run([*git, "-C", str(work), "add", "."], check=True, env=env)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "release"], check=True, env=env)
    subprocess.run([*git, "-C", str(work), "tag", "-a", tag, "-m", tag], check=True, env=env)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True, env=env)
    server.add_tree("/vllm-project/vllm.git", bare)
    out = subprocess.run(
        ["git", "-C", str(work), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def test_lock_reports_pins_and_check_passes(server, tmp_path):
    commit = _git_remote(tmp_path, server, "v0.31.0")
    body = {"components": {"vllm": {"commit": commit, "repository": f"{server.base}/vllm-project/vllm.git"}}}
    result = lock_recipe(SESSION, write_recipe(tmp_path, body), check=True)
    assert result.ok
    states = {e.key: (e.state, e.resolved) for e in result.entries}
    assert states["components.vllm.commit"] == ("pinned", commit)


def test_lock_expands_the_wheel_short_commit(server, tmp_path):
    commit = _git_remote(tmp_path, server, "v0.33.0")
    body = {
        "components": {"vllm": {"commit": commit[:9], "repository": f"{server.base}/vllm-project/vllm.git"}}
    }
    recipe = write_recipe(tmp_path, body, extends="vllm-qwen35-wheels")
    checked = lock_recipe(SESSION, recipe, check=True)  # an abbreviated wheel commit is not floating
    entries = {e.key: e for e in checked.entries}
    assert entries["components.vllm.commit"].state == "resolved"
    assert entries["components.vllm.commit"].resolved == commit
    assert entries["components.vllm.wheel"].resolved.startswith(
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl sha256:"
    )
    lock_recipe(SESSION, recipe, write=True)
    assert load_recipe(recipe.path).model.components.vllm.commit == commit


def test_lock_offline_says_what_to_do():
    with pytest.raises(PreflightError, match=r"needs the network.*fix: run it online"):
        lock_recipe(dataclasses.replace(SESSION, offline=True), load_recipe("vllm-qwen35"))
