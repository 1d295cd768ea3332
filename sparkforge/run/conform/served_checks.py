"""The checks of one served configuration: determinism, in-server equivalence, long decode, prefix-cache hits
and the API surface. Each returns a report row (`Check`); a divergence names its position and both sides.

Rule for every comparison: token ids identical, position by position (never "close enough"). vLLM promises
identical greedy output across streaming, prefix caching and chunked prefill; across batch sizes only with its
batch-invariant mode, so a divergence under concurrency is reported as what it is, with the first position.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from sparkforge.recipe.conformspec import ConformSettings
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check
from sparkforge.run.conform.client import Completion, OpenAIClient, counter
from sparkforge.run.conform.garble import GarbleRules, exactness, judge


@dataclass(frozen=True)
class Divergence:
    prompt: int
    position: int
    left: tuple[int, ...]
    right: tuple[int, ...]

    def describe(self, names: tuple[str, str], client: OpenAIClient | None = None) -> str:
        sides = [_show(ids, client) for ids in (self.left, self.right)]
        return (
            f"prompt {self.prompt} diverges at token {self.position}: {names[0]} continues {sides[0]}, "
            f"{names[1]} continues {sides[1]}"
        )


def _show(ids: tuple[int, ...], client: OpenAIClient | None) -> str:
    if not ids:
        return "(nothing: it ended)"
    if client is not None:
        try:
            text = client.post_json("/detokenize", {"model": client.model, "tokens": list(ids)}).get("prompt")
            return f"{text!r} {list(ids)}"
        except Exception:  # the ids alone still name the divergence
            pass
    return str(list(ids))


def first_divergence(left: Sequence[Sequence[int]], right: Sequence[Sequence[int]]) -> Divergence | None:
    """The first prompt and token position where two runs of the prompt set differ (8 tokens of each side)."""
    for n, (a, b) in enumerate(zip(left, right, strict=True)):
        if list(a) == list(b):
            continue
        pos = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return Divergence(n, pos, tuple(a[pos : pos + 8]), tuple(b[pos : pos + 8]))
    return None


def compare_row(
    name: str,
    reference: list[Completion],
    other: list[Completion],
    names: tuple[str, str],
    client: OpenAIClient,
) -> Check:
    left, right = [c.token_ids for c in reference], [c.token_ids for c in other]
    found = first_divergence(left, right)
    tokens = sum(len(ids) for ids in left)
    details = {"prompts": len(left), "tokens": tokens, "rule": "identical token ids"}
    if found is None:
        return Check(
            name,
            "passed",
            f"{len(left)} prompts, {tokens} tokens identical ({names[0]} vs {names[1]})",
            details,
        )
    details.update(
        {
            "prompt": found.prompt,
            "position": found.position,
            names[0]: list(found.left),
            names[1]: list(found.right),
        }
    )
    return Check(name, "failed", found.describe(names, client), details)


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


def streaming(client: OpenAIClient, settings: ConformSettings, reference: list[Completion]) -> Check:
    streamed = greedy(client, prompt_set(settings), settings, stream=True)
    return compare_row("equivalence:streaming", reference, streamed, ("non-streaming", "streaming"), client)


def concurrency(client: OpenAIClient, settings: ConformSettings, reference: list[Completion]) -> Check:
    """Each prompt alone vs all prompts in flight at once (N copies of the set, so the batch is full)."""
    prompts = prompt_set(settings)
    copies = max(1, settings.concurrency // len(prompts) + 1)
    batch = client.complete_many(prompts * copies, settings.max_tokens, settings.concurrency)
    row = compare_row(
        "equivalence:concurrency",
        reference * copies,
        batch,
        ("1 request", f"{settings.concurrency} concurrent"),
        client,
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
        return Check("prefix-cache", "failed", "vLLM's /metrics counted no prefix-cache queries: prefix caching is off "
                     "(e.g. --no-enable-prefix-caching) or its counters are missing", details)  # fmt: skip
    if hits <= 0:
        return Check("prefix-cache", "failed", f"0 hits of {queries:.0f} queried tokens for a repeated "
                     f"{settings.long_prompt_words}-word prefix: the cache is silently at 0 %", details)  # fmt: skip
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


# A 2x2 PNG (RGB), made here rather than stored: the smallest real image an OpenAI image_url carries.
def _png() -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    raw = b"".join(b"\x00" + bytes([200, 30, 30, 30, 200, 30]) for _ in range(2))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", (2).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00")
    png += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def api(
    client: OpenAIClient, profile: Profile, settings: ConformSettings, reference: list[Completion]
) -> Check:
    """/v1/models, max_tokens and stop honoured; image, tool call and reasoning where the profile enables them."""
    served = client.model
    listed = client.models()
    results: dict[str, str] = {}
    failures: list[str] = []
    results["models"] = f"lists {listed}"
    if served not in listed:
        failures.append(f"/v1/models lists {listed}, not the served name {served!r}")
    short = client.complete(settings.prompts[0], 3, ignore_eos=True)
    results["max_tokens"] = f"3 asked, {len(short.token_ids)} returned, finish {short.finish_reason}"
    if len(short.token_ids) != 3 or short.finish_reason != "length":
        failures.append(
            f"max_tokens 3 returned {len(short.token_ids)} tokens (finish {short.finish_reason!r})"
        )
    words = reference[0].text.split()
    if len(words) >= 3:
        stop = words[2]
        stopped = client.complete(settings.prompts[0], settings.max_tokens, stop=[stop])
        results["stop"] = f"stop {stop!r}: finish {stopped.finish_reason}, {len(stopped.token_ids)} tokens"
        if stopped.finish_reason != "stop" or stop in stopped.text:
            failures.append(
                f"stop {stop!r} not honoured: finish {stopped.finish_reason!r}, text {stopped.text[:80]!r}"
            )
    else:
        results["stop"] = "skipped: the first prompt's answer has fewer than 3 words to stop at"
    args = {k.replace("_", "-"): v for k, v in profile.model.args.items()}
    results["image"] = _image(client, args, failures)
    results["tool_call"] = _tool_call(client, args, failures)
    results["reasoning"] = _reasoning(client, args, failures)
    if failures:
        return Check("api", "failed", "; ".join(failures), results)
    return Check("api", "passed", "; ".join(f"{k}: {v}" for k, v in results.items()), results)


def _chat(client: OpenAIClient, content, **extra) -> dict:
    body = {"model": client.model, "messages": [{"role": "user", "content": content}], "max_tokens": 64,
            "temperature": 0.0, **extra}  # fmt: skip
    return client.post_json("/v1/chat/completions", body)["choices"][0]


def _image(client: OpenAIClient, args: dict, failures: list[str]) -> str:
    limits = json.loads(str(args.get("limit-mm-per-prompt", "{}")) or "{}")
    if limits.get("image", 1) == 0:
        return "skipped: the profile disables image input (limit-mm-per-prompt image 0)"
    url = f"data:image/png;base64,{_png()}"
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "what is the image ?"},
    ]
    try:
        choice = _chat(client, content)
    except Exception as exc:  # vLLM's refusal is the finding
        failures.append(f"an image_url (base64 PNG) was refused: {str(exc)[:200]}")
        return "refused"
    answer = (choice.get("message") or {}).get("content") or ""
    if not answer.strip():
        failures.append("an image_url (base64 PNG) got an empty answer")
    return f"base64 PNG answered ({len(answer)} chars)"


def _tool_call(client: OpenAIClient, args: dict, failures: list[str]) -> str:
    if not (args.get("enable-auto-tool-choice") and args.get("tool-call-parser")):
        return "skipped: the profile enables no tool-call parser"
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    choice = _chat(
        client,
        "What is the weather in Paris? Use the tool.",
        tools=[tool],
        tool_choice="auto",
        max_tokens=512,
    )
    calls = (choice.get("message") or {}).get("tool_calls") or []
    if not calls:
        failures.append(
            f"no tool call parsed by {args['tool-call-parser']} (finish {choice.get('finish_reason')!r})"
        )
        return "no tool call"
    try:
        json.loads(calls[0]["function"]["arguments"])
    except (ValueError, KeyError, TypeError):
        failures.append(f"the tool call's arguments are not JSON: {str(calls[0])[:200]}")
        return "arguments not JSON"
    return f"{calls[0]['function'].get('name')} with JSON arguments"


def _reasoning(client: OpenAIClient, args: dict, failures: list[str]) -> str:
    if not args.get("reasoning-parser"):
        return "skipped: the profile enables no reasoning parser"
    message = (
        _chat(client, "What is 17 * 23? Answer with the number only.", max_tokens=2048).get("message") or {}
    )
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    if not reasoning or not (message.get("content") or "").strip():
        failures.append(f"the {args['reasoning-parser']} parser did not separate reasoning and answer")
        return "not separated"
    return f"reasoning {len(reasoning)} chars, answer apart"
