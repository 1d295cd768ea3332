"""A server's /metrics (Prometheus text format) read as typed samples: each series (name and label set) once, a
counter finite and not negative. A series printed twice is refused, not summed; an infinite counter is refused,
not shown as 'nan of nan'."""

from __future__ import annotations

import math
import re

from sparkforge.boundary import bounded_lines
from sparkforge.errors import RunError

MAX_SERIES = 200_000  # vLLM exports a few hundred; a million-line answer is not metrics
_SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?")
FIX = "check that the URL is vLLM's OpenAI server (its /metrics), not a proxy or another program"


def read_samples(text: str, where: str) -> dict[tuple[str, str], float]:
    """{(name, labels): value} of every sample line (comments and blank lines skipped); a malformed line, a
    series twice or more than MAX_SERIES series is a RunError naming `where`."""
    samples: dict[tuple[str, str], float] = {}
    for number, line in enumerate(bounded_lines(text), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise RunError(f"{where}: line {number} is not a Prometheus sample ({line[:80]!r}); fix: {FIX}")
        name, labels, raw = match.group(1), match.group(2) or "", match.group(3)
        try:
            value = float(raw)
        except ValueError:
            raise RunError(f"{where}: line {number}: {raw[:40]!r} is not a number; fix: {FIX}") from None
        if (name, labels) in samples:
            raise RunError(
                f"{where}: line {number}: the series {name}{labels[:120]} appears twice; fix: {FIX}"
            )
        samples[(name, labels)] = value
        if len(samples) > MAX_SERIES:
            raise RunError(f"{where}: more than {MAX_SERIES} series; fix: {FIX}")
    return samples


def counter_total(text: str, name: str, where: str = "the server's /metrics") -> float:
    """The sum of counter `name` (vLLM exports `<name>_total`) over its label sets, each finite and >= 0."""
    total = 0.0
    for (series, labels), value in read_samples(text, where).items():
        if series not in (name, f"{name}_total"):
            continue
        if not math.isfinite(value) or value < 0:
            raise RunError(
                f"{where}: counter {series}{labels[:120]} is {value}, not a finite count; fix: {FIX}"
            )
        total += value
    return total
