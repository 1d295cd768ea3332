"""The checks of one served configuration: determinism, in-server equivalence, long decode, prefix-cache hits
and the API surface. Each returns a report row (`Check`); a divergence names its position and both sides.

Rules (docs/run.md, "Equal answers on a GPU"): determinism (the same request twice on one server) is exact, token
ids identical position by position. The equivalence rows (streaming, concurrency, prefix caching, chunked
prefill, speculative decoding) request top-5 logprobs and judge by vLLM's own `check_logprobs_close`
(conform/logprobs.py): a divergence is accepted only where each side's token is in the other's top-5, since
vLLM promises identical greedy output across batch sizes and kernels only in its batch-invariant mode; a
profile that runs that mode (VLLM_BATCH_INVARIANT=1) is held to exact equality there too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sparkforge.recipe.conformspec import ConformSettings
from sparkforge.report import Check
from sparkforge.run.conform.client import Completion, OpenAIClient, counter
from sparkforge.run.conform.conformrun import ConformRun
from sparkforge.run.conform.garble import GarbleRules, exactness, judge
from sparkforge.run.conform.logprobs import TOP_K, Decode, Divergence, rule_name
from sparkforge.run.conform.logprobs import judge as judge_logprobs


def compare_row(
    name: str,
    reference: list[Completion],
    other: list[Completion],
    names: tuple[str, str],
    client: OpenAIClient,
    *,
    exact: bool = True,
) -> Check:
    """Two runs of the prompt set: exact, or (`exact=False`) under the logprobs rule; the first divergence shown."""
    found = judge_logprobs(decodes(reference), decodes(other), exact=exact)
    tokens = sum(len(c.token_ids) for c in reference)
    details: dict = {"prompts": len(reference), "tokens": tokens, "rule": rule_name(exact)}
    rejected = [d for d in found if not d.accepted]
    if found:
        details["divergences"] = [d.to_dict() for d in found]
    if not rejected:
        within = ""
        if found:
            first = found[0]
            within = (
                f"; {len(found)} prompt(s) diverge within the rule, first: "
                f"{render(first, names, reference[first.prompt], other[first.prompt], served_text(client))}"
            )
        identical = len(reference) - len(found)
        return Check(
            name,
            "passed",
            f"{len(reference)} prompts, {identical} identical, {tokens} tokens "
            f"({names[0]} vs {names[1]}){within}",
            details,
        )
    bad = rejected[0]
    details.update({"prompt": bad.prompt, "position": bad.position})
    return Check(
        name,
        "failed",
        render(bad, names, reference[bad.prompt], other[bad.prompt], served_text(client)),
        details,
    )


def decodes(completions: Sequence[Completion]) -> list[Decode]:
    return [Decode(tuple(c.token_ids), tuple(c.top)) for c in completions]


def render(
    found: Divergence,
    names: tuple[str, str],
    left: Completion,
    right: Completion,
    text_of: Callable[[Sequence[int]], str | None],
) -> str:
    """A divergence as a reader needs it: where, the text before it, each side's continuation and top-5 lists
    (`text_of`: ids to text, None when unknown)."""
    pos = found.position
    before = text(left.token_ids[max(0, pos - 8) : pos], text_of) if pos else "(the start)"
    sides = [text(c.token_ids[pos : pos + 8], text_of) for c in (left, right)]
    tops = [show_top(top, text_of) for top in (found.left_top, found.right_top)]
    verdict = "accepted" if found.accepted else "NOT accepted"
    return (
        f"prompt {found.prompt} diverges at token {pos} after {before}: {names[0]} continues {sides[0]} "
        f"(top-{TOP_K} {tops[0]}), {names[1]} continues {sides[1]} (top-{TOP_K} {tops[1]}); {verdict}: {found.why}"
    )


def text(ids: Sequence[int], text_of: Callable[[Sequence[int]], str | None]) -> str:
    """Ids as the report shows them: their text (when known) and the ids."""
    if not ids:
        return "(nothing: it ended)"
    shown = text_of(list(ids))
    return f"{shown!r} {list(ids)}" if shown is not None else str(list(ids))


def show_top(top, text_of: Callable[[Sequence[int]], str | None]) -> str:
    """A top-k {id: logprob} as the report shows it, most likely first."""
    if not top:
        return "none"
    ranked = sorted(top.items(), key=lambda kv: -kv[1])
    return "[" + ", ".join(f"{text_of([t])!r}={t} {lp:.2f}" for t, lp in ranked) + "]"


def served_text(client: OpenAIClient) -> Callable[[Sequence[int]], str | None]:
    """Ids to text by the served tokenizer (vLLM's /detokenize); None when it does not answer."""

    def text_of(ids: Sequence[int]) -> str | None:
        try:
            text = client.post_json("/detokenize", {"model": client.model, "tokens": list(ids)}).get("prompt")
        except Exception:  # the ids alone still name the tokens
            return None
        return text if isinstance(text, str) else None

    return text_of


def prompt_set(settings: ConformSettings) -> list[str]:
    """The profile's prompts plus one long prompt (longer than a prefill chunk, so chunking really happens)."""
    prompts = list(settings.prompts)
    if settings.long_prompt_words:
        prompts.append(long_prompt(settings))
    return prompts


def long_prompt(settings: ConformSettings, offset: int = 0) -> str:
    if settings.known_answer:
        m = settings.known_answer.modulus
        return " ".join(str((offset + k) % m) for k in range(settings.long_prompt_words))
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while"]
    return " ".join(words[(offset + k) % len(words)] for k in range(settings.long_prompt_words))


def greedy(
    client: OpenAIClient, prompts: Sequence[str], settings: ConformSettings, **extra
) -> list[Completion]:
    return [client.complete(p, settings.max_tokens, **extra) for p in prompts]


def determinism(client: OpenAIClient, settings: ConformSettings, reference: list[Completion]) -> Check:
    """The prompt set twice more, greedy and seeded sampling: identical token ids every time."""
    prompts = prompt_set(settings)
    again = greedy(client, prompts, settings)
    row = compare_row("determinism", reference, again, ("first run", "second run"), client)
    if row.status == "failed":
        return row
    seeded = {"temperature": 1.0, "seed": settings.seed}
    one, two = greedy(client, prompts, settings, **seeded), greedy(client, prompts, settings, **seeded)
    sampled = compare_row("determinism", one, two, (f"seed {settings.seed} run 1", "run 2"), client)
    if sampled.status == "failed":
        return sampled
    row.reason += f"; seeded sampling (temperature 1, seed {settings.seed}) identical too"
    return row


def streaming(
    client: OpenAIClient, settings: ConformSettings, reference: list[Completion], *, exact: bool = False
) -> Check:
    streamed = greedy(client, prompt_set(settings), settings, stream=True, logprobs=TOP_K)
    return compare_row(
        "equivalence:streaming", reference, streamed, ("non-streaming", "streaming"), client, exact=exact
    )


def concurrency(
    client: OpenAIClient, settings: ConformSettings, reference: list[Completion], *, exact: bool = False
) -> Check:
    """Each prompt alone vs all prompts in flight at once (N copies of the set, so the batch is full)."""
    prompts = prompt_set(settings)
    copies = max(1, settings.concurrency // len(prompts) + 1)
    batch = client.complete_many(prompts * copies, settings.max_tokens, settings.concurrency, logprobs=TOP_K)
    row = compare_row(
        "equivalence:concurrency",
        reference * copies,
        batch,
        ("1 request", f"{settings.concurrency} concurrent"),
        client,
        exact=exact,
    )
    row.details["concurrency"] = settings.concurrency
    return row


def prefix_cache(client: OpenAIClient, settings: ConformSettings) -> Check:
    """A repeated long prefix must register hits in vLLM's own counters (catches the silent 0 %)."""
    prompt = long_prompt(settings, offset=7)
    before = client.metrics()
    client.complete(prompt, 4)
    client.complete(prompt + " " + prompt.split()[-1], 4)  # the same prefix, one word longer
    after = client.metrics()
    hits = counter(after, "vllm:prefix_cache_hits") - counter(before, "vllm:prefix_cache_hits")
    queries = counter(after, "vllm:prefix_cache_queries") - counter(before, "vllm:prefix_cache_queries")
    details = {"hit_tokens": hits, "queried_tokens": queries, "prompt_words": settings.long_prompt_words}
    if queries <= 0 and hits <= 0:
        return Check(
            "prefix-cache",
            "failed",
            "vLLM's /metrics counted no prefix-cache queries: prefix caching is off "
            "(e.g. --no-enable-prefix-caching) or its counters are missing",
            details,
        )
    if hits <= 0:
        return Check(
            "prefix-cache",
            "failed",
            f"0 hits of {queries:.0f} queried tokens for a repeated "
            f"{settings.long_prompt_words}-word prefix: the cache is silently at 0 %",
            details,
        )
    return Check(
        "prefix-cache",
        "passed",
        f"{hits:.0f} of {queries:.0f} queried tokens hit (vllm:prefix_cache_hits)",
        details,
    )


def long_decode(client: OpenAIClient, settings: ConformSettings) -> Check:
    spec = settings.long_decode
    prompt = spec.prompt
    start = time.monotonic()
    done = client.complete(prompt, spec.tokens, ignore_eos=spec.ignore_eos)
    seconds = time.monotonic() - start
    rules = GarbleRules(spec.max_period, spec.loop_tail, spec.window, spec.collapse_ratio)
    verdict = judge(list(done.token_ids), done.text, rules)
    details = {"tokens": len(done.token_ids), "asked": spec.tokens, "finish_reason": done.finish_reason,
               "tok_s": round(len(done.token_ids) / seconds, 1) if seconds else 0.0,
               "findings": [f.__dict__ for f in verdict.findings]}  # fmt: skip
    findings = list(verdict.findings)
    if settings.known_answer:
        right, total, wrong = exactness(done.text, prompt, spec.tokens, settings.known_answer.modulus)
        details.update({"right": right, "answer_tokens": total})
        if wrong:
            findings.append(wrong)
            details["findings"].append(wrong.__dict__)
    if findings:
        return Check(
            "long-decode",
            "failed",
            "; ".join(f"{f.rule} at token {f.position}: {f.detail}" for f in findings),
            details,
        )
    exact = " and exactly the known answer" if settings.known_answer else ""
    return Check(
        "long-decode",
        "passed",
        f"{len(done.token_ids)} tokens, no loop, no U+FFFD, no diversity collapse{exact}",
        details,
    )


# The rows (sparkforge/run/conform/rows.py declares them): each adds its check to the run's report.
def determinism_row(run: ConformRun) -> None:
    run.timed("determinism", lambda: determinism(run.client, run.settings, run.reference))


def long_decode_row(run: ConformRun) -> None:
    run.timed("long-decode", lambda: long_decode(run.client, run.settings))


def prefix_cache_row(run: ConformRun) -> None:
    def row() -> Check:
        found = prefix_cache(run.client, run.settings)
        flags = {k.replace("_", "-"): v for k, v in run.profile.model.args.items()}
        if found.status == "failed" and flags.get("enable-prefix-caching", True) is False:
            found.reason += " (the profile itself sets enable-prefix-caching: false)"
        return found

    run.timed("prefix-cache", row)
