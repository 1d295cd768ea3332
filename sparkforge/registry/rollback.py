"""Move a moving tag back to the previous GPU-verified index its history names, under promote's own gate.

The gate is `publish.require_gpu_verified` (every platform image GPU-verified for the recipe's GPU) plus the
recipe's platform set, exactly what `promote` requires; only the one tag asked for moves.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sparkforge.context import Session
from sparkforge.errors import PublishError
from sparkforge.recipe.loader import Recipe, recipe_ref
from sparkforge.registry import earlier, history, tagtrust
from sparkforge.registry import publish as pub
from sparkforge.registry.cosign import Cosign, Policy
from sparkforge.registry.manifests import Manifests, index_platforms
from sparkforge.registry.trust import is_moving
from sparkforge.verify import verified


def roll_back(
    session: Session, recipe: Recipe, tag: str, evidence_dir: Path = verified.VERIFIED_DIR
) -> pub.Published:
    """Point `tag` at the newest earlier index in its history that passes promote's gate; refuse when none does."""
    repo = recipe.model.publish.repository
    if not is_moving(recipe, tag):
        moving = ", ".join(recipe.model.publish.moving_tags) or "none"
        raise PublishError(
            f"--rollback {tag}: not a moving tag of recipe {recipe.name} (moving tags: {moving}); immutable tags "
            "never move; fix: pass a moving tag, e.g. --rollback latest"
        )
    tools = pub.session_tools(session, recipe, "rollback")
    policy = Policy.of(recipe)
    signing = policy is not None and Policy.for_verify(recipe) is not None
    state = tagtrust.state_of(tools, recipe) if signing else None
    # signing recipes: the signed TUF targets (what the tag names there, its moves, the revoked list)
    bare = history.tag_of(repo, tag)
    target = state.moves_of(bare) if state else None
    past = tagtrust.log_of(target, repo) if state else history.read(tools, tag)
    if not past.entries:
        raise history.no_history(repo, tag, recipe_ref(recipe), signed=state is not None)
    if state:
        current: str | None = state.tags[bare].index if bare in state.tags else None
    else:
        current = tools.digest_of(f"{repo}:{tag}") if tools.fetch(f"{repo}:{tag}") else None
    revoked = set(state.revoked) if state else set()
    # The entries before the one that made the tag name what it names now, newest first.
    last = max((i for i, e in enumerate(past.entries) if e.digest == current), default=len(past.entries))
    # A release the tag was rolled back from is never a rollback target again.
    seen: set[str] = {current or ""} | {e.previous or "" for e in past.entries if e.action == "rollback"}
    refused: list[str] = []
    for entry in reversed(past.entries[:last]):
        if entry.digest in seen:
            continue
        seen.add(entry.digest)
        if {entry.digest, *entry.platforms.values()} & revoked:
            refused.append(f"{entry.digest[:19]} ({entry.date}): revoked in the signed TUF targets")
            continue
        if (
            policy is not None
            and not (found := Cosign(tools.runner).verify(f"{repo}@{entry.digest}", policy)).ok
        ):
            refused.append(f"{entry.digest[:19]} ({entry.date}): no valid index signature ({found.reason})")
            continue
        manifest = tools.fetch(f"{repo}@{entry.digest}")
        if manifest is None:
            refused.append(f"{entry.digest[:19]} ({entry.date}): no longer in the registry")
            continue
        images = dict(index_platforms(manifest)) if "manifests" in manifest else {}
        try:
            pub.require_platforms(recipe, list(images), f"index {entry.digest[:19]}", "roll back to")
            if policy is None:  # unsigned recipes: this machine's verify records (promote's gate)
                pub.require_gpu_verified(recipe, images, evidence_dir)
        except PublishError as exc:
            refused.append(f"{entry.digest[:19]} ({entry.date}): {str(exc).split('Not: ')[-1][:300]}")
            continue
        # Signing recipes: the signed GPU claims, judged by the recipe the signed provenance names (any clone).
        problems = [
            f"{p} {d[:19]}: {why}"
            for p, d in sorted(images.items())
            if policy is not None and (why := earlier.signed_gpu_claim(recipe, tools, p, d)[0])
        ]
        if problems:
            refused.append(f"{entry.digest[:19]} ({entry.date}): {' | '.join(problems)[:400]}")
            continue
        move = history.TagMove(
            "rollback", entry.recipe, entry.recipe_hash, entry.digest, images, {tag: current}
        )
        return _move(session, recipe, tools, tag, move, evidence_dir)
    raise PublishError(
        f"refusing to roll back {repo}:{tag}: no earlier index in its history is GPU-verified for "
        f"{recipe.model.gpu} on every platform (promote's rule). "
        + (f"Tried: {' | '.join(refused)}. " if refused else "Its history names no earlier index. ")
        + f"Nothing was moved; {tag} still names {current}. Fix: verify an earlier index on the target GPU "
        "('invoke verify --gpus all' of its pulled images), then re-run the rollback, or promote a new index"
    )


def _move(
    session: Session, recipe: Recipe, tools: Manifests, tag: str, move: history.TagMove, evidence_dir: Path
) -> pub.Published:
    repo, index, images = recipe.model.publish.repository, move.index, dict(move.platforms)
    current = move.previous[tag]
    if not tools.runner.dry:  # the index signature, no revocation in the (refreshed) signed targets
        tagtrust.before_move(recipe, tools, index, images)
    if tools.buildx:
        tools.create(
            [f"{repo}:{tag}"], [f"{repo}@{index}"]
        )  # one index source: a carbon copy, as promote does
        got = index if tools.runner.dry else tools.digest_of(f"{repo}:{tag}")
    else:
        got = tools.create([f"{repo}:{tag}"], [f"{repo}@{d}" for d in images.values()]) or index
    if got != index:
        raise PublishError(
            f"{tag} now names index {got}, an equivalent of {index} with other bytes; verify it and promote it "
            "('invoke publish --promote')"
        )
    session.echo(f"sparkforge: rolled back {repo}:{tag} from {current} to {index}")
    if Policy.for_verify(recipe) is not None and not tools.runner.dry:
        claims = {p: [earlier.signed_gpu_claim(recipe, tools, p, d)[1]] for p, d in sorted(images.items())}
        move = replace(move, claims=claims)
    tagtrust.record_move(recipe, tools, [tag], move, evidence_dir)
    return pub.Published(recipe.name, repo, index, images, (tag,), (), "")
