"""What a published release carries beyond its signature: the signed kernel report, and a tag's history
enriched with each index's signed verify verdicts and kernel coverage (for `history`, `pull` and `verify`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sparkforge.audit.compat import VERDICTS
from sparkforge.context import Session, quiet_session
from sparkforge.recipe.loader import Recipe
from sparkforge.registry import history, tagtrust
from sparkforge.registry.cosign import (
    KERNELS_CLAIM,
    VERIFY_CLAIM,
    Cosign,
    Policy,
    SigningError,
)
from sparkforge.registry.manifests import Manifests
from sparkforge.registry.trust import attestation_check
from sparkforge.report import Check
from sparkforge.verify.kernels_report import coverage_summary


def _newest(predicates: list[dict[str, Any]]) -> dict[str, Any]:
    """The claim with the latest signed time (attestedAt, inside the signed predicate), not the last listed."""
    return max(predicates, key=lambda p: str(p.get("attestedAt") or ""))


def signed_claims(recipe: Recipe, ref: str, cosign: Cosign) -> dict[str, Any]:
    """The newest signed kernel report and verify claim of one platform image (empty when unsigned or none).

    Both are read with the verify signer's identity only (the GPU job attests them): a claim signed by the
    publishing identity is never shown as a verify result.
    """
    policy = Policy.for_verify(recipe)
    if policy is None:
        return {"signed": False, "why": "the recipe declares no publish.signing"}
    try:
        kernels = cosign.attestations(ref, policy, KERNELS_CLAIM).statements
        claims = cosign.attestations(ref, policy, VERIFY_CLAIM).statements
    except SigningError as exc:
        return {"signed": False, "why": str(exc)}
    digest = ref.rsplit("@", 1)[-1]
    kernel = [s.predicate for s in kernels if digest in s.subjects]
    verify = [s.predicate for s in claims if digest in s.subjects]
    out: dict[str, Any] = {"signed": True, "signer": policy.describe()}
    if kernel:
        out["kernels"] = coverage_summary(_newest(kernel).get("report") or {})
    if verify:
        last = _newest(verify)
        out["verify"] = {
            "status": last.get("status"),
            "gpu_used": bool((last.get("gpu") or {}).get("used")),
            "devices": (last.get("gpu") or {}).get("devices") or [],
        }
    return out


def history_view(recipe: Recipe, tools: Manifests, tag: str, attestations: bool = True) -> dict[str, Any]:
    """The tag's history, newest first, each index with its platforms' signed verify and kernel claims."""
    past = tagtrust.read_log(recipe, tools, tag)  # the signed TUF targets when the recipe signs
    if not past.entries:
        raise history.no_history(
            tools.repository, tag, recipe.name, signed=Policy.for_verify(recipe) is not None
        )
    current = tagtrust.current_of(recipe, tools, tag)
    rows = []
    for entry in reversed(past.entries):
        platforms = {}
        for platform, digest in sorted(entry.platforms.items()):
            claims = (
                signed_claims(recipe, f"{tools.repository}@{digest}", Cosign(tools.runner))
                if attestations
                else {}
            )
            platforms[platform] = {"digest": digest, "recorded": entry.verified.get(platform, {}), **claims}
        rows.append(
            {
                "digest": entry.digest,
                "date": entry.date,
                "action": entry.action,
                "recipe": entry.recipe,
                "recipe_hash": entry.recipe_hash,
                "previous": entry.previous,
                "current": entry.digest == current,
                "platforms": platforms,
            }
        )
    return {
        "repository": tools.repository,
        "tag": tag,
        "record": past.reference,
        "current": current,
        "entries": rows,
    }


def find_release(recipe: Recipe, tools: Manifests, tags: list[str], digest: str) -> dict[str, Any] | None:
    """The history entry (of any of `tags`) naming `digest` as an index or a platform image, if any (the
    signed log when the recipe signs)."""
    for tag in tags:
        for entry in tagtrust.read_log(recipe, tools, tag).entries:
            if entry.action != "revoke" and (digest == entry.digest or digest in entry.platforms.values()):
                return {"tag": tag, "date": entry.date, "action": entry.action, "index": entry.digest}
    return None


def carried_with_kernels(recipe: Recipe, image: str) -> Check:
    """verify --image's attestation check, plus the signed kernel report the pulled image carries."""
    check = attestation_check(recipe, image)
    ref = (check.details or {}).get("reference")
    if check.status != "passed" or not ref:
        return check
    claims = signed_claims(recipe, str(ref), Cosign(quiet_session().runner))
    kernels = claims.get("kernels")
    reason = check.reason + (
        f"; kernel report: {_coverage_text(kernels)}" if kernels else "; no signed kernel report"
    )
    return Check(check.name, check.status, reason, {**dict(check.details), "kernels": kernels or {}})


def verdict_counts(kernels: Mapping[str, Any]) -> str:
    """'native 2, family 1, jit 0, none 0' in the audit's order (attested JSON comes back with sorted keys)."""
    by = kernels.get("by_verdict") or {}
    return ", ".join(f"{v} {by[v]}" for v in VERDICTS if v in by)


def _coverage_text(kernels: Mapping[str, Any]) -> str:
    counts = verdict_counts(kernels)
    return f"{kernels.get('target')}: {counts}; usable backends: {', '.join(kernels.get('usable_backends') or []) or 'none'}"


def pulled(session: Session, recipe: Recipe, image: str, digest: str = "") -> dict[str, Any]:
    """What `pull` shows after verifying: the pulled image's signed kernel report, and for `--digest`, where
    that digest stands in the moving tags' history."""
    from sparkforge.recipe import plan
    from sparkforge.registry.publish import session_tools

    claims = signed_claims(recipe, image, Cosign(session.runner))
    kernels = claims.get("kernels")
    if not claims.get("signed"):
        lines = [f"kernel report: not checked ({claims.get('why')})"]
    else:
        lines = ["kernel report: " + (_coverage_text(kernels) if kernels else "none attested for this image")]
    found = None
    if digest:
        tools = session_tools(session, recipe, "pull-history")
        found = find_release(
            recipe,
            tools,
            [t.rsplit(":", 1)[1] for t in plan.final_tags(recipe, dt.date.today()).moving],
            digest.rsplit("@", 1)[-1],
        )
        says = (
            "the signed TUF targets say" if Policy.for_verify(recipe) else "the unsigned history record says"
        )
        lines.append(
            f"release: {says}: {found['tag']} named it from {found['date']} ({found['action']})"
            if found
            else f"release: {says}: no moving tag named it (an immutable-tag release, or published elsewhere)"
        )
    return {"lines": lines, "kernels": kernels or {}, "history": found}
