"""Option values at the boundary: numbers written in ASCII and in range, lists of them, flags that exclude
each other. Re-exported by `sparkforge.boundary`, the one import callers use."""

from __future__ import annotations

import math

from sparkforge.errors import InputError

MAX_NUMBER_CHARS = 40  # a count or size never needs more; Python would parse 4,300 digits


def check_number(option: str, value: object, *, low: float, high: float, integer: bool = False,
                 low_open: bool = False) -> float | int:  # fmt: skip
    """A number from the command line or a file: finite, in [low, high] ((low, high] with `low_open`), whole
    when a count is meant; a string is parsed first ("1e309", "nan" refused)."""
    parsed: object = value
    if isinstance(value, str):
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
