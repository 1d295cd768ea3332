"""The boundary's bounded parsers: option numbers written in ASCII and in range, lists of them, flags that exclude
each other, regexes that run in linear time over untrusted text, walks of untrusted trees with a depth and a
count. Re-exported by `sparkforge.boundary`, the one import callers use."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any

from sparkforge.errors import InputError

MAX_NUMBER_CHARS = 40  # a count or size never needs more; Python would parse 4,300 digits


def check_number(option: str, value: object, *, low: float, high: float, integer: bool = False,
                 low_open: bool = False, text: bool = True) -> float | int:  # fmt: skip
    """A number from the command line or a file: finite, in [low, high] ((low, high] with `low_open`), whole
    when a count is meant; a string is parsed first ("1e309", "nan" refused), or refused with text=False (a
    JSON value where the file's format says number)."""
    parsed: object = value
    if isinstance(value, str) and text:
        parsed = ascii_number(value.strip(), integer)
    if isinstance(parsed, float) and integer and parsed.is_integer():
        parsed = int(parsed)
    kind = "a whole number" if integer else "a number"
    good = not isinstance(parsed, bool) and isinstance(parsed, int if integer else int | float)
    good = good and (isinstance(parsed, int) or math.isfinite(parsed))  # type: ignore[arg-type]
    good = good and (low < parsed if low_open else low <= parsed) and parsed <= high  # type: ignore[operator]
    if not good:
        bounds = f"{'above' if low_open else 'from'} {low:g} {'up ' if low_open else ''}to {high:g}"
        raise InputError(f"{option} {str(value)[:60]!r} is not {kind} {bounds}; fix: pass {kind} {bounds}")
    return parsed  # type: ignore[return-value]


def check_label(
    option: str, value: object, *, max_len: int, forbid: str = "", optional: bool = False
) -> str | None:
    """Text from a file that is shown as a label or a table cell: a string of at most `max_len` printable
    characters (no control character, no terminal escape) and none of `forbid` (e.g. '$', which matplotlib
    reads as mathtext); None passes when `optional`."""
    if optional and value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) > max_len
        or not value.isprintable()
        or set(forbid) & set(value)
    ):
        banned = f", no {' '.join(repr(c) for c in forbid)}" if forbid else ""
        raise InputError(
            f"{option} {str(value)[:60]!r} is not a short plain text (at most {max_len} printable characters"
            f"{banned}); fix: name the file sparkforge wrote"
        )
    return value


_FLOAT_CHARS = frozenset("0123456789+-.eE")


def ascii_number(text: str, integer: bool) -> int | float | None:
    """`text` as a number written in ASCII only: Python's int()/float() also take '1_0' (10), '٣' (3), '²'
    (error) and 'nan'; the boundary takes digits, one sign, a point and an exponent, and at most 40 of them."""
    if not text or len(text) > MAX_NUMBER_CHARS or not text.isascii():
        return None
    body = text[1:] if text[0] in "+-" else text
    if integer:
        return int(text) if body.isdigit() else None
    if not set(text) <= _FLOAT_CHARS or not any(c.isdigit() for c in body):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_int(option: str, text: str, *, low: int, high: int) -> int:
    """A whole number from an option's text: ASCII digits only (no '1_0', '٣', '²', '0x10', '+-3'), in range."""
    return int(check_number(option, str(text), low=low, high=high, integer=True))


def parse_int_list(option: str, text: str, *, low: int, high: int, max_items: int = 64) -> list[int]:
    """A comma-separated list of whole numbers (`--concurrency 1,4,16`): each by `parse_int`; an empty entry
    or more than `max_items` entries is refused, never dropped."""
    parts = str(text).split(",")
    if len(parts) > max_items:
        raise InputError(f"{option}: {len(parts)} entries, at most {max_items}; fix: pass fewer values")
    if any(not p.strip() for p in parts):
        raise InputError(f"{option} {str(text)[:60]!r}: an empty entry; fix: remove the extra comma")
    return [parse_int(option, p, low=low, high=high) for p in parts]


def check_exclusive(**flags: object) -> None:
    """Flags that exclude each other: two given at once are refused, never one silently ignored."""
    given = [name for name, value in flags.items() if value]
    if len(given) > 1:
        names = " and ".join("--" + n.replace("_", "-") for n in given)
        raise InputError(f"{names} exclude each other; fix: give one of them")


BUILD_NETWORKS = ("default", "host", "none")  # BuildKit's RUN --network modes; anything else is no mode


def check_build_network(option: str, value: str) -> str:
    """A BuildKit network mode for RUN steps (empty: the default), from an allow-list."""
    if value and value not in BUILD_NETWORKS:
        raise InputError(
            f"{option} {value[:60]!r} is not a BuildKit network mode; fix: use one of {', '.join(BUILD_NETWORKS)}"
        )
    return value


MAX_REGEX_MEM = 1 << 20  # RE2's budget for one compiled pattern: more (nested counted repeats) is refused
MAX_LINE = 8192  # a log line sparkforge searches: longer lines are cut there (vLLM's are under 1 KiB)


@functools.lru_cache(maxsize=512)
def linear_regex(pattern: str, *, max_mem: int = MAX_REGEX_MEM) -> Any:
    """`pattern` compiled by RE2: every regex over untrusted text (logs, answers, profile patterns) runs in time
    linear in the text, `(a+)+$` included; a pattern RE2 cannot run so (back-references, look-arounds, over the
    budget) is a ValueError naming it."""
    import re2

    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"{pattern!r} is not a regular expression sparkforge runs ({reason}; patterns run in linear time, "
            "without back-references or look-arounds); fix: e.g. '\\b391\\b'"
        ) from None


def bounded_lines(text: str, max_line: int = MAX_LINE) -> list[str]:
    """`text`'s lines, each cut at `max_line` characters (a 2 MB line is searched as its first 8 KiB)."""
    return [line[:max_line] for line in text.splitlines()]


def walk_tree(root: Path | str, option: str, *, max_depth: int = 16, max_entries: int = 10_000) -> list[Path]:
    """The regular files under `root`, sorted, without following a symlink (a linked file or folder is left out,
    so a link to /etc or a loop is never entered); deeper than `max_depth` or more than `max_entries` entries
    is refused, not cut short."""
    top = Path(root)
    if top.is_symlink() or not top.is_dir():
        raise InputError(f"{option} {top}: not a folder (or a symlink to one); fix: name a real folder")
    found: list[Path] = []
    stack, seen = [(top, 0)], 0
    while stack:
        folder, depth = stack.pop()
        if depth > max_depth:
            raise InputError(
                f"{option} {top}: nested deeper than {max_depth} folders; fix: name a shallower tree"
            )
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise InputError(
                f"{option} {folder}: cannot list it ({exc.strerror}); fix: check the folder"
            ) from None
        seen += len(entries)
        if seen > max_entries:
            raise InputError(f"{option} {top}: more than {max_entries} entries; fix: name a smaller tree")
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), depth + 1))
            elif entry.is_file(follow_symlinks=False):
                found.append(Path(entry.path))
    return sorted(found)
