"""The published smoke index the publish tests share: smoke images for amd64 and arm64 (QEMU), a real registry.

The images are the template's quick 'base' stage (OS layer, venv and every sparkforge label) of
tests/recipes/smoke-multiarch.yaml, built once per session on the offline Debian bases, pushed by digest and
merged into one multi-arch index. The engine conftest registers the fixtures; tests import the rest.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pytest
from registry import LocalRegistry, local_registry, unavailable_reason

from sparkforge import engine
from sparkforge.commands import Runner
from sparkforge.engine import Engine, detect_engine
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe, load_recipe
from sparkforge.registry import publish as pub
from sparkforge.registry import pushed as pushed_records
from tests import registry_calls as calls
from tests.prerequisites import skip_or_fail
from tests.recipe_files import SMOKE_PLATFORMS as PLATFORMS
from tests.recipe_files import smoke_recipe_file

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
    evidence: Path  # verify records of these tests (never the checkout's build/verified)

    def publish(self, digests: dict[str, str], **kw: object) -> pub.Published:
        """Smoke images are the base stage on offline bases: nothing to verify, so publish waives both (loudly)."""
        kw = {"when": DAY, "allow_unverified": True, "allow_base_override": True, **kw}
        return calls.publish(
            self.recipe, digests, runner=self.runner, eng=self.eng, evidence_dir=self.evidence, **kw,  # type: ignore[arg-type]
        )  # fmt: skip

    @property
    def name(self) -> str:  # repository path inside the registry
        return self.recipe.model.publish.repository.split("/", 1)[1]

    def digests(self) -> dict[str, str]:
        return {p: self.pushed[p].digest for p in PLATFORMS}


def tag_of(full: str) -> str:
    """The tag of repository:tag."""
    return full.rsplit(":", 1)[1]


@pytest.fixture(scope="session")
def smoke_registry(tmp_path_factory: pytest.TempPathFactory):
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    with local_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="session")
def smoke(smoke_registry: LocalRegistry, base_stages, tmp_path_factory: pytest.TempPathFactory):
    """Both platforms built (base target) and pushed by digest; images removed afterwards."""
    tmp = tmp_path_factory.mktemp("smoke")
    recipe = load_recipe(smoke_recipe_file(tmp / "recipe", smoke_registry.host))
    eng = detect_engine()
    runner = Runner(log_dir=tmp / "logs", stream=False)
    pushed: dict[str, pushed_records.PushedImage] = {}
    try:
        with base_stages(recipe, tmp / "build") as candidates:
            for platform in PLATFORMS:
                pushed[platform] = calls.push(
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
            yield Smoke(
                recipe, smoke_registry, eng, runner, candidates, pushed, tmp / "digests", tmp / "verified"
            )
    finally:
        repo = recipe.model.publish.repository
        refs = [p.reference for p in pushed.values()]
        refs += [f"{repo}:{recipe.hash[:12]}-{p.split('/')[1]}" for p in PLATFORMS]  # staging tags
        refs += list(plan.final_tags(recipe, DAY).all)
        for ref in refs:
            engine.remove_image(ref)


@pytest.fixture(scope="session")
def published(smoke: Smoke) -> pub.Published:
    return smoke.publish(smoke.digests())
