"""The workflow's buildx path run for real: build + push by digest, record, merge with imagetools, pull.

What the workflow's lines published (buildx_fixtures.py): one index in the registry with every platform, the
recipe's labels and the built layers on each, a provenance attestation per platform, and a pull of each
platform through the workflow's own pull line. About 2 minutes warm, 4 cold (shared with
test_buildx_refusals.py).
"""

from __future__ import annotations

import json

import pytest
from buildx_fixtures import PLATFORMS, Published, Workspace, docker
from workflow import WorkflowLine, line

from sparkforge.imagebuild import hostsetup
from sparkforge.recipe import plan

pytestmark = [pytest.mark.engine]
ATTESTATION = "attestation-manifest"
PROVENANCE = "https://slsa.dev/provenance/v0.2"


def test_registry_holds_one_index_with_every_platform(buildx_published: Published) -> None:
    ws, result = buildx_published.ws, buildx_published.result
    found = ws.registry.manifest(ws.name, str(result["index"]))
    assert found is not None
    digest, index = found
    assert digest == result["index"]
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    images = [
        m
        for m in index["manifests"]
        if (m.get("annotations") or {}).get("vnd.docker.reference.type") != ATTESTATION
    ]
    platforms = sorted(f"{m['platform']['os']}/{m['platform']['architecture']}" for m in images)
    assert platforms == sorted(PLATFORMS)
    # The platform manifests are the ones each platform's push recorded (its index's image manifest).
    for platform, record in buildx_published.records.items():
        pushed = ws.registry.manifest(ws.name, record["digest"])
        assert pushed is not None
        entries = pushed[1].get("manifests") or [{"digest": record["digest"], "platform": {"os": "linux"}}]
        inner = [m["digest"] for m in entries if m.get("platform", {}).get("os") == "linux"]
        assert inner and set(inner) <= {m["digest"] for m in images}, platform
    # Every immutable tag names the index; no moving tag was written.
    tags = ws.registry.tags(ws.name)
    assert result["tags"]
    for ref in result["tags"]:
        assert str(ref).startswith(ws.recipe.model.publish.repository + ":")
        assert ws.registry.manifest(ws.name, str(ref).rsplit(":", 1)[1])[0] == digest
    for moving in ws.recipe.model.publish.moving_tags:
        assert moving not in tags


def _image(ws: Workspace, index: dict, platform: str) -> tuple[dict, dict]:
    os_, arch = platform.split("/")
    entry = next(
        m
        for m in index["manifests"]
        if m["platform"] == {"os": os_, "architecture": arch}
        or (m["platform"].get("os"), m["platform"].get("architecture")) == (os_, arch)
    )
    manifest = ws.registry.manifest(ws.name, entry["digest"])[1]
    config = ws.registry.blob(ws.name, manifest["config"]["digest"])
    return entry, config


def test_each_platform_carries_the_recipe_labels_and_the_built_layers(buildx_published: Published) -> None:
    ws = buildx_published.ws
    index = ws.registry.manifest(ws.name, str(buildx_published.result["index"]))[1]
    for platform in PLATFORMS:
        # Built on the offline base (--base-image): the labels record that effective base.
        base = hostsetup.base_image_name(platform)
        effective = plan.bases(ws.recipe, {"builder": base, "runtime": base})
        expected = {
            k: v
            for k, v in plan.labels(ws.recipe, effective).items()
            if k.startswith(plan.LABEL_PREFIX + ".")
        }
        _, config = _image(ws, index, platform)
        assert f"{config['os']}/{config['architecture']}" == platform
        labels = config["config"]["Labels"]
        assert {k: labels.get(k) for k in expected} == expected
        # The pushed image is the one the build loaded into the engine: same layers, same labels.
        local = json.loads(
            docker("image", "inspect", f"{plan.candidate_tag(ws.recipe, platform)}-base").stdout
        )[0]
        assert local["RootFS"]["Layers"] == config["rootfs"]["diff_ids"]
        assert local["Config"]["Labels"] == labels


def test_provenance_attestation_for_each_platform(buildx_published: Published) -> None:
    ws = buildx_published.ws
    index = ws.registry.manifest(ws.name, str(buildx_published.result["index"]))[1]
    attestations = {
        m["annotations"]["vnd.docker.reference.digest"]: m["digest"]
        for m in index["manifests"]
        if (m.get("annotations") or {}).get("vnd.docker.reference.type") == ATTESTATION
    }
    for platform in PLATFORMS:
        entry, _ = _image(ws, index, platform)
        manifest = ws.registry.manifest(ws.name, attestations[entry["digest"]])[1]
        kinds = [layer["annotations"]["in-toto.io/predicate-type"] for layer in manifest["layers"]]
        assert PROVENANCE in kinds, kinds
        statement = ws.registry.blob(ws.name, manifest["layers"][kinds.index(PROVENANCE)]["digest"])
        assert statement["subject"][0]["digest"]["sha256"] == entry["digest"].split(":")[1]
        # SBOM needs BuildKit's scanner image (Docker Hub); this machine cannot pull it (SPARKFORGE_SBOM=false).
        assert "https://spdx.dev/Document" not in kinds


def test_pull_each_platform_through_the_workflow_line(buildx_published: Published) -> None:
    ws = buildx_published.ws
    pull = line("verify", "pull")
    values = {**ws.values("linux/arm64"), "INDEX": str(buildx_published.result["index"])}
    for platform in PLATFORMS:
        argv_extra = [
            "--allow-unsigned"
        ]  # the smoke recipe declares no publish.signing (tested in test_signing_pull)
        wl = pull
        if (
            platform != "linux/arm64"
        ):  # the workflow pulls arm64 (the Spark); amd64 goes through the same line
            wl = WorkflowLine(
                pull.job, pull.step, tuple(a if a != "linux/arm64" else platform for a in pull.argv)
            )
        done = ws.run(wl, values, *argv_extra)
        assert done.returncode == 0, done.stdout + done.stderr
        pulled = json.loads((ws.runner_temp / "pulled.json").read_text())
        assert pulled["platform"] == platform
        assert pulled["drift"] == {}
        local = json.loads(docker("image", "inspect", pulled["image"]).stdout)[0]
        assert local["Architecture"] == platform.split("/")[1]
        docker("image", "rm", "--force", pulled["image"], check=False)
