"""Unified diffs (`git diff`, `git format-patch`): parsed into file changes, applied strictly (no fuzz).

Standard library only, and no file I/O: the same file is copied into an overlay's build context (files/unidiff.py)
where dockerfiles/files/apply-patches.py applies the series inside the image with it, so the host's preflight and
the image's build apply one algorithm. A hunk
must match its context exactly; only a line offset is tolerated (as `git apply` does), never fuzz.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


class PatchError(Exception):
    """A diff that cannot be read, or does not apply to the files it names."""


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based line the hunk's old side starts at (0 for an empty old file)
    old_lines: tuple[str, ...]  # context and removed lines, without their newline
    new_lines: tuple[str, ...]  # context and added lines


@dataclass(frozen=True)
class FileChange:
    """One file a diff touches: old and new paths ('/dev/null' for a created or deleted file)."""

    old_path: str
    new_path: str
    hunks: tuple[Hunk, ...] = ()
    binary: bool = False  # a binary or mode-only change: no hunks to apply
    mode_change: bool = False

    @property
    def path(self) -> str:
        """The path the change is about (the new one, or the old one for a deletion)."""
        return self.old_path if self.new_path == "/dev/null" else self.new_path

    @property
    def created(self) -> bool:
        return self.old_path == "/dev/null"

    @property
    def deleted(self) -> bool:
        return self.new_path == "/dev/null"


@dataclass(frozen=True)
class Diff:
    changes: tuple[FileChange, ...] = field(default_factory=tuple)

    @property
    def paths(self) -> list[str]:
        """Every path the diff names (both sides of a rename), in order, once."""
        seen: dict[str, None] = {}
        for change in self.changes:
            for p in (change.old_path, change.new_path):
                if p != "/dev/null":
                    seen[p] = None
        return list(seen)


def _strip(path: str) -> str:
    path = path.split("\t", 1)[0].strip()
    if path == "/dev/null":
        return path
    if path.startswith(("a/", "b/")):
        path = path[2:]
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        raise PatchError(
            f"the diff names the path {path!r}; a patch may name only relative paths without . or .."
        )
    return path


def parse(text: str) -> Diff:
    """Every file change of a unified diff; a `git format-patch` mail header before the first diff is skipped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    changes: list[FileChange] = []
    i = 0
    git_paths: tuple[str, str] | None = None
    binary = mode = False
    while i < len(lines):
        line = lines[i]
        header = _GIT_HEADER.match(line)
        if header:
            if git_paths is not None and (binary or mode):
                changes.append(FileChange(git_paths[0], git_paths[1], (), binary, mode))
            git_paths = (_strip(header.group(1)), _strip(header.group(2)))
            binary = mode = False
            i += 1
            continue
        if git_paths is not None and line.startswith(("new file mode", "deleted file mode", "index ")):
            if line.startswith("new file mode"):
                git_paths = ("/dev/null", git_paths[1])
            elif line.startswith("deleted file mode"):
                git_paths = (git_paths[0], "/dev/null")
            i += 1
            continue
        if git_paths is not None and line.startswith(("old mode", "new mode", "similarity index", "rename ")):
            mode = True  # a rename or mode change: refused by the rules above this module, never silently
            i += 1
            continue
        if line.startswith("Binary files ") or line == "GIT binary patch":
            binary = True
            i += 1
            continue
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip(line[4:]), _strip(lines[i + 1][4:])
            i += 2
            hunks: list[Hunk] = []
            while i < len(lines) and lines[i].startswith("@@"):
                hunk, i = _read_hunk(lines, i)
                hunks.append(hunk)
            if not hunks:
                raise PatchError(f"{new}: a file header without hunks; the diff is cut short")
            changes.append(FileChange(old, new, tuple(hunks), False, mode))
            git_paths = None
            binary = mode = False
            continue
        i += 1
    if git_paths is not None and (binary or mode):
        changes.append(FileChange(git_paths[0], git_paths[1], (), binary, mode))
    if not changes:
        raise PatchError("no file changes found; a patch is 'git diff' or 'git format-patch' output")
    return Diff(tuple(changes))


def _read_hunk(lines: list[str], i: int) -> tuple[Hunk, int]:
    match = _HUNK.match(lines[i])
    if not match:
        raise PatchError(f"line {i + 1}: {lines[i][:60]!r} is not a hunk header")
    old_start, old_count = int(match.group(1)), int(match.group(2) or "1")
    new_count = int(match.group(4) or "1")
    old: list[str] = []
    new: list[str] = []
    i += 1
    while (len(old) < old_count or len(new) < new_count) and i < len(lines):
        line = lines[i]
        tag, body = (line[:1], line[1:]) if line else (" ", "")
        if tag == " ":
            old.append(body)
            new.append(body)
        elif tag == "-":
            old.append(body)
        elif tag == "+":
            new.append(body)
        elif tag == "\\":
            pass  # "\ No newline at end of file"
        else:
            raise PatchError(f"line {i + 1}: {line[:60]!r} is not a hunk line; the diff is damaged")
        i += 1
    if len(old) != old_count or len(new) != new_count:
        raise PatchError(
            f"line {i}: a hunk ends early ({len(old)}/{old_count} old, {len(new)}/{new_count} new lines)"
        )
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    return Hunk(old_start, tuple(old), tuple(new)), i


def apply_hunks(text: str | None, change: FileChange) -> str | None:
    """The file's text after `change` (None: deleted); raise PatchError naming the hunk that does not match."""
    if change.created:
        if text is not None:
            raise PatchError(f"{change.path}: the patch creates it, but it exists already")
        text = ""
    elif text is None:
        raise PatchError(f"{change.path}: the patch changes it, but it does not exist at this version")
    lines = text.split("\n") if text else []
    if text.endswith("\n"):
        lines.pop()  # the last newline ends the last line; the result always ends with one
    offset = 0
    for number, hunk in enumerate(change.hunks, 1):
        want = max(hunk.old_start - 1, 0) + offset
        at = _find(lines, hunk.old_lines, want)
        if at is None:
            raise PatchError(
                f"{change.path}: hunk {number} (at line {hunk.old_start}) does not match the file's lines; the file "
                "differs from the version the patch was written against"
            )
        lines[at : at + len(hunk.old_lines)] = list(hunk.new_lines)
        offset = at - max(hunk.old_start - 1, 0) + len(hunk.new_lines) - len(hunk.old_lines)
    if change.deleted:
        if lines:
            raise PatchError(f"{change.path}: the patch deletes it, but lines remain after its hunks")
        return None
    return "\n".join(lines) + ("\n" if lines else "")


def _find(lines: list[str], block: tuple[str, ...], want: int) -> int | None:
    """Where `block` matches exactly, nearest to `want` (an offset, never fuzz)."""
    size = len(block)
    for distance in range(0, len(lines) + 1):
        for at in (want - distance, want + distance) if distance else (want,):
            if 0 <= at <= len(lines) - size and tuple(lines[at : at + size]) == block:
                return at
        if want - distance < 0 and want + distance > len(lines) - size:
            break
    return None


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()
