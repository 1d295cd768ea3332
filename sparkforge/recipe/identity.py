"""Keyless signer identities: pinned to one workflow file, on the default branch and release tags.

A Fulcio certificate of a GitHub Actions job names the workflow file and the ref it ran from. A recipe's
identity regexp that also matches a branch or tag that anyone with push access can create (the old
`refs/(heads|tags)/.*`) lets any collaborator sign an arbitrary image, so it is refused when the recipe loads.
"""

from __future__ import annotations

import re

# Refs that anyone with push access can create: a signer identity that matches one is no pin at all.
_UNPINNED_REFS = (
    "refs/heads/any-branch",
    "refs/heads/main-copy",
    "refs/heads/main/copy",
    "refs/tags/any-tag",
    "refs/tags/vany",
    "refs/tags/v1.2.3-any",
    "refs/pull/1/merge",
)


def identity_problem(pattern: str) -> str | None:
    """Why a keyless identity regexp is not pinned to one workflow file on the default branch and release tags."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"not a regular expression ({exc})"
    if not (pattern.startswith("^") and pattern.endswith("$")) or "@refs/" not in pattern:
        return "it must be anchored (^...$) and name the refs after '@refs/'"
    workflow = re.sub(r"\\([./-])", r"\1", pattern[1:].split("@refs/", 1)[0])
    if re.search(r"[*+?()|\[\]^$\\]", workflow):
        return f"the workflow part {workflow!r} must be literal (one repository, one workflow file)"
    matched = [ref for ref in _UNPINNED_REFS if compiled.fullmatch(f"{workflow}@{ref}")]
    if matched:
        return f"it also matches {workflow}@{matched[0]} (a ref anyone with push access can create)"
    return None


def pinned_identity(value: str) -> str:
    """`value`, or ValueError with the fix when it is not pinned (a pydantic validator of signer identities)."""
    problem = identity_problem(value)
    if problem:
        raise ValueError(
            f"signer identity {value!r} is too broad: {problem}; fix: pin the default branch and release tags, "
            "e.g. '^https://github.com/ORG/REPO/.github/workflows/images.yml"
            "@refs/(heads/main|tags/v[0-9]+\\.[0-9]+\\.[0-9]+)$'"
        )
    return value
