"""The `api` row: the OpenAI surface a client relies on, each part where the profile enables it.

`/v1/models` lists the served name; `max_tokens` and `stop` are honoured; an image (OpenAI `image_url`, a base64
PNG) is accepted and answered, its tokens counted in the prompt usage (the same chat with and without the image);
a tool call through the profile's tool parser carries JSON arguments; the reasoning parser separates reasoning
from the answer. A part the profile does not enable is `skipped` with the profile setting that disables it.
With a reasoning parser every chat says whether to think (`chat_template_kwargs.enable_thinking`, what Qwen3.5's
template and vLLM's qwen3 parser read; both default to thinking): off for the image and the tool call, whose
answers must not hide in a thought cut short by max_tokens, on for the reasoning part.
"""

from __future__ import annotations

import base64
import zlib

from sparkforge.boundary import parse_json
from sparkforge.errors import InputError
from sparkforge.recipe.conformspec import ConformSettings
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check
from sparkforge.run.conform.client import Completion, OpenAIClient
from sparkforge.run.conform.conformrun import ConformRun

PNG_SIDE = 64


# A 64x64 PNG (RGB, two colours), made here rather than stored: a real image an OpenAI image_url carries, large
# enough for a few vision tokens on a tiny processor and a few dozen on Qwen3.5's own.
def png_base64(side: int = PNG_SIDE) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    row = bytes([200, 30, 30] * (side // 2) + [30, 30, 200] * (side - side // 2))
    raw = b"".join(b"\x00" + row for _ in range(side))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", side.to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00")
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
    thinking = thinking_switch(args, False)
    results["image"] = _image(client, profile, settings, args, failures, thinking)
    results["tool_call"] = _tool_call(client, args, failures, thinking)
    results["reasoning"] = _reasoning(client, args, failures)
    if failures:
        return Check("api", "failed", "; ".join(failures), results)
    return Check("api", "passed", "; ".join(f"{k}: {v}" for k, v in results.items()), results)


def api_row(run: ConformRun) -> None:
    run.timed("api", lambda: api(run.client, run.profile, run.settings, run.reference))


def thinking_switch(args: dict, on: bool) -> dict:
    """The chat's thinking switch where the profile has a reasoning parser (nothing to say otherwise)."""
    return {"chat_template_kwargs": {"enable_thinking": on}} if args.get("reasoning-parser") else {}


def chat(client: OpenAIClient, content, **extra) -> dict:
    """One greedy chat completion: the whole reply (choices and usage)."""
    body = {"model": client.model, "messages": [{"role": "user", "content": content}], "max_tokens": 64,
            "temperature": 0.0, **extra}  # fmt: skip
    return client.post_json("/v1/chat/completions", body)


def _image(
    client: OpenAIClient,
    profile: Profile,
    settings: ConformSettings,
    args: dict,
    failures: list[str],
    thinking: dict,
) -> str:
    """A base64 PNG answered, and its tokens counted: the prompt usage with it minus the same chat without it."""
    try:  # the profile's flag, through the boundary's JSON (a malformed value is this row's failure, not a crash)
        limits = parse_json(str(args.get("limit-mm-per-prompt", "{}")) or "{}", "--limit-mm-per-prompt")
    except InputError as exc:
        failures.append(f"the profile's limit-mm-per-prompt is not JSON: {str(exc)[:200]}")
        return "limit-mm-per-prompt not JSON"
    if not isinstance(limits, dict):
        failures.append(f"the profile's limit-mm-per-prompt is not a JSON object: {str(limits)[:100]}")
        return "limit-mm-per-prompt not an object"
    if limits.get("image", 1) == 0:
        return "skipped: the profile disables image input (limit-mm-per-prompt image 0)"
    text = {"type": "text", "text": settings.image_prompt}
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png_base64()}"}}
    try:
        reply = chat(client, [image, text], max_tokens=16, **thinking)
        plain = chat(client, [text], max_tokens=1, **thinking)
    except Exception as exc:  # vLLM's refusal is the finding
        failures.append(f"an image_url (base64 PNG, {PNG_SIDE}x{PNG_SIDE}) was refused: {str(exc)[:300]}")
        return "refused"
    choice, usage = reply["choices"][0], reply.get("usage") or {}
    answer = (choice.get("message") or {}).get("content") or ""
    counted = int(usage.get("prompt_tokens", 0)) - int((plain.get("usage") or {}).get("prompt_tokens", 0))
    if not answer.strip():
        failures.append(
            f"an image_url (base64 PNG) got an empty answer (finish {choice.get('finish_reason')!r})"
        )
    if counted <= 0:
        failures.append(
            f"the image added {counted} prompt tokens (usage with and without it): it was not seen"
        )
    return (
        f"base64 PNG {PNG_SIDE}x{PNG_SIDE} answered by {profile.model.architecture or 'the served class'} "
        f"({usage.get('completion_tokens', '?')} tokens: {answer.strip()[:60]!r}); the image counted "
        f"{counted} prompt tokens ({usage.get('prompt_tokens', '?')} in all)"
    )


def _tool_call(client: OpenAIClient, args: dict, failures: list[str], thinking: dict) -> str:
    if not (args.get("enable-auto-tool-choice") and args.get("tool-call-parser")):
        return "skipped: the profile enables no tool-call parser"
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    choice = chat(
        client,
        "What is the weather in Paris? Use the tool.",
        tools=[tool],
        tool_choice="auto",
        max_tokens=512,
        **thinking,
    )["choices"][0]
    calls = (choice.get("message") or {}).get("tool_calls") or []
    if not calls:
        failures.append(
            f"no tool call parsed by {args['tool-call-parser']} (finish {choice.get('finish_reason')!r})"
        )
        return "no tool call"
    try:
        parse_json(str(calls[0]["function"]["arguments"]), "the tool call's arguments")
    except (InputError, KeyError, TypeError):
        failures.append(f"the tool call's arguments are not JSON: {str(calls[0])[:200]}")
        return "arguments not JSON"
    return f"{calls[0]['function'].get('name')} with JSON arguments"


def _reasoning(client: OpenAIClient, args: dict, failures: list[str]) -> str:
    if not args.get("reasoning-parser"):
        return "skipped: the profile enables no reasoning parser"
    message = (
        chat(
            client,
            "What is 17 * 23? Answer with the number only.",
            max_tokens=2048,
            **thinking_switch(args, True),
        )["choices"][0].get("message")
        or {}
    )
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    if not reasoning or not (message.get("content") or "").strip():
        failures.append(f"the {args['reasoning-parser']} parser did not separate reasoning and answer")
        return "not separated"
    return f"reasoning {len(reasoning)} chars, answer apart"
