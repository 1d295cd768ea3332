"""The workflow's buildx path run for real: build + push by digest, record, merge with imagetools, pull.

Runs the invoke lines of .github/workflows/images.yml (read from the file, variables filled in) against the
buildx engine `invoke engine.up --buildx` starts (Docker 26 with the containerd image store, buildx 0.13.1,
both from Debian trixie) and a real local registry, for linux/amd64 natively and linux/arm64 under QEMU.
The images are the smoke recipe's quick 'base' stage on the offline Debian bases; test-only options are
appended after the workflow's own (never replacing them). About 2 minutes warm, 4 cold.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkforge.build import hostsetup
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.registry.matrix import ci_matrix

try:  # tests/engine is imported as a package or as a plain directory, depending on how pytest finds it
    from .registry import LocalRegistry, local_registry, unavailable_reason
    from .workflow import WorkflowLine, line
except ImportError:
    from registry import LocalRegistry, local_registry, unavailable_reason  # type: ignore[no-redef]
    from workflow import WorkflowLine, line  # type: ignore[no-redef]

pytestmark = [pytest.mark.engine]
SMOKE = REPO_ROOT / "tests" / "recipes" / "smoke-multiarch.yaml"
PLATFORMS = ("linux/amd64", "linux/arm64")
ATTESTATION = "attestation-manifest"
PROVENANCE = "https://slsa.dev/provenance/v0.2"


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("SPARKFORGE_REQUIRE_ENGINE") == "1":
        pytest.fail(f"SPARKFORGE_REQUIRE_ENGINE=1 but {reason}")  # CI must not pass by skipping
    pytest.skip(reason)


def buildx_env() -> dict[str, str]:
    env = {**os.environ, **hostsetup.buildx_env(), "PYTHONPATH": str(REPO_ROOT)}
    # BuildKit's SBOM scanner is an image from Docker Hub, unreachable here: provenance only (README says so).
    env["SPARKFORGE_SBOM"] = "false"
    env.pop("CI", None)
    return env


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/docker", *args], env=buildx_env(), capture_output=True, text=True, check=check
    )


@dataclass(frozen=True)
class Workspace:
    recipe: Recipe
    registry: LocalRegistry
    work: Path  # the job's working directory (the workflow's relative paths land here)
    runner_temp: Path

    @property
    def name(self) -> str:  # repository path inside the registry
        return self.recipe.model.publish.repository.split("/", 1)[1]

    def values(self, platform: str) -> dict[str, str]:
        """The variables the workflow's build job sees for this recipe and platform (from ci.matrix)."""
        entry = next(e for e in ci_matrix([self.recipe]) if e["platform"] == platform)
        return {
            "RECIPE": str(self.recipe.path),
            "PLATFORM": platform,
            "NAME": self.recipe.name,
            "RUNNER_TEMP": str(self.runner_temp),
            "CACHE_FROM": entry["cache_from"],
            "CACHE_TO": entry["cache_to"],
        }

    def run(
        self, wl: WorkflowLine, values: Mapping[str, str], *extra: str
    ) -> subprocess.CompletedProcess[str]:
        """The workflow line, variables filled, test-only options after it; run where the job would."""
        argv = wl.filled(values)
        assert argv[:3] == ["python", "-m", "invoke"]
        command = [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), *argv[3:], *extra]
        # A hung build (e.g. a RUN step waiting on a network this engine lacks) fails the test, not CI.
        return subprocess.run(
            command, cwd=self.work, env=buildx_env(), capture_output=True, text=True, timeout=900
        )


def build_base_stage(
    ws: Workspace, platform: str, metadata: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The workflow's build line for one platform, building only the smoke 'base' stage (no verify: nothing to verify)."""
    values = ws.values(platform)
    if metadata is not None:
        metadata.parent.mkdir(parents=True, exist_ok=True)
        values["RUNNER_TEMP"] = str(metadata.parent)
    base = hostsetup.base_image_name(platform)
    return ws.run(
        line("build", "build"),
        values,
        "--target",
        "base",
        "--base-image",
        base,
        "--no-verify",
        "--no-preflight",
    )


def _require_buildx_engine() -> None:
    if not (hostsetup.BUILDX_CONFIG / "cli-plugins" / "docker-buildx").exists():
        _skip_or_fail("buildx is not installed; run 'invoke engine.up --buildx' (CI: .ci/run does)")
    if docker("info", check=False).returncode != 0:
        _skip_or_fail(
            f"the buildx engine ({hostsetup.BUILDX_HOST}) is not running; run 'invoke engine.up --buildx'"
        )
    for platform in PLATFORMS:
        if docker("image", "inspect", hostsetup.base_image_name(platform), check=False).returncode != 0:
            _skip_or_fail(
                f"{hostsetup.base_image_name(platform)} missing in the buildx engine; 'invoke engine.up --buildx'"
            )
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not entry.exists() or "enabled" not in entry.read_text():
        _skip_or_fail("qemu-aarch64 binfmt is not registered; run 'invoke engine.up --qemu'")


def _recipe_file(directory: Path, registry: LocalRegistry, **pins: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"extends: {SMOKE}", "publish:", f"  repository: {registry.host}/sparkforge/smoke-multiarch"]
    if pins:
        lines.append("components:")
        for component, version in pins.items():
            lines += [f"  {component}:", f"    version: {version}"]
    path = directory / "smoke-multiarch.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Published:
    ws: Workspace
    records: dict[str, dict[str, str]]  # platform -> digest record written by 'invoke push'
    result: dict[str, object]  # build/published/NAME.json
    refused_push: subprocess.CompletedProcess[str]


# Test-only options after the workflow's publish line: smoke base stages on offline bases have no verify record.
TEST_IMAGES = ("--unverified", "--allow-base-override")


@pytest.fixture(scope="module")
def published(engine_ready: None, tmp_path_factory: pytest.TempPathFactory):
    """Both platforms built and pushed by the workflow's lines, recorded, merged by the workflow's publish."""
    _require_buildx_engine()
    reason = unavailable_reason()
    if reason:
        _skip_or_fail(reason)
    tmp = tmp_path_factory.mktemp("buildx")
    with local_registry(tmp / "registry") as registry:
        recipe = load_recipe(_recipe_file(tmp / "recipe", registry))
        ws = Workspace(recipe, registry, tmp / "work", tmp / "runner")
        ws.work.mkdir()
        ws.runner_temp.mkdir()
        try:
            records, refused = {}, None
            for platform in PLATFORMS:
                built = build_base_stage(ws, platform)
                assert built.returncode == 0, built.stdout + built.stderr
                push = line("build", "push")
                if refused is None:
                    # The workflow's own line: a stage that never passed verify is not recorded.
                    refused = ws.run(push, ws.values(platform))
                    assert not (ws.work / "build" / "digests").exists()
                recorded = ws.run(push, ws.values(platform), "--unverified")
                assert recorded.returncode == 0, recorded.stdout + recorded.stderr
                arch = platform.split("/")[1]
                records[platform] = json.loads(
                    (ws.work / "build" / "digests" / f"{recipe.name}-{arch}.json").read_text()
                )
            (ws.work / "build" / "published").mkdir(parents=True)
            # The workflow's publish takes only digests with a passed verify record: these smoke base stages
            # have none (nothing to verify), so it refuses before writing; CI's test images then say so explicitly.
            unverified = ws.run(line("merge", "publish"), ws.values("linux/amd64"))
            assert unverified.returncode != 0 and "no verify record" in unverified.stdout + unverified.stderr
            assert not list((ws.work / "build" / "published").iterdir())
            merged = ws.run(line("merge", "publish"), ws.values("linux/amd64"), *TEST_IMAGES)
            assert merged.returncode == 0, merged.stdout + merged.stderr
            result = json.loads((ws.work / "build" / "published" / f"{recipe.name}.json").read_text())
            yield Published(ws, records, result, refused)
        finally:
            for platform in PLATFORMS:
                docker("image", "rm", "--force", f"{plan.candidate_tag(recipe, platform)}-base", check=False)


def test_unverified_digest_is_not_recorded(published: Published) -> None:
    refused = published.refused_push
    assert refused.returncode != 0
    assert "refusing to record" in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr


def test_registry_holds_one_index_with_every_platform(published: Published) -> None:
    ws, result = published.ws, published.result
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
    for platform, record in published.records.items():
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


def test_each_platform_carries_the_recipe_labels_and_the_built_layers(published: Published) -> None:
    ws = published.ws
    index = ws.registry.manifest(ws.name, str(published.result["index"]))[1]
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


def test_provenance_attestation_for_each_platform(published: Published) -> None:
    ws = published.ws
    index = ws.registry.manifest(ws.name, str(published.result["index"]))[1]
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


def test_pull_each_platform_through_the_workflow_line(published: Published) -> None:
    ws = published.ws
    pull = line("verify", "pull")
    values = {**ws.values("linux/arm64"), "INDEX": str(published.result["index"])}
    for platform in PLATFORMS:
        argv_extra = [
            "--allow-unsigned"
        ]  # the smoke recipe declares no publish.signing (tested in test_signing)
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


def _publish(ws: Workspace, *extra: str) -> subprocess.CompletedProcess[str]:
    return ws.run(line("merge", "publish"), ws.values("linux/amd64"), *TEST_IMAGES, *extra)


def _snapshot(ws: Workspace) -> dict[str, str]:
    return {tag: ws.registry.manifest(ws.name, tag)[0] for tag in ws.registry.tags(ws.name)}


def test_missing_platform_is_refused_before_writing(published: Published, tmp_path: Path) -> None:
    ws = published.ws
    before = _snapshot(ws)
    # A merge job whose artifacts hold only the amd64 digest (the arm64 build failed).
    only_amd64 = tmp_path / "build" / "digests"
    only_amd64.mkdir(parents=True)
    (only_amd64 / "one.json").write_text(json.dumps(published.records["linux/amd64"]))
    done = _publish(dataclasses.replace(ws, work=tmp_path))
    assert done.returncode != 0
    assert "no image for linux/arm64" in done.stdout + done.stderr
    assert _snapshot(ws) == before


def test_extra_platform_is_refused_before_writing(published: Published) -> None:
    ws = published.ws
    before = _snapshot(ws)
    extra = f"linux/riscv64={published.records['linux/amd64']['digest']}"
    done = _publish(ws, "--digest", extra)
    assert done.returncode != 0
    assert "unexpected or repeated linux/riscv64" in done.stdout + done.stderr
    assert _snapshot(ws) == before


def test_digest_with_other_labels_is_refused_and_immutable_tags_never_move(
    published: Published, tmp_path: Path
) -> None:
    ws = published.ws
    # The same platform built from a recipe with another pin: pushed by digest, then offered as amd64.
    other = load_recipe(_recipe_file(tmp_path / "other", ws.registry, transformers="4.99.0"))
    other_ws = Workspace(other, ws.registry, tmp_path / "work", tmp_path / "runner")
    other_ws.work.mkdir()
    other_ws.runner_temp.mkdir()
    try:
        assert build_base_stage(other_ws, "linux/amd64").returncode == 0
        metadata = json.loads((other_ws.runner_temp / "metadata.json").read_text())
        drifted = metadata["containerimage.digest"]
        before = _snapshot(ws)
        done = _publish(ws, "--digest", f"linux/amd64={drifted}")
        assert done.returncode != 0
        assert "was not built from this recipe" in done.stdout + done.stderr
        assert "dev.sparkforge.pin.transformers" in done.stdout + done.stderr
        assert _snapshot(ws) == before
        # A rebuild of this recipe (new created date, new digest) cannot move the date tag already published.
        assert (
            build_base_stage(ws, "linux/amd64", metadata=tmp_path / "again" / "metadata.json").returncode == 0
        )
        rebuilt = json.loads((tmp_path / "again" / "metadata.json").read_text())["containerimage.digest"]
        assert rebuilt != published.records["linux/amd64"]["digest"]
        before = _snapshot(ws)  # the rebuild moved only its per-platform staging tag
        done = _publish(ws, "--digest", f"linux/amd64={rebuilt}", "--date", str(published.result["date"]))
        assert done.returncode != 0
        assert "refusing to move immutable tag" in done.stdout + done.stderr
        assert _snapshot(ws) == before
    finally:
        docker("image", "rm", "--force", f"{plan.candidate_tag(other, 'linux/amd64')}-base", check=False)


def test_builder_option_selects_the_buildx_builder(published: Published, tmp_path: Path) -> None:
    ws = dataclasses.replace(published.ws, work=tmp_path)
    values = {**ws.values("linux/amd64"), "RUNNER_TEMP": str(tmp_path)}
    extra = ["--target", "base", "--base-image", hostsetup.base_image_name("linux/amd64"), "--no-verify"]
    done = ws.run(line("build", "build"), values, *extra, "--no-preflight", "--builder", "default")
    assert done.returncode == 0, done.stdout + done.stderr
    log_dir = Path(re.search(r"log: (\S+?);?\n", done.stdout).group(1))  # type: ignore[union-attr]
    for script in ("build", "push-by-digest"):
        assert "buildx build --builder default " in next(log_dir.glob(f"*-{script}.sh")).read_text()
    assert json.loads((tmp_path / "metadata.json").read_text())["containerimage.digest"].startswith("sha256:")
    missing = ws.run(
        line("build", "build"), values, *extra, "--no-preflight", "--builder", "sparkforge-no-such"
    )
    assert missing.returncode != 0
    assert "buildx builder sparkforge-no-such is not usable" in missing.stdout + missing.stderr
    assert "Traceback" not in missing.stderr
