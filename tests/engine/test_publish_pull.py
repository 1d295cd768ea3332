"""Pulling the published smoke index for real: each platform by tag or by index digest, its labels checked
against the recipe, and drift from the recipe refused unless allowed (tests/engine/publish_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from publish_fixtures import PLATFORMS, Smoke, tag_of

from sparkforge import engine
from sparkforge.errors import PublishError
from sparkforge.recipe.loader import load_recipe
from sparkforge.registry import publish as pub
from sparkforge.registry import pull as pulling
from tests import registry_calls as calls
from tests.recipe_files import smoke_recipe_file

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("platform", PLATFORMS)
def test_pull_each_platform_and_check_labels(smoke: Smoke, published: pub.Published, platform: str) -> None:
    pulled = calls.pull(
        smoke.recipe,
        platform=platform,
        runner=smoke.runner,
        eng=smoke.eng,
        allow_unsigned=True,
        allow_unverified=True,
        echo=lambda _: None,
    )
    assert pulled.reference == pulling.reference_for(smoke.recipe)
    assert pulled.image == smoke.pushed[platform].reference and pulled.drift == {}
    assert engine.image_platform(pulled.image) == platform
    assert engine.image_labels(pulled.reference)["dev.sparkforge.recipe-hash"] == smoke.recipe.hash


def test_pull_by_index_digest(smoke: Smoke, published: pub.Published) -> None:
    pulled = calls.pull(
        smoke.recipe,
        published.index,
        platform="linux/arm64",
        runner=smoke.runner,
        eng=smoke.eng,
        allow_unsigned=True,
        allow_unverified=True,
        echo=lambda _: None,
    )
    assert pulled.reference.endswith("@" + published.index)
    assert pulled.image == smoke.pushed["linux/arm64"].reference


def test_pull_catches_drift_from_the_recipe(smoke: Smoke, published: pub.Published, tmp_path: Path) -> None:
    drifted = load_recipe(smoke_recipe_file(tmp_path, smoke.registry.host, transformers="5.20.1"))
    tag = tag_of(pulling.reference_for(smoke.recipe))
    with pytest.raises(PublishError) as caught:
        calls.pull(
            drifted,
            tag,
            platform="linux/amd64",
            runner=smoke.runner,
            eng=smoke.eng,
            allow_unsigned=True,
            allow_unverified=True,
            echo=lambda _: None,
        )
    message = str(caught.value)
    assert "dev.sparkforge.pin.transformers: image 5.20.2, recipe 5.20.1" in message
    assert "dev.sparkforge.recipe-hash" in message and "--allow-drift" in message
    warnings: list[str] = []
    pulled = calls.pull(
        drifted,
        tag,
        allow_drift=True,
        platform="linux/amd64",
        runner=smoke.runner,
        eng=smoke.eng,
        allow_unsigned=True,
        allow_unverified=True,
        echo=lambda _: None,
        warn=warnings.append,
    )
    assert set(pulled.drift) == {"dev.sparkforge.pin.transformers", "dev.sparkforge.recipe-hash"}
    drift = [w for w in warnings if "--allow-drift" in w]  # signing hook: --allow-unsigned warns as well
    assert len(drift) == 1 and "WARNING" in drift[0]
