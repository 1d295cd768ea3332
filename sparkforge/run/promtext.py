"""Counters from a Prometheus text exposition (a served vLLM's `/metrics`), read strictly.

The text comes from the served deployment, so it is untrusted: only the allow-listed counters are read; each of
their sample lines must be the counter's name, optional `{label="value",...}` and a non-negative whole number
(prometheus_client prints 12.0 or 1.2e+06), optionally a timestamp; anything else on such a line is an error
naming where the text came from, never a guess. Every other line (comments, other metrics) is ignored. Used by
conform (speculative decoding's acceptance) and bench (the acceptance over a run).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from sparkforge.boundary import linear_regex
from sparkforge.errors import RunError

MAX_METRICS_CHARS = 16 << 20  # a vLLM server's /metrics is tens of KiB
MAX_COUNT = 2**63 - 1
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
# name{label="v",...} value [timestamp] (RE2 is linear in the line, so the repetitions need no bound).
_SAMPLE = (
    rf"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{(?:{_LABEL}(?:,{_LABEL})*,?)?\}})?"
    r" (?P<value>[0-9]{1,19}(?:\.0{1,20})?|[0-9](?:\.[0-9]{1,20})?e\+?[0-9]{1,2})(?: -?[0-9]{1,20})?"
)


@cache
def _sample() -> object:
    return linear_regex(_SAMPLE)


def read_counters(text: str, names: Iterable[str], where: str, fix: str) -> dict[str, int]:
    """Each allow-listed counter's value summed over its label sets (one per engine); a counter the text does not
    carry is absent from the result. `fix` ends every error."""
    wanted = frozenset(names)
    if len(text) > MAX_METRICS_CHARS:
        raise RunError(
            f"{where}: {len(text)} characters, more than a vLLM /metrics ({MAX_METRICS_CHARS}); {fix}"
        )
    totals: dict[str, int] = {}
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name not in wanted:  # comments (# HELP, # TYPE), blank lines and every other metric
            continue
        sample = _sample().fullmatch(line)  # type: ignore[attr-defined]
        if sample is None or sample.group("name") != name:
            raise RunError(f"{where}: not a counter sample: {line[:200]!r}; {fix}")
        value = float(sample.group("value"))
        if not value.is_integer() or value > MAX_COUNT:
            raise RunError(f"{where}: {name} is not a whole number: {line[:200]!r}; {fix}")
        totals[name] = totals.get(name, 0) + int(value)
    return totals
