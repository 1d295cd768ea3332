"""What an image says it was built from against what this checkout would build (rebuild --check).

Three ways a rebuild can differ for reasons other than a non-reproducible step, each named before or after the
rebuild instead of reading as "rebuild failed": the template (the image's sparkforge revision against HEAD and
the working tree, for the files that make a build context), a base override recorded in the image's labels,
and Dockerfile steps that differ between the two images' histories (a template changed without a commit).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkforge.commands import Command
from sparkforge.errors import SparkforgeError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe
from sparkforge.report import Check

if TYPE_CHECKING:
    from sparkforge.context import Session

# The files that make a build context: templates and in-image scripts, the suite copied into the image, the
# renderer, the plan (labels, bases, lock) and BuildKit's argv.
TEMPLATE_PATHS = (
    "dockerfiles",
    "sparkforge/verify/inimage",
    "tests/image",
    "sparkforge/imagebuild/render.py",
    "sparkforge/imagebuild/buildkit.py",
    "sparkforge/recipe/plan.py",
)
ALLOW_FLAG = "--allow-template-drift"
# BuildKit's history line of a RUN: its build args, the stage's SHELL, the command, a trailing marker.
SHELL_STEP = re.compile(
    r"^RUN (?:\|\d+ (?:[A-Za-z_]\w*=\S* )*)?(?:/bin/\w+(?: -o \w+)* -c )?(.*?)(?: # buildkit)?$", re.S
)


class TemplateDrift(SparkforgeError):
    """The checkout's templates are not the ones the image was built from."""


def _git(session: Session, root: Path, *args: str) -> tuple[int, str]:
    result = session.runner.capture(Command.of("git", "-C", str(root), *args), "git", check=False)
    return result.returncode, result.output.strip()


def changed_template_files(
    session: Session, revision: str, root: Path = REPO_ROOT, paths: Sequence[str] = TEMPLATE_PATHS
) -> tuple[str, list[str] | None]:
    """(HEAD, the template files HEAD changed since `revision`); None when this checkout does not hold
    `revision` (another fork, or a shallow clone). Uncommitted changes are not read here: the image's revision
    cannot say whether its own tree had any; a changed step is named after the rebuild (steps_check)."""
    code, head = _git(session, root, "rev-parse", "HEAD")
    head = head if code == 0 else "unknown"
    if _git(session, root, "cat-file", "-e", f"{revision}^{{commit}}")[0] != 0:
        return head, None
    code, out = _git(session, root, "diff", "--name-only", revision, "HEAD", "--", *paths)
    return head, (sorted(set(out.splitlines()) - {""}) if code == 0 else None)


def template_check(
    session: Session,
    revision: str | None,
    allow: bool,
    root: Path = REPO_ROOT,
    paths: Sequence[str] = TEMPLATE_PATHS,
) -> Check:
    """The image's revision against this checkout; TemplateDrift (unless `allow`) when its template files differ."""
    if not revision or revision == "unknown":
        return Check("template", "skipped", "the image records no sparkforge revision to compare with")
    head, changed = changed_template_files(session, revision, root, paths)
    details: dict[str, Any] = {"revision": revision, "head": head, "changed": changed}
    if changed == []:
        same = "the same revision" if head == revision else f"HEAD {head[:12]}"
        return Check(
            "template", "passed", f"built at {revision[:12]}; {same} has the same template files", details
        )
    what = (
        f"its template files differ here ({', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''})"
        if changed
        else "this checkout does not hold that revision, so its templates cannot be compared"
    )
    message = (
        f"the image was built at {revision[:12]}, this checkout is at {head[:12]} and {what}: a rebuild would "
        f"not be the image's build; fix: check out {revision[:12]} or pass {ALLOW_FLAG}"
    )
    if not allow:
        raise TemplateDrift(message)
    return Check(
        "template", "skipped", f"{message} (passed: a difference below may come from the template)", details
    )


def bases_check(recipe: Recipe, labels: dict[str, str]) -> Check:
    """The bases the image records against the recipe's pins (plan.base_override): an override is named."""
    override = plan.base_override(recipe, labels)
    recorded = {stage: labels.get(label) for stage, label in plan.BASE_LABELS.items()}
    if override:
        named = "; ".join(
            f"{stage} {found or '(no label)'} (the recipe pins {pinned})"
            for stage, (found, pinned) in override.items()
        )
        return Check(
            "bases",
            "passed",
            f"base override recorded in the labels: {named}. Rebuilt on the same bases: a pass says nothing of a "
            "build on the recipe's pinned bases",
            {"recorded": recorded, "override": True},
        )
    return Check(
        "bases", "passed", "built on the recipe's pinned bases", {"recorded": recorded, "override": False}
    )


def history_steps(config: dict[str, Any]) -> list[str]:
    """The Dockerfile steps an image config records, in order (empty layers included)."""
    return [str(h.get("created_by") or "") for h in config.get("history") or []]


def short_step(step: str) -> str:
    """A history entry as its Dockerfile line: BuildKit's `RUN |2 A=1 B=2 /bin/sh -c CMD # buildkit` -> `RUN CMD`."""
    found = SHELL_STEP.match(step)
    return f"RUN {found.group(1)}" if found else step


def steps_check(original: dict[str, Any], rebuilt: dict[str, Any], revision: str | None) -> Check | None:
    """None when both images record the same steps; else a failed check naming the steps only one has."""
    import difflib

    a, b = history_steps(original), history_steps(rebuilt)
    if a == b:
        return None
    only: list[dict[str, Any]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            only += [{"side": "original", "index": i, "step": a[i]} for i in range(i1, i2)]
            only += [{"side": "rebuild", "index": j, "step": b[j]} for j in range(j1, j2)]
    named = "; ".join(f"only in the {s['side']}: {short_step(s['step'])[:120]}" for s in only[:4])
    return Check(
        "steps",
        "failed",
        f"template drift: the image's Dockerfile steps are not this checkout's ({named}); it was built from "
        f"another template than this checkout's"
        + (f" (its revision {revision[:12]} plus changes never committed)" if revision else "")
        + "; fix: rebuild-check from the template the image was built from",
        {"steps": only},
    )
