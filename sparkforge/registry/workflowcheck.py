"""Our own workflow check (`invoke lint`, beside zizmor): what may reach the GPU runner, sign, or feed a
published image, read as an allow-list: what it cannot prove safe is refused.

- `runs-on` is proven GitHub-hosted only when every label is a hosted image (HOSTED), or an expression whose every
  possible value is a quoted hosted label (`${{ matrix.arch == 'arm64' && 'ubuntu-24.04-arm' || 'ubuntu-24.04' }}`:
  comparisons choose, literals are the result). A runner named by data (`${{ matrix.runner }}`, even of the plan
  job's matrix: a dispatched branch's or a pull request's `ci.matrix` computes it), a self-hosted label with or
  without `self-hosted`, a runner-group object, may reach the GPU runner, so its job must be provably main only.
- A job that reaches the GPU runner or holds an OIDC token checks out no ref chosen by an expression
  (`ref: ${{ inputs.ref }}`): a main-only job would run another ref's code.
- "Main only": `github.ref == 'refs/heads/main'` is a top-level `&&` term of `if:` and the condition has no
  top-level `||` (`main && x || y` runs for any ref when y holds).
- A reusable workflow is followed whether called as `./.github/workflows/F` or `OWNER/REPO/.github/workflows/F@REF`
  (this repository); one from another repository cannot be read, so it counts as reaching the GPU runner.
- A workflow that reaches the GPU runner has no trigger that carries others' code or choice of ref
  (UNSAFE_TRIGGERS); a reusable one with the GPU runner or an OIDC token refuses callers from other repositories.
- Build caches: no workflow names a registry or GitHub cache itself (`type=registry`, `type=gha`, `cache-from`
  outside the matrix's values); the matrix gives main and release tags none (matrix.cache_refs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sparkforge.boundary import read_text

# Triggers that carry someone else's code or choice of ref to a job (fork PRs, comments, chained runs).
UNSAFE_TRIGGERS = (
    "pull_request",
    "pull_request_target",
    "pull_request_review",
    "pull_request_review_comment",
    "issue_comment",
    "workflow_run",
    "merge_group",
    "discussion_comment",
)
MAIN_ONLY = "github.ref == 'refs/heads/main'"
HOSTED = re.compile(r"(ubuntu|windows|macos)-(latest|\d[\w.]*)(-arm)?")  # GitHub-hosted runner images
CHOICE = re.compile(r"\(?\s*(matrix|inputs|github)\.[\w.-]+\s*[!=]=\s*'[^']*'\s*\)?")
CACHE_WORDS = re.compile(
    r"type=(registry|gha|local|s3|azblob)|cache-(from|to)(?!\s+\"?\$\{CACHE_(FROM|TO)\})"
)
MAX_WORKFLOW_BYTES = 1 << 20  # a workflow file: a few KiB


def _split(expression: str, op: str) -> list[str]:
    """The top-level `op` terms of an expression (outside parentheses and quotes), normalised."""
    text = expression.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    terms, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0 and text.startswith(op, i):
            terms.append(text[start:i])
            start = i + len(op)
    terms.append(text[start:])
    return [" ".join(t.split()) for t in terms]


def conjuncts(expression: str) -> list[str]:
    """The top-level `&&` terms of an `if:` expression; [] when it has a top-level `||` (not a conjunction)."""
    if len(_split(expression, "||")) > 1:
        return []
    return _split(expression, "&&")


def main_only(condition: object) -> bool:
    return isinstance(condition, str) and MAIN_ONLY in conjuncts(condition)


def _triggers(data: Mapping[Any, Any]) -> dict[str, Any]:
    on = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` key as True
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {str(t): None for t in on}
    return dict(on or {})


def _literal_hosted(expression: str) -> bool:
    """An expression whose every value is a quoted hosted label: `||` alternatives, each `&&` comparisons
    (matrix/inputs/github X == 'v') ending in a quoted hosted label."""
    for term in _split(expression, "||"):
        *conditions, value = _split(term, "&&")
        quoted = re.fullmatch(r"\(?'([^']*)'\)?", value.strip())
        if not quoted or not HOSTED.fullmatch(quoted.group(1)):
            return False
        if not all(CHOICE.fullmatch(c) for c in conditions):
            return False
    return True


def _hosted(job: Mapping[str, Any]) -> bool:
    """True only when the job's runner is provably GitHub-hosted (never the GPU runner)."""
    labels = job.get("runs-on")
    if isinstance(labels, str) and labels.strip().startswith("${{"):
        return _literal_hosted(labels)
    if isinstance(labels, str):
        labels = [labels]
    if not isinstance(labels, list) or not labels:
        return False  # a runner-group object, or nothing readable
    return all(isinstance(label, str) and HOSTED.fullmatch(label) for label in labels)


def _called(job: Mapping[str, Any], repository: str) -> str | None:
    """The workflow file a job calls in this repository ('' for one elsewhere; None when it calls none)."""
    uses = str(job.get("uses") or "")
    if not uses:
        return None
    if uses.startswith("./.github/workflows/"):
        return uses.removeprefix("./.github/workflows/")
    found = re.fullmatch(r"([^/]+/[^/]+)/\.github/workflows/([^@]+)@.+", uses)
    return found.group(2) if found and found.group(1).lower() == repository.lower() else ""


def workflow_problems(workflows: Mapping[str, Mapping[Any, Any]], repository: str) -> list[str]:
    """Every way a workflow (file name -> parsed YAML) lets a pull request, another ref or another repository
    reach the GPU runner or the verify identity, in a shape this check cannot prove safe."""
    problems = []
    gpu_files = {
        name
        for name, data in workflows.items()
        if any("uses" not in j and not _hosted(j) for j in (data.get("jobs") or {}).values())
    }
    same_repo = f"github.repository == '{repository}'"
    for name, data in sorted(workflows.items()):
        triggers = _triggers(data)
        for job_name, job in sorted((data.get("jobs") or {}).items()):
            called = _called(job, repository)
            gpu = (called is None and not _hosted(job)) or called == "" or called in gpu_files
            token = (job.get("permissions") or {}).get("id-token") == "write"
            where = f"{name} job {job_name}"
            if gpu:
                for trigger in UNSAFE_TRIGGERS:
                    if trigger in triggers:
                        problems.append(
                            f"{where} sends {trigger} runs to the GPU runner; fix: drop that trigger"
                        )
                if not main_only(job.get("if")):
                    problems.append(
                        f"{where} may reach the GPU runner (runs-on {job.get('runs-on', job.get('uses'))!r} is not "
                        f'provably GitHub-hosted) from refs other than main; fix: make "{MAIN_ONLY}" a top-level '
                        "&& condition of its if: with no top-level ||, or run it on a GitHub-hosted label"
                    )
            if gpu or token:
                for step in job.get("steps") or []:
                    ref = str(((step or {}).get("with") or {}).get("ref") or "")
                    if str((step or {}).get("uses") or "").startswith("actions/checkout@") and "${{" in ref:
                        problems.append(
                            f"{where} checks out a ref chosen by an expression ({ref!r}) and "
                            + ("may reach the GPU runner" if gpu else "holds an OIDC token")
                            + ": it would run another ref's code; fix: check out the triggering commit (no ref:)"
                        )
            if (
                "workflow_call" in triggers
                and (gpu or token)
                and same_repo not in conjuncts(str(job.get("if") or ""))
            ):
                problems.append(
                    f"{where}: a reusable workflow with the GPU runner or an OIDC token can be called from "
                    f'another repository; fix: make "{same_repo}" a top-level && condition of its if:'
                )
    return problems + cache_problems(workflows)


def cache_problems(workflows: Mapping[str, Mapping[Any, Any]]) -> list[str]:
    """A build cache another ref can write must never reach a published image (main and release tags)."""
    from sparkforge.recipe.identity import MAIN
    from sparkforge.registry.matrix import cache_refs

    problems = []
    for ref in (MAIN, "refs/tags/v1.2.3"):
        if any(cache_refs("ghcr.io/o/r", "recipe", "arm64", ref)):
            problems.append(
                f"the CI matrix gives {ref} a registry build cache; fix: published images build without one "
                "(registry/matrix.py cache_refs)"
            )
    for name, data in sorted(workflows.items()):
        for job_name, job in sorted((data.get("jobs") or {}).items()):
            for step in job.get("steps") or []:
                text = yaml.safe_dump(step)
                found = CACHE_WORDS.search(text)
                if found:
                    problems.append(
                        f"{name} job {job_name} names a build cache itself ({found.group(0).strip()!r}); fix: take "
                        "--cache-from/--cache-to only from the matrix (${{ matrix.cache_from }}), which gives "
                        "published builds none"
                    )
    return problems


def check_files(folder: Path, repository: str) -> list[str]:
    workflows = {
        p.name: yaml.safe_load(read_text(p, "workflow", MAX_WORKFLOW_BYTES)) or {}
        for p in sorted(folder.glob("*.y*ml"))
    }
    return workflow_problems(workflows, repository)
