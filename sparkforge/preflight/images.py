"""Check 5 (and lock's image half): base images pinned by digest, the digest resolving for every platform.

Talks the registry HTTP API v2 directly (anonymous bearer tokens as Docker Hub and GHCR hand out), so it
needs no container engine. Registries on localhost / 127.0.0.1 are spoken to over plain HTTP, as Docker does.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from sparkforge import oci
from sparkforge.errors import PreflightError
from sparkforge.preflight.fetch import Fetcher, UnreachableError
from sparkforge.recipe.loader import RecipeModel
from sparkforge.report import Check
from sparkforge.urlfetch import redirect_allowed

MANIFEST_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
_DOCKER_HUB = "registry-1.docker.io"
_ANY_ERROR = tuple(range(400, 600))  # the status is the answer here (401: ask for a token; 404: not there)
_MANIFEST_BYTES = 4 << 20  # an OCI index or manifest is a few KiB


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


def _token(fetcher: Fetcher, challenge: str, image: ImageRef) -> str | None:
    fields = dict(re.findall(r'(\w+)="([^"]{0,2048})"', challenge[:8192]))
    realm = fields.get("realm")
    if not realm:
        return None
    # The realm is named by whoever answers: only a token service of the registry's own site gets the request.
    why = redirect_allowed(image.base_url, realm)
    if why:
        raise PreflightError(
            f"{image.registry}: its token service {realm[:200]} is {why.replace('to ', '', 1)}; fix: check the "
            "registry named in the recipe"
        )
    query = urlencode({"service": fields.get("service", ""), "scope": f"repository:{image.repository}:pull"})
    answer = fetcher.get(
        f"{realm}?{query}", what=f"a pull token for {image.repository}", ok_status=_ANY_ERROR
    )
    if answer.status_code != 200:
        return None
    data = fetcher.json_of(answer, f"{image.registry}'s token")
    token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
    return token if isinstance(token, str) else None


def fetch_manifest(fetcher: Fetcher, image: ImageRef, reference: str) -> tuple[dict[str, Any], str]:
    """(manifest JSON, its digest) for a tag or digest; raises PreflightError (also when unreachable)."""
    url = f"{image.base_url}/v2/{image.repository}/manifests/{reference}"
    headers = {"Accept": MANIFEST_ACCEPT}
    what = f"the manifest of {image.registry}/{image.repository}"
    answer = fetcher.get(url, what=what, headers=headers, ok_status=_ANY_ERROR, max_bytes=_MANIFEST_BYTES)
    if answer.status_code == 401:
        token = _token(fetcher, answer.headers.get("WWW-Authenticate", ""), image)
        if token:
            headers["Authorization"] = f"Bearer {token}"
            answer = fetcher.get(
                url, what=what, headers=headers, ok_status=_ANY_ERROR, max_bytes=_MANIFEST_BYTES
            )
    if answer.status_code != 200:
        raise PreflightError(
            f"{image.registry}/{image.repository}@{reference}: the registry answered HTTP {answer.status_code}; "
            "fix: check the image name and pin (run 'invoke lock' to re-resolve the tag)"
        )
    digest = "sha256:" + hashlib.sha256(answer.content).hexdigest()
    manifest = fetcher.json_of(answer, what)
    if not isinstance(manifest, dict):
        raise PreflightError(f"{what}: not a JSON object; fix: check the image name")
    return manifest, answer.headers.get("Docker-Content-Digest", digest)


def manifest_platforms(fetcher: Fetcher, image: ImageRef, manifest: dict[str, Any]) -> list[str]:
    """'os/arch[/variant]' for every image an index lists, or of the single image a manifest describes."""
    if "manifests" in manifest:
        out = []
        for item in manifest["manifests"] if isinstance(manifest["manifests"], list) else ():
            platform = (item.get("platform") if isinstance(item, dict) else None) or {}
            if not isinstance(platform, dict) or platform.get("os") == "unknown":
                continue  # attestation manifests
            parts = [str(platform.get("os", "?")), str(platform.get("architecture", "?"))]
            out.append("/".join([*parts, str(platform["variant"])] if platform.get("variant") else parts))
        return out
    config = manifest.get("config", {}).get("digest") if isinstance(manifest.get("config"), dict) else None
    if not config:
        return []
    url = f"{image.base_url}/v2/{image.repository}/blobs/{config}"
    answer = fetcher.get(url, what="an image config", ok_status=_ANY_ERROR, max_bytes=_MANIFEST_BYTES)
    if answer.status_code != 200:
        return []
    data = fetcher.json_of(answer, "an image config")
    if not isinstance(data, dict):
        return []
    parts = [data.get("os", "?"), data.get("architecture", "?"), data.get("variant")]
    return ["/".join(str(p) for p in parts if p)]


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
        except UnreachableError as exc:
            unreachable.append(f"{image.registry} ({str(exc).split(';')[0][:120]})")
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
