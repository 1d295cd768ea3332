"""Check 3: the recipe's patch series applies, in order, to the pinned source (on a scratch copy).

Only the files the series touches are copied, so the check is cheap on a 7,000-file tree; each patch is
`git apply --check`ed and then applied for real to the copy, so patch N sees patches 1..N-1. A patch whose
reverse applies is reported as already applied (upstream merged it; the build's `git apply` would fail).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.boundary import MAX_PATCH_BYTES, read_bytes
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.report import Check

_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_MINUS = re.compile(r"^--- (?:a/)?(\S+)", re.M)
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$")
_FAILED_AT = re.compile(r"error: patch failed: (\S+?):(\d+)")
_ERROR = re.compile(r"^error: (.*)$", re.M)


@dataclass(frozen=True)
class Hunk:
    file: str
    number: int  # 1-based within its file
    old_start: int
    header: str


def touched_files(text: str) -> list[str]:
    """Paths (pre-image) a unified/git diff touches."""
    names = [m.group(1) for m in _DIFF_GIT.finditer(text)]
    if not names:
        names = [m.group(1) for m in _MINUS.finditer(text) if m.group(1) != "/dev/null"]
    return list(dict.fromkeys(names))


def escaping_paths(text: str) -> list[str]:
    """Paths a diff names (either side) that are absolute or climb out of the tree with '..'."""
    names = [n for m in _DIFF_GIT.finditer(text) for n in m.groups()]
    names += [m.group(1) for m in re.finditer(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", text, re.M)]
    names += [m.group(1) for m in re.finditer(r"^(?:rename|copy) (?:from|to) (.+)$", text, re.M)]
    bad = [n for n in names if n != "/dev/null" and (n.startswith("/") or ".." in Path(n).parts)]
    return list(dict.fromkeys(bad))


def hunks(text: str) -> list[Hunk]:
    out: list[Hunk] = []
    current = ""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("diff --git "):
            match = _DIFF_GIT.match(line)
            current = match.group(1) if match else current
        elif line.startswith("--- ") and not current:
            current = line[4:].removeprefix("a/").split("\t")[0]
        match = _HUNK.match(line)
        if match and current:
            counts[current] = counts.get(current, 0) + 1
            out.append(Hunk(current, counts[current], int(match.group(1)), line))
    return out


def _git_apply(session: Session, scratch: Path, patch: Path, *flags: str) -> tuple[bool, str]:
    # GIT_CEILING_DIRECTORIES: never let git discover an enclosing repository around the scratch copy.
    command = Command.of(
        "git",
        "apply",
        *flags,
        str(patch),
        env={"GIT_CEILING_DIRECTORIES": str(scratch.parent)},
        cwd=scratch,
    )
    result = session.runner.capture(command, "git-apply", check=False)
    return result.returncode == 0, result.output.strip()


def explain_failure(patch_text: str, output: str) -> str:
    """'file, hunk #n (@@ ... @@)' for the first hunk git could not apply, or git's own error."""
    match = _FAILED_AT.search(output)
    if match:
        file, line = match.group(1), int(match.group(2))
        for hunk in hunks(patch_text):
            if hunk.file == file and hunk.old_start == line:
                return f"{file}, hunk #{hunk.number} ({hunk.header.strip()})"
        return f"{file}, hunk at line {line}"
    errors = _ERROR.findall(output)
    return errors[0] if errors else (output.splitlines() or ["git apply failed"])[-1]


def read_patch(patch: Path) -> str:
    """A patch of patches/ as text (a stray byte replaced: a patch may carry a binary hunk's context)."""
    return read_bytes(patch, "patch", MAX_PATCH_BYTES).decode("utf-8", "replace")


def prepare_scratch(root: Path, patches: list[Path], scratch: Path) -> list[str]:
    """Copy the files the series touches from `root` into `scratch`; returns those copied."""
    copied = []
    for patch in patches:
        text = read_patch(patch)
        if escaping_paths(text):
            raise ValueError(
                f"{patch}: names paths outside the source tree: {', '.join(escaping_paths(text))}"
            )
        for rel in touched_files(text):
            source, target = root / rel, scratch / rel
            inside = source.resolve().is_relative_to(root.resolve())  # a symlink in the checkout stays unread
            if inside and source.is_file() and not source.is_symlink() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
                copied.append(rel)
    return copied


def check_patches(
    session: Session,
    check: Check,
    root: Path,
    patches: list[Path],
    scratch: Path,
    *,
    subject: str,
    repo_root: Path,
) -> None:
    """Fill `check`; afterwards `scratch` holds the touched files with every applicable patch applied."""
    if not patches:
        check.status = "skipped"
        check.reason = "the recipe has no patches"
        return
    not_regular = [_display(p, repo_root) for p in patches if p.is_symlink() or not p.is_file()]
    if not_regular:
        check.status = "failed"
        check.reason = (
            f"{', '.join(not_regular)}: not a regular file in patches/ (a symlink's target would be read and "
            "shipped); fix: put the patch itself in patches/"
        )
        return
    escaping = {_display(p, repo_root): escaping_paths(read_patch(p)) for p in patches}
    escaping = {name: paths for name, paths in escaping.items() if paths}
    if escaping:
        check.status = "failed"
        check.reason = " | ".join(
            f"{name} names paths outside the source tree ({', '.join(paths)}); fix: regenerate the patch with "
            "'git diff' inside the checkout (paths relative to its root)"
            for name, paths in escaping.items()
        )
        check.details = {"escaping": escaping}
        return
    prepare_scratch(root, patches, scratch)
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    for patch in patches:
        name = _display(patch, repo_root)
        text = read_patch(patch)
        ok, output = _git_apply(session, scratch, patch, "--check", "-v")
        if ok:
            _git_apply(session, scratch, patch)
            results.append({"patch": name, "state": "applies", "files": touched_files(text)})
            continue
        reverse_ok, _ = _git_apply(session, scratch, patch, "--check", "-R")
        if reverse_ok:
            results.append({"patch": name, "state": "already-applied", "files": touched_files(text)})
            problems.append(
                f"{name} is already applied in {subject} (its reverse applies); fix: remove it from the "
                "recipe's patches (upstream has the change)"
            )
            continue
        where = explain_failure(text, output)
        results.append({"patch": name, "state": "fails", "where": where, "git": output[-2000:]})
        problems.append(
            f"{name} does not apply to {subject}: {where}; fix: rebase the patch on the pinned commit"
        )
    check.details = {"series": results}
    if problems:
        check.status = "failed"
        check.reason = " | ".join(problems)
    else:
        check.reason = f"{len(patches)} patch(es) apply in order to {subject}"


def _display(patch: Path, repo_root: Path) -> str:
    try:
        return str(patch.relative_to(repo_root))
    except ValueError:
        return str(patch)
