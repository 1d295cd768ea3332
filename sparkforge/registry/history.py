"""Tag history kept in the registry itself: which indexes a tag has named, when, and on what evidence.

A registry keeps no tag history, so every move of a moving tag (publish --moving, promote, rollback) appends
an entry to a small record stored beside the tag: the image `REPOSITORY:<tag>.history`, one layer holding
`/sparkforge-history.json`. Anyone who can pull the tag can read it (`invoke history`, or `docker pull` then
`docker cp` of that one file). The record is append-only by convention: each write reads the last one first.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkforge import engine
from sparkforge.boundary import parse_json
from sparkforge.commands import Command
from sparkforge.errors import EngineError, InputError, PublishError
from sparkforge.registry.manifests import Manifests
from sparkforge.verify import verified

FILE = "sparkforge-history.json"
SUFFIX = ".history"
KIND = "sparkforge/tag-history/v1"
MAX_BYTES = 1 << 20  # a record of thousands of moves; more is refused before it is pulled


@dataclass(frozen=True)
class Entry:
    """One move of a tag: the index it named from then on, and the evidence it moved on."""

    digest: str  # the index (or single image) the tag named after this move
    date: str  # UTC, ISO 8601
    action: str  # publish, promote, rollback
    recipe: str
    recipe_hash: str
    platforms: dict[str, str]  # platform -> image digest
    previous: str | None = None  # what the tag named before (None: nothing)
    verified: dict[str, dict[str, Any]] = field(default_factory=dict)  # platform -> GPU verdict at the move

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class TagHistory:
    repository: str
    tag: str
    entries: tuple[Entry, ...]

    @property
    def reference(self) -> str:
        return record_ref(self.repository, self.tag)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "repository": self.repository,
            "tag": self.tag,
            "entries": [asdict(e) for e in self.entries],
        }


def tag_of(repository: str, tag: str) -> str:
    """The bare tag of `tag`, which may also be given as repository:tag (as plan.final_tags writes them)."""
    return tag.removeprefix(f"{repository}:")


def record_ref(repository: str, tag: str) -> str:
    return f"{repository}:{tag_of(repository, tag)}{SUFFIX}"


def no_history(repository: str, tag: str, recipe: str, signed: bool = False) -> PublishError:
    where = (
        "the signed TUF targets name no move of it"
        if signed
        else f"{record_ref(repository, tag)} is not in the registry"
    )
    return PublishError(
        f"{repository}:{tag} has no history ({where}): it was never "
        "moved by 'invoke publish --moving/--promote' of this sparkforge, or the tag does not exist; fix: check "
        f"--tag, or move it to a GPU-verified index with 'invoke publish --recipe {recipe} --promote sha256:...'"
    )


def evidence_of(platforms: Mapping[str, str], evidence_dir: Path, gpu: str) -> dict[str, dict[str, Any]]:
    """The GPU verdict of each platform image at the time of a move, from this machine's verify records."""
    out = {}
    for platform, digest in sorted(platforms.items()):
        record = verified.record_for_digest(digest, evidence_dir)
        verdict = (record or {}).get("gpu_verified") or {}
        out[platform] = {
            "status": (record or {}).get("status", "unknown"),
            "gpu_verified": verified.is_gpu_verified(record, gpu),
            "reason": verdict.get("reason", "no verify record on the machine that moved the tag"),
        }
    return out


def read(tools: Manifests, tag: str) -> TagHistory:
    """The tag's history from the registry (no entries when it has none)."""
    tag = tag_of(tools.repository, tag)
    ref = record_ref(tools.repository, tag)
    manifest = tools.fetch(ref)
    if manifest is None:
        return TagHistory(tools.repository, tag, ())
    if record_size(manifest) > MAX_BYTES:
        raise PublishError(
            f"{ref} says it holds {record_size(manifest)} bytes, more than a tag history may ({MAX_BYTES}); nothing "
            "of it was pulled. fix: check who writes that tag (a registry writer may be flooding it), and delete it "
            "if it is not sparkforge's"
        )
    try:
        pulled = tools.runner.capture(
            Command((tools.engine.docker, "pull", "-q", ref), tools.engine.env), "history-pull", check=False
        )
        if pulled.returncode != 0:
            raise EngineError(pulled.output.strip()[-300:])
        data = engine.read_image_file(ref, "/" + FILE)
    except EngineError as exc:
        raise PublishError(f"cannot read the history of {tools.repository}:{tag} ({ref}): {exc}") from None
    finally:
        engine.remove_image(ref)
    try:
        parsed = parse_json((data or b"").decode("utf-8", "replace"), ref)
        if not isinstance(parsed, dict) or parsed.get("kind") != KIND:
            raise ValueError(f"kind {parsed.get('kind')!r}")
        entries = tuple(Entry.from_dict(e) for e in parsed.get("entries") or [])
    except (InputError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise PublishError(
            f"{ref} is not a sparkforge tag history ({exc}); fix: check that nothing else writes tags ending in "
            f"'{SUFFIX}' to {tools.repository}, and delete that tag if it was written in error"
        ) from None
    return TagHistory(tools.repository, tag, entries)


def append(
    tools: Manifests,
    tag: str,
    entry: Entry,
    now: dt.datetime | None = None,
) -> TagHistory:
    """Add `entry` to the tag's unsigned history (recipes without publish.signing; signing recipes keep moves in the TUF targets: tagtrust)."""
    tag = tag_of(tools.repository, tag)
    current = read(tools, tag)
    updated = TagHistory(tools.repository, tag, (*current.entries, entry))
    push_record(tools, updated, now)
    return updated


def push_record(tools: Manifests, updated: TagHistory, now: dt.datetime | None = None) -> str:
    """Push the history image `REPOSITORY:<tag>.history` holding `updated`; its digest in the registry."""
    ref = updated.reference
    payload = (json.dumps(updated.to_json(), indent=2, sort_keys=True) + "\n").encode()
    stamp = (now or dt.datetime.now(dt.UTC)).timestamp()
    with tempfile.TemporaryDirectory(prefix="sparkforge-history-") as tmp:
        archive = Path(tmp) / "history.tar"
        with tarfile.open(archive, "w") as tar:
            info = tarfile.TarInfo(FILE)
            info.size, info.mtime, info.mode = len(payload), int(stamp), 0o644
            tar.addfile(info, io.BytesIO(payload))
        change = f"LABEL dev.sparkforge.history={tools.repository}:{updated.tag}"
        try:
            engine.run_cli(
                tools.runner, tools.engine, "history-import", "import", "-c", change, str(archive), ref
            )
            output = engine.run_cli(tools.runner, tools.engine, "history-push", "push", ref)
        except EngineError as exc:
            raise PublishError(
                f"{tools.repository}:{updated.tag} moved, but its history record {ref} could not be written "
                f"({exc}); fix: log in to the registry with push rights and re-run the same command"
            ) from None
        finally:
            engine.remove_image(ref)
    found = re.findall(r"digest: (sha256:[0-9a-f]{64})", output)
    return found[-1] if found else tools.digest_of(ref)


def record_size(manifest: Mapping[str, Any]) -> int:
    """The bytes a history record's manifest says it holds (checked before anything of it is pulled)."""
    parts = [manifest.get("config") or {}, *(manifest.get("layers") or [])]
    return sum(int(p.get("size") or 0) for p in parts if isinstance(p, Mapping))


@dataclass(frozen=True)
class TagMove:
    """One move of tags to an index (publish --moving, promote, rollback): what the history, or the signed
    targets, record for each tag moved."""

    action: str  # publish, promote, rollback
    recipe: str  # the recipe (and its hash) the index was built from
    recipe_hash: str
    index: str  # the index the tags name from now on
    platforms: Mapping[str, str]  # platform -> image digest inside the index
    previous: Mapping[str, str | None] = field(
        default_factory=dict
    )  # tag -> what it named before (None: absent)
    claims: Mapping[str, list[str]] = field(
        default_factory=dict
    )  # platform -> the signed GPU claims (signing)


def new_entry(
    move: TagMove, previous: str | None, evidence_dir: Path, gpu: str, now: dt.datetime | None = None
) -> Entry:
    """The history entry of `move` for one tag that named `previous` before; the verdicts are for `gpu`."""
    when = (now or dt.datetime.now(dt.UTC)).replace(microsecond=0).isoformat()
    return Entry(
        move.index,
        when,
        move.action,
        move.recipe,
        move.recipe_hash,
        dict(move.platforms),
        previous,
        evidence_of(move.platforms, evidence_dir, gpu),
    )


def record_move(
    tools: Manifests, tags: tuple[str, ...] | list[str], move: TagMove, evidence_dir: Path, gpu: str
) -> None:
    """Append one entry per moved tag (nothing when dry); `gpu` is the recipe's target the verdicts are for."""
    if tools.runner.dry:
        return
    for tag in tags:
        before = move.previous.get(tag, move.previous.get(tag_of(tools.repository, tag)))
        append(tools, tag, new_entry(move, before, evidence_dir, gpu))


def current_digests(tools: Manifests, tags: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """What each tag names in the registry now (None: absent), read before a move; keyed by bare tag."""
    out: dict[str, str | None] = {}
    for tag in tags:
        ref = f"{tools.repository}:{tag_of(tools.repository, tag)}"
        out[tag_of(tools.repository, tag)] = tools.digest_of(ref) if tools.fetch(ref) else None
    return out
