"""The one URL fetcher: every HTTP(S) body sparkforge reads from the network comes through `fetch_url`.

Rules (docs/inputs.md, "URLs"): http/https only, no user:password, a port in 1..65535; redirects followed by
hand: never from https to http, never to another host unless the caller allows it (or it is a subdomain of the
first URL's site); a total deadline over connect, redirects and the whole body (a server that drips its body
is cut off at the deadline, not after one timeout per read); the byte cap applied while reading (and to a
declared Content-Length before reading); gzip/deflate decoded by hand with a cap on the decoded bytes.

`request_url` is the one HTTP seam for every method (the registry client's HEAD, POST, PUT and PATCH too):
the same deadline and caps, a redirect policy chosen per call ("site", "any" host for a body checked by its
digest, or "none"), the answer's content type checked against the caller's list, an error answer read to its
first bytes only, and `location_of` for a Location header (never to http from https, never to another host).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.util.retry import Retry

from sparkforge.errors import InputError

_CHUNK = 1 << 16
MAX_REDIRECTS = 5
# Redirects a site makes to its own download hosts (GitHub archives, Hugging Face files); any other host
# needs the caller's `allow_hosts`.
SITE_CDNS = {
    "github.com": ("githubusercontent.com",),
    "huggingface.co": ("hf.co",),
}


class FetchError(InputError):
    """A URL was refused, or its answer broke a rule of the fetcher (deadline, size, redirect)."""


class Unreachable(FetchError):
    """The server could not be reached or did not answer within the deadline (retrying may help)."""


@dataclass(frozen=True)
class Fetched:
    """What a URL answered: final URL, status, headers and the (decoded, capped) body."""

    url: str
    status_code: int
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes = b""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
REDIRECTS = ("site", "any", "none")
ANY_STATUS = range(100, 600)  # the caller reads every status itself (a registry's 202, 404, 401)
# The HTTP session type and the connection error the Docker SDK raises, named here so that no module outside
# the boundary imports requests.
HttpSession = requests.Session
ConnectionFailure = requests.exceptions.ConnectionError


def direct_session() -> requests.Session:
    """A session for servers asked directly (a served model on this machine or its cluster link): no proxy from
    the environment, no .netrc credentials."""
    session = requests.Session()
    session.trust_env = False
    return session


def proxied_session() -> requests.Session:
    """A session for public services reached the machine's own way: proxies and CA bundles from the environment
    (PyPI's JSON API behind a TLS-intercepting proxy)."""
    return requests.Session()


class _CaSession(requests.Session):
    """A Session whose own `verify` (the chosen CA bundle) wins over REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE.

    requests puts those variables over `session.verify` for every request that passes no `verify` of its own
    (Session.merge_environment_settings, with trust_env), so a bundle set on the session was silently replaced;
    trust_env stays on for the proxy variables (builds reach PyPI through a TLS proxy)."""

    def merge_environment_settings(
        self, url: str, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> dict[str, Any]:
        if verify is None and self.verify is not True:
            verify = self.verify
        return super().merge_environment_settings(url, proxies, stream, verify, cert)


def retrying_session(retries: int, ca_bundle: str | None, user_agent: str) -> requests.Session:
    """A proxied session that retries GET/HEAD on 429/5xx (`retries` in all) and trusts `ca_bundle` if given."""
    retry = Retry(
        total=retries,
        connect=1,  # an unreachable host (no DNS, firewall) should fail fast, not after backoffs
        read=1,  # a read timeout retried once: the fetcher's total deadline bounds the rest
        backoff_factor=0.5,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=frozenset({"GET", "HEAD"}),
        raise_on_status=False,
    )
    session = _CaSession()
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.headers["User-Agent"] = user_agent
    if ca_bundle:
        session.verify = ca_bundle
    return session


def check_url(url: str, what: str) -> tuple[str, str, int]:
    """`url`'s (scheme, host, port), or a FetchError naming `what`: http(s) only, a host, no credentials, no
    whitespace or control character, a port in 1..65535 (Python would wrap none, but 99999 must not pass)."""
    if not isinstance(url, str) or not url or len(url) > 4096 or any(c <= " " or c == "\x7f" for c in url):
        raise FetchError(
            f"{what}: {str(url)[:80]!r} is not a URL (empty, too long or holds a space or control "
            "character); fix: give an https:// URL"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise FetchError(
            f"{what}: {url[:200]}: {exc}; fix: give a port in 1..65535 and a valid host"
        ) from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise FetchError(f"{what}: {url[:200]} is not an http(s) URL with a host; fix: give an https:// URL")
    if parts.username is not None or parts.password is not None:
        raise FetchError(f"{what}: {url[:200]}: holds a user or password; fix: remove them from the URL")
    if port is not None and not 1 <= port <= 65535:
        raise FetchError(f"{what}: {url[:200]}: port {port} is outside 1..65535; fix: give a valid port")
    host = parts.hostname.lower()
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise FetchError(
                f"{what}: {url[:200]}: {host!r} is not an IPv6 address; fix: check the host"
            ) from None
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def _site(host: str) -> str:
    labels = host.split(".")
    return host if len(labels) < 2 or host.replace(".", "").isdigit() else ".".join(labels[-2:])


def redirect_allowed(start: str, target: str, allow_hosts: tuple[str, ...] = ()) -> str:
    """Why following `start` -> `target` is refused ("" when allowed)."""
    s_scheme, s_host, _ = check_url(start, "redirect")
    t_scheme, t_host, _ = check_url(target, "redirect")
    if s_scheme == "https" and t_scheme != "https":
        return "from https to http"
    site = _site(s_host)
    sites = (site, *SITE_CDNS.get(site, ()))
    if t_host == s_host or any(t_host == h or t_host.endswith("." + h) for h in allow_hosts):
        return ""
    if any(t_host == s or t_host.endswith("." + s) for s in sites):
        return ""
    return f"to another host ({t_host})"


def location_of(answer: Fetched, what: str) -> str:
    """The absolute URL an answer's Location header names (an upload's next step), or a FetchError: resolved
    against the answer's URL, a URL the fetcher accepts, never from https to http nor to another host (the
    request that follows carries the same credentials)."""
    header = answer.headers.get("Location") or answer.headers.get("location") or ""
    if not header:
        raise FetchError(f"{what}: {answer.url[:200]} answered HTTP {answer.status_code} without a Location")
    target = urljoin(answer.url, header)
    s_scheme, s_host, s_port = check_url(answer.url, what)
    t_scheme, t_host, t_port = check_url(target, what)
    if s_scheme == "https" and t_scheme != "https":
        raise FetchError(
            f"{what}: {answer.url[:200]} points from https to http ({target[:200]}); not followed"
        )
    if (t_host, t_port) != (s_host, s_port):
        raise FetchError(
            f"{what}: {answer.url[:200]} points to another host ({target[:200]}); not followed: the "
            "next request would carry this host's credentials"
        )
    return target


class _Decoder:
    """Content-Encoding decoded by hand, at most `cap` bytes out (a gzip bomb stops at the cap)."""

    def __init__(self, encoding: str, cap: int, where: str) -> None:
        encoding = encoding.strip().lower()
        if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
            raise FetchError(f"{where}: answered in {encoding!r} encoding; fix: serve it plain or gzip")
        self._z = None if encoding in ("", "identity") else zlib.decompressobj(47)
        self._cap, self._out, self._where = cap, 0, where

    def feed(self, raw: bytes) -> bytes:
        if self._z is None:
            data = raw
        else:
            try:
                data = self._z.decompress(raw, self._cap - self._out + 1)
            except zlib.error as exc:
                raise FetchError(
                    f"{self._where}: a broken compressed body ({exc}); fix: check the server"
                ) from None
        self._out += len(data)
        if self._out > self._cap:
            raise FetchError(
                f"{self._where}: decodes to more than {self._cap} bytes; fix: check the URL is the "
                "file meant (a compressed bomb stops here)"
            )
        return data


@dataclass(frozen=True)
class Policy:
    """What a request may get: at most `max_bytes` in `deadline` seconds (in all); redirects "site" (the first
    URL's host, its site and `allow_hosts`), "any" (any host, never to http: a body its reader checks by
    digest; credentials are dropped at a host change) or "none" (a redirect is the answer); the statuses the
    caller reads itself (`ok_status`); the content types a 2xx body may have (`content_types`, when given); an
    accepted error answer read to its first `error_head` bytes when set (a 1 GiB error body is never read whole)."""

    max_bytes: int
    deadline: float
    allow_hosts: tuple[str, ...] = ()
    redirects: str = "site"
    ok_status: Collection[int] = ()
    content_types: tuple[str, ...] = ()
    error_head: int = 0


def fetch_url(
    session: requests.Session,
    url: str,
    *,
    what: str,
    max_bytes: int,
    deadline: float,
    headers: Mapping[str, str] | None = None,
    allow_hosts: tuple[str, ...] = (),
    sink: Callable[[bytes], Any] | None = None,
    ok_status: Collection[int] = (),
    body: bytes | None = None,
) -> Fetched:
    """GET `url` (POST `body` when given) under the fetcher's rules; the answer's body (at most `max_bytes`, raw
    and decoded) is returned, or handed chunk by chunk to `sink`. An error status is a FetchError unless in
    `ok_status`; a network failure or the deadline (seconds, in all) is a FetchError naming `what` and the URL."""
    return request_url(
        session,
        "POST" if body is not None else "GET",
        url,
        what=what,
        policy=Policy(max_bytes, deadline, allow_hosts, ok_status=ok_status),
        headers=headers,
        sink=sink,
        body=body,
    )


def request_url(
    session: requests.Session,
    method: str,
    url: str,
    *,
    what: str,
    policy: Policy,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    sink: Callable[[bytes], Any] | None = None,
) -> Fetched:
    """`method` on `url` (sending `body`) under the fetcher's rules and `policy` (Policy: caps, deadline,
    redirects, statuses, content types); the answer, or a FetchError naming `what` and the URL."""
    if method not in METHODS or policy.redirects not in REDIRECTS:
        raise ValueError(
            f"request_url: method {method!r} or redirect policy {policy.redirects!r} is not known"
        )
    deadline, ok_status = policy.deadline, policy.ok_status
    end = time.monotonic() + deadline
    current, sent = url, {"Accept-Encoding": "gzip, identity", **(headers or {})}
    check_url(url, what)
    for _ in range(MAX_REDIRECTS + 1):
        left = end - time.monotonic()
        if left <= 0:
            raise Unreachable(
                f"{what}: {url[:200]} took longer than {deadline:g} s; fix: check the server or network"
            )
        try:
            response = session.request(
                method,
                current,
                data=body,
                headers=sent,
                stream=True,
                allow_redirects=False,
                timeout=(min(10.0, left), max(0.1, left / 2)),
            )
        except requests.RequestException as exc:
            text = str(exc)[:300]
            raise Unreachable(
                f"cannot fetch {what} from {current[:200]}: {text}; fix: check the network or "
                "proxy, or use a mirror"
            ) from None
        if response.is_redirect and policy.redirects != "none":
            target = urljoin(current, response.headers.get("Location", ""))
            if response.raw is not None:
                response.close()
            why = (
                redirect_allowed(current, target, policy.allow_hosts)
                if policy.redirects == "site"
                else ("from https to http" if _downgrades(current, target) else "")
            )
            if why:
                raise FetchError(
                    f"{what}: {current[:200]} redirects {why}: {target[:200]}; fix: fetch the final "
                    "URL yourself if you trust it"
                )
            if urlsplit(target).hostname != urlsplit(current).hostname:
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
            current = target
            continue
        if method == "HEAD":
            response.close()
            if response.status_code >= 400 and response.status_code not in ok_status:
                raise FetchError(f"{what}: {current[:200]} answered HTTP {response.status_code}")
            return Fetched(current, response.status_code, CaseInsensitiveDict(response.headers))
        if policy.error_head and response.status_code >= 400 and response.status_code in ok_status:
            head = _head(response, policy.error_head)
            return Fetched(current, response.status_code, CaseInsensitiveDict(response.headers), head)
        if policy.content_types and 200 <= response.status_code < 300:
            _check_type(response, current, what, policy.content_types)
        return _read_body(response, current, what, policy, end, sink)
    raise FetchError(
        f"{what}: {url[:200]} redirects more than {MAX_REDIRECTS} times; fix: give the final URL"
    )


def _downgrades(start: str, target: str) -> bool:
    return check_url(start, "redirect")[0] == "https" and check_url(target, "redirect")[0] != "https"


def _head(response: requests.Response, limit: int) -> bytes:
    """The first `limit` bytes of an answer (decoded), the rest never read."""
    try:
        return response.raw.read(limit, decode_content=True) if response.raw is not None else b""
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError, ValueError):
        return b""
    finally:
        response.close()


def _check_type(response: requests.Response, url: str, what: str, allowed: tuple[str, ...]) -> None:
    media = response.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if media not in allowed:
        response.close()
        raise FetchError(
            f"{what} ({url[:200]}): answered content type {media[:100]!r}, not one of {', '.join(allowed)}; "
            "fix: check the URL is the document meant"
        )


def _socket_of(response: requests.Response) -> socket.socket | None:
    """The connection's socket under requests/urllib3/http.client (None if the layers change shape)."""
    fp = getattr(getattr(response.raw, "_fp", None), "fp", None)
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _read_body(
    response: requests.Response,
    url: str,
    what: str,
    policy: Policy,
    end: float,
    sink: Callable[[bytes], Any] | None,
) -> Fetched:
    where = f"{what} ({url[:200]})"
    max_bytes, deadline, ok_status = policy.max_bytes, policy.deadline, policy.ok_status
    expired = threading.Event()

    def cut() -> None:  # the total deadline: a body that drips is cut off, whatever each read's timeout
        expired.set()
        sock = _socket_of(response)
        if sock is not None:
            with contextlib.suppress(OSError):  # wakes the read blocked in another thread (close() does not)
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(0.0, end - time.monotonic()), cut)
    timer.daemon = True
    timer.start()
    try:
        if response.status_code >= 400 and response.status_code not in ok_status:
            raise FetchError(
                f"cannot fetch {what}: {url[:200]} answered HTTP {response.status_code}; fix: check "
                "the pin (version, commit) exists there, or use a mirror"
            )
        declared = response.headers.get("Content-Length", "")
        if declared.isascii() and declared.isdigit() and len(declared) < 20 and int(declared) > max_bytes:
            raise FetchError(f"{where}: declares {declared} bytes, more than {max_bytes}; fix: check the URL")
        decoder = _Decoder(response.headers.get("Content-Encoding", ""), max_bytes, where)
        chunks: list[bytes] = []
        raw_total = 0
        # A transport adapter that answered from memory (no raw stream) hands over its body whole.
        stream = (
            response.raw.stream(_CHUNK, decode_content=False)
            if response.raw is not None
            else [response.content]
        )
        for raw in stream:
            raw_total += len(raw)
            if raw_total > max_bytes:
                raise FetchError(
                    f"{where}: more than {max_bytes} bytes; fix: check the URL is the file meant"
                )
            data = decoder.feed(raw)
            if sink is not None:
                sink(data)
            else:
                chunks.append(data)
            if expired.is_set():
                break
    except (
        requests.RequestException,
        urllib3.exceptions.HTTPError,
        OSError,
        AttributeError,
        ValueError,
    ) as exc:
        if not expired.is_set():
            raise Unreachable(
                f"cannot read {where}: {str(exc)[:300]}; fix: check the network or server"
            ) from None
    finally:
        timer.cancel()
        if response.raw is not None:
            response.close()
    if expired.is_set():
        raise Unreachable(f"{where}: not finished within {deadline:g} s; fix: check the server or network")
    return Fetched(url, response.status_code, CaseInsensitiveDict(response.headers), b"".join(chunks))
