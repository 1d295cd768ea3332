"""The garble detector and the known-answer oracle: pure functions over token ids and text (no server).

Each rule names what it saw: a repetition loop (a period of at most `max_period` tokens filling the tail), the
Unicode replacement character (what invalid UTF-8 decodes to), a collapse of token diversity (the last window
holds far fewer distinct tokens than the first), and, for the known-answer model, the first token that is not
the answer. Rules are stated, never loosened to get green: their thresholds are the profile's settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GarbleRules:
    max_period: int = 16  # loops of up to this many tokens (counting's period, 50-100, is not one)
    loop_tail: int = 128  # ... repeated over at least this many trailing tokens
    window: int = 256  # diversity: distinct tokens per window
    collapse_ratio: float = 0.25  # the last window below this share of the first window's diversity


@dataclass(frozen=True)
class Finding:
    rule: str
    position: int  # token index where it starts (-1: the text as a whole)
    detail: str


@dataclass(frozen=True)
class GarbleVerdict:
    tokens: int
    findings: list[Finding] = field(default_factory=list)

    def summary(self) -> str:
        if not self.findings:
            return f"{self.tokens} tokens, no garble"
        return "; ".join(f"{f.rule} at token {f.position}: {f.detail}" for f in self.findings)


def find_loop(ids: list[int], rules: GarbleRules) -> Finding | None:
    """The shortest period p <= max_period that the last `loop_tail` (or more) tokens repeat exactly."""
    if len(ids) < rules.loop_tail:
        return None
    for period in range(1, rules.max_period + 1):
        run = 0  # trailing tokens equal to the token one period earlier
        for i in range(len(ids) - 1, period - 1, -1):
            if ids[i] != ids[i - period]:
                break
            run += 1
        if run + period >= rules.loop_tail:
            start = len(ids) - run - period
            return Finding(
                "loop",
                start,
                f"the last {run + period} tokens repeat a {period}-token cycle {ids[start : start + period]}",
            )
    return None


def find_collapse(ids: list[int], rules: GarbleRules) -> Finding | None:
    if len(ids) < 2 * rules.window:
        return None
    first = len(set(ids[: rules.window]))
    last = len(set(ids[-rules.window :]))
    if first >= 8 and last < rules.collapse_ratio * first:
        return Finding(
            "diversity-collapse",
            len(ids) - rules.window,
            f"{last} distinct tokens in the last {rules.window}, {first} in the first",
        )
    return None


def judge(ids: list[int], text: str, rules: GarbleRules) -> GarbleVerdict:
    """Every garble rule over one decode (token ids and their text)."""
    findings = []
    bad = text.find("\ufffd")
    if bad >= 0:
        findings.append(
            Finding(
                "replacement-character",
                -1,
                f"U+FFFD (invalid UTF-8) at character {bad}: {text[max(0, bad - 40) : bad + 40]!r}",
            )
        )
    for rule in (find_loop, find_collapse):
        found = rule(ids, rules)
        if found:
            findings.append(found)
    return GarbleVerdict(len(ids), findings)


# ---- the known-answer model: an arithmetic progression modulo M on number words -------------------------
_NUMBER = re.compile(r"^\d+$")


def progression_answer(prompt: str, tokens: int, modulus: int) -> list[str]:
    """The next `tokens` number words after the prompt's last two numbers (their difference is the step)."""
    numbers = [int(w) for w in prompt.split() if _NUMBER.match(w)]
    if len(numbers) < 2:
        raise ValueError(f"a progression prompt needs two numbers at least: {prompt[:80]!r}")
    last, step = numbers[-1], (numbers[-1] - numbers[-2]) % modulus
    return [str((last + k * step) % modulus) for k in range(1, tokens + 1)]


def first_wrong(words: list[str], answer: list[str]) -> int | None:
    """Index of the first word that is not the answer (a short output is wrong where it ends)."""
    for i, want in enumerate(answer):
        if i >= len(words) or words[i] != want:
            return i
    return None


def exactness(text: str, prompt: str, tokens: int, modulus: int) -> tuple[int, int, Finding | None]:
    """(right, total, first wrong) of a progression decode judged word by word."""
    words = text.split()
    answer = progression_answer(prompt, tokens, modulus)
    right = sum(a == b for a, b in zip(words, answer, strict=False))
    wrong = first_wrong(words, answer)
    if wrong is None:
        return right, len(answer), None
    got = " ".join(words[wrong : wrong + 6]) or "(nothing)"
    return (
        right,
        len(answer),
        Finding("not-the-answer", wrong, f"expected {' '.join(answer[wrong : wrong + 6])!r}, got {got!r}"),
    )
