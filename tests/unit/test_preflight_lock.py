"""Check 5 and `lock`: a registry API and a git remote served on 127.0.0.1 (real HTTP, real git)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from preflight_fixtures import (  # noqa: F401 (pytest fixtures)
    Served,
    check_named,
    fixture_server,
    sha256_of,
    write_recipe,
)

from sparkforge.errors import PreflightError
from sparkforge.preflight import lock_recipe
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.images import check_images, parse_image
from sparkforge.recipe import load_recipe
from sparkforge.report import Check

TAG = "13.0.2-devel-ubuntu24.04"
INDEX = "application/vnd.oci.image.index.v1+json"


def _index(platforms: list[str]) -> dict:
    manifests = []
    for i, platform in enumerate(platforms):
        os_name, arch = platform.split("/")
        manifests.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": f"sha256:{i:064x}",
                "size": 1,
                "platform": {"os": os_name, "architecture": arch},
            }
        )
    manifests.append(
        {"digest": "sha256:" + "f" * 64, "size": 1, "platform": {"os": "unknown", "architecture": "unknown"}}
    )
    return {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}


def _serve_image(server: Served, repo: str, platforms: list[str], *, tag: str = TAG) -> str:
    """Serve an index for `platforms` by tag and by digest; returns its digest."""
    body = server.add_json(f"/v2/{repo}/manifests/{tag}", _index(platforms), {"Content-Type": INDEX})
    digest = sha256_of(body)
    server.add_json(f"/v2/{repo}/manifests/{digest}", _index(platforms), {"Content-Type": INDEX})
    return digest


def _image(server: Served, repo: str, digest: str) -> str:
    return f"{server.base.removeprefix('http://')}/{repo}:{TAG}@{digest}"


def _images_check(recipe, *, offline: bool = False) -> Check:
    check = Check("images", "passed")
    check_images(check, recipe.model, make_fetcher(offline=offline))
    return check


def test_digest_resolves_for_every_platform(server, tmp_path):
    digest = _serve_image(server, "nvidia/cuda", ["linux/amd64", "linux/arm64"])
    image = _image(server, "nvidia/cuda", digest)
    recipe = write_recipe(tmp_path, {"images": {"builder": image, "runtime": image}})
    check = _images_check(recipe)
    assert check.status == "passed", check.reason
    assert check.details["builder"]["platforms"] == ["linux/amd64", "linux/arm64"]  # attestations left out
    assert check.details["builder"]["resolved"] == digest


def test_digest_without_the_recipe_platform_fails(server, tmp_path):
    digest = _serve_image(server, "nvidia/cuda", ["linux/amd64"])
    image = _image(server, "nvidia/cuda", digest)
    recipe = write_recipe(tmp_path, {"images": {"builder": image, "runtime": image}})
    check = _images_check(recipe)
    assert check.status == "failed"
    assert "has no linux/arm64 image (it has linux/amd64)" in check.reason


def test_unknown_digest_fails_and_offline_or_unreachable_skips(server, tmp_path):
    image = _image(server, "nvidia/cuda", "sha256:" + "0" * 64)
    recipe = write_recipe(tmp_path, {"images": {"builder": image, "runtime": image}})
    assert "HTTP 404" in _images_check(recipe).reason
    offline = _images_check(recipe, offline=True)
    assert offline.status == "skipped" and "offline" in offline.reason
    shipped = _images_check(load_recipe("vllm-qwen35"))  # Docker Hub is not reachable from here
    assert shipped.status in ("skipped", "passed")


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
    digest = _serve_image(server, "nvidia/cuda", ["linux/arm64"])
    image = _image(server, "nvidia/cuda", digest)
    body = {
        "images": {"builder": image, "runtime": image},
        "components": {"vllm": {"commit": commit, "repository": f"{server.base}/vllm-project/vllm.git"}},
    }
    result = lock_recipe(write_recipe(tmp_path, body), check=True)
    assert result.ok
    states = {e.key: (e.state, e.resolved) for e in result.entries}
    assert states["images.builder"] == ("pinned", image)
    assert states["components.vllm.commit"] == ("pinned", commit)


def test_lock_check_fails_on_a_moved_tag_and_write_repins(server, tmp_path):
    old = _serve_image(server, "nvidia/cuda", ["linux/arm64"])
    image = _image(server, "nvidia/cuda", old)
    new = _serve_image(server, "nvidia/cuda", ["linux/arm64", "linux/amd64"])  # the tag moved
    recipe = write_recipe(tmp_path, {"images": {"builder": image, "runtime": image}})
    with pytest.raises(PreflightError, match=r"images.builder drift .*fix: run 'invoke lock"):
        lock_recipe(recipe, check=True)
    result = lock_recipe(recipe, write=True)
    assert not result.ok and result.written == (recipe.path,)
    assert load_recipe(recipe.path).model.images.builder.endswith(new)
    assert lock_recipe(load_recipe(recipe.path), check=True).ok


def test_lock_expands_the_wheel_short_commit(server, tmp_path):
    commit = _git_remote(tmp_path, server, "v0.33.0")
    body = {
        "components": {"vllm": {"commit": commit[:9], "repository": f"{server.base}/vllm-project/vllm.git"}}
    }
    recipe = write_recipe(tmp_path, body, extends="vllm-qwen35-wheels")
    checked = lock_recipe(recipe, check=True)  # an abbreviated wheel commit is not floating
    entries = {e.key: e for e in checked.entries}
    assert entries["components.vllm.commit"].state == "resolved"
    assert entries["components.vllm.commit"].resolved == commit
    assert entries["components.vllm.wheel"].resolved.startswith(
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl sha256:"
    )
    lock_recipe(recipe, write=True)
    assert load_recipe(recipe.path).model.components.vllm.commit == commit


def test_lock_offline_says_what_to_do():
    with pytest.raises(PreflightError, match=r"needs the network.*fix: run it online"):
        lock_recipe(load_recipe("vllm-qwen35"), offline=True)
