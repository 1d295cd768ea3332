"""Publishing for real: the smoke images pushed by digest and merged into one multi-arch index in a real
registry; immutable tags that never move to other content; what push and publish refuse.

The smoke images and the registry are shared with the other publish tests (tests/engine/publish_fixtures.py).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from publish_fixtures import DAY, PLATFORMS, Smoke, tag_of

from sparkforge import engine
from sparkforge.errors import PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import load_recipe
from sparkforge.registry import publish as pub
from sparkforge.registry import pushed as pushed_records
from sparkforge.registry.manifests import index_platforms
from tests import registry_calls as calls
from tests.recipe_files import smoke_recipe_file

pytestmark = pytest.mark.engine


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
        digest, index = smoke.registry.manifest(smoke.name, tag_of(full)) or ("", {})
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
        yield calls.push(
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
        first = tag_of(plan.final_tags(smoke.recipe, DAY).immutable[0])
        assert (smoke.registry.manifest(smoke.name, first) or ("",))[0] == published.index


def test_rebuild_next_day_keeps_the_hash_tag_and_gets_a_new_date_tag(
    smoke: Smoke, published: pub.Published, tmp_path: Path
) -> None:
    # A scheduled rebuild of the same recipe: other bytes, same recipe hash, a later day.
    with _rebuilt_and_pushed(smoke, tmp_path, "next-day") as other:
        next_day = DAY + dt.timedelta(days=1)
        result = smoke.publish({**smoke.digests(), "linux/amd64": other.digest}, when=next_day)
        hash_tag, date_tag = plan.final_tags(smoke.recipe, next_day).immutable
        assert result.tags == (date_tag,) and result.unchanged == (hash_tag,)
        assert (smoke.registry.manifest(smoke.name, tag_of(hash_tag)) or ("",))[0] == published.index
        assert (
            (smoke.registry.manifest(smoke.name, tag_of(date_tag)) or ("",))[0]
            == result.index
            != published.index
        )


def test_push_refuses_an_image_on_an_override_base(smoke: Smoke) -> None:
    with pytest.raises(PublishError, match="built on other base images than the recipe pins"):
        calls.push(
            smoke.recipe, "linux/amd64", image=smoke.candidates["linux/amd64"], digests_dir=None,
            eng=smoke.eng, allow_unverified=True, evidence_dir=smoke.evidence,
        )  # fmt: skip


def test_push_refuses_an_image_built_from_another_recipe(smoke: Smoke, tmp_path: Path) -> None:
    drifted = load_recipe(smoke_recipe_file(tmp_path, smoke.registry.host, transformers="5.20.1"))
    with pytest.raises(PublishError, match=r"refusing to push .*dev\.sparkforge\.pin\.transformers"):
        calls.push(
            drifted, "linux/amd64", image=smoke.candidates["linux/amd64"], digests_dir=None, eng=smoke.eng
        )


def test_push_refuses_an_unverified_image(smoke: Smoke) -> None:
    with pytest.raises(PublishError, match="no verify record"):
        calls.push(
            smoke.recipe,
            "linux/amd64",
            image=smoke.candidates["linux/amd64"],
            digests_dir=None,
            eng=smoke.eng,
        )


def test_promote_refuses_a_single_platform_image(smoke: Smoke, published: pub.Published) -> None:
    with pytest.raises(PublishError, match="is a single image, not a multi-arch index"):
        calls.promote(
            smoke.recipe, smoke.pushed["linux/amd64"].digest, when=DAY, runner=smoke.runner, eng=smoke.eng
        )
