"""Judging a known-answer reply on its answer span, so that a real model's lead-in sentence ("Sure, here it is.")
or closing remark does not fail a probe it answered right.

The spans judged, each by the probe's own exact rule (sparkforge/run/conform/probes.py `Probe.judge`): the whole
reply (the rule the tiny model was trained and measured under, so the twin's set passes whatever it passed
before); then, with thinking, markdown emphasis and quotes removed, the text after the reply's last "Answer:" marker where
it has one (that span alone decides: "42" on one line and "Answer: 43" on the next is wrong), else its first and
its last non-empty line.
"""

from __future__ import annotations

import re

from sparkforge.run.conform.probes import Probe

# "Answer:", "The answer is", "final answer is:"; not "Here is the answer." nor "answers" (a word boundary).
MARKER = re.compile(r"\banswer\b\s*(?::|is\b\s*:?)", re.IGNORECASE)
THOUGHT = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
# Markdown emphasis, code marks and quotes around an answer ("**Answer:** `42`"); no probe's answer holds them.
EMPHASIS = str.maketrans("", "", '*`"')


def answer_spans(reply: str) -> list[str]:
    """The spans of `reply` that are judged, the whole reply first."""
    text = THOUGHT.sub("", reply).translate(EMPHASIS)
    markers = list(MARKER.finditer(text))
    if markers:
        tail = text[markers[-1].end() :].strip()
        return [reply, tail.splitlines()[0] if tail else ""]
    lines = [line for line in text.splitlines() if line.strip()]
    return [reply, *lines[:1], *lines[-1:]]


def judge(probe: Probe, reply: str) -> bool:
    """Whether `reply` answers `probe` right on one of its answer spans."""
    return any(probe.judge(span) for span in answer_spans(reply))
