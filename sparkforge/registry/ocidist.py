"""A minimal OCI distribution client over HTTP: raw manifests and blobs by tag or digest, and small artifacts.

The TUF metadata (registry/tufstore.py) and the transparency-log times of cosign bundles are read through the
registry's own HTTP API, not the engine: the bytes a signature covers must be the bytes that were served.
Registries on this machine speak plain HTTP; others HTTPS. Credentials: anonymous (a bearer token from the
registry's challenge), or SPARKFORGE_REGISTRY_USER / SPARKFORGE_REGISTRY_PASSWORD (in CI: the actor and
GITHUB_TOKEN), never read from a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

from sparkforge.boundary import parse_json
from sparkforge.errors import InputError, PublishError
from sparkforge.oci import is_local_registry
from sparkforge.urlfetch import (
    ANY_STATUS,
    Fetched,
    FetchError,
    HttpSession,
    Policy,
    check_url,
    direct_session,
    fetch_url,
    location_of,
    proxied_session,
    request_url,
)

USER_ENV, PASSWORD_ENV = "SPARKFORGE_REGISTRY_USER", "SPARKFORGE_REGISTRY_PASSWORD"
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY_CONFIG = b"{}"
MAX_MANIFEST = 4 << 20  # distribution's own manifest limit
TIMEOUT_S = 30
MAX_TOKEN_ANSWER = 1 << 20  # a bearer token answer: a few KiB
ERROR_HEAD = 200  # an error answer is read to its first bytes: enough for the registry's own message
UPLOAD_CHUNK = (
    16 << 20
)  # a blob larger than this is uploaded in PATCH chunks (the distribution API's own way)
MANIFEST_MEDIA = tuple(t.strip() for t in MANIFEST_TYPES.split(","))
MAX_ANSWER = 64 << 10  # what an upload's answer may say (distribution's are empty; others a little JSON)
NO_BODY = Policy(MAX_ANSWER, TIMEOUT_S, redirects="none")  # uploads: a small answer read, nothing followed
HEAD_ANY = Policy(0, TIMEOUT_S, redirects="any")  # a blob's HEAD may be redirected to its storage host
MAX_UPLOAD = 1 << 30  # what one put_blob sends: trust metadata and attestations, never image layers


def printable(head: bytes) -> str:
    """An error answer's first bytes as one printable line (the seam read at most ERROR_HEAD of them)."""
    return "".join(c if c.isprintable() else " " for c in head.decode("utf-8", "replace"))


def token_from_realm(
    registry: Registry, params: dict[str, str], scope: str, credentials: tuple[str, str] | None
) -> str:
    """A bearer token from the realm a 401 named, through the one fetcher (a total deadline, a byte cap, its
    redirect rules). The registry's credentials go only to a realm on the registry's own host: a 401 that
    names another host gets an anonymous request, never the user and password."""
    import base64

    realm = params["realm"]
    try:
        scheme, host, _ = check_url(realm, f"the token service of {registry.repository}")
    except FetchError:
        return ""
    if scheme != "https" and not is_local_registry(registry.repository):
        return ""  # a token over plain HTTP only from a registry on this machine
    headers = {}
    if credentials and host == registry.host.split(":")[0].lower():
        pair = f"{credentials[0]}:{credentials[1]}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    query = urlencode({"service": params.get("service", ""), "scope": f"repository:{registry.name}:{scope}"})
    url = f"{realm}{'&' if '?' in realm else '?'}{query}"
    try:
        session = registry.session
        got = fetch_url(
            session,
            url,
            what="a registry token",
            max_bytes=MAX_TOKEN_ANSWER,
            deadline=TIMEOUT_S,
            headers=headers,
            ok_status=(401, 403),
        )
        answer = parse_json(got.text, "the registry's token answer")
    except (FetchError, PublishError, InputError):
        return ""
    if got.status_code != 200 or not isinstance(answer, dict):
        return ""
    token = answer.get("token") or answer.get("access_token") or ""
    return (
        token
        if isinstance(token, str) and token.isascii() and token.isprintable() and len(token) < 16384
        else ""
    )


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Registry:
    """One repository (`host/name`) of a registry, spoken to over the distribution API through the one HTTP seam
    (urlfetch.request_url: a total deadline per request, byte caps, manifests' content types checked, uploads'
    Location kept on the registry's host)."""

    repository: str
    session: HttpSession | None = field(default=None, repr=False)
    _token: str = field(default="", repr=False)
    _basic: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.session is None:  # a registry on this machine is asked directly, never through a proxy
            self.session = direct_session() if is_local_registry(self.repository) else proxied_session()

    @property
    def host(self) -> str:
        return self.repository.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.repository.split("/", 1)[1]

    @property
    def base(self) -> str:
        scheme = "http" if is_local_registry(self.repository) else "https"
        return f"{scheme}://{self.host}/v2/{self.name}"

    def _auth(self, answer: Fetched, scope: str) -> bool:
        """Answer a 401 challenge with a bearer token (anonymous, or the configured user); True when got."""
        import base64

        challenge = answer.headers.get("WWW-Authenticate", "")
        user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
        if challenge.lower().startswith("basic") and user:
            pair = f"{user}:{password or ''}".encode()
            self._basic = "Basic " + base64.b64encode(pair).decode()
            return True
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not challenge.lower().startswith("bearer") or "realm" not in params:
            return False
        self._token = token_from_realm(self, params, scope, (user, password or "") if user else None)
        return bool(self._token)

    def _request(
        self,
        method: str,
        url: str,
        scope: str = "pull",
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        policy: Policy = NO_BODY,
    ) -> Fetched:
        """One request through the seam under `policy` (the registry's deadline, every status back to the
        caller, error answers read to ERROR_HEAD bytes), answering one 401 challenge."""
        policy = replace(policy, deadline=TIMEOUT_S, ok_status=ANY_STATUS, error_head=ERROR_HEAD)
        for attempt in range(2):
            sent = dict(headers or {})
            if self._token or self._basic:
                sent["Authorization"] = f"Bearer {self._token}" if self._token else self._basic
            try:
                answer = request_url(
                    self.session,  # type: ignore[arg-type]
                    method,
                    url,
                    what=f"the registry of {self.repository}",
                    policy=policy,
                    headers=sent,
                    body=body,
                )
            except FetchError as exc:
                raise PublishError(f"{self.repository}: {exc}; fix: check the network, or log in") from None
            if answer.status_code != 401 or attempt or not self._auth(answer, scope):
                return answer
        return answer

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        """The raw manifest a tag or digest names and its digest (None when absent)."""
        answer = self._request(
            "GET",
            f"{self.base}/manifests/{reference}",
            headers={"Accept": MANIFEST_TYPES},
            policy=Policy(MAX_MANIFEST, TIMEOUT_S, redirects="none", content_types=MANIFEST_MEDIA),
        )
        if answer.status_code == 404:
            return None
        self._check(answer, f"read manifest {reference}")
        body = answer.content
        digest = sha256(body)
        if reference.startswith("sha256:") and digest != reference:
            raise PublishError(f"{self.repository}@{reference}: the registry served other bytes ({digest})")
        return body, digest

    def blob(self, digest: str, max_bytes: int) -> bytes:
        """A blob by digest, at most `max_bytes`, checked against its digest (so it may come from any host the
        registry redirects to, over https)."""
        answer = self._request(
            "GET", f"{self.base}/blobs/{digest}", policy=Policy(max_bytes, TIMEOUT_S, redirects="any")
        )
        self._check(answer, f"read blob {digest[:19]}")
        if sha256(answer.content) != digest:
            raise PublishError(f"{self.repository} blob {digest[:19]}: the registry served other bytes")
        return answer.content

    def put_blob(self, data: bytes) -> str:
        """Upload `data` (at most MAX_UPLOAD bytes) unless the registry holds it; one PUT, or PATCH chunks of
        UPLOAD_CHUNK bytes and a closing PUT when larger. Its digest."""
        if len(data) > MAX_UPLOAD:
            raise PublishError(
                f"{self.repository}: a blob of {len(data)} bytes is over {MAX_UPLOAD}; not sent"
            )
        digest = sha256(data)
        if (
            self._request("HEAD", f"{self.base}/blobs/{digest}", "pull,push", policy=HEAD_ANY).status_code
            == 200
        ):
            return digest
        answer = self._request("POST", f"{self.base}/blobs/uploads/", "pull,push")
        self._check(answer, "start a blob upload")
        octets = {"Content-Type": "application/octet-stream"}
        rest = data
        if len(data) > UPLOAD_CHUNK:
            for start in range(0, len(data), UPLOAD_CHUNK):
                chunk = data[start : start + UPLOAD_CHUNK]
                span = {"Content-Range": f"{start}-{start + len(chunk) - 1}"}
                answer = self._request(
                    "PATCH", self._next(answer), "pull,push", body=chunk, headers={**octets, **span}
                )
                self._check(answer, f"upload a chunk of blob {digest[:19]} at {start}")
            rest = b""
        done = self._request(
            "PUT", _with_digest(self._next(answer), digest), "pull,push", body=rest, headers=octets
        )
        self._check(done, f"upload blob {digest[:19]}")
        return digest

    def _next(self, answer: Fetched) -> str:
        """Where an upload goes on (the answer's Location), kept on the registry's host."""
        try:
            return location_of(answer, f"the upload to {self.repository}")
        except FetchError as exc:
            raise PublishError(f"{exc}; fix: check the registry's address") from None

    def put_artifact(self, tag: str, artifact_type: str, layer_type: str, data: bytes) -> str:
        """Push `data` as a one-layer OCI artifact under `tag`; the manifest's digest."""
        config = self.put_blob(EMPTY_CONFIG)
        layer = self.put_blob(data)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {"mediaType": artifact_type, "digest": config, "size": len(EMPTY_CONFIG)},
            "layers": [{"mediaType": layer_type, "digest": layer, "size": len(data)}],
        }
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        answer = self._request(
            "PUT",
            f"{self.base}/manifests/{tag}",
            "pull,push",
            body=body,
            headers={"Content-Type": OCI_MANIFEST},
        )
        self._check(answer, f"write {tag}")
        return sha256(body)

    def artifact(self, tag: str, max_bytes: int) -> bytes | None:
        """The one layer of the artifact under `tag` (None when the tag is absent)."""
        found = self.manifest(tag)
        if found is None:
            return None
        try:
            layers = parse_json(found[0].decode("utf-8"), f"the manifest of {self.repository}:{tag}")[
                "layers"
            ]
            (layer,) = layers
            size, digest = int(layer["size"]), str(layer["digest"])
        except (ValueError, KeyError, TypeError, InputError):
            raise PublishError(
                f"{self.repository}:{tag} is not a one-layer artifact; fix: check what else writes that tag"
            ) from None
        if size > max_bytes:
            raise PublishError(
                f"{self.repository}:{tag} says it holds {size} bytes (over {max_bytes}); not read"
            )
        return self.blob(digest, max_bytes)

    def _check(self, answer: Fetched, what: str) -> None:
        if answer.status_code >= 300:
            raise PublishError(
                f"{self.repository}: could not {what} (HTTP {answer.status_code}: {printable(answer.content)}); fix: "
                f"log in with push rights ({USER_ENV}/{PASSWORD_ENV}) or check the repository name"
            )


def _with_digest(location: str, digest: str) -> str:
    return f"{location}{'&' if '?' in location else '?'}{urlencode({'digest': digest})}"
