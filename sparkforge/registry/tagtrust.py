"""Moving tags under TUF: what promote, rollback and the GPU job's revocation check and write, for every recipe.

The signed TUF targets (tufclient, tufrepo) are the truth of a moving tag: `tags/<tag>` names its index, its
platform images and the GPU claims it moved on; `revoked/<digest>` lists every image a failed verify revoked.
The registry tag itself is a convenience for `docker pull`: it is re-pointed after each move, and a tag moved by
hand is ignored by `pull` (which pulls what the targets name) and simply re-pointed by the next move.
Recipes without publish.signing keep the unsigned history record (history.py) and have no trusted tags.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkforge.errors import PublishError
from sparkforge.recipe.loader import Recipe
from sparkforge.registry import history, tufclient, tufrepo
from sparkforge.registry.cosign import Cosign, Policy
from sparkforge.registry.history import Entry, TagHistory, TagMove
from sparkforge.registry.manifests import Manifests
from sparkforge.registry.ocidist import Registry
from sparkforge.registry.tufclient import TagTarget, TrustedState


def state_of(tools: Manifests, recipe: Recipe) -> TrustedState:
    """The repository's trusted TUF targets, refreshed from the registry now."""
    return tufclient.refresh(
        tools.repository, Registry(tools.repository), root_file=tufclient.root_file_of(recipe)
    )


def log_of(target: TagTarget | None, repository: str) -> TagHistory:
    """A tag's signed moves as history entries (oldest first), for `history`, `rollback` and `pull --digest`."""
    if target is None:
        return TagHistory(repository, "", ())
    moves = [*target.history, {**target.custom(), "index": target.index}]
    entries, previous = [], None
    for move in moves:
        index = str(move.get("index"))
        entries.append(
            Entry(
                index,
                str(move.get("date") or ""),
                str(move.get("action") or ""),
                target.recipe,
                target.recipe_hash,
                dict(move.get("platforms") or {}),
                previous,
            )
        )
        previous = index
    return TagHistory(repository, target.tag, tuple(entries))


def read_log(recipe: Recipe, tools: Manifests, tag: str) -> TagHistory:
    """The tag's history for readers: from the signed TUF targets when the recipe signs, else the record."""
    if Policy.for_verify(recipe) is None:
        return history.read(tools, tag)
    bare = history.tag_of(tools.repository, tag)
    return log_of(state_of(tools, recipe).moves_of(bare), tools.repository)


def current_of(recipe: Recipe, tools: Manifests, tag: str) -> str | None:
    """What `tag` names now: by the signed TUF targets when the recipe signs (None when they name nothing),
    else by the registry tag."""
    bare = history.tag_of(tools.repository, tag)
    if Policy.for_verify(recipe) is None:
        ref = f"{tools.repository}:{bare}"
        return tools.digest_of(ref) if tools.fetch(ref) else None
    target = state_of(tools, recipe).tags.get(bare)
    return target.index if target else None


def before_move(
    recipe: Recipe, tools: Manifests, index: str, images: Mapping[str, str]
) -> TrustedState | None:
    """What promote and rollback check before moving tags of a signing recipe: the index's signature, and no
    revocation in the signed targets (refreshed: a rolled-back, frozen or forked repository is refused)."""
    policy = Policy.of(recipe)
    if policy is None or Policy.for_verify(recipe) is None:
        return None
    repo = recipe.model.publish.repository
    signed = Cosign(tools.runner).verify(f"{repo}@{index}", policy)
    if not signed.ok:
        raise PublishError(
            f"refusing to move tags to {repo}@{index}: the index has no valid signature by {policy.describe()} "
            f"(cosign: {signed.reason}); nothing was moved. fix: move tags only to an index 'invoke sign' signed"
        )
    state = state_of(tools, recipe)
    why = state.revoked_of(index, *images.values())
    if why:
        raise PublishError(
            f"refusing to move tags to {repo}@{index}: {why}; nothing was moved. fix: publish and verify a new build"
        )
    return state


def record_move(
    recipe: Recipe, tools: Manifests, tags: list[str] | tuple[str, ...], move: TagMove, evidence_dir: Path
) -> None:
    """After the registry tags moved: a new signed targets version per tag (signing recipes), else the record."""
    if Policy.for_verify(recipe) is None:
        history.record_move(tools, tags, move, evidence_dir, recipe.model.gpu)
        return
    if tools.runner.dry:
        return
    when = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    for tag in tags:
        target = TagTarget(
            history.tag_of(tools.repository, tag),
            move.index,
            dict(move.platforms),
            {p: list(d) for p, d in move.claims.items()},
            move.recipe,
            move.recipe_hash,
            when,
            move.action,
        )
        tufrepo.move_tag(tools.repository, target, Registry(tools.repository), tufclient.root_file_of(recipe))


def revoke_failed(recipe: Recipe, image: str, report: Mapping[str, Any], tools: Manifests) -> list[str]:
    """After a failed verify was attested: the digest goes into the signed targets' revoked list, and every
    moving tag naming it leaves the targets (a new targets version without the image); the tags removed."""
    if report.get("status") == "passed" or Policy.for_verify(recipe) is None or tools.runner.dry:
        return []
    failed = [c.get("name") for c in report.get("checks") or [] if c.get("status") == "failed"]
    reason = "verify failed: " + (", ".join(str(f) for f in failed) or "no check passed")
    digest = image.rpartition("@")[2]
    before = state_of(tools, recipe)
    removed = [t for t, target in before.tags.items() if digest in {target.index, *target.platforms.values()}]
    tufrepo.revoke(
        tools.repository, {digest: reason}, Registry(tools.repository), tufclient.root_file_of(recipe)
    )
    return removed


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


def signed_claims(recipe: Recipe, tools: Manifests, images: Mapping[str, str]) -> dict[str, list[str]]:
    """platform -> the digest of the signed GPU claim that makes its image GPU-verified (else PublishError)."""
    from sparkforge.registry.earlier import signed_gpu_claim

    out, problems = {}, []
    for platform, digest in sorted(images.items()):
        why, claim = signed_gpu_claim(recipe, tools, platform, digest)
        if why:
            problems.append(f"{platform} {digest[:19]}: {why}")
        out[platform] = [claim] if claim else []
    if problems:
        raise PublishError(
            f"refusing to move the moving tags of {recipe.model.publish.repository}: a platform image has no "
            f"signed GPU-verified claim ({' | '.join(problems)}); nothing was moved. fix: let the GPU verify job "
            "attest it ('invoke sign.attest'), then promote"
        )
    return out


def published(state: TrustedState) -> list[dict[str, Any]]:
    """Every index the signed targets name or named (`invoke images`), newest move first: tag, index, platform
    images, GPU claims, date, action and the verdict the signed metadata gives (revoked, or GPU-verified when
    it moved: a moving tag names only GPU-verified images)."""
    rows = []
    for tag, target in [*state.tags.items(), *state.removed.items()]:
        current = tag in state.tags
        for n, move in enumerate(reversed([*target.history, {**target.custom(), "index": target.index}])):
            platforms = dict(move.get("platforms") or {})
            revoked = state.revoked_of(str(move.get("index")), *platforms.values())
            rows.append(
                {
                    "tag": tag,
                    "index": str(move.get("index")),
                    "platforms": platforms,
                    "claims": target.claims if n == 0 else {},
                    "date": str(move.get("date") or ""),
                    "action": str(move.get("action") or ""),
                    "names_now": current and n == 0,
                    "verdict": f"REVOKED: {revoked}"
                    if revoked
                    else "GPU-verified when it moved (signed claim)",
                }
            )
    return sorted(rows, key=lambda r: r["date"], reverse=True)
