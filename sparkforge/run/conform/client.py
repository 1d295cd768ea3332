"""A small client of vLLM's OpenAI server (HTTP from this machine, or from inside the head container of a
multi-node deployment, whose address only its cluster link may reach): completions with token ids, streaming,
/v1/models, /version, /tokenize and the Prometheus counters of /metrics. With `logprobs=K` a completion carries
each position's top-K {token id: logprob} (vLLM's `return_tokens_as_token_ids` names them by id, not by text).

The server is vLLM's own; nothing here interprets answers (the checks do). Every request has a timeout; a
refused or failed request is a RunError naming the URL and vLLM's own message.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkforge.boundary import parse_json
from sparkforge.errors import InputError, RunError
from sparkforge.run.nodes import NodeEngine
from sparkforge.urlfetch import FetchError, Unreachable, direct_session, fetch_url
from sparkforge.urlfetch import check_url as check_fetch_url

MAX_ANSWER_BYTES = 64 << 20  # a completion of the longest decode conform asks for, streamed, is a few MiB
_ERRORS = tuple(range(400, 600))  # an error status is vLLM's answer: its message goes into the RunError


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    top: tuple[dict[int, float], ...] = ()  # per position: the top-K logprobs, when they were asked for


def check_url(url: str) -> str:
    """An http(s) base URL of an OpenAI server, normalized to end without '/v1' or '/' (the fetcher's URL rules:
    no CR/LF or space, a valid host and IPv6 literal, a port in 1..65535, no user or password)."""
    try:
        check_fetch_url(url, "--attach")
    except FetchError as exc:
        raise RunError(
            f"{str(exc).rpartition('; fix:')[0]}; nothing was started or stopped; fix: pass the served "
            "profile's base URL, e.g. --attach http://127.0.0.1:8000"
        ) from None
    if "?" in url or "#" in url:
        raise RunError(
            f"--attach {url[:200]}: a base URL has no query or fragment; fix: e.g. http://127.0.0.1:8000"
        )
    return url.rstrip("/").removesuffix("/v1")


def _object(doc: Any, where: str, *keys: str) -> dict[str, Any]:
    """An answer that must be a JSON object with `keys` (an HTML page, [] or {} is named, never a KeyError)."""
    if not isinstance(doc, dict) or any(k not in doc for k in keys):
        shape = type(doc).__name__ if not isinstance(doc, dict) else f"an object without {', '.join(keys)}"
        raise RunError(
            f"{where}: answered {shape}, not the OpenAI API's answer; fix: --attach the vLLM server"
        )
    return doc


class OpenAIClient:
    def __init__(self, base_url: str, model: str = "", timeout_s: float = 1800) -> None:
        self.base = check_url(base_url)
        self.model = model
        self.timeout_s = timeout_s
        self._session = direct_session()  # a served model is asked directly, never through a proxy

    def _open(
        self, path: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> io.BytesIO:
        """One request through the one fetcher: a total deadline, a size cap; an error status is a RunError."""
        url = f"{self.base}{path}"
        data = json.dumps(body).encode() if body is not None else None
        try:
            answer = fetch_url(
                self._session,
                url,
                what=url,
                max_bytes=MAX_ANSWER_BYTES,
                body=data,
                deadline=timeout or self.timeout_s,
                ok_status=_ERRORS,
                headers={"Content-Type": "application/json"},
            )
        except Unreachable as exc:
            raise RunError(
                f"{url} does not answer ({str(exc)[:300]}); fix: check that the server is up"
            ) from None
        except FetchError as exc:
            raise RunError(str(exc)) from None
        if answer.status_code >= 400:
            raise RunError(f"{url} answered HTTP {answer.status_code}: {answer.text[:600]!r}")
        return io.BytesIO(answer.content)

    def _json(self, reply: io.BytesIO, path: str) -> Any:
        try:
            return parse_json(reply.read().decode("utf-8", "replace"), f"{self.base}{path}")
        except InputError as exc:
            raise RunError(str(exc).rpartition("; fix:")[0] + "; fix: --attach the vLLM server") from None

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        with self._open(path, timeout=timeout) as reply:
            return _object(self._json(reply, path), f"{self.base}{path}")

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        with self._open(path, body) as reply:
            return _object(self._json(reply, path), f"{self.base}{path}")

    def models(self, timeout: float | None = None) -> list[str]:
        data = _object(self.get_json("/v1/models", timeout), f"{self.base}/v1/models", "data")["data"]
        if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
            raise RunError(
                f"{self.base}/v1/models: 'data' is not a list of models; fix: --attach the vLLM server"
            )
        return [str(m.get("id")) for m in data]

    def version(self) -> str:
        try:
            return str(self.get_json("/version").get("version", ""))[:100]
        except RunError:
            return ""

    def tokenize(self, text: str) -> list[int]:
        tokens = self.post_json("/tokenize", {"model": self.model, "prompt": text}).get("tokens", [])
        return _ids(tokens, f"{self.base}/tokenize")

    def metrics(self, timeout: float | None = None) -> str:
        with self._open("/metrics", timeout=timeout) as reply:
            return reply.read().decode("utf-8", "replace")

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
        if body.get("logprobs"):
            body["return_tokens_as_token_ids"] = True
        where = f"{self.base}/v1/completions"
        if not body.get("stream"):
            doc = self.post_json("/v1/completions", body)
            choice = _choices(doc, where)[0]
            usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
            usage = {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
            return Completion(
                tuple(_ids(choice.get("token_ids") or [], where)),
                str(choice.get("text") or ""),
                str(choice.get("finish_reason") or ""),
                usage,
                tuple(_top(choice, where)),
            )
        ids: list[int] = []
        top: list[dict[int, float]] = []
        text, finish = [], ""
        with self._open("/v1/completions", body) as reply:
            for raw in reply:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                try:
                    event = parse_json(line[5:], where)
                except InputError as exc:
                    raise RunError(
                        str(exc).rpartition("; fix:")[0] + "; fix: --attach the vLLM server"
                    ) from None
                for choice in _choices(event, where, allow_empty=True):
                    ids += _ids(choice.get("token_ids") or [], where)
                    top += _top(choice, where)
                    text.append(str(choice.get("text") or ""))
                    finish = str(choice.get("finish_reason") or finish)
        return Completion(tuple(ids), "".join(text), str(finish), top=tuple(top))

    def complete_many(
        self, prompts: Sequence[str], max_tokens: int, workers: int, **extra: Any
    ) -> list[Completion]:
        """The prompts sent at once, `workers` in flight (vLLM batches them)."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda p: self.complete(p, max_tokens, **extra), prompts))


def _choices(doc: Any, where: str, *, allow_empty: bool = False) -> list[dict[str, Any]]:
    choices = _object(doc, where, "choices")["choices"]
    if (
        not isinstance(choices, list)
        or not all(isinstance(c, dict) for c in choices)
        or not (choices or allow_empty)
    ):
        raise RunError(f"{where}: 'choices' is not a list of choices; fix: --attach the vLLM server")
    return choices


def _ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise RunError(f"{where}: token ids are not a list of whole numbers; fix: --attach the vLLM server")
    return value


def _top(choice: dict[str, Any], where: str) -> list[dict[int, float]]:
    """A choice's `logprobs.top_logprobs` as {token id: logprob} per position ([] when none were asked)."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return []
    tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(tops, list):
        raise RunError(f"{where}: 'logprobs' without a top_logprobs list; fix: --attach the vLLM server")
    out = []
    for entry in tops:
        if entry is None:  # vLLM gives none for a position it has no logprobs of
            out.append({})
            continue
        if not isinstance(entry, dict):
            raise RunError(f"{where}: a top_logprobs entry is not an object; fix: --attach the vLLM server")
        out.append({_token_key(k, where): float(v) for k, v in entry.items() if isinstance(v, int | float)})
    return out


def _token_key(key: str, where: str) -> int:
    """vLLM's `token_id:123` (return_tokens_as_token_ids) as 123."""
    number = key.removeprefix("token_id:")
    if not number.isdigit() or len(number) > 10:
        raise RunError(
            f"{where}: a top_logprobs key {key[:40]!r} is not 'token_id:N' (this vLLM ignores "
            "return_tokens_as_token_ids); fix: --attach a vLLM server that supports it"
        )
    return int(number)


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
            "conform-request",
            "exec",
            self.container,
            "python3",
            "-c",
            _REQUEST,
            url,
            json.dumps(body) if body is not None else "",
            str(wait),
            timeout=wait + 30,
        )
        line = next((x for x in output.splitlines() if x.startswith("SPARKFORGE-HTTP ")), "")
        if not line:
            raise RunError(
                f"{url} in {self.container} on {self.engine.node.label}: no answer ({output[-400:]}); fix: check "
                f"that the container runs ('invoke cluster.logs') and has python3"
            )
        try:
            reply = _object(parse_json(line.removeprefix("SPARKFORGE-HTTP "), url), url, "status", "body")
        except InputError as exc:
            raise RunError(str(exc)) from None
        where = f"{url} (from inside {self.container} on {self.engine.node.label})"
        if not isinstance(reply["status"], int) or not isinstance(reply["body"], str):
            raise RunError(f"{where}: a malformed answer; fix: check the container's python3")
        if reply["status"] == 0:
            raise RunError(
                f"{where} does not answer ({reply['body'][:300]}); fix: check that the server is up"
            )
        if reply["status"] >= 400:
            raise RunError(f"{where} answered HTTP {reply['status']}: {reply['body'][:600]}")
        return io.BytesIO(reply["body"].encode())


def counter(metrics: str, name: str) -> float:
    """The sum of a Prometheus counter over its label sets (vLLM exports `<name>_total`): run/prometheus.py's
    one reader (a series twice or an infinite counter refused)."""
    from sparkforge.run.prometheus import counter_total

    return counter_total(metrics, name)
