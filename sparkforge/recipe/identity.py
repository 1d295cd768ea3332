"""Keyless signer identities, parsed into an allow-list: one repository, one workflow file, exact refs.

A Fulcio certificate of a GitHub Actions job names the workflow file and the ref it ran from (never the job's
environment). A recipe writes its signer as the regexp cosign takes, but sparkforge does not probe that regexp
with samples: it parses it into an allow-list (the literal repository, the literal workflow path, and refs from
a closed set) and refuses anything else when the recipe loads. What cosign receives is rebuilt from the parsed
allow-list, never the raw text, so an unescaped `.` or a stray top-level `|` cannot widen it.

The refs a signer may run from are the ones a maintainer-protected rule can create: the default branch
`refs/heads/main` (branch protection) and release tags `refs/tags/vX.Y.Z` (the tag ruleset on `v*`,
docs/trust.md). The GPU verify workflow's identity (`verify=True`) accepts only `refs/heads/main`: the GPU runner
runs jobs of main only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAIN = "refs/heads/main"
RELEASE_TAGS = r"refs/tags/v[0-9]+\.[0-9]+\.[0-9]+"  # the one ref pattern: the ruleset on v* protects it
# The triggers a signing run may come from, per ref (never pull_request*, issue_comment or workflow_run).
TRIGGERS = {MAIN: ("workflow_dispatch", "schedule"), RELEASE_TAGS: ("push",)}
_REF_TEXT = {"heads/main": MAIN, r"tags/v[0-9]+\.[0-9]+\.[0-9]+": RELEASE_TAGS}
_NAME = r"[A-Za-z0-9_.-]+"
_WORKFLOW = re.compile(
    rf"(?P<server>https://github\.com)/(?P<repo>{_NAME}/{_NAME})/(?P<path>\.github/workflows/{_NAME}\.ya?ml)"
)
EXAMPLE = "'^https://github.com/ORG/REPO/\\.github/workflows/images\\.yml@refs/(heads/main|tags/v[0-9]+\\.[0-9]+\\.[0-9]+)$'"


@dataclass(frozen=True)
class Identity:
    """One signer: the workflow file `path` of `repository` (owner/name), running from one of `refs`."""

    repository: str
    path: str
    refs: tuple[str, ...]  # MAIN and/or RELEASE_TAGS
    server: str = "https://github.com"

    @property
    def workflow(self) -> str:
        return f"{self.server}/{self.repository}/{self.path}"

    def regexp(self, ref: str | None = None) -> str:
        """The certificate identity regexp cosign checks (one ref, or every allowed ref)."""
        refs = [ref] if ref else list(self.refs)
        alternatives = [_literal(r) if r == MAIN else r for r in refs]
        body = alternatives[0] if len(alternatives) == 1 else "(" + "|".join(alternatives) + ")"
        return f"^{_literal(self.workflow)}@{body}$"


def _literal(text: str) -> str:
    return re.escape(text).replace("\\-", "-")  # '-' outside a class is literal; keep the form readable


def _unescape(text: str) -> str:
    """The literal a regexp fragment stands for, or ValueError when it holds any operator."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text) or text[i + 1] not in "./-":
                raise ValueError(f"{text!r} must be literal (only \\. \\/ \\- escapes)")
            out.append(text[i + 1])
            i += 2
            continue
        if ch in "*+?()|[]{}^$":
            raise ValueError(f"{text!r} must be literal (one repository, one workflow file), it holds {ch!r}")
        out.append(ch)  # an unescaped '.' is read as a literal dot: cosign gets the escaped form
        i += 1
    return "".join(out)


def _refs(text: str) -> tuple[str, ...]:
    """The refs after '@refs/': exactly one accepted ref, or one (a|b) group of them; nothing else."""
    grouped = text.startswith("(") and text.endswith(")") and "(" not in text[1:-1] and ")" not in text[1:-1]
    parts = text[1:-1].split("|") if grouped else [text]
    if not all(p in _REF_TEXT for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(
            f"the refs {text!r} are not exactly 'heads/main', 'tags/v[0-9]+\\.[0-9]+\\.[0-9]+' or one (a|b) group "
            "of those (the only refs a maintainer-protected rule creates)"
        )
    return tuple(_REF_TEXT[p] for p in parts)


def parse_identity(pattern: str, *, verify: bool = False) -> Identity:
    """The allow-list a signer regexp stands for, or ValueError naming what is not allowed."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        raise ValueError("it must be anchored (^...$)")
    body = pattern[1:-1]
    if body.count("@refs/") != 1:
        raise ValueError("it must name one workflow, then '@refs/' and the refs")
    workflow_text, refs_text = body.split("@refs/")
    match = _WORKFLOW.fullmatch(_unescape(workflow_text))
    if not match:
        raise ValueError(
            f"the workflow part {workflow_text!r} is not https://github.com/OWNER/REPO/.github/workflows/FILE.yml"
        )
    refs = _refs(refs_text)
    if verify and refs != (MAIN,):
        raise ValueError(
            "the GPU verify identity must accept only refs/heads/main (the GPU runner runs main's jobs only)"
        )
    return Identity(match["repo"], match["path"], refs, match["server"])


def identity_problem(pattern: str, *, verify: bool = False) -> str | None:
    """Why a keyless identity regexp is not an allow-list of protected refs (None when it is)."""
    try:
        parse_identity(pattern, verify=verify)
    except ValueError as exc:
        return str(exc)
    return None


def _validator(value: str, verify: bool) -> str:
    problem = identity_problem(value, verify=verify)
    if problem:
        example = (
            EXAMPLE.replace("images", "gpu-attest").split("@")[0] + "@refs/heads/main$'"
            if verify
            else EXAMPLE
        )
        raise ValueError(
            f"signer identity {value!r} is too broad: {problem}; fix: pin "
            + ("refs/heads/main" if verify else "the default branch and release tags")
            + f", "
            f"e.g. {example}"
        )
    return value


def pinned_identity(value: str) -> str:
    """`value`, or ValueError with the fix (a pydantic validator of the publishing signer's identity)."""
    return _validator(value, verify=False)


def pinned_verify_identity(value: str) -> str:
    """`value`, or ValueError with the fix (the GPU verify signer: refs/heads/main only)."""
    return _validator(value, verify=True)
