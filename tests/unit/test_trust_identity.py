"""Signer identities are parsed into an allow-list (literal repository, literal workflow file, exact protected
refs), never probed with samples; cosign gets flags rebuilt from that allow-list, never the recipe's raw text."""

from __future__ import annotations

import re

import pytest

from sparkforge.recipe.identity import MAIN, RELEASE_TAGS, identity_problem, parse_identity
from sparkforge.registry.cosign import Policy

URL = r"https://github.com/sparkforge/sparkforge/\.github/workflows/images\.yml"
PINNED = f"^{URL}@refs/(heads/main|tags/v[0-9]+\\.[0-9]+\\.[0-9]+)$"


def test_the_pinned_form_parses_into_its_allow_list() -> None:
    found = parse_identity(PINNED)
    assert (found.repository, found.path) == ("sparkforge/sparkforge", ".github/workflows/images.yml")
    assert found.refs == (MAIN, RELEASE_TAGS)
    assert parse_identity(f"^{URL}@refs/heads/main$").refs == (MAIN,)
    # an unescaped '.' is read as the literal dot it names: cosign gets the escaped form
    loose = parse_identity(
        "^https://github.com/sparkforge/sparkforge/.github/workflows/images.yml@refs/heads/main$"
    )
    assert re.fullmatch(loose.regexp(), f"{loose.workflow}@{MAIN}")
    assert not re.fullmatch(
        loose.regexp(), f"https://githubXcom/sparkforge/sparkforge/.github/workflows/images.yml@{MAIN}"
    )


# Each was accepted by the seven-sample probe (or by raw-text comparison) before the parser.
ADVERSARIAL = {
    "release branches": f"^{URL}@refs/(heads/main|heads/release/.*)$",
    "release candidate tags": f"^{URL}@refs/(heads/main|tags/v[0-9]+\\.[0-9]+\\.[0-9]+-rc[0-9]+)$",
    "any char in main": f"^{URL}@refs/heads/ma.n$",
    "main_ prefix": f"^{URL}@refs/heads/main_.*$",
    "top-level | to another repository": f"^{URL}@refs/heads/main|^https://github.com/evil/x/.github/workflows/a.yml@refs/heads/main$",
    "top-level | without a second @refs": f"^{URL}@refs/heads/main|https://evil.example/x$",
    "any repository": r"^https://github.com/[^/]+/sparkforge/\.github/workflows/images\.yml@refs/heads/main$",
    "a workflow alternative": r"^https://github.com/sparkforge/sparkforge/\.github/workflows/(images|other)\.yml@refs/heads/main$",
    "a character class in the owner": r"^https://github.com/sparkforg[e]/sparkforge/\.github/workflows/images\.yml@refs/heads/main$",
    "another host": r"^https://evil\.example/sparkforge/sparkforge/\.github/workflows/images\.yml@refs/heads/main$",
    "not a workflow file": r"^https://github.com/sparkforge/sparkforge/scripts/sign\.sh@refs/heads/main$",
    "every tag": f"^{URL}@refs/tags/.*$",
    "v-anything tags": f"^{URL}@refs/tags/v.*$",
    "pull request refs": f"^{URL}@refs/(heads/main|pull/[0-9]+/merge)$",
    "a nested group": f"^{URL}@refs/(heads/(main|dev))$",
    "a repeated ref": f"^{URL}@refs/(heads/main|heads/main)$",
    "an escape other than . / -": f"^{URL}\\w@refs/heads/main$",
    "unanchored": f"{URL}@refs/heads/main",
    "a lookahead": f"^{URL}@refs/(?=heads/main)heads/main$",
}


@pytest.mark.parametrize("pattern", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_an_identity_outside_the_allow_list_is_refused(pattern: str) -> None:
    assert identity_problem(pattern), pattern


def test_the_verify_identity_accepts_only_main() -> None:
    # Tags as identity: anyone who pushes a tag runs that tag's own copy of the workflow, free of its guards.
    assert "only refs/heads/main" in (identity_problem(PINNED, verify=True) or "")
    assert identity_problem(f"^{URL}@refs/heads/main$", verify=True) is None


def test_cosign_gets_the_allow_list_with_repository_trigger_and_ref_pinned() -> None:
    policy = Policy(
        identity=PINNED, issuer="https://token.actions.githubusercontent.com", allowed=parse_identity(PINNED)
    )
    sets = [dict(zip(f[::2], f[1::2], strict=True)) for f in policy.verify_argsets()]
    assert {s["--certificate-github-workflow-repository"] for s in sets} == {"sparkforge/sparkforge"}
    by_trigger = {s["--certificate-github-workflow-trigger"]: s for s in sets}
    assert set(by_trigger) == {"workflow_dispatch", "schedule", "push"}  # never pull_request*, workflow_run
    main = by_trigger["workflow_dispatch"]
    assert main["--certificate-github-workflow-ref"] == MAIN
    assert (
        main["--certificate-identity-regexp"]
        == "^" + URL.replace("github.com", r"github\.com") + "@refs/heads/main$"
    )
    tags = by_trigger["push"]  # a tag push: the ref is any protected release tag, pinned by the regexp
    assert "--certificate-github-workflow-ref" not in tags
    assert re.fullmatch(tags["--certificate-identity-regexp"], f"{URL.replace(chr(92), '')}@refs/tags/v1.2.3")
    assert not re.fullmatch(
        tags["--certificate-identity-regexp"], f"{URL.replace(chr(92), '')}@refs/tags/v1.2.3-rc1"
    )
