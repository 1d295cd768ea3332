"""A small client of vLLM's OpenAI server (HTTP from this machine, or from inside the head container of a
multi-node deployment, whose address only its cluster link may reach): completions with token ids, streaming,
/v1/models, /version, /tokenize and the Prometheus counters of /metrics.

The server is vLLM's own; nothing here interprets answers (the checks do). Every request has a timeout; a
refused or failed request is a RunError naming the URL and vLLM's own message.
"""

from __future__ import annotations

import io
import json
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sparkforge.errors import RunError
from sparkforge.run.nodes import NodeEngine


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)


def check_url(url: str) -> str:
    """An http(s) base URL of an OpenAI server, normalized to end without '/v1' or '/'."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RunError(
            f"--attach {url!r} is not an http(s) URL; nothing was started or stopped; fix: pass the served "
            "profile's base URL, e.g. --attach http://127.0.0.1:8000"
        )
    return url.rstrip("/").removesuffix("/v1")


class OpenAIClient:
    def __init__(self, base_url: str, model: str = "", timeout_s: float = 1800) -> None:
        self.base = check_url(base_url)
        self.model = model
        self.timeout_s = timeout_s

    def _open(self, path: str, body: dict[str, Any] | None = None, timeout: float | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base}{path}", data, {"Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(request, timeout=timeout or self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:600]
            raise RunError(f"{self.base}{path} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RunError(
                f"{self.base}{path} does not answer ({exc}); fix: check that the server is up"
            ) from None

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        with self._open(path, timeout=timeout) as reply:
            return json.loads(reply.read().decode())

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        with self._open(path, body) as reply:
            return json.loads(reply.read().decode())

    def models(self, timeout: float | None = None) -> list[str]:
        return [str(m.get("id")) for m in self.get_json("/v1/models", timeout).get("data", [])]

    def version(self) -> str:
        try:
            return str(self.get_json("/version").get("version", ""))
        except RunError:
            return ""

    def tokenize(self, text: str) -> list[int]:
        return list(self.post_json("/tokenize", {"model": self.model, "prompt": text}).get("tokens", []))

    def metrics(self) -> str:
        with self._open("/metrics") as reply:
            return reply.read().decode()

    def complete(self, prompt: str, max_tokens: int, **extra: Any) -> Completion:
        """One /v1/completions request with vLLM's `return_token_ids`; `stream=True` joins the deltas."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "return_token_ids": True,
            **extra,
        }
        body.setdefault("temperature", 0.0)
        if not body.get("stream"):
            doc = self.post_json("/v1/completions", body)
            choice = doc["choices"][0]
            usage = {k: int(v) for k, v in (doc.get("usage") or {}).items() if isinstance(v, int)}
            return Completion(tuple(choice.get("token_ids") or ()), str(choice.get("text") or ""),
                              str(choice.get("finish_reason") or ""), usage)  # fmt: skip
        ids: list[int] = []
        text, finish = [], ""
        with self._open("/v1/completions", body) as reply:
            for raw in reply:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[5:]).get("choices", []):
                    ids += choice.get("token_ids") or []
                    text.append(choice.get("text") or "")
                    finish = choice.get("finish_reason") or finish
        return Completion(tuple(ids), "".join(text), str(finish))

    def complete_many(
        self, prompts: Sequence[str], max_tokens: int, workers: int, **extra: Any
    ) -> list[Completion]:
        """The prompts sent at once, `workers` in flight (vLLM batches them)."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda p: self.complete(p, max_tokens, **extra), prompts))


# One request from inside the head container (its python3, the stdlib only): one marked line of JSON back.
_REQUEST = """
import json, sys, urllib.error, urllib.request
url, body, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
request = urllib.request.Request(url, body.encode() if body else None, {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        status, data = reply.status, reply.read()
except urllib.error.HTTPError as exc:
    status, data = exc.code, exc.read()
except OSError as exc:
    status, data = 0, str(exc).encode()
print("SPARKFORGE-HTTP " + json.dumps({"status": status, "body": data.decode(errors="replace")}))
"""


class HeadExecClient(OpenAIClient):
    """The same client, each request made by the head container's python3 (`docker exec` through the engine
    seam): a multi-node head listens on its cluster-link address, which this machine may not reach."""

    def __init__(
        self, engine: NodeEngine, container: str, port: int, model: str = "", timeout_s: float = 1800
    ):
        super().__init__(f"http://127.0.0.1:{port}", model, timeout_s)
        self.engine, self.container = engine, container

    def _open(self, path: str, body: dict[str, Any] | None = None, timeout: float | None = None):
        wait = timeout or self.timeout_s
        url = f"{self.base}{path}"
        output = self.engine.call(
            "conform-request", "exec", self.container, "python3", "-c", _REQUEST, url,
            json.dumps(body) if body is not None else "", str(wait), timeout=wait + 30,
        )  # fmt: skip
        line = next((x for x in output.splitlines() if x.startswith("SPARKFORGE-HTTP ")), "")
        if not line:
            raise RunError(
                f"{url} in {self.container} on {self.engine.node.label}: no answer ({output[-400:]}); fix: check "
                f"that the container runs ('invoke cluster.logs') and has python3"
            )
        reply = json.loads(line.removeprefix("SPARKFORGE-HTTP "))
        where = f"{url} (from inside {self.container} on {self.engine.node.label})"
        if reply["status"] == 0:
            raise RunError(
                f"{where} does not answer ({reply['body'][:300]}); fix: check that the server is up"
            )
        if reply["status"] >= 400:
            raise RunError(f"{where} answered HTTP {reply['status']}: {reply['body'][:600]}")
        return io.BytesIO(reply["body"].encode())


def counter(metrics: str, name: str) -> float:
    """The sum of a Prometheus counter over its label sets (vLLM exports `<name>_total`)."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$")
    for line in metrics.splitlines():
        match = pattern.match(line)
        if match:
            total += float(match.group(1))
    return total
