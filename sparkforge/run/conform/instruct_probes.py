"""The known-answer probes worded for a real instruction model: the twin's set (sparkforge/run/conform/probes.py,
which the committed tiny model learnt word for word) from the same seed, with the same numbers and answers, written
as prose (sentence case, punctuation attached) and ending in one explicit instruction to answer only, on an
"Answer:" line, which the judge (answer_span.py) reads.

The twin's set stays as it is, byte for byte: the tiny model's content key covers probes.py
(tests/engine/tiny_fixture.py), and retraining it is the only way to change that set.
"""

from __future__ import annotations

import re

from sparkforge.run.conform.probes import Probe, probe_set

INSTRUCTION = 'Reply with the answer only, on one line that starts with "Answer:".'
# The twin's own answer-only tail (every kind but format carries it); the instruction above replaces it.
TWIN_TAIL = re.compile(r"\s*answer with the numbers? only \.$")


def prose(twin_prompt: str) -> str:
    """A twin prompt ("what is 3 plus 4 ? answer with the number only .") as an instruction model reads it."""
    text = TWIN_TAIL.sub("", twin_prompt)
    text = re.sub(r" ([?.:,])", r"\1", text)
    text = re.sub(r"\bi\b", "I", text)
    text = re.sub(r"(^|[.?] )([a-z])", lambda m: m.group(1) + m.group(2).upper(), text)
    return f"{text} {INSTRUCTION}"


def instruct_probe_set(seed: int, count: int, recall_span: int = 12) -> list[Probe]:
    """`count` probes from `seed` (the twin's set from that seed), each worded for an instruction model."""
    return [Probe(p.kind, prose(p.prompt), p.answer) for p in probe_set(seed, count, recall_span)]
