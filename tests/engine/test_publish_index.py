"""Publishing for real: smoke images for amd64 and arm64 (QEMU), a real registry, one multi-arch index.

The images are the template's quick 'base' stage (OS layer, venv and every sparkforge label) of
tests/recipes/smoke-multiarch.yaml, built once per module on the offline Debian bases.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.build.pipeline import build
from sparkforge.build.stage import BuildOptions
from sparkforge.commands import Runner
from sparkforge.engine import Engine, detect_engine
from sparkforge.errors import PreflightError, PublishError
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.images import check_images
from sparkforge.preflight.lock import lock_recipe
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.registry import publish as pub
from sparkforge.registry import pull as pulling
from sparkforge.registry import pushed as pushed_records
from sparkforge.registry.manifests import index_platforms
from sparkforge.report import Check
from sparkforge.verify import evidence, verified

try:  # tests/engine is imported as a package or as a plain directory, depending on how pytest finds it
    from .registry import LocalRegistry, local_registry, unavailable_reason
except ImportError:
    from registry import LocalRegistry, local_registry, unavailable_reason  # type: ignore[no-redef]

pytestmark = pytest.mark.engine
SMOKE = REPO_ROOT / "tests" / "recipes" / "smoke-multiarch.yaml"
PLATFORMS = ("linux/amd64", "linux/arm64")
DAY = dt.date(2026, 11, 29)


@dataclass(frozen=True)
class Smoke:
    recipe: Recipe
    registry: LocalRegistry
    eng: Engine
    runner: Runner
    candidates: dict[str, str]  # platform -> local image
    pushed: dict[str, pushed_records.PushedImage]
    digests_dir: Path
    evidence: Path  # verify records of this test module (never the checkout's build/verified)

    def publish(self, digests: dict[str, str], **kw: object) -> pub.Published:
        """Smoke images are the base stage on offline bases: nothing to verify, so publish waives both (loudly)."""
        kw = {"when": DAY, "allow_unverified": True, "allow_base_override": True, **kw}
        return pub.publish(
            self.recipe, digests, runner=self.runner, eng=self.eng, evidence_dir=self.evidence, **kw,  # type: ignore[arg-type]
        )  # fmt: skip

    @property
    def name(self) -> str:  # repository path inside the registry
        return self.recipe.model.publish.repository.split("/", 1)[1]

    def digests(self) -> dict[str, str]:
        return {p: self.pushed[p].digest for p in PLATFORMS}


def _qemu_reason() -> str | None:
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not entry.exists() or "enabled" not in entry.read_text():
        return "qemu-aarch64 binfmt is not registered; run 'invoke engine.up --qemu'"
    return None


def _recipe_file(directory: Path, registry: LocalRegistry, **overrides: str) -> Path:
    """The smoke recipe pointed at this registry (and with any pin overridden: a drifted recipe)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"extends: {SMOKE}", "publish:", f"  repository: {registry.host}/sparkforge/smoke-multiarch"]
    if overrides:
        lines.append("components:")
        for component, version in overrides.items():
            lines += [f"  {component}:", f"    version: {version}"]
    path = directory / "smoke-multiarch.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("SPARKFORGE_REQUIRE_ENGINE") == "1":
        pytest.fail(f"SPARKFORGE_REQUIRE_ENGINE=1 but {reason}")  # CI must not pass by skipping
    pytest.skip(reason)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    reason = unavailable_reason()
    if reason:
        _skip_or_fail(reason)
    with local_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def smoke(
    registry: LocalRegistry, base_amd64: str, base_arm64: str, tmp_path_factory: pytest.TempPathFactory
):
    """Both platforms built (base target) and pushed by digest; images removed afterwards."""
    reason = _qemu_reason()
    if reason:
        _skip_or_fail(reason)
    tmp = tmp_path_factory.mktemp("smoke")
    recipe = load_recipe(_recipe_file(tmp / "recipe", registry))
    eng = detect_engine()
    runner = Runner(log_dir=tmp / "logs", stream=False)
    bases = {"linux/amd64": base_amd64, "linux/arm64": base_arm64}
    candidates: dict[str, str] = {}
    pushed: dict[str, pushed_records.PushedImage] = {}
    try:
        for platform in PLATFORMS:
            options = BuildOptions(
                preflight=False,
                platform=platform,
                target="base",
                base_image=bases[platform],
                verify=False,
                log_root=tmp / "build",
            )
            candidates[platform] = build(recipe, options, echo=lambda _: None).candidate
            pushed[platform] = pub.push(
                recipe,
                platform,
                allow_unverified=True,  # smoke images are the base stage: nothing in them to verify
                allow_base_override=True,  # and built on the offline Debian bases
                evidence_dir=tmp / "verified",
                image=candidates[platform],
                digests_dir=tmp / "digests",
                runner=runner,
                eng=eng,
            )
        yield Smoke(recipe, registry, eng, runner, candidates, pushed, tmp / "digests", tmp / "verified")
    finally:
        repo = recipe.model.publish.repository
        refs = [*candidates.values(), *(p.reference for p in pushed.values())]
        refs += [f"{repo}:{recipe.hash[:12]}-{p.split('/')[1]}" for p in PLATFORMS]  # staging tags
        refs += list(plan.final_tags(recipe, DAY).all)
        for ref in refs:
            engine.remove_image(ref)


@pytest.fixture(scope="module")
def published(smoke: Smoke) -> pub.Published:
    return smoke.publish(smoke.digests())


def _tag(full: str) -> str:
    return full.rsplit(":", 1)[1]


def test_push_records_each_platform_by_digest(smoke: Smoke) -> None:
    records = pushed_records.load_digests(smoke.recipe, smoke.digests_dir)
    assert records == smoke.digests()
    for platform, image in smoke.pushed.items():
        found = smoke.registry.manifest(smoke.name, image.digest)
        assert found is not None and found[0] == image.digest, platform
        assert engine.image_platform(smoke.candidates[platform]) == platform


def test_publish_refuses_a_missing_platform(smoke: Smoke) -> None:
    before = smoke.registry.tags(smoke.name)
    only_amd64 = {"linux/amd64": smoke.pushed["linux/amd64"].digest}
    with pytest.raises(PublishError, match=r"no image for linux/arm64.*nothing was tagged"):
        smoke.publish(only_amd64)
    assert smoke.registry.tags(smoke.name) == before


def test_publish_refuses_a_digest_that_is_not_its_platform(smoke: Smoke) -> None:
    before = smoke.registry.tags(smoke.name)
    lying = {p: smoke.pushed["linux/amd64"].digest for p in PLATFORMS}  # an amd64 image recorded as arm64
    with pytest.raises(PublishError, match=r"the merged index has no image for linux/arm64"):
        smoke.publish(lying)
    assert smoke.registry.tags(smoke.name) == before


def test_publish_merges_every_platform_under_the_immutable_tags(
    smoke: Smoke, published: pub.Published
) -> None:
    tags = plan.final_tags(smoke.recipe, DAY)
    assert published.tags == tags.immutable and published.unchanged == ()
    for full in tags.immutable:
        digest, index = smoke.registry.manifest(smoke.name, _tag(full)) or ("", {})
        assert digest == published.index
        assert sorted(index_platforms(index)) == sorted(smoke.digests().items())
    assert "latest" not in smoke.registry.tags(smoke.name)  # moving tags wait for verification


def test_publish_again_leaves_immutable_tags_unchanged(smoke: Smoke, published: pub.Published) -> None:
    again = smoke.publish(smoke.digests())
    assert again.tags == () and again.unchanged == plan.final_tags(smoke.recipe, DAY).immutable
    assert again.index == published.index


@contextmanager
def _rebuilt_and_pushed(smoke: Smoke, tmp_path: Path, label: str) -> Iterator[pushed_records.PushedImage]:
    """The amd64 smoke image rebuilt with other bytes (same recipe and labels) and pushed by digest."""
    (tmp_path / "Dockerfile").write_text(f"FROM {smoke.candidates['linux/amd64']}\nLABEL rebuilt={label}\n")
    rebuilt = f"{smoke.recipe.model.publish.repository}:rebuilt-{label}-amd64"
    subprocess.run(
        ["/usr/bin/docker", "build", "--platform", "linux/amd64", "-t", rebuilt, str(tmp_path)],
        check=True,
        capture_output=True,
        env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"},
    )
    try:
        yield pub.push(
            smoke.recipe,
            "linux/amd64",
            image=rebuilt,
            digests_dir=None,
            runner=smoke.runner,
            eng=smoke.eng,
            allow_unverified=True,
            allow_base_override=True,
            evidence_dir=smoke.evidence,
        )
    finally:
        engine.remove_image(rebuilt)


def test_immutable_tag_never_moves_to_other_content(
    smoke: Smoke, published: pub.Published, tmp_path: Path
) -> None:
    # Same recipe and labels, other bytes: what a non-reproducible rebuild on the same day produces.
    with _rebuilt_and_pushed(smoke, tmp_path, "same-day") as other:
        assert other.digest != smoke.pushed["linux/amd64"].digest
        digests = {**smoke.digests(), "linux/amd64": other.digest}
        with pytest.raises(PublishError, match="refusing to move immutable tag"):
            smoke.publish(digests)
        first = _tag(plan.final_tags(smoke.recipe, DAY).immutable[0])
        assert (smoke.registry.manifest(smoke.name, first) or ("",))[0] == published.index


def _gb10_checks() -> list[dict[str, object]]:
    """The in-image suite's report from a full GB10 run: every expected check, the required FP8 cases."""
    shapes = [(16, 256, 512), (64, 1024, 2048), (1, 16384, 5120)]
    cases = {
        "fp8.cutlass_scaled_mm": [
            {"m": m, "n": n, "k": k, "per_token": t, "per_channel": t}
            for m, n, k in shapes
            for t in (False, True)
        ],
        "fp8.cutlass_block": [{"m": m, "n": n, "k": k} for m, n, k in shapes],
    }
    return [
        {"name": name, "status": "passed", "reason": "", "details": {"cases": cases.get(name, [])}}
        for name in evidence.EXPECTED_IMAGE_CHECKS
    ]


def _record(smoke: Smoke, platform: str, gpu: dict[str, str] | None, status: str = "passed") -> None:
    """What 'invoke verify' (on a GPU host when `gpu`) then 'invoke push' leave behind for one platform image.

    A GB10 cannot exist here: its run is the one thing mocked; the rule that judges it is the real one."""
    image_id = str(engine.inspect_image(smoke.candidates[platform])["Id"])
    checks = _gb10_checks()
    verdict = evidence.gpu_verdict(checks, gpu, smoke.recipe.model.gpu)
    data = {
        "status": status,
        "checks": checks,
        "gpu": gpu,
        "gpu_verified": verdict.to_dict(),
        "base_override": True,
    }
    verified.write_record(image_id, data, smoke.evidence)
    repo = smoke.recipe.model.publish.repository
    verified.link_digest(smoke.pushed[platform].digest, image_id, repo, smoke.evidence)


GB10 = {"name": "NVIDIA GB10", "capability": "12.1", "driver": "580.95.05"}
H200 = {"name": "NVIDIA H200", "capability": "9.0", "driver": "580.159.04"}


def _promote(smoke: Smoke, index: str) -> pub.Published:
    return pub.promote(
        smoke.recipe, index, when=DAY, runner=smoke.runner, eng=smoke.eng, evidence_dir=smoke.evidence
    )


def test_moving_tags_never_move_without_gpu_verified_records(smoke: Smoke, published: pub.Published) -> None:
    before = smoke.registry.tags(smoke.name)
    for platform in PLATFORMS:
        _record(smoke, platform, None)  # passed, but on no GPU (what CI records)
    with pytest.raises(PublishError, match=r"refusing to move the moving tags \(latest\).*no GPU was used"):
        _promote(smoke, published.index)
    with pytest.raises(PublishError, match="refusing to move the moving tags"):
        smoke.publish(smoke.digests(), moving=True)
    _record(smoke, "linux/amd64", H200)  # all checks passed, on another GPU
    with pytest.raises(PublishError, match="ran on sm_90; recipe targets sm_121"):
        _promote(smoke, published.index)
    _record(smoke, "linux/arm64", GB10)  # one platform GPU-verified is not enough: the tag names both
    with pytest.raises(PublishError, match=r"Not: linux/amd64 sha256:\w+: ran on sm_90") as info:
        _promote(smoke, published.index)
    assert "linux/arm64" not in str(info.value).split("Not:")[1].split("Nothing")[0]
    assert smoke.registry.tags(smoke.name) == before and "latest" not in before


def test_a_failed_verify_revokes_the_right_to_move(smoke: Smoke, published: pub.Published) -> None:
    for platform in PLATFORMS:
        _record(smoke, platform, GB10)
    _record(smoke, "linux/amd64", GB10, status="failed")  # a later verify of the same image failed
    with pytest.raises(PublishError, match=r"linux/amd64 sha256:[0-9a-f]+: its latest verify failed"):
        _promote(smoke, published.index)
    with pytest.raises(PublishError, match=r"verify FAILED \(the pass is revoked\)"):
        pub.publish(
            smoke.recipe, smoke.digests(), when=DAY, runner=smoke.runner, eng=smoke.eng,
            allow_base_override=True, evidence_dir=smoke.evidence,
        )  # fmt: skip


def test_promote_moves_the_moving_tags_to_a_gpu_verified_index(
    smoke: Smoke, published: pub.Published
) -> None:
    for platform in PLATFORMS:
        _record(smoke, platform, GB10)
    moved = _promote(smoke, published.index)
    assert moved.tags == plan.final_tags(smoke.recipe, DAY).moving
    assert (smoke.registry.manifest(smoke.name, "latest") or ("",))[0] == published.index
    again = smoke.publish(smoke.digests(), moving=True)
    assert plan.final_tags(smoke.recipe, DAY).moving[0] in again.tags


def test_publish_takes_only_verified_digests(smoke: Smoke, published: pub.Published, tmp_path: Path) -> None:
    empty = tmp_path / "no-records"
    kw = {"when": DAY, "runner": smoke.runner, "eng": smoke.eng, "evidence_dir": empty}
    with pytest.raises(PublishError, match="no verify record"):
        pub.publish(smoke.recipe, smoke.digests(), allow_base_override=True, **kw)  # type: ignore[arg-type]
    for platform in PLATFORMS:
        _record(smoke, platform, None)
    with pytest.raises(PublishError, match="--allow-base-override"):  # offline bases are not the recipe's
        smoke.publish(smoke.digests(), allow_base_override=False)


def test_push_refuses_an_image_on_an_override_base(smoke: Smoke) -> None:
    with pytest.raises(PublishError, match="built on other base images than the recipe pins"):
        pub.push(
            smoke.recipe, "linux/amd64", image=smoke.candidates["linux/amd64"], digests_dir=None,
            eng=smoke.eng, allow_unverified=True, evidence_dir=smoke.evidence,
        )  # fmt: skip


def test_promote_refuses_a_single_platform_image(smoke: Smoke, published: pub.Published) -> None:
    with pytest.raises(PublishError, match="is a single image, not a multi-arch index"):
        pub.promote(
            smoke.recipe, smoke.pushed["linux/amd64"].digest, when=DAY, runner=smoke.runner, eng=smoke.eng
        )


@pytest.mark.parametrize("platform", PLATFORMS)
def test_pull_each_platform_and_check_labels(smoke: Smoke, published: pub.Published, platform: str) -> None:
    pulled = pulling.pull(
        smoke.recipe,
        platform=platform,
        runner=smoke.runner,
        eng=smoke.eng,
        allow_unsigned=True,
        echo=lambda _: None,
    )
    assert pulled.reference == pulling.reference_for(smoke.recipe)
    assert pulled.image == smoke.pushed[platform].reference and pulled.drift == {}
    assert engine.image_platform(pulled.image) == platform
    assert engine.image_labels(pulled.reference)["dev.sparkforge.recipe-hash"] == smoke.recipe.hash


def test_pull_by_index_digest(smoke: Smoke, published: pub.Published) -> None:
    pulled = pulling.pull(
        smoke.recipe,
        published.index,
        platform="linux/arm64",
        runner=smoke.runner,
        eng=smoke.eng,
        allow_unsigned=True,
        echo=lambda _: None,
    )
    assert pulled.reference.endswith("@" + published.index)
    assert pulled.image == smoke.pushed["linux/arm64"].reference


def test_pull_catches_drift_from_the_recipe(smoke: Smoke, published: pub.Published, tmp_path: Path) -> None:
    drifted = load_recipe(_recipe_file(tmp_path, smoke.registry, transformers="5.20.1"))
    tag = _tag(pulling.reference_for(smoke.recipe))
    with pytest.raises(PublishError) as caught:
        pulling.pull(
            drifted,
            tag,
            platform="linux/amd64",
            runner=smoke.runner,
            eng=smoke.eng,
            allow_unsigned=True,
            echo=lambda _: None,
        )
    message = str(caught.value)
    assert "dev.sparkforge.pin.transformers: image 5.20.2, recipe 5.20.1" in message
    assert "dev.sparkforge.recipe-hash" in message and "--allow-drift" in message
    warnings: list[str] = []
    pulled = pulling.pull(
        drifted,
        tag,
        allow_drift=True,
        platform="linux/amd64",
        runner=smoke.runner,
        eng=smoke.eng,
        allow_unsigned=True,
        echo=lambda _: None,
        warn=warnings.append,
    )
    assert set(pulled.drift) == {"dev.sparkforge.pin.transformers", "dev.sparkforge.recipe-hash"}
    drift = [w for w in warnings if "--allow-drift" in w]  # signing hook: --allow-unsigned warns as well
    assert len(drift) == 1 and "WARNING" in drift[0]


def test_push_refuses_an_image_built_from_another_recipe(smoke: Smoke, tmp_path: Path) -> None:
    drifted = load_recipe(_recipe_file(tmp_path, smoke.registry, transformers="5.20.1"))
    with pytest.raises(PublishError, match=r"refusing to push .*dev\.sparkforge\.pin\.transformers"):
        pub.push(
            drifted, "linux/amd64", image=smoke.candidates["linux/amd64"], digests_dir=None, eng=smoke.eng
        )


def test_push_refuses_an_unverified_image(smoke: Smoke) -> None:
    with pytest.raises(PublishError, match="no verify record"):
        pub.push(
            smoke.recipe,
            "linux/amd64",
            image=smoke.candidates["linux/amd64"],
            digests_dir=None,
            eng=smoke.eng,
        )


def test_rebuild_next_day_keeps_the_hash_tag_and_gets_a_new_date_tag(
    smoke: Smoke, published: pub.Published, tmp_path: Path
) -> None:
    # A scheduled rebuild of the same recipe: other bytes, same recipe hash, a later day.
    with _rebuilt_and_pushed(smoke, tmp_path, "next-day") as other:
        next_day = DAY + dt.timedelta(days=1)
        result = smoke.publish({**smoke.digests(), "linux/amd64": other.digest}, when=next_day)
        hash_tag, date_tag = plan.final_tags(smoke.recipe, next_day).immutable
        assert result.tags == (date_tag,) and result.unchanged == (hash_tag,)
        assert (smoke.registry.manifest(smoke.name, _tag(hash_tag)) or ("",))[0] == published.index
        assert (
            (smoke.registry.manifest(smoke.name, _tag(date_tag)) or ("",))[0]
            == result.index
            != published.index
        )


# ---- preflight's image check and lock against the same real registry ----------------------------------


def _pinned_recipe(smoke: Smoke, tmp_path: Path, image: str, platforms: str) -> Recipe:
    path = tmp_path / "pinned.yaml"
    path.write_text(
        f"extends: {REPO_ROOT / 'recipes' / 'vllm-qwen35-wheels.yaml'}\nplatforms: {platforms}\n"
        f"images:\n  builder: {image}\n  runtime: {image}\n"
    )
    return load_recipe(path)


def _images_check(recipe: Recipe) -> Check:
    check = Check("images", "passed")
    check_images(check, recipe.model, make_fetcher())
    return check


def test_preflight_resolves_a_multi_arch_digest_for_every_platform(
    smoke: Smoke, published: pub.Published, tmp_path: Path
) -> None:
    tag = _tag(plan.final_tags(smoke.recipe, DAY).immutable[0])
    image = f"{smoke.registry.host}/{smoke.name}:{tag}@{published.index}"
    check = _images_check(_pinned_recipe(smoke, tmp_path, image, "[linux/amd64, linux/arm64]"))
    assert check.status == "passed", check.reason
    # The engine records arm64 images with their variant; preflight matches linux/arm64 to linux/arm64/v8.
    assert sorted(check.details["builder"]["platforms"]) == ["linux/amd64", "linux/arm64/v8"]


def test_preflight_fails_an_image_without_the_recipe_platform(smoke: Smoke, tmp_path: Path) -> None:
    amd64_only = f"{smoke.registry.host}/{smoke.name}@{smoke.pushed['linux/amd64'].digest}"
    check = _images_check(_pinned_recipe(smoke, tmp_path, amd64_only, "[linux/arm64]"))
    assert check.status == "failed" and "has no linux/arm64 image (it has linux/amd64)" in check.reason
    unknown = f"{smoke.registry.host}/{smoke.name}@sha256:{'0' * 64}"
    assert "HTTP 404" in _images_check(_pinned_recipe(smoke, tmp_path, unknown, "[linux/arm64]")).reason


def test_lock_catches_a_moved_tag_and_write_repins(
    smoke: Smoke, published: pub.Published, tmp_path: Path
) -> None:
    # The recipe pins the tag to the amd64 image; in the registry the tag names the multi-arch index.
    tag = _tag(plan.final_tags(smoke.recipe, DAY).immutable[0])
    stale = f"{smoke.registry.host}/{smoke.name}:{tag}@{smoke.pushed['linux/amd64'].digest}"
    recipe = _pinned_recipe(smoke, tmp_path, stale, "[linux/amd64]")
    with pytest.raises(PreflightError, match=r"images.builder drift .*fix: run 'invoke lock"):
        lock_recipe(recipe, check=True)
    lock_recipe(recipe, write=True)
    assert load_recipe(recipe.path).model.images.builder.endswith(published.index)
