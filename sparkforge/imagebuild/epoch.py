"""SOURCE_DATE_EPOCH for a build: one timestamp derived from the recipe's pins, never from the clock.

The pinned inputs of every stage are its base images (by digest); their `created` time is fixed by the digest.
The newest of them is the build's epoch: BuildKit (0.11+) sets the image config's and history's times to it,
and with `rewrite-timestamp` (0.13) clamps every file time in the new layers to it; Python's py_compile reads
it and writes hash-checked (not mtime-stamped) bytecode. `SOURCE_DATE_EPOCH` in the environment wins
(reproducible-builds.org's convention): `invoke rebuild --check` passes the epoch an image records.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkforge import engine
from sparkforge.errors import EngineError, SparkforgeError
from sparkforge.recipe.loader import Recipe
from sparkforge.recipe.plan import Bases

if TYPE_CHECKING:
    from sparkforge.context import Session

ENV = "SOURCE_DATE_EPOCH"


@dataclass(frozen=True)
class Epoch:
    """A build's timestamp and where it came from (said in the build log)."""

    seconds: int
    source: str

    @property
    def iso(self) -> str:
        return dt.datetime.fromtimestamp(self.seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_epoch(value: str, where: str) -> int:
    """A SOURCE_DATE_EPOCH value (whole seconds since 1970), or a one-paragraph error naming `where`."""
    if not value.isdigit():
        raise SparkforgeError(
            f"{where}: SOURCE_DATE_EPOCH {value!r} is not a whole number of seconds since 1970-01-01 UTC; "
            "fix: unset it (the build derives one from its pinned base images) or set e.g. 1767225600"
        )
    return int(value)


def parse_created(value: str) -> int:
    """An OCI/Docker `created` time (RFC 3339, any fraction) -> whole seconds since the epoch."""
    text = value.strip().replace("Z", "+00:00")
    if "." in text:  # Go writes up to nanoseconds; Python's parser takes at most microseconds
        head, _, rest = text.partition(".")
        text = head + rest.lstrip("0123456789")
    return int(dt.datetime.fromisoformat(text).timestamp())


def source_date_epoch(base_images: Sequence[str], created_of: Callable[[str], str]) -> Epoch:
    """The build's epoch: $SOURCE_DATE_EPOCH, else the newest `created` of the stages' pinned base images."""
    if os.environ.get(ENV):
        return Epoch(parse_epoch(os.environ[ENV], "the environment"), f"${ENV}")
    times = {ref: parse_created(created_of(ref)) for ref in dict.fromkeys(base_images)}
    newest = max(times, key=lambda ref: times[ref])
    return Epoch(times[newest], f"created time of base image {newest}")


def for_build(session: Session, recipe: Recipe, bases: Bases) -> Epoch:
    """The epoch of one build of `recipe` on `bases` (a source build has two base images; --dry reads none)."""
    if session.runner.dry and not os.environ.get(ENV):
        return Epoch(0, "--dry: base images not read")
    return source_date_epoch(epoch_bases(recipe, bases), lambda ref: _engine_created(session, ref))


def epoch_bases(recipe: Recipe, bases: Bases) -> list[str]:
    """The base images whose newest `created` is the epoch: a source build's two stages, else the runtime's."""
    git = recipe.model.components.vllm.source == "git"
    return [bases.builder, bases.runtime] if git else [bases.runtime]


def _engine_created(session: Session, ref: str) -> str:
    """A base image's `created`, as the engine holds it (a base BuildKit has to pull is pulled first)."""
    if not engine.image_exists(ref):
        try:
            engine.run_cli(session.runner, session.container_engine, "pull-base", "pull", ref)
        except EngineError as exc:
            raise EngineError(
                f"base image {ref} is not in the engine and its pull failed ({str(exc).splitlines()[-1][:160]}); "
                "the build reads its SOURCE_DATE_EPOCH from it. A base image could not be pulled (offline, or no "
                "access): pass --base-image REF (a mirror, or 'invoke engine.bases' for offline Debian bases), or "
                "log in to the registry; nothing was built"
            ) from None
    return str(engine.inspect_image(ref).get("Created") or "")
