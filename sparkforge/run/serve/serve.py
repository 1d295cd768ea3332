"""`serve` / `serve.down`: one node, one container, the way GB10 needs it; health, then one chat completion.

Before anything starts, the model class (the profile's `architecture`, or the `--model-dir` config.json's) is
looked up in the image's own vLLM registry, so a model the image cannot load is refused before any download.
The chat completion asks the profile's `check.prompt` (default: a question whose answer needs thinking): with
the profile's reasoning parser the reply carries the reasoning and the answer in separate fields; an empty or
failed answer, or one not matching `check.expect`, fails serve (a green health check is not an answer check).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.recipe.profile import Profile, expect_pattern
from sparkforge.run.launch import ContainerPlan, LaunchOptions, architecture_argv, plan_launch
from sparkforge.run.nodes import NodeEngine
from sparkforge.run.serve.start import cluster_down, launch_plan
from sparkforge.run.weights.weights import fetch_weights

CHAT_PROMPT = "What is 17 * 23? Answer with the number only."
# Runs inside the head container (the API listens there whatever the host's firewall says).
_CHAT = """
import json, sys, urllib.error, urllib.request
body = {"model": sys.argv[2], "messages": [{"role": "user", "content": sys.argv[3]}], "max_tokens": int(sys.argv[4])}
if sys.argv[5] == "1":
    body["ignore_eos"] = True
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=600).read().decode())
except urllib.error.HTTPError as exc:
    print(exc.read().decode().replace("\\n", " "))
"""


@dataclass(frozen=True)
class ChatReply:
    reasoning: str
    answer: str
    finish_reason: str = ""
    usage: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> ChatReply:
        """vLLM's OpenAI reply; the reasoning parser's part is `reasoning` (0.33.0; `reasoning_content` before)."""
        from sparkforge.boundary import parse_json
        from sparkforge.errors import InputError

        try:
            doc = parse_json(text, "the chat completion")  # the served model's answer: untrusted
            choice = doc["choices"][0]
            message = choice["message"]
        except (InputError, KeyError, IndexError, TypeError, AttributeError):
            raise RunError(f"the chat completion did not return an OpenAI reply: {text[:400]}") from None
        reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        usage = {k: int(v) for k, v in (doc.get("usage") or {}).items() if isinstance(v, int)}
        return cls(
            str(reasoning), str(message.get("content") or ""), str(choice.get("finish_reason") or ""), usage
        )


def check_architecture(
    session: Session, engine: NodeEngine, profile: Profile, options: LaunchOptions
) -> None:
    """Refuse a model class the image's vLLM does not register, before any container serves or downloads."""
    argv = architecture_argv(profile, options)
    if argv is None:
        return
    arch = argv[-1]
    result = engine.runner.capture(
        engine.command(*argv),
        "architecture",
        check=False,
        timeout=300,
    )
    if result.returncode == 3:
        count = re.search(r"registered=(\d+)", result.output)
        raise RunError(
            f"profile {profile.name}: {options.image}'s vLLM has no model class {arch} (it registers "
            f"{count.group(1) if count else 'other'} others); nothing was downloaded or started; fix: use a "
            "recipe whose vLLM supports it (preflight lists the recipe's models.architectures)"
        )
    if result.returncode != 0:
        raise RunError(f"cannot read the model registry of {options.image}: {result.output.strip()[-400:]}")
    session.echo(f"model class {arch}: registered in the image's vLLM")


def ask(session: Session, engine: NodeEngine, container: str, port: int, profile: Profile) -> ChatReply:
    """One chat completion from inside the head container; fails on an empty or failed answer or a miss."""
    check = profile.model.check
    prompt = check.prompt if check else CHAT_PROMPT
    max_tokens, ignore_eos = (check.max_tokens, check.ignore_eos) if check else (2048, False)
    name = profile.model.served_model_name or profile.model.model
    output = engine.call(
        "chat",
        "exec",
        container,
        "python3",
        "-c",
        _CHAT,
        str(port),
        name,
        prompt,
        str(max_tokens),
        "1" if ignore_eos else "0",
        timeout=900,
    )
    reply = ChatReply.parse(output.strip().splitlines()[-1])
    session.echo(f"reasoning ({len(reply.reasoning)} chars): {reply.reasoning[:300]}")
    session.echo(f"answer: {reply.answer.strip()[:300]}")
    session.echo(
        f"finish reason: {reply.finish_reason or '?'}; usage: prompt {reply.usage.get('prompt_tokens', '?')}, "
        f"completion {reply.usage.get('completion_tokens', '?')} tokens"
    )
    if profile.model.args.get("reasoning-parser") and not reply.reasoning:
        session.echo(
            "warning: the profile names a reasoning parser but the reply carries no separate reasoning"
        )
    if not reply.answer.strip():
        raise RunError(
            f"profile {profile.name}: the model answered nothing to {prompt!r} (finish reason "
            f"{reply.finish_reason or 'unknown'}); fix: read 'invoke cluster.logs' (a broken or stale model can "
            "pass the health check)"
        )
    if check and not expect_pattern(check.expect).search(reply.answer):
        raise RunError(
            f"profile {profile.name}: the answer to {check.prompt!r} does not match {check.expect!r}: "
            f"{reply.answer.strip()[:200]!r}; fix: check the model and its weights (health was green)"
        )
    return reply


@dataclass(frozen=True)
class ServeOptions:
    """How `serve_up` starts a profile: the launch (image, ports, mounts), the health wait, the answer check."""

    launch: LaunchOptions
    health_timeout_s: float = 1800
    chat: bool = True  # ask once after health (the answer check)
    down_on_fail: bool = False  # a wrong answer removes the (healthy) deployment
    containers: ContainerPlan | None = None  # as the launch plan decided them (None: planned from `launch`)


def serve_up(
    session: Session, engine: NodeEngine, profile: Profile, options: ServeOptions
) -> tuple[ContainerPlan, ChatReply | None]:
    """Start the profile on this node (its pin and opt-ins checked by the launch plan, sparkforge/run/launchplan.py),
    wait for health, ask once; a failed start is removed, a failed answer leaves the healthy deployment running (to
    inspect it) unless `down_on_fail`."""
    if profile.model.nodes != 1:
        raise RunError(
            f"profile {profile.name} needs {profile.model.nodes} nodes; fix: 'invoke cluster.up --profile {profile.name} --nodes A,B'"
        )
    launch = options.launch
    plan = options.containers or plan_launch(profile, ["127.0.0.1"], [{}], launch)
    check_architecture(session, engine, profile, launch)
    fetch_weights(session, [engine], profile, launch)
    launch_plan(session, [engine], plan, health_timeout_s=options.health_timeout_s, dry=False)
    if not options.chat:
        return plan, None
    try:
        reply = ask(session, engine, plan.head.container.name, launch.port, profile)
    except RunError:
        keep_or_remove(session, [engine], plan.profile, options.down_on_fail)
        raise
    return plan, reply


def keep_or_remove(session: Session, engines: list[NodeEngine], profile: str, down_on_fail: bool) -> None:
    """After a failed answer check: the deployment is healthy, so it stays unless --down-on-fail."""
    if down_on_fail:
        removed = cluster_down(engines, profile)
        session.echo(f"removed {sum(removed.values())} container(s) after the failed answer (--down-on-fail)")
    else:
        session.echo(
            f"the deployment stays up (healthy, answering wrong): inspect it, then 'invoke serve.down --profile {profile}' (or cluster.down); --down-on-fail removes it"
        )


def serve_down(engine: NodeEngine, profile: str | None = None) -> int:
    return sum(cluster_down([engine], profile).values())
