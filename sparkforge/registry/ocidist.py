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
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import requests

from sparkforge.errors import InputError, PublishError
from sparkforge.oci import is_local_registry

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


def error_text(response: requests.Response, limit: int = 200) -> str:
    """The first `limit` bytes of an error answer, printable (a 1 GiB error body is never read whole)."""
    try:
        head = response.raw.read(limit, decode_content=True) if response.raw is not None else b""
    except (requests.RequestException, OSError, ValueError):
        head = b""
    finally:
        response.close()
    text = head.decode("utf-8", "replace")
    return "".join(c if c.isprintable() else " " for c in text)


def token_from_realm(
    registry: Registry, params: dict[str, str], scope: str, credentials: tuple[str, str] | None
) -> str:
    """A bearer token from the realm a 401 named, through the one fetcher (a total deadline, a byte cap, its
    redirect rules). The registry's credentials go only to a realm on the registry's own host: a 401 that
    names another host gets an anonymous request, never the user and password."""
    import base64

    from sparkforge.boundary import parse_json
    from sparkforge.urlfetch import FetchError, check_url, direct_session, fetch_url, proxied_session

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
        session = direct_session() if is_local_registry(registry.repository) else proxied_session()
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
    """One repository (`host/name`) of a registry, spoken to over the distribution API."""

    repository: str
    session: requests.Session = field(default_factory=requests.Session, repr=False)
    _token: str = field(default="", repr=False)

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

    def _auth(self, response: requests.Response, scope: str) -> bool:
        """Answer a 401 challenge with a bearer token (anonymous, or the configured user); True when got."""
        challenge = response.headers.get("WWW-Authenticate", "")
        user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
        if challenge.lower().startswith("basic") and user:
            self.session.auth = (user, password or "")
            return True
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not challenge.lower().startswith("bearer") or "realm" not in params:
            return False
        self._token = token_from_realm(self, params, scope, (user, password or "") if user else None)
        return bool(self._token)

    def _request(self, method: str, url: str, scope: str = "pull", **kwargs: Any) -> requests.Response:
        for _ in range(2):
            headers = dict(kwargs.pop("headers", {}) or {})
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            kwargs.setdefault("stream", True)  # a body is read only as far as its reader's cap, never whole
            try:
                response = self.session.request(method, url, headers=headers, timeout=TIMEOUT_S, **kwargs)
            except requests.RequestException as exc:
                raise PublishError(
                    f"cannot reach the registry of {self.repository} ({exc}); fix: check the network, or log in"
                ) from None
            kwargs["headers"] = headers
            if response.status_code != 401 or not self._auth(response, scope):
                return response
        return response

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        """The raw manifest a tag or digest names and its digest (None when absent)."""
        response = self._request(
            "GET", f"{self.base}/manifests/{reference}", headers={"Accept": MANIFEST_TYPES}, stream=True
        )
        if response.status_code == 404:
            return None
        self._check(response, f"read manifest {reference}")
        body = response.raw.read(MAX_MANIFEST + 1, decode_content=True)
        if len(body) > MAX_MANIFEST:
            raise PublishError(f"{self.repository}:{reference} is larger than a manifest may be; not read")
        digest = sha256(body)
        if reference.startswith("sha256:") and digest != reference:
            raise PublishError(f"{self.repository}@{reference}: the registry served other bytes ({digest})")
        return body, digest

    def blob(self, digest: str, max_bytes: int) -> bytes:
        """A blob by digest, at most `max_bytes`, checked against its digest."""
        response = self._request("GET", f"{self.base}/blobs/{digest}", stream=True)
        self._check(response, f"read blob {digest[:19]}")
        body = response.raw.read(max_bytes + 1, decode_content=True)
        if len(body) > max_bytes:
            raise PublishError(f"{self.repository} blob {digest[:19]} is over {max_bytes} bytes; not read")
        if sha256(body) != digest:
            raise PublishError(f"{self.repository} blob {digest[:19]}: the registry served other bytes")
        return body

    def put_blob(self, data: bytes) -> str:
        digest = sha256(data)
        if self._request("HEAD", f"{self.base}/blobs/{digest}", "pull,push").status_code == 200:
            return digest
        start = self._request("POST", f"{self.base}/blobs/uploads/", "pull,push")
        self._check(start, "start a blob upload")
        location = start.headers["Location"]
        if location.startswith("/"):
            location = self.base.split("/v2/", 1)[0] + location
        sep = "&" if "?" in location else "?"
        done = self._request(
            "PUT",
            f"{location}{sep}digest={digest}",
            "pull,push",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        self._check(done, f"upload blob {digest[:19]}")
        return digest

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
        response = self._request(
            "PUT",
            f"{self.base}/manifests/{tag}",
            "pull,push",
            data=body,
            headers={"Content-Type": OCI_MANIFEST},
        )
        self._check(response, f"write {tag}")
        return sha256(body)

    def artifact(self, tag: str, max_bytes: int) -> bytes | None:
        """The one layer of the artifact under `tag` (None when the tag is absent)."""
        found = self.manifest(tag)
        if found is None:
            return None
        try:
            layers = json.loads(found[0])["layers"]
            (layer,) = layers
            size, digest = int(layer["size"]), str(layer["digest"])
        except (ValueError, KeyError, TypeError):
            raise PublishError(
                f"{self.repository}:{tag} is not a one-layer artifact; fix: check what else writes that tag"
            ) from None
        if size > max_bytes:
            raise PublishError(
                f"{self.repository}:{tag} says it holds {size} bytes (over {max_bytes}); not read"
            )
        return self.blob(digest, max_bytes)

    def _check(self, response: requests.Response, what: str) -> None:
        if response.status_code >= 300:
            raise PublishError(
                f"{self.repository}: could not {what} (HTTP {response.status_code}: {error_text(response)}); fix: "
                f"log in with push rights ({USER_ENV}/{PASSWORD_ENV}) or check the repository name"
            )
