"""Check 5 (and lock's image half): base images pinned by digest, the digest resolving for every platform.

Talks the registry HTTP API v2 directly (anonymous bearer tokens as Docker Hub and GHCR hand out), so it
needs no container engine. Registries on localhost / 127.0.0.1 are spoken to over plain HTTP, as Docker does.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import requests

from sparkforge import oci
from sparkforge.errors import PreflightError
from sparkforge.preflight.fetch import Fetcher
from sparkforge.recipe.loader import RecipeModel
from sparkforge.report import Check

MANIFEST_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
_DOCKER_HUB = "registry-1.docker.io"


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def base_url(self) -> str:
        return f"{'http' if oci.is_local_registry(self.registry) else 'https'}://{self.registry}"

    def with_digest(self, digest: str) -> str:
        name = self.repository if self.registry == _DOCKER_HUB else f"{self.registry}/{self.repository}"
        if self.registry == _DOCKER_HUB:
            name = name.removeprefix("library/")
        return f"{name}{':' + self.tag if self.tag else ''}@{digest}"


def parse_image(ref: str) -> ImageRef:
    """Split `[registry/]name[:tag][@sha256:...]` the way Docker does (docker.io and library/ defaults)."""
    name, _, digest = ref.partition("@")
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = _DOCKER_HUB, name if "/" in name else f"library/{name}"
    if registry == "docker.io":
        registry = _DOCKER_HUB
    return ImageRef(registry, repository, tag, digest or None)


def _token(fetcher: Fetcher, challenge: str, repository: str) -> str | None:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = fields.get("realm")
    if not realm:
        return None
    params = {"service": fields.get("service", ""), "scope": f"repository:{repository}:pull"}
    response = fetcher.session.get(realm, params=params, timeout=fetcher.timeout)
    if response.status_code != 200:
        return None
    data = response.json()
    return data.get("token") or data.get("access_token")


def fetch_manifest(fetcher: Fetcher, image: ImageRef, reference: str) -> tuple[dict[str, Any], str]:
    """(manifest JSON, its digest) for a tag or digest; raises PreflightError, ConnectionError if unreachable."""
    url = f"{image.base_url}/v2/{image.repository}/manifests/{reference}"
    headers = {"Accept": MANIFEST_ACCEPT}
    response = fetcher.session.get(url, headers=headers, timeout=fetcher.timeout)
    if response.status_code == 401:
        token = _token(fetcher, response.headers.get("WWW-Authenticate", ""), image.repository)
        if token:
            headers["Authorization"] = f"Bearer {token}"
            response = fetcher.session.get(url, headers=headers, timeout=fetcher.timeout)
    if response.status_code != 200:
        raise PreflightError(
            f"{image.registry}/{image.repository}@{reference}: the registry answered HTTP {response.status_code}; "
            "fix: check the image name and pin (run 'invoke lock' to re-resolve the tag)"
        )
    digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
    return response.json(), response.headers.get("Docker-Content-Digest", digest)


def manifest_platforms(fetcher: Fetcher, image: ImageRef, manifest: dict[str, Any]) -> list[str]:
    """'os/arch[/variant]' for every image an index lists, or of the single image a manifest describes."""
    if "manifests" in manifest:
        out = []
        for item in manifest["manifests"]:
            platform = item.get("platform") or {}
            if platform.get("os") == "unknown":
                continue  # attestation manifests
            parts = [platform.get("os", "?"), platform.get("architecture", "?")]
            out.append("/".join([*parts, platform["variant"]] if platform.get("variant") else parts))
        return out
    config = manifest.get("config", {}).get("digest")
    if not config:
        return []
    url = f"{image.base_url}/v2/{image.repository}/blobs/{config}"
    response = fetcher.session.get(url, timeout=fetcher.timeout)
    if response.status_code != 200:
        return []
    data = response.json()
    parts = [data.get("os", "?"), data.get("architecture", "?"), data.get("variant")]
    return ["/".join(p for p in parts if p)]


def _covers(available: list[str], wanted: str) -> bool:
    """linux/arm64 is covered by linux/arm64 and linux/arm64/v8 (oci's one platform table decides)."""
    return any(oci.canonical(*[*a.split("/", 2), ""][:3]) == wanted for a in available)


def check_images(check: Check, model: RecipeModel, fetcher: Fetcher) -> None:
    """Fill `check`: each base image pinned by digest; online, the digest exists for every platform."""
    refs = {"builder": model.images.builder, "runtime": model.images.runtime}
    details: dict[str, Any] = {}
    problems, unreachable = [], []
    for role, ref in refs.items():
        image = parse_image(ref)
        entry: dict[str, Any] = {"ref": ref, "pinned": bool(image.digest)}
        details[role] = entry
        if not image.digest:
            problems.append(f"images.{role} {ref} is not pinned by digest; fix: run 'invoke lock --write'")
            continue
        if fetcher.offline:
            continue
        try:
            manifest, digest = fetch_manifest(fetcher, image, image.digest)
        except requests.RequestException as exc:
            unreachable.append(f"{image.registry} ({type(exc).__name__})")
            continue
        except PreflightError as exc:
            problems.append(f"images.{role}: {exc}")
            continue
        platforms = manifest_platforms(fetcher, image, manifest)
        missing = [p for p in model.platforms if not _covers(platforms, p)]
        entry.update({"resolved": digest, "platforms": platforms, "missing_platforms": missing})
        if missing:
            problems.append(
                f"images.{role} {ref} has no {', '.join(missing)} image (it has {', '.join(platforms)}); "
                "fix: pin a multi-arch index digest"
            )
    check.details = details
    if problems:
        check.status = "failed"
        check.reason = " | ".join(problems)
    elif fetcher.offline:
        check.status = "skipped"
        check.reason = "offline: digests are pinned, but not resolved against the registry"
    elif unreachable:
        check.status = "skipped"
        check.reason = f"digests are pinned; registry unreachable: {', '.join(sorted(set(unreachable)))}"
        check.details["unreachable"] = sorted(set(unreachable))
    else:
        check.reason = f"digests resolve for {', '.join(model.platforms)}"
