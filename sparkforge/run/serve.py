"""`serve` / `serve.down`: one node, one container, the way GB10 needs it; health, then one chat completion.

The chat completion asks a question whose answer needs thinking: with the profile's reasoning parser the
reply carries the reasoning and the answer in separate fields, which is what is checked and shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkforge.console import Echo
from sparkforge.errors import RunError
from sparkforge.recipe.profile import Profile
from sparkforge.run.cluster import cluster_down, launch_plan
from sparkforge.run.launch import LaunchOptions, LaunchPlan, plan_launch
from sparkforge.run.nodes import NodeEngine
from sparkforge.run.weights import fetch_weights

CHAT_PROMPT = "What is 17 * 23? Answer with the number only."
# Runs inside the head container (the API listens there whatever the host's firewall says).
_CHAT = """
import json, sys, urllib.request
body = json.dumps({"model": sys.argv[2], "messages": [{"role": "user", "content": sys.argv[3]}], "max_tokens": 2048}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions", body, {"Content-Type": "application/json"})
print(urllib.request.urlopen(req, timeout=600).read().decode())
"""


@dataclass(frozen=True)
class ChatReply:
    reasoning: str
    answer: str

    @classmethod
    def parse(cls, text: str) -> ChatReply:
        """vLLM's OpenAI reply; the reasoning parser's part is `reasoning` (0.33.0; `reasoning_content` before)."""
        try:
            message = json.loads(text)["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise RunError(f"the chat completion did not return an OpenAI reply: {text[:400]}") from None
        reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        return cls(str(reasoning), str(message.get("content") or ""))


def serve_up(
    engine: NodeEngine,
    profile: Profile,
    options: LaunchOptions,
    *,
    echo: Echo,
    health_timeout_s: float = 1800,
    chat: bool = True,
    dry: bool = False,
) -> tuple[LaunchPlan, ChatReply | None]:
    """Start the profile on this node, wait for health, ask once; on failure everything is removed."""
    if profile.model.nodes != 1:
        raise RunError(
            f"profile {profile.name} needs {profile.model.nodes} nodes; fix: 'invoke cluster.up --profile {profile.name} --nodes A,B'"
        )
    plan = plan_launch(profile, ["127.0.0.1"], [{}], options)
    fetch_weights([engine], profile, options, echo=echo, dry=dry)
    launch_plan([engine], plan, echo=echo, health_timeout_s=health_timeout_s, dry=dry)
    if dry or not chat:
        return plan, None
    name = profile.model.served_model_name or profile.model.model
    output = engine.call(
        "chat",
        "exec",
        plan.head.container.name,
        "python3",
        "-c",
        _CHAT,
        str(options.port),
        name,
        CHAT_PROMPT,
        timeout=900,
    )
    reply = ChatReply.parse(output.strip().splitlines()[-1])
    echo(f"reasoning ({len(reply.reasoning)} chars): {reply.reasoning[:300]}")
    echo(f"answer: {reply.answer.strip()[:300]}")
    if profile.model.args.get("reasoning-parser") and not reply.reasoning:
        echo("warning: the profile names a reasoning parser but the reply carries no separate reasoning")
    return plan, reply


def serve_down(engine: NodeEngine, profile: str | None = None) -> int:
    return sum(cluster_down([engine], profile).values())
