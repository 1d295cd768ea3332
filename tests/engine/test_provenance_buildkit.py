"""BuildKit's own SLSA provenance (buildx, `--provenance mode=max`), for real: a two-platform image built on the
buildx engine FROM the signed smoke index and pushed with its provenance to the signed fixture's registry, signed
by the workflow's `invoke sign` (which attests BuildKit's provenance and each SBOM too), then `invoke pull` on the
buildx engine (Docker 26, containerd store: the SBOM is read from the export stream). Pull accepts it when the
signed provenance names the labels' revision, recipe hash and base; it refuses a provenance naming another
revision, and one the index carries unsigned.

Needs the buildx engine ('invoke engine.up --buildx') besides the signed smoke images (signing_fixtures.py, ~60 s
warm); each test adds a buildx build and push (~15 s), `invoke sign` (~30 s) and `invoke pull` (~15 s).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from attestation_edits import rewrite_attestations
from buildx_fixtures import docker as buildx_docker
from signing_fixtures import PASSWORD, Signed, verify_report

from sparkforge.engine import Engine
from sparkforge.imagebuild import hostsetup
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.registry.attest import attest_report
from sparkforge.registry.buildprov import BUILDKIT_PROVENANCE, facts_of
from sparkforge.registry.cosign import Policy, Signer
from tests.prerequisites import skip_or_fail
from tests.unit.test_evidence import GB10

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(
        cost_s=150,
        rank=40,
        reason="the signed fixture (41 s, shared) and three buildx builds with invoke sign and invoke pull (43 s); "
        "measured 87 s on a quiet machine, 230 s beside five other engineers' work",
    ),
]


def _head() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def on_buildx(signed: Signed, monkeypatch: pytest.MonkeyPatch) -> Iterator[Signed]:
    """The signed fixture with its CLI calls (here and in subprocesses) on the buildx engine."""
    if not (hostsetup.BUILDX_CONFIG / "cli-plugins" / "docker-buildx").exists():
        skip_or_fail("buildx is not installed; run 'invoke engine.up --buildx' (CI: .ci/run does)")
    if buildx_docker("info", check=False).returncode != 0:
        skip_or_fail(
            f"the buildx engine ({hostsetup.BUILDX_HOST}) is not running; 'invoke engine.up --buildx'"
        )
    for key, value in hostsetup.buildx_env().items():
        monkeypatch.setenv(key, value)
    yield dataclasses.replace(signed, eng=Engine("/usr/bin/docker", "buildx", "", "docker"))
    listed = buildx_docker(
        "images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", check=False
    ).stdout.split("\n")
    for ref, image_id in (line.split() for line in listed if line.startswith(signed.registry.host + "/")):
        buildx_docker(
            "rmi", "--force", image_id if ref.endswith(":<none>") else ref, check=False
        )  # ours only


def _built(signed: Signed, tmp_path: Path, tag: str, revision: str) -> tuple[str, dict[str, str]]:
    """FROM the signed smoke index, labelled with this checkout's HEAD, built with SPARKFORGE_REVISION=`revision`,
    pushed with BuildKit's provenance; returns the index digest and platform -> image digest."""
    repo = signed.recipe.model.publish.repository
    base = f"{repo}@{signed.published.index}"
    context = tmp_path / tag
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {base}\n"
        "ARG SPARKFORGE_REVISION=unknown\n"
        f'LABEL org.opencontainers.image.revision="{_head()}" \\\n'
        f'      dev.sparkforge.recipe-hash="{signed.recipe.hash}" \\\n'
        f'      dev.sparkforge.base.builder="{base}" dev.sparkforge.base.runtime="{base}" rebuilt="{tag}"\n'
    )
    meta = tmp_path / f"{tag}-meta.json"
    built = buildx_docker(
        "buildx", "build", "--platform", "linux/amd64,linux/arm64", "--provenance", "mode=max", "--sbom=false",
        "--build-arg", f"SPARKFORGE_REVISION={revision}", "--metadata-file", str(meta),
        "--output", f"type=image,name={repo}:{tag},push=true", str(context),
        check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    index = json.loads(meta.read_text())["containerimage.digest"]
    found = signed.registry.manifest(repo.split("/", 1)[1], index)
    assert found is not None
    platforms = {
        f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
        for m in found[1]["manifests"]
        if m["platform"]["os"] == "linux"
    }
    assert set(platforms) == {"linux/amd64", "linux/arm64"}, found
    return index, platforms


def _sign(signed: Signed, tmp_path: Path, index: str, platforms: dict[str, str]) -> str:
    """The publish job's `invoke sign` (index, images, provenance, SBOMs, BuildKit's provenance), then the GPU job's
    claim for amd64. Returns sign's output."""
    published = tmp_path / f"{index[7:19]}-published.json"
    published.write_text(json.dumps({"index": index, "platforms": platforms}))
    env = {
        **os.environ,
        "SPARKFORGE_SIGNING_KEY": str(signed.keys / "cosign.key"),
        "COSIGN_PASSWORD": PASSWORD,
    }
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "sign", "--recipe", str(signed.recipe.path), "--published", str(published)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    image = f"{signed.recipe.model.publish.repository}@{platforms['linux/amd64']}"
    report = verify_report(signed, image, "linux/amd64", GB10, tmp_path / f"{index[7:19]}-gpu.json")
    signer = Signer(str(signed.keys / "cosign.key"))
    attest_report(
        signed.recipe, image, json.loads(report.read_text()), signed.cosign(), signer, signed.manifests()
    )
    return done.stdout


def _pull(signed: Signed, tag: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "invoke", "pull", "--recipe", str(signed.recipe.path), "--tag", tag]
    pulled = subprocess.run(
        [*argv, "--platform", "linux/amd64"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    buildx_docker("image", "rm", "--force", f"{signed.recipe.model.publish.repository}:{tag}", check=False)
    return pulled


def test_pull_checks_buildkits_signed_provenance(on_buildx: Signed, tmp_path: Path) -> None:
    index, platforms = _built(on_buildx, tmp_path, "buildkit-good", _head())
    signed_out = _sign(on_buildx, tmp_path, index, platforms)
    assert (
        signed_out.count(f"({BUILDKIT_PROVENANCE})") == 2
        and signed_out.count("(https://spdx.dev/Document)") == 2
    )
    pulled = _pull(on_buildx, "buildkit-good")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert (
        "BuildKit's provenance signed by key" in pulled.stdout and "its SBOM signed by key" in pulled.stdout
    )
    repo = on_buildx.recipe.model.publish.repository
    found = on_buildx.cosign().attestations(
        f"{repo}@{platforms['linux/amd64']}", Policy.of(on_buildx.recipe), BUILDKIT_PROVENANCE
    )
    facts = facts_of(found.statements[0].predicate)
    assert facts.revision == _head() and on_buildx.recipe.hash in facts.recipe_hashes
    assert (f"{repo}@{on_buildx.published.index}", on_buildx.published.index) in facts.bases


def test_refuses_a_provenance_naming_another_revision(on_buildx: Signed, tmp_path: Path) -> None:
    index, platforms = _built(on_buildx, tmp_path, "buildkit-other-rev", "0" * 40)
    _sign(on_buildx, tmp_path, index, platforms)
    pulled = _pull(on_buildx, "buildkit-other-rev")
    assert pulled.returncode != 0 and "Traceback" not in pulled.stderr
    assert "signed BuildKit provenance: it names source revision " + "0" * 40 in pulled.stdout + pulled.stderr


def _drop_buildkit(statement: dict) -> dict | None:
    return None if statement["predicateType"] == BUILDKIT_PROVENANCE else statement


def test_refuses_buildkits_provenance_left_unsigned(on_buildx: Signed, tmp_path: Path) -> None:
    index, platforms = _built(on_buildx, tmp_path, "buildkit-unsigned", _head())
    _sign(on_buildx, tmp_path, index, platforms)
    image = f"{on_buildx.recipe.model.publish.repository}@{platforms['linux/amd64']}"
    # its signed copy removed from the registry: what the index carries is BuildKit's own, unsigned
    assert rewrite_attestations(on_buildx.registry, image, _drop_buildkit, tmp_path / "dropped") == 1
    pulled = _pull(on_buildx, "buildkit-unsigned")
    assert pulled.returncode != 0
    assert "its index carries BuildKit's provenance, but none signed by key" in pulled.stdout + pulled.stderr
