"""Trust, round 4, for real and cheap (no image build): synthetic images pushed over the registry's HTTP API,
signed and attested with real cosign and a key made here, TUF metadata signed with ed25519 keys made here.

Every pull path without a GPU claim is refused (and --allow-unverified says what is missing); moving tags are
resolved through the signed TUF targets; a revoked digest is refused by digest even after its failed claim
was erased; a hand rollback of the registry tag is ignored by pull and followed by a working promote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from registry import local_registry, unavailable_reason

from sparkforge.commands import Runner
from sparkforge.engine import detect_engine
from sparkforge.recipe.loader import Recipe, load_recipe
from sparkforge.registry import pull, tagtrust, trust
from sparkforge.registry.attest import attest_report
from sparkforge.registry.cosign import Cosign, Signer, SigningError, Source, sign_published, source_of
from sparkforge.registry.manifests import Manifests
from sparkforge.registry.ocidist import Registry
from sparkforge.report import Check, Report
from sparkforge.verify.evidence import suite_digest
from sparkforge.verify.suite import SUITE_DIR
from tests import registry_calls as calls
from tests.prerequisites import skip_or_fail
from tests.recipe_files import smoke_recipe_file
from tests.unit.test_evidence import GB10, passing_checks
from tests.unit.tuf_fixtures import TufWorld, start_tuf

pytestmark = pytest.mark.engine
PASSWORD = "round4"
# Docker's media types: the `docker manifest` commands of a 20.10 CLI (no buildx here) read them
INDEX = "application/vnd.docker.distribution.manifest.list.v2+json"
IMAGE = "application/vnd.docker.distribution.manifest.v2+json"


@dataclass
class World:
    recipe: Recipe
    tuf: TufWorld
    keys: Path
    tools: Manifests

    @property
    def repo(self) -> str:
        return self.recipe.model.publish.repository

    def signer(self) -> Signer:
        return Signer(str(self.keys / "cosign.key"))


def _push_index(world: World, unique: str, tags: list[str]) -> tuple[str, dict[str, str]]:
    """One tiny image per platform of the recipe and their index, pushed under `tags`: (index, platforms)."""
    reg = Registry(world.repo)
    platforms = {}
    for platform in world.recipe.model.platforms:
        os_, arch = platform.split("/")
        config = json.dumps({"architecture": arch, "os": os_, "config": {"Labels": {"u": unique}}}).encode()
        layer = f"{unique}-{platform}".encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": IMAGE,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": reg.put_blob(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "digest": reg.put_blob(layer),
                    "size": len(layer),
                }
            ],
        }
        platforms[platform] = _put(world, json.dumps(manifest).encode(), IMAGE, f"tmp-{unique}-{arch}")
    # the index as publish makes it (promote re-makes it the same way and compares the bytes)
    index = world.tools.create(
        [f"{world.repo}:{t}" for t in tags],
        [f"{world.repo}@{platforms[p]}" for p in world.recipe.model.platforms],
    )
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    sign_published(
        world.recipe,
        index,
        platforms,
        Cosign(world.tools.runner),
        world.signer(),
        Source.detect(world.tools.runner, source_of(world.recipe)),
    )
    return index, platforms


def _put(world: World, body: bytes, media: str, tag: str) -> str:
    host, name = world.repo.split("/", 1)
    response = requests.put(
        f"http://{host}/v2/{name}/manifests/{tag}", data=body, headers={"Content-Type": media}, timeout=10
    )
    response.raise_for_status()
    return response.headers["Docker-Content-Digest"]


def _attest(world: World, image: str, platform: str, status: str = "passed") -> None:
    data = _report(world, image, platform, status)
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    attest_report(world.recipe, image, data, Cosign(world.tools.runner), world.signer(), world.tools)
    if status == "failed":
        tagtrust.revoke_failed(world.recipe, image, data, world.tools)


def _report(world: World, image: str, platform: str, status: str = "passed") -> dict:
    """The verify report a GB10 run of `image` writes (passed, or its last check failed)."""
    report = Report(command="verify", subject=image, recipe=world.recipe.name)
    for check in passing_checks():
        report.add(Check.from_dict(check))
    if status == "failed":
        report.checks[-1] = Check(report.checks[-1].name, "failed", "the kernel gave wrong answers")
    report.extra.update(
        {
            "image_id": world.tools.config_digest(image),
            "recipe_hash": world.recipe.hash,
            "gpus": {"mode": "all", "used": True},
            "gpu": GB10,
            "suite": {"sha256": suite_digest(SUITE_DIR)},
            "platform": platform,
        }
    )
    return json.loads(json.dumps(report.to_dict()))


def _check(world: World, ref: str, image: str, platform: str = "linux/arm64", **kw) -> trust.Trusted:
    warn = kw.pop("warn", print)
    return trust.verify_remote(world.recipe, ref, image, platform, world.tools, trust.Overrides(**kw), warn)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for reason in (unavailable_reason(), None if shutil.which("cosign") else "cosign is not installed"):
        if reason:
            skip_or_fail(reason)
    keys = tmp_path / "keys"
    keys.mkdir()
    env = {**os.environ, "COSIGN_PASSWORD": PASSWORD}
    subprocess.run(["cosign", "generate-key-pair"], cwd=keys, env=env, check=True, capture_output=True)
    with local_registry(tmp_path / "registry") as local:
        recipe = load_recipe(
            smoke_recipe_file(
                tmp_path / "recipe",
                local.host,
                repository="sparkforge/round4",
                name="smoke-round4",
                signing_key=keys / "cosign.pub",
            )
        )
        tuf = start_tuf(local, recipe.model.publish.repository, tmp_path, monkeypatch)
        tools = Manifests(
            detect_engine(), Runner(log_dir=tmp_path / "logs", stream=False), recipe.model.publish.repository
        )
        yield World(recipe, tuf, keys, tools)


def test_every_pull_path_needs_a_gpu_claim(world: World) -> None:
    default = pull.reference_for(world.recipe)
    immutable = default.rsplit(":", 1)[1]
    index, platforms = _push_index(world, "one", [immutable, "latest"])
    image = f"{world.repo}@{platforms['linux/arm64']}"
    paths = {
        "recipe default tag": default,
        "--tag": f"{world.repo}:{immutable}",
        "--tag sha256:": f"{world.repo}@{index}",
        "--digest": image,
    }
    for what, ref in paths.items():
        with pytest.raises(SigningError, match="every pull needs a signed GPU-verified claim"):
            _check(world, ref, image)
        said: list[str] = []
        _check(world, ref, image, allow_unverified=True, warn=said.append)
        assert "Missing: a GPU-verified claim" in said[0] and "carries no signed GPU verify" in said[0], what
    with pytest.raises(SigningError, match="name no latest: it was never promoted"):  # the moving tag
        _check(world, f"{world.repo}:latest", image, allow_unverified=True)
    for platform, digest in platforms.items():
        _attest(world, f"{world.repo}@{digest}", platform)
    for ref in paths.values():
        assert _check(world, ref, image).verified["status"] == "passed"
    assert _check(world, image, image).verified["attestedAtSource"] == "signer clock"  # a key: no tlog bundle


def test_promote_revoke_and_a_hand_rollback(world: World) -> None:
    immutable = pull.default_tag(world.recipe)
    old, old_platforms = _push_index(world, "old", [immutable])
    new, new_platforms = _push_index(world, "new", ["other-immutable"])
    for platforms in (old_platforms, new_platforms):
        for platform, digest in platforms.items():
            _attest(world, f"{world.repo}@{digest}", platform)
    runner, eng = world.tools.runner, world.tools.engine
    calls.promote(world.recipe, old, runner=runner, eng=eng)
    calls.promote(world.recipe, new, runner=runner, eng=eng)
    new_image = f"{world.repo}@{new_platforms['linux/arm64']}"
    assert _check(world, f"{world.repo}:latest", new_image).top == new
    # a maintainer's hand rollback of the registry tag: pull keeps to the signed targets, and warns
    _put(world, Registry(world.repo).manifest(old)[0], INDEX, "latest")
    said: list[str] = []
    assert _check(world, f"{world.repo}:latest", new_image, warn=said.append).top == new
    assert "moved by hand?" in said[0]
    calls.promote(world.recipe, new, runner=runner, eng=eng)  # the next promote works and re-points the tag
    assert world.tools.digest_of(f"{world.repo}:latest") == new
    # the GPU job's failed verify of the new image revokes it: latest leaves the targets
    _attest(world, new_image, "linux/arm64", status="failed")
    with pytest.raises(SigningError, match="no longer name it"):
        _check(world, f"{world.repo}:latest", new_image)
    # the registry writer erases every claim of the image: pull --digest is still refused (TUF revoked list)
    world.tuf.delete_tag(new_platforms["linux/arm64"].replace(":", "-") + ".att")
    with pytest.raises(SigningError, match="revoked by the signed TUF targets"):
        _check(world, new_image, new_image, allow_unverified=True)
    # a fresh machine sees the same
    world.tuf.machine("fresh")
    with pytest.raises(SigningError, match="revoked by the signed TUF targets"):
        _check(world, new_image, new_image, allow_unverified=True)
    # rollback goes to the older index; promoting the revoked index again is refused
    world.tuf.machine("publisher")
    from tests.registry_calls import rollback

    assert rollback(world.recipe, "latest", runner=runner, eng=eng).index == old
    with pytest.raises(Exception, match="revoked"):
        calls.promote(world.recipe, new, runner=runner, eng=eng)
