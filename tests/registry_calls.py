"""The registry's entry points in the keyword form the tests call them in (`push(recipe, platform,
runner=..., eng=..., allow_unverified=True)`): each builds the one Session and the options class, then calls
the session form the tasks call (`push_image(session, recipe, PushOptions(...))`). The library has only the
session forms; this module is the tests' shorthand for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkforge import console
from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.engine import Engine
from sparkforge.recipe.loader import Recipe
from sparkforge.registry import publish as pub
from sparkforge.registry import pull as pulling
from sparkforge.registry.diff import diff as diff_of
from sparkforge.registry.rollback import roll_back
from sparkforge.verify import verified

Echo = Callable[[str], None]


def session(
    runner: Runner | None = None,
    eng: Engine | None = None,
    echo: Echo = console.say,
    warn: Echo = console.warn,
) -> Session:
    """A test's Session: no runner means the registry steps log under the recipe's folder, as the tasks do."""
    return Session(echo=echo, runner=runner or Runner(echo=echo), engine=eng, warn=warn)


def push(
    recipe: Recipe, platform: str | None = None, *, runner=None, eng=None, echo=console.say, **options: Any
):
    return pub.push_image(session(runner, eng, echo), recipe, pub.PushOptions(platform, **options))


def publish(
    recipe: Recipe, digests: Mapping[str, str], *, runner=None, eng=None, echo=console.say, **options: Any
):
    return pub.publish_index(session(runner, eng, echo), recipe, digests, pub.PublishOptions(**options))


def promote(recipe: Recipe, index: str, *, runner=None, eng=None, echo=console.say, **options: Any):
    return pub.move_tags(session(runner, eng, echo), recipe, index, pub.PromoteOptions(**options))


def pull(
    recipe: Recipe,
    tag: str | None = None,
    *,
    runner=None,
    eng=None,
    echo=console.say,
    warn=console.warn,
    **options: Any,
):
    return pulling.pull_image(session(runner, eng, echo, warn), recipe, pulling.PullOptions(tag, **options))


def rollback(
    recipe: Recipe,
    tag: str,
    *,
    runner=None,
    eng=None,
    echo=console.say,
    evidence_dir: Path = verified.VERIFIED_DIR,
):
    return roll_back(session(runner, eng, echo), recipe, tag, evidence_dir)


def diff(a: str, b: str, *, runner=None, echo=console.say, bench: Sequence[Path] = ()):
    return diff_of(session(runner or Runner(stream=False, echo=echo), None, echo), a, b, bench)
