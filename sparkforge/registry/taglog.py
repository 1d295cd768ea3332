"""The signed, append-only log of a moving tag: every move and every revocation, signed by the verify signer.

A registry writer can delete a failed claim's layer from the `.att` manifest, re-point a tag, or rewrite the
unsigned history record. So each version of `REPOSITORY:<tag>.history` carries a cosign attestation (predicate
type TAG_LOG) whose predicate is the whole log: the entries, their count (`sequence`), repository and tag. It is
signed by the verify signer (the GPU job moves tags and revokes) and read only through that signature; the
image's own file is a copy for readers without sparkforge.

What holds offline: an entry cannot be forged or removed from a signed version; a tag moved outside sparkforge
(its log's last move names another index) and a missing or unsigned log of a moving tag are refused; a client
that has read sequence n refuses any shorter version later (`seen_dir`). What does not: a client that never read
the log can be shown an older, validly signed version (a freeze); keyless signatures are in Rekor, whose search
by digest (rekor-cli) shows every attestation ever made, including an erased revocation (docs/trust.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkforge.boundary import read_json, write_output
from sparkforge.errors import InputError, PublishError
from sparkforge.recipe.loader import Recipe
from sparkforge.registry import history
from sparkforge.registry.cosign import TAG_LOG, Cosign, Policy, Signer
from sparkforge.registry.history import Entry, TagHistory
from sparkforge.registry.manifests import Manifests
from sparkforge.verify import verified

STATE_ENV = "SPARKFORGE_TAG_LOG_STATE"  # where this machine keeps the longest log it has read (default below)


def seen_dir() -> Path:
    return Path(os.environ.get(STATE_ENV) or verified.VERIFIED_DIR / "tag-logs")


ATTEMPTS = 5  # compare-and-swap retries when another move lands between read and write


def predicate(log: TagHistory) -> dict[str, Any]:
    data = log.to_json()
    return {**data, "sequence": len(log.entries), "attestedAt": dt.datetime.now(dt.UTC).isoformat()}


def read_signed(tools: Manifests, tag: str, policy: Policy) -> tuple[TagHistory, str] | None:
    """The tag's log as its newest signed version says (and that version's digest); None when there is none.

    Refuses, before pulling anything, a record over history.MAX_BYTES; refuses a record without a valid
    signature by `policy`, and a version shorter than one this machine has read before.
    """
    tag = history.tag_of(tools.repository, tag)
    ref = history.record_ref(tools.repository, tag)
    manifest = tools.fetch(ref)
    if manifest is None:
        return None
    if history.record_size(manifest) > history.MAX_BYTES:
        raise history.too_large(ref, history.record_size(manifest))
    digest = tools.digest_of(ref)
    found = Cosign(tools.runner).attestations(f"{tools.repository}@{digest}", policy, TAG_LOG)
    mine = [
        s.predicate
        for s in found.statements
        if digest in s.subjects
        and s.predicate.get("kind") == history.KIND
        and s.predicate.get("repository") == tools.repository
        and s.predicate.get("tag") == tag
        and len(s.predicate.get("entries") or []) == s.predicate.get("sequence")
    ]
    if not mine:
        raise PublishError(
            f"the history of {tools.repository}:{tag} ({ref}, {digest[:19]}) carries no valid signature by "
            f"{policy.describe()}"
            + (f" (cosign: {found.reason})" if found.reason else "")
            + ": a registry writer may have rewritten it, or it was written by a sparkforge that did not sign "
            "it; nothing was trusted. fix: have the GPU verify job re-append the tag's moves (promote again), "
            "or restore the signed record"
        )
    newest = max(mine, key=lambda p: int(p.get("sequence") or 0))
    log = TagHistory(tools.repository, tag, tuple(Entry.from_dict(e) for e in newest["entries"]))
    _check_seen(log, digest)
    return log, digest


def _seen_file(seen_dir: Path, repository: str, tag: str) -> Path:
    return seen_dir / (hashlib.sha256(f"{repository}:{tag}".encode()).hexdigest()[:32] + ".json")


def _check_seen(log: TagHistory, digest: str) -> None:
    """A version shorter than one read before on this machine is a rolled-back log: refused."""
    folder = seen_dir()
    path = _seen_file(folder, log.repository, log.tag)
    try:
        seen = read_json(path, "the seen-history record", max_bytes=1 << 20) if path.exists() else {}
    except InputError:
        seen = {}
    if len(log.entries) < int(seen.get("sequence") or 0):
        raise PublishError(
            f"the signed history of {log.repository}:{log.tag} has {len(log.entries)} entries, but this machine "
            f"read {seen.get('sequence')} before ({seen.get('digest')}): the registry serves an older version (a "
            "registry writer may be hiding a later move or revocation). fix: restore the newest record, or ask "
            f"the maintainers; remove {path} only if the log was reset on purpose"
        )
    write_output(
        path, json.dumps({"sequence": len(log.entries), "digest": digest}) + "\n", "seen-history record"
    )


def append_signed(tools: Manifests, tag: str, entry: Entry, signer: Signer, policy: Policy) -> TagHistory:
    """Append `entry` and sign the new version; compare-and-swap with retry so concurrent moves lose nothing.

    A registry has no conditional tag write: the record's digest is compared just before the push and read
    again after signing; when another move landed in between, the log is re-read and `entry` appended again.
    """
    tag = history.tag_of(tools.repository, tag)
    ref = history.record_ref(tools.repository, tag)
    for _ in range(ATTEMPTS):
        found = read_signed(tools, tag, policy)
        before = found[1] if found else None
        updated = TagHistory(tools.repository, tag, (*(found[0].entries if found else ()), entry))
        now = tools.digest_of(ref) if tools.fetch(ref) is not None else None
        if now != before:
            continue  # another move landed since the read
        digest = history.push_record(tools, updated)
        Cosign(tools.runner).attest(f"{tools.repository}@{digest}", TAG_LOG, predicate(updated), signer)
        if tools.digest_of(ref) == digest:
            _check_seen(updated, digest)
            return updated
    raise PublishError(
        f"could not append to the history of {tools.repository}:{tag}: it changed under every one of {ATTEMPTS} "
        "attempts (another move is writing it); fix: wait for the other move to finish and re-run the command"
    )


def revocations(log: TagHistory) -> set[str]:
    """Digests (index or platform image) that a signed failed verify revoked."""
    return {d for e in log.entries if e.action == "revoke" for d in (e.digest, *e.platforms.values())}


def last_move(log: TagHistory) -> Entry | None:
    moves = [e for e in log.entries if e.action != "revoke"]
    return moves[-1] if moves else None


def moving_tags_of(recipe: Recipe) -> list[str]:
    from sparkforge.recipe import plan

    tags = plan.final_tags(recipe, dt.datetime.now(dt.UTC).date()).moving
    return [history.tag_of(recipe.model.publish.repository, t) for t in tags]


def check_moving_tag(tools: Manifests, tag: str, names: str | None, policy: Policy) -> TagHistory:
    """A moving tag's signed log exists and its last move names what the tag names now (`names`)."""
    found = read_signed(tools, tag, policy)
    if found is None:
        raise PublishError(
            f"{tools.repository}:{tag} is a moving tag without a signed history ({history.record_ref(tools.repository, tag)} "
            "is missing): it was moved outside sparkforge, or its log was deleted; nothing was trusted. fix: "
            "move it with 'invoke publish --promote' from the GPU verify job (that writes the signed log)"
        )
    log = found[0]
    last = last_move(log)
    if names is not None and (last is None or last.digest != names):
        raise PublishError(
            f"{tools.repository}:{tag} names {names}, but its signed history says the last move made it name "
            f"{last.digest if last else 'nothing'}: the tag was moved outside sparkforge (or the log is an older "
            "version); nothing was trusted. fix: move it with 'invoke publish --promote' or '--rollback'"
        )
    return log


def revoked_in_logs(recipe: Recipe, tools: Manifests, policy: Policy, digests: Mapping[str, str]) -> str:
    """Why one of `digests` (what -> digest) is revoked by a moving tag's signed log ('' when none is)."""
    for tag in moving_tags_of(recipe):
        found = read_signed(tools, tag, policy)
        if found is None:
            continue
        revoked = revocations(found[0])
        for what, digest in digests.items():
            if digest in revoked:
                return (
                    f"the signed history of {tools.repository}:{tag} records a failed verify of the {what} "
                    f"{digest[:19]} (a revocation, kept even where its claim was erased from the registry)"
                )
    return ""


def record_revocation(
    recipe: Recipe, tools: Manifests, platform: str, digest: str, signer: Signer, reason: str
) -> list[str]:
    """Append a signed `revoke` entry naming the platform image to every moving tag's log; the tags written."""
    policy = Policy.for_verify(recipe)
    if policy is None or tools.runner.dry:
        return []
    done = []
    for tag in moving_tags_of(recipe):
        entry = history.Entry(
            digest,
            dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
            "revoke",
            recipe.name,
            recipe.hash,
            {platform: digest},
            None,
            {platform: {"status": "failed", "gpu_verified": False, "reason": reason[:300]}},
        )
        append_signed(tools, tag, entry, signer, policy)
        done.append(tag)
    return done


def read_log(recipe: Recipe, tools: Manifests, tag: str) -> TagHistory:
    """The tag's history for readers: the signed log when the recipe signs, else the unsigned record."""
    policy = Policy.for_verify(recipe)
    if policy is None:
        return history.read(tools, tag)
    found = read_signed(tools, tag, policy)
    return found[0] if found else TagHistory(tools.repository, history.tag_of(tools.repository, tag), ())


def record_move(
    recipe: Recipe,
    tools: Manifests,
    tags: list[str] | tuple[str, ...],
    action: str,
    names: tuple[str, str],
    index: str,
    platforms: Mapping[str, str],
    previous: Mapping[str, str | None],
    evidence_dir: Path,
    signer: Signer | None = None,
) -> None:
    """Append one entry per moved tag: signed by the verify signer when the recipe signs (`names`: the recipe
    name and hash the entry is for)."""
    policy = Policy.for_verify(recipe)
    if policy is None:
        history.record_move(
            tools, tags, action, *names, index, platforms, previous, evidence_dir, recipe.model.gpu
        )
        return
    if tools.runner.dry:
        return
    for tag in tags:
        bare = history.tag_of(tools.repository, tag)
        before = previous.get(tag, previous.get(bare))
        entry = history.new_entry(action, *names, index, platforms, before, evidence_dir, recipe.model.gpu)
        append_signed(tools, bare, entry, signer or Signer.from_env(), policy)


def before_move(
    recipe: Recipe, tools: Manifests, index: str, images: Mapping[str, str], current: Mapping[str, str | None]
) -> None:
    """What promote and rollback check before moving tags of a signing recipe: the index's signature, each
    moving tag's signed log (present, and its last move names what the tag names now), and no revocation."""
    policy, verifier = Policy.of(recipe), Policy.for_verify(recipe)
    if policy is None or verifier is None:
        return
    repo = recipe.model.publish.repository
    signed = Cosign(tools.runner).verify(f"{repo}@{index}", policy)
    if not signed.ok:
        raise PublishError(
            f"refusing to move tags to {repo}@{index}: the index has no valid signature by {policy.describe()} "
            f"(cosign: {signed.reason}); nothing was moved. fix: move tags only to an index 'invoke sign' signed"
        )
    revoked: set[str] = set()
    for tag in moving_tags_of(recipe):
        names = current.get(tag, current.get(f"{repo}:{tag}"))
        if names is not None:  # the tag exists: its signed log must say it names what it names
            revoked |= revocations(check_moving_tag(tools, tag, names, verifier))
            continue
        found = read_signed(tools, tag, verifier)
        revoked |= revocations(found[0]) if found else set()
    hit = sorted({index, *images.values()} & revoked)
    if hit:
        raise PublishError(
            f"refusing to move tags to {repo}@{index}: the signed history revokes {', '.join(d[:19] for d in hit)} "
            "(a failed GPU verify); nothing was moved. fix: publish and verify a new build"
        )


def revoke_failed(
    recipe: Recipe, image: str, report: Mapping[str, Any], signer: Signer, tools: Manifests
) -> list[str]:
    """After a failed verify was attested: the revocation also goes into every moving tag's signed log, where
    a registry writer who erases the claim's layer from the `.att` manifest cannot remove it."""
    if report.get("status") == "passed":
        return []
    failed = [c.get("name") for c in report.get("checks") or [] if c.get("status") == "failed"]
    reason = "verify failed: " + (", ".join(str(f) for f in failed) or "no check passed")
    platform = str(report.get("platform") or "")
    return record_revocation(recipe, tools, platform, image.rpartition("@")[2], signer, reason)


def crashed_report(recipe: Recipe, image: str, platform: str, error: str, tools: Manifests) -> dict[str, Any]:
    """The minimal failed verify report CI attests when verify crashed before writing one (so a crash revokes
    too): about the image (its config digest), with the error as its one failed check."""
    return {
        "tool": "sparkforge",
        "command": "verify",
        "recipe": recipe.name,
        "subject": image,
        "status": "failed",
        "recipe_hash": recipe.hash,
        "image_id": tools.config_digest(image),
        "platform": platform,
        "gpus": {"used": False, "why": "verify did not finish"},
        "gpu": None,
        "suite": {},
        "checks": [{"name": "verify", "status": "failed", "reason": f"verify did not finish: {error[:500]}"}],
    }
