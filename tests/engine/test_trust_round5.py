"""Trust, round 5: nothing a registry writer serves can roll a revocation back, for real.

A real local registry (Debian's docker-registry), TUF metadata signed with ed25519 keys made here, the committed
metadata of the publisher's checkout in a folder (git is the truth). The pull scenario signs and attests
synthetic images with real cosign (test_trust_round4's world).
"""

from __future__ import annotations

import pytest
from test_trust_round4 import World, _attest, _check, _push_index
from test_trust_round4 import world as world
from tuf.api.metadata import Metadata, Targets

from sparkforge.errors import PublishError
from sparkforge.registry import pull, tufclient, tufrepo
from sparkforge.registry.cosign import SigningError
from tests import registry_calls as calls
from tests.unit.tuf_fixtures import TufWorld, digest
from tests.unit.tuf_fixtures import tuf_world as tuf_world

pytestmark = pytest.mark.engine
X, X_IMAGE, Y, Y_IMAGE = digest(1), digest(2), digest(3), digest(4)


def _history_with_a_revocation(world: TufWorld) -> None:
    """latest -> Y (v2), latest -> X (v3), X revoked (v4); a checkout kept at v3 ('stale') and every timestamp."""
    tufrepo.move_tag(world.repository, world.target("latest", Y, Y_IMAGE))
    world.keep_timestamp()
    tufrepo.move_tag(world.repository, world.target("latest", X, X_IMAGE))
    world.keep_timestamp()
    world.stale_checkout("stale")
    tufrepo.revoke(world.repository, {X_IMAGE: "verify failed: fp8.cutlass_block"})
    world.keep_timestamp()


def _fork_from_v3(world: TufWorld, versions: int) -> None:
    """The registry writer deletes v4 and serves v3 again; a writer with the stale checkout (or the online key)
    then signs `versions` forked versions on top of v3 (v4', v5', ...), each naming X as latest."""
    for tag in ("tuf-timestamp", "tuf-targets-4", "tuf-snapshot-4"):
        world.delete_tag(tag)
    world.put_old_timestamp(3)
    world.use_checkout(world.tmp / "checkouts" / "stale" / "tuf")
    world.machine("forker")
    for _ in range(versions):
        tufrepo.move_tag(world.repository, world.target("latest", X, X_IMAGE))


def _trusted_version(world: TufWorld) -> tuple[int, bool]:
    data = (world.trusted_dir() / "targets.json").read_bytes()
    state = tufclient.state_of_targets(world.repository, data)
    return Metadata[Targets].from_bytes(data).signed.version, X_IMAGE in state.revoked


def test_a_fork_is_refused_three_refreshes_in_a_row(tuf_world: TufWorld) -> None:
    _history_with_a_revocation(tuf_world)
    tuf_world.machine("seen")
    assert tufclient.refresh(tuf_world.repository).version == 4
    _fork_from_v3(tuf_world, 2)  # v4', v5': the head is one version ahead of the trusted v4
    tuf_world.machine("seen")
    for attempt in range(3):
        with pytest.raises(PublishError, match=r"a fork|refused before"):
            tufclient.refresh(tuf_world.repository)
        assert _trusted_version(tuf_world) == (4, True), attempt  # nothing of the fork was kept


def test_a_fork_two_versions_ahead_is_refused(tuf_world: TufWorld) -> None:
    _history_with_a_revocation(tuf_world)
    tuf_world.machine("seen")
    tufclient.refresh(tuf_world.repository)
    _fork_from_v3(tuf_world, 3)  # v4', v5', v6': the head is two versions ahead of the trusted v4
    tuf_world.machine("seen")
    with pytest.raises(
        PublishError, match=r"targets v5 does not descend from the targets v4 this machine trusts"
    ):
        tufclient.refresh(tuf_world.repository)
    with pytest.raises(PublishError, match="refused before"):
        tufclient.refresh(tuf_world.repository)
    assert _trusted_version(tuf_world) == (4, True)


def test_a_dev_root_never_speaks_for_the_real_root(
    tuf_world: TufWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The registry holds a repository made with a developer's root; the machine trusted it in dev mode (warned
    on every use). Once the real root ships, the cached dev root is not used: the real one refuses it."""
    for _ in range(2):
        tufclient.refresh(tuf_world.repository)
        assert capsys.readouterr().err.count("TEST/DEV MODE") == 1
    from securesystemslib.signer import CryptoSigner

    real = tufrepo.new_root([CryptoSigner.generate_ed25519().public_key], [tuf_world.online.public_key])
    real.sign(CryptoSigner.generate_ed25519())
    shipped = tuf_world.tmp / "shipped"
    shipped.mkdir()
    (shipped / tufclient.root_file_name(tuf_world.repository)).write_bytes(real.to_bytes())
    monkeypatch.setattr(tufclient, "ROOTS_DIR", shipped)
    with pytest.raises(PublishError, match="does not verify"):
        tufclient.refresh(tuf_world.repository)
    assert "TEST/DEV MODE" not in capsys.readouterr().err  # the shipped root wins over the dev root


def test_a_writers_rollback_survives_the_daily_resign_and_a_promote_on_fresh_runners(world: World) -> None:
    """Review finding 1: latest -> Y, latest -> X, X revoked; the registry writer re-points tuf-timestamp at the
    pre-revocation copy and erases X's failed claim; the daily re-sign and a promote run on fresh CI runners
    (empty caches, the committed metadata checked out). A new owner's pull of latest and of X's digest is
    refused."""
    tuf = world.tuf
    y, y_platforms = _push_index(world, "y", [pull.default_tag(world.recipe)])
    x, x_platforms = _push_index(world, "x", ["x-immutable"])
    for platforms in (y_platforms, x_platforms):
        for platform, image in platforms.items():
            _attest(world, f"{world.repo}@{image}", platform)
    runner, eng = world.tools.runner, world.tools.engine
    calls.promote(world.recipe, y, runner=runner, eng=eng)
    tuf.keep_timestamp()
    calls.promote(world.recipe, x, runner=runner, eng=eng)
    tuf.keep_timestamp()
    pre_revocation = Metadata.from_bytes(
        tuf.registry.artifact("tuf-timestamp", 1 << 20) or b""
    ).signed.version
    x_image = f"{world.repo}@{x_platforms['linux/arm64']}"
    _attest(world, x_image, "linux/arm64", status="failed")  # the GPU job's failed verify revokes X
    assert "latest" not in tufclient.refresh(world.repo).tags
    # the registry writer: the pre-revocation timestamp back, X's claims erased
    tuf.put_old_timestamp(pre_revocation)
    tuf.delete_tag(x_platforms["linux/arm64"].replace(":", "-") + ".att")
    tuf.machine("ci-daily")
    tufrepo.resign_timestamp(world.repo)
    tuf.machine("new-owner")
    seen = tufclient.refresh(world.repo)
    assert "latest" not in seen.tags and seen.revoked_of(x_image.rpartition("@")[2])
    with pytest.raises(SigningError, match="no longer name it"):
        _check(world, f"{world.repo}:latest", x_image)
    with pytest.raises(SigningError, match="revoked by the signed TUF targets"):
        _check(world, x_image, x_image, allow_unverified=True)
    tuf.machine("ci-promote")
    calls.promote(world.recipe, y, runner=runner, eng=eng)
    tuf.machine("another-new-owner")
    assert _check(world, f"{world.repo}:latest", f"{world.repo}@{y_platforms['linux/arm64']}").top == y
    with pytest.raises(SigningError, match="revoked by the signed TUF targets"):
        _check(world, x_image, x_image, allow_unverified=True)


def test_the_run_tasks_run_the_local_build_else_the_digest_pull_verified(world: World) -> None:
    """The resolver asks the real engine for the recipe's local build; without it, the digest pull recorded;
    a tag of the repository pull never verified is refused; the engine never fetches it (--pull never)."""
    import subprocess

    from sparkforge import engine
    from sparkforge.recipe import plan
    from sparkforge.registry import pulled
    from sparkforge.run.nodes import ContainerSpec, run_argv

    platform = "linux/amd64"
    build = plan.candidate_tag(world.recipe, platform)
    with pytest.raises(PublishError, match="neither built nor pulled"):
        pulled.resolve(world.recipe, platform=platform)
    index, platforms = _push_index(world, "seam", ["seam"])
    pulled.record(world.recipe, f"{world.repo}:seam", platform, platforms[platform], index, gpu_verified=True)
    assert pulled.resolve(world.recipe, platform=platform).image == f"{world.repo}@{platforms[platform]}"
    engine.tag_image("sparkforge-base/debian-bookworm:amd64", build)
    try:
        assert pulled.resolve(world.recipe, platform=platform).image == build
    finally:
        subprocess.run(["docker", "rmi", build], check=True, capture_output=True)  # only the tag made here
    with pytest.raises(PublishError, match="names no digest 'invoke pull' verified"):
        pulled.resolve(world.recipe, f"{world.repo}:latest", platform=platform)
    argv = run_argv(ContainerSpec("sparkforge-test-seam", f"{world.repo}:seam"))
    ran = subprocess.run(["docker", *argv], capture_output=True, text=True)
    assert (
        ran.returncode != 0 and "No such image" in ran.stderr
    )  # the registry has it; the engine did not fetch it


def _invoke(*argv: str, ok: bool = True) -> str:
    """The real command line (no code edited, no dev root): `python -m invoke ...` in this checkout; its output,
    asserting it succeeded (`ok`) or failed."""
    import os
    import subprocess
    import sys

    from sparkforge.recipe.loader import REPO_ROOT

    done = subprocess.run(
        [sys.executable, "-m", "invoke", *argv],
        cwd=REPO_ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
    )
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture
def fork(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A fork's recipe: its own repository, cosign key, TUF root file and source repository; no dev root, no
    shipped root: the recipe names everything."""
    import os
    import shutil
    import subprocess

    from registry import local_registry, unavailable_reason
    from test_trust_round4 import PASSWORD

    from sparkforge.commands import Runner
    from sparkforge.engine import detect_engine
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry.manifests import Manifests
    from tests.prerequisites import skip_or_fail
    from tests.recipe_files import smoke_recipe_file
    from tests.unit.tuf_fixtures import TufWorld, ed25519_key_file

    for reason in (unavailable_reason(), None if shutil.which("cosign") else "cosign is not installed"):
        if reason:
            skip_or_fail(reason)
    keys = tmp_path / "keys"
    keys.mkdir()
    env = {**os.environ, "COSIGN_PASSWORD": PASSWORD}
    subprocess.run(["cosign", "generate-key-pair"], cwd=keys, env=env, check=True, capture_output=True)
    for name in ("root1", "root2", "root3", "root4", "online", "online2"):
        ed25519_key_file(keys / f"{name}.pem")
    with local_registry(tmp_path / "registry") as local:
        path = smoke_recipe_file(
            tmp_path / "recipe",
            local.host,
            repository="fork/vllm",
            name="smoke-fork",
            signing_key=keys / "cosign.pub",
        )
        root_file = tmp_path / "fork-checkout" / "trust" / "fork.root.json"
        path.write_text(
            path.read_text().replace(
                f"    key: {keys / 'cosign.pub'}\n",
                f"    key: {keys / 'cosign.pub'}\n    trust_root: {root_file}\n"
                "    source: https://github.com/fork/sparkforge\n",
            )
        )
        recipe = load_recipe(path)
        monkeypatch.delenv(tufclient.DEV_ROOT_ENV, raising=False)
        monkeypatch.delenv("SPARKFORGE_REGISTRY_USER", raising=False)
        monkeypatch.setattr(tufclient, "ROOTS_DIR", tmp_path / "no-shipped-roots")
        monkeypatch.setenv(tufrepo.METADATA_ENV, str(tmp_path / "fork-checkout" / "tuf"))
        monkeypatch.setenv(tufrepo.SIGNER_ENV, f"file2:{keys / 'online.pem'}")
        tuf = TufWorld(local, recipe.model.publish.repository, tmp_path, None, None, root_file, monkeypatch)  # type: ignore[arg-type]
        tuf.machine("publisher")
        tools = Manifests(detect_engine(), Runner(log_dir=tmp_path / "logs", stream=False), tuf.repository)
        yield World(recipe, tuf, keys, tools), path


def test_a_fork_publishes_and_pulls_with_its_own_root(fork) -> None:
    """trust.init -> publish -> pull -> trust.rotate -> trust.recover, through the command line, with the
    fork's recipe naming its root file and source repository (no code edited, no dev root)."""
    world, path = fork
    keys, runner, eng = world.keys, world.tools.runner, world.tools.engine
    said = _invoke(
        "trust.init", "--recipe", str(path), "--root-key", str(keys / "root1.pem"), "--root-key",
        str(keys / "root2.pem"), "--threshold", "2", "--online-key", str(keys / "online.pem"),
    )  # fmt: skip
    fingerprint = tufclient.root_fingerprint(world.tuf.root_path.read_bytes())
    assert f"fingerprint {fingerprint}" in said
    index, platforms = _push_index(world, "fork", [pull.default_tag(world.recipe)])
    for platform, image in platforms.items():
        _attest(world, f"{world.repo}@{image}", platform)
    calls.promote(world.recipe, index, runner=runner, eng=eng)
    image = f"{world.repo}@{platforms['linux/arm64']}"
    world.tuf.machine("owner")
    trusted = _check(world, f"{world.repo}:latest", image)
    assert (trusted.top, trusted.repository) == (index, "https://github.com/fork/sparkforge")
    listed = _invoke("images", "--recipe", str(path))  # what is published, from the signed metadata
    assert f"now latest       {index[:19]}" in listed and "GPU-verified when it moved" in listed
    status = _invoke("trust.status", "--recipe", str(path))
    assert f"fingerprint {fingerprint}" in status and "DEV" not in status and "trusted targets" in status
    # a maintainer leaves: new root keys, signed by the old threshold and the new keys
    _invoke(
        "trust.rotate", "--recipe", str(path), "--sign-key", str(keys / "root1.pem"), "--sign-key",
        str(keys / "root2.pem"), "--root-key", str(keys / "root3.pem"), "--root-key", str(keys / "root4.pem"),
    )  # fmt: skip
    for machine in ("owner", "fresh-owner"):
        world.tuf.machine(machine)
        assert _check(world, f"{world.repo}:latest", image).top == index
    # the online key leaks: recover with the new root keys; the leaked key can no longer write
    _invoke(
        "trust.recover", "--recipe", str(path), "--sign-key", str(keys / "root3.pem"), "--sign-key",
        str(keys / "root4.pem"), "--online-key", str(keys / "online2.pem"),
    )  # fmt: skip
    world.tuf.machine("publisher")
    with pytest.raises(PublishError, match="names no key of the TUF role"):
        calls.promote(world.recipe, index, runner=runner, eng=eng)
    world.tuf.patch.setenv(tufrepo.SIGNER_ENV, f"file2:{keys / 'online2.pem'}")
    calls.promote(world.recipe, index, runner=runner, eng=eng)
    for machine in ("owner", "another-fresh-owner"):
        world.tuf.machine(machine)
        assert _check(world, f"{world.repo}:latest", image).top == index
    assert tufclient.refresh(world.repo, root_file=world.tuf.root_path).version >= 4


def _invoke_refused(*argv: str) -> str:
    return _invoke(*argv, ok=False)


def test_the_sign_job_signs_only_what_the_merge_job_published(world: World, tmp_path) -> None:
    """Review finding 3: the GPU job names another index (a v* build that never ran on a GPU) and hands over a
    report about it. The sign job derives the image from the merge job's own record and refuses."""
    import json
    import os

    from test_trust_round4 import PASSWORD, _report

    published, published_platforms = _push_index(world, "merged", ["merged"])
    _, never_ran = _push_index(world, "never-ran", ["v9.9.9"])
    record = tmp_path / "published.json"
    record.write_text(json.dumps({"index": published, "platforms": published_platforms, "date": "20261204"}))
    other = f"{world.repo}@{never_ran['linux/arm64']}"
    report = tmp_path / "verify.json"
    report.write_text(json.dumps(_report(world, other, "linux/arm64")))
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    base = ["sign.attest", "--recipe", str(world.recipe.path), "--key", str(world.keys / "cosign.key")]
    said = _invoke_refused(*base, "--published", str(record), "--report", str(report))
    assert f"the report is about '{other}'" in said and "nothing was signed" in said
    said = _invoke_refused(*base, "--published", str(record), "--image", other, "--report", str(report))
    assert "is not the linux/arm64 image of the published index" in said
    mine = f"{world.repo}@{published_platforms['linux/arm64']}"
    report.write_text(json.dumps(_report(world, mine, "linux/arm64")))
    assert f"attested {mine}" in _invoke(*base, "--published", str(record), "--report", str(report))


def test_attested_at_is_the_logs_time_only_when_cosign_verified_the_bundle(world: World) -> None:
    """Review item 6: a registry writer adds a Rekor bundle annotation with a made-up integrated time to a
    key-signed claim (cosign ignores the log for keys): it is not taken as the log's time."""
    import json

    import requests
    from test_trust_round4 import _put

    from sparkforge.registry.tlogtime import BUNDLE, SIGNER

    _, platforms = _push_index(world, "clock", ["clock"])
    image = f"{world.repo}@{platforms['linux/arm64']}"
    _attest(world, image, "linux/arm64")
    host, name = world.repo.split("/", 1)
    tag = platforms["linux/arm64"].replace(":", "-") + ".att"
    got = requests.get(
        f"http://{host}/v2/{name}/manifests/{tag}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        timeout=10,
    )
    manifest = got.json()
    for layer in manifest["layers"]:
        layer.setdefault("annotations", {})[BUNDLE] = json.dumps({"Payload": {"integratedTime": 4102444800}})
    _put(world, json.dumps(manifest).encode(), got.headers["Content-Type"], tag)
    assert _check(world, image, image).verified["attestedAtSource"] == SIGNER
