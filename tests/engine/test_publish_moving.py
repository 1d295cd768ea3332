"""Moving tags for real: they move only to an index whose every platform image is GPU-verified for the
recipe's GPU, and a later failed verify revokes that right (the smoke index of tests/engine/publish_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from publish_fixtures import DAY, PLATFORMS, Smoke

from sparkforge import engine
from sparkforge.errors import PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe, load_recipe
from sparkforge.registry import publish as pub
from sparkforge.verify import evidence, verified
from sparkforge.verify.suite import SUITE_DIR
from tests import registry_calls as calls

pytestmark = pytest.mark.engine


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


def _record(
    smoke: Smoke,
    platform: str,
    gpu: dict[str, str] | None,
    status: str = "passed",
    recipe: Recipe | None = None,
) -> None:
    """What 'invoke verify' (on a GPU host when `gpu`) then 'invoke push' leave behind for one platform image.

    A GB10 cannot exist here: its run is the one thing mocked; the rule that judges it is the real one."""
    recipe = recipe or smoke.recipe
    image_id = str(engine.inspect_image(smoke.candidates[platform])["Id"])
    checks = _gb10_checks()
    verdict = evidence.gpu_verdict(checks, gpu, smoke.recipe.model.gpu)
    data = {
        "status": status,
        "recipe": recipe.name,
        "recipe_hash": recipe.hash,
        "platform": platform,
        "suite": {"sha256": evidence.suite_digest(SUITE_DIR)},
        "checks": checks,
        "gpus": {"used": gpu is not None},  # the host passed the GPU in and read it
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
    return calls.promote(
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
        calls.publish(
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
        calls.publish(smoke.recipe, smoke.digests(), allow_base_override=True, **kw)  # type: ignore[arg-type]
    for platform in PLATFORMS:
        _record(smoke, platform, None)
    with pytest.raises(PublishError, match="--allow-base-override"):  # offline bases are not the recipe's
        smoke.publish(smoke.digests(), allow_base_override=False)


def test_promote_checks_the_labels_of_the_index_it_moves_to(
    smoke: Smoke, published: pub.Published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hole 5: promote checked only the records; an index of images built from another recipe version moved.
    from buildx_fixtures import buildx_env
    from registry import unavailable_reason  # noqa: F401 - the registry is the smoke one

    from sparkforge.engine import Engine
    from sparkforge.imagebuild import hostsetup
    from tests.recipe_files import smoke_recipe_file

    env = buildx_env()
    if not (Path(env["DOCKER_CONFIG"]) / "cli-plugins" / "docker-buildx").exists():
        from tests.prerequisites import skip_or_fail

        skip_or_fail("the buildx plugin is not installed (invoke engine.up --buildx)")
    monkeypatch.setenv("DOCKER_CONFIG", str(hostsetup.BUILDX_CONFIG))  # imagetools reads the registry itself
    drifted = load_recipe(smoke_recipe_file(tmp_path, smoke.registry.host, transformers="5.20.1"))
    assert drifted.hash != smoke.recipe.hash
    for platform in PLATFORMS:  # GPU-verified records that claim the drifted recipe for these digests
        _record(smoke, platform, GB10, recipe=drifted)
    buildx = Engine("/usr/bin/docker", "buildx", smoke.eng.server_version)
    before = smoke.registry.tags(smoke.name)
    with pytest.raises(PublishError, match=r"was not built from this recipe: .*transformers"):
        calls.promote(
            drifted, published.index, when=DAY, runner=smoke.runner, eng=buildx, evidence_dir=smoke.evidence
        )
    assert smoke.registry.tags(smoke.name) == before
