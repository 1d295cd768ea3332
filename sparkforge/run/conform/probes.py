"""The known-answer probe set: questions with one exact answer that any competent instruction model gets right
(arithmetic, copying, long-range recall, counting, ordering, format following), generated from a seed so the set
is shipped as code, the same on every machine, and as large as a profile asks.

Prompts are lowercase words and numbers 0-99 separated by spaces (punctuation stands apart), so a word-level
tokenizer reads them as a BPE one does. Standard library only: the tiny test model's trainer
(tests/engine/tiny_trained_qwen35moe.py) loads this file inside the twin image and learns the same generator's
items, so the row is exercised where no real model fits.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

KINDS = ("arithmetic", "copying", "recall", "counting", "ordering", "format")
THINGS = ("cat", "dog", "sun", "tree", "car", "book")
FILLER = "the sky is blue ."
# Every word a prompt or an answer uses besides the numbers 0-99 (a word-level tokenizer needs each one).
WORDS = (
    "what", "is", "plus", "?", "answer", "with", "the", "number", "only", ".", "repeat", "these", "numbers", ":",
    "remember", "did", "i", "ask", "you", "to", "how", "many", "words", "are", "in", "this", "list", "sort", "from",
    "smallest", "largest", "write", "separated", "by", "commas", ",", "sky", "blue", *THINGS,
)  # fmt: skip


@dataclass(frozen=True)
class Probe:
    kind: str
    prompt: str
    answer: str

    def judge(self, reply: str) -> bool:
        """Whether a model's reply is exactly the answer (case, spacing and a final full stop aside; commas count
        only where the format asks for them)."""
        got, want = normalize(reply), normalize(self.answer)
        if self.kind != "format":
            got, want = got.replace(",", " "), want.replace(",", " ")
            got, want = " ".join(got.split()), " ".join(want.split())
        return got == want


def normalize(text: str) -> str:
    text = re.sub(r"\s+([,.?:!;])", r"\1", text.strip().lower())
    text = re.sub(r",\s*", ", ", text)
    return " ".join(text.split()).rstrip(".").strip()


def _numbers(rng: random.Random, n: int) -> list[int]:
    return rng.sample(range(100), n)


def probe(kind: str, rng: random.Random, recall_span: int = 12) -> Probe:
    """One probe of `kind`; `recall_span` is the number of filler sentences between the fact and the question."""
    if kind == "arithmetic":
        a = rng.randrange(1, 90)
        b = rng.randrange(1, 100 - a)
        return Probe(kind, f"what is {a} plus {b} ? answer with the number only .", str(a + b))
    if kind == "copying":
        seq = " ".join(map(str, _numbers(rng, rng.randrange(3, 7))))
        return Probe(kind, f"repeat these numbers : {seq} . answer with the numbers only .", seq)
    if kind == "recall":
        key = rng.randrange(100)
        filler = " ".join([FILLER] * rng.randrange(recall_span // 2, recall_span + 1))
        prompt = f"remember the number {key} . {filler} what number did i ask you to remember ? answer with the number only ."
        return Probe(kind, prompt, str(key))
    if kind == "counting":
        items = " ".join(rng.choice(THINGS) for _ in range(rng.randrange(2, 10)))
        return Probe(
            kind,
            f"how many words are in this list : {items} ? answer with the number only .",
            str(len(items.split())),
        )
    if kind == "ordering":
        nums = _numbers(rng, rng.randrange(3, 6))
        listed = " ".join(map(str, nums))
        return Probe(
            kind,
            f"sort these numbers from smallest to largest : {listed} . answer with the numbers only .",
            " ".join(map(str, sorted(nums))),
        )
    if kind == "format":
        start = rng.randrange(0, 90)
        end = start + rng.randrange(2, 6)
        return Probe(
            kind,
            f"write the numbers from {start} to {end} separated by commas .",
            " , ".join(str(n) for n in range(start, end + 1)),
        )
    raise ValueError(f"unknown probe kind {kind!r}; choose from {', '.join(KINDS)}")


def probe_set(seed: int, count: int, recall_span: int = 12) -> list[Probe]:
    """`count` probes from `seed`, the kinds in turn (the same seed and count: the same set everywhere)."""
    rng = random.Random(seed)
    return [probe(KINDS[n % len(KINDS)], rng, recall_span) for n in range(count)]
