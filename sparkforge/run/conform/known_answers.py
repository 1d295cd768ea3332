"""The `known-answers` row: a shipped probe set (`conform.known_answers.probes`: `instruct`, worded for a real
model, sparkforge/run/conform/instruct_probes.py, or `twin`, the words the tiny model learnt, probes.py; from the
profile's seed) asked as greedy chats, each reply right or wrong on its answer span (answer_span.py); accuracy
with its Wilson 95 % interval, passed when the interval's lower bound reaches the profile's floor
(`conform.known_answers.floor`; what that claims: docs/run.md, "What the floor claims"): a deterministic fault
that is identical in every mode (a scale off by a constant, wrong expert routing) fails here while every comparison of the server
with itself passes.

The `sampled-answers` row asks the same probes with sampling (`conform.known_answers.sampled`: temperature,
top-p, a seed per probe from `conform.seed`), as users serve: a fault only on the sampling path (vLLM's rejection
sampler garbling sampled requests under speculative decoding, measured on the twin) passes every greedy row and
fails here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from sparkforge.recipe.conformspec import KnownAnswers, SampledAnswers
from sparkforge.report import Check
from sparkforge.run.conform.answer_span import judge
from sparkforge.run.conform.apisurface import chat, thinking_switch
from sparkforge.run.conform.conformrun import ConformRun
from sparkforge.run.conform.instruct_probes import instruct_probe_set
from sparkforge.run.conform.probes import Probe, probe_set
from sparkforge.run.conform.spec_decode import uses_speculative

Z95 = 1.959964
# `conform.known_answers.probes`: each set's maker (seed, count, recall span).
PROBE_SETS: dict[str, Callable[[int, int, int], list[Probe]]] = {
    "instruct": instruct_probe_set,
    "twin": probe_set,
}


def wilson(right: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of right/total (95 % by default); (0, 1) for no trials."""
    if total <= 0:
        return 0.0, 1.0
    p = right / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def score(
    probes: list[Probe],
    replies: list[str],
    spec: KnownAnswers | SampledAnswers,
    name: str = "known-answers",
    seed: int | None = None,
) -> Check:
    """The row's verdict from the replies (one per probe, in order) against `spec.floor`."""
    right = [judge(probe, reply) for probe, reply in zip(probes, replies, strict=True)]
    total, hits = len(probes), sum(right)
    low, high = wilson(hits, total)
    kinds, kinds_right = (
        Counter(p.kind for p in probes),
        Counter(p.kind for p, ok in zip(probes, right, strict=True) if ok),
    )
    wrong = [
        {"kind": p.kind, "prompt": p.prompt, "answer": p.answer, "reply": r[:200]}
        for p, r, ok in zip(probes, replies, right, strict=True)
        if not ok
    ]
    details = {
        "right": hits, "total": total, "accuracy": round(hits / total, 4), "wilson95": [round(low, 4), round(high, 4)],
        "floor": spec.floor, "seed": spec.seed if isinstance(spec, KnownAnswers) else seed, "by_kind": {k: f"{kinds_right[k]}/{n}" for k, n in kinds.items()},
        "wrong": wrong[:10],
    }  # fmt: skip
    summary = (
        f"{hits}/{total} right ({hits / total:.1%}, Wilson 95 % [{low:.3f}, {high:.3f}]) against the floor "
        f"{spec.floor:g}; by kind {details['by_kind']}"
    )
    if low >= spec.floor:
        return Check(name, "passed", summary, details)
    first = wrong[0] if wrong else None
    shown = (
        f"; first wrong: {first['prompt'][:120]!r} -> {first['reply'][:80]!r}, want {first['answer']!r}"
        if first
        else ""
    )
    why = "the interval's lower bound is below the floor" + (
        " (too few probes to tell)" if hits == total else ""
    )
    return Check(name, "failed", f"{summary}: {why}{shown}", details)


def reply_text(doc: object) -> str:
    """The first choice's message content of a chat reply ('' where the server sent none)."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = first.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


def _asked(run: ConformRun, sampled: bool) -> tuple[list[Probe], list[str]]:
    """The probe set and each reply: greedy, or sampled with the profile's knobs and a seed per probe."""
    spec = run.settings.known_answers
    probes = PROBE_SETS[spec.probes](spec.seed, spec.count, spec.recall_span)
    thinking = thinking_switch({k.replace("_", "-"): v for k, v in run.profile.model.args.items()}, False)
    knobs = {"temperature": spec.sampled.temperature, "top_p": spec.sampled.top_p} if sampled else {}
    replies = [
        reply_text(
            chat(
                run.client,
                p.prompt,
                max_tokens=spec.max_tokens,
                **({"seed": run.settings.seed + i} if sampled else {}),
                **knobs,
                **thinking,
            )
        )
        for i, p in enumerate(probes)
    ]
    return probes, replies


def known_answers(run: ConformRun) -> None:
    def row() -> Check:
        check = score(*_asked(run, False), run.settings.known_answers)
        check.details["probes"] = run.settings.known_answers.probes
        return check

    run.timed("known-answers", row)


def sampled_answers(run: ConformRun) -> None:
    sampled = run.settings.known_answers.sampled

    def row() -> Check:
        check = score(*_asked(run, True), sampled, "sampled-answers", run.settings.seed)
        check.details.update(
            temperature=sampled.temperature, top_p=sampled.top_p, probes=run.settings.known_answers.probes
        )
        check.reason = f"temperature {sampled.temperature:g}, top-p {sampled.top_p:g}: {check.reason}"
        greedy = next((c for c in run.report.checks if c.name == "known-answers"), None)
        if check.status == "failed" and greedy is not None and greedy.status == "passed":
            check.reason += "; the greedy probes passed, so the sampling path is at fault" + (
                " (speculative decoding is on: compare with its speculative-config off; vLLM's rejection "
                "sampler decides sampled drafts)"
                if uses_speculative(run.profile)
                else ""
            )
        return check

    run.timed("sampled-answers", row)
