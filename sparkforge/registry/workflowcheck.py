"""Our own workflow check (`invoke lint`, beside zizmor): what may reach the GPU runner and sign as the verifier.

The `[self-hosted, dgx-spark]` runner holds the GPU verify identity's jobs. A job on it must run only for
`refs/heads/main` (a top-level `github.ref == 'refs/heads/main'` condition of its `if:`), in a workflow that no
pull request, comment or other workflow's run can trigger; a reusable workflow with such a job, or with an OIDC
token, must also refuse callers from other repositories (`github.repository == 'OWNER/REPO'`): a caller's
certificate names our workflow file whatever repository calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

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


def conjuncts(expression: str) -> list[str]:
    """The top-level `&&` terms of an `if:` expression (outside parentheses and quotes), normalised."""
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
        elif not quoted and depth == 0 and text.startswith("&&", i):
            terms.append(text[start:i])
            start = i + 2
    terms.append(text[start:])
    return [" ".join(t.split()) for t in terms]


def _triggers(data: Mapping[Any, Any]) -> dict[str, Any]:
    on = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` key as True
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {str(t): None for t in on}
    return dict(on or {})


def _on_gpu(job: Mapping[str, Any]) -> bool:
    labels = job.get("runs-on")
    labels = [labels] if isinstance(labels, str) else list(labels or [])
    return "self-hosted" in labels


def workflow_problems(workflows: Mapping[str, Mapping[Any, Any]], repository: str) -> list[str]:
    """Every way a workflow (file name -> parsed YAML) lets a pull request, another ref or another repository
    reach the GPU runner or the verify identity."""
    problems = []
    gpu_files = {
        name for name, data in workflows.items() if any(_on_gpu(j) for j in (data.get("jobs") or {}).values())
    }
    same_repo = f"github.repository == '{repository}'"
    for name, data in sorted(workflows.items()):
        triggers = _triggers(data)
        for job_name, job in sorted((data.get("jobs") or {}).items()):
            called = str(job.get("uses") or "").removeprefix("./.github/workflows/")
            gpu = _on_gpu(job) or called in gpu_files
            token = (job.get("permissions") or {}).get("id-token") == "write"
            terms = conjuncts(str(job.get("if") or ""))
            where = f"{name} job {job_name}"
            if gpu:
                for trigger in UNSAFE_TRIGGERS:
                    if trigger in triggers:
                        problems.append(
                            f"{where} sends {trigger} runs to the GPU runner; fix: drop that trigger"
                        )
                if MAIN_ONLY not in terms:
                    problems.append(
                        f"{where} reaches the GPU runner from refs other than main; fix: make "
                        f'"{MAIN_ONLY}" a top-level && condition of its if:'
                    )
            if "workflow_call" in triggers and (gpu or token) and same_repo not in terms:
                problems.append(
                    f"{where}: a reusable workflow with the GPU runner or an OIDC token can be called from "
                    f'another repository; fix: make "{same_repo}" a top-level && condition of its if:'
                )
    return problems


def check_files(folder: Path, repository: str) -> list[str]:
    workflows = {p.name: yaml.safe_load(p.read_text()) or {} for p in sorted(folder.glob("*.y*ml"))}
    return workflow_problems(workflows, repository)
