"""The JSON files the signing tasks read ('invoke publish --json', 'invoke verify --report'), type-checked before
cosign sees any of them: a hand-edited or hostile file ends in one paragraph, never a traceback or a signature."""

from __future__ import annotations

from typing import Any

from sparkforge.oci import PLATFORMS
from sparkforge.registry.cosign import SigningError, plan_digest


def parse_published(data: object, where: str) -> tuple[str, dict[str, str]]:
    """What 'invoke publish --json' wrote -> (index digest, platform -> digest), every value type-checked
    before cosign sees any of it."""
    fix = "fix: pass the file 'invoke publish --json' wrote, unedited"
    if not isinstance(data, dict):
        raise SigningError(f"{where}: a JSON object is expected, found {type(data).__name__}; {fix}")
    index, platforms = data.get("index"), data.get("platforms")
    if not isinstance(index, str) or not plan_digest(index):
        raise SigningError(
            f"{where}: 'index' must be sha256: and 64 lowercase hex digits, found {index!r:.80}; {fix}"
        )
    if not isinstance(platforms, dict) or not platforms:
        raise SigningError(
            f"{where}: 'platforms' must map each platform to its digest, found {platforms!r:.80}; {fix}"
        )
    for platform, digest in platforms.items():
        if platform not in PLATFORMS:
            raise SigningError(
                f"{where}: platforms: {platform!r:.80} is not one of {', '.join(PLATFORMS)}; {fix}"
            )
        if not isinstance(digest, str) or not plan_digest(digest):
            raise SigningError(
                f"{where}: platforms.{platform}: must be sha256: and 64 lowercase hex digits, found {digest!r:.80}; {fix}"
            )
    return index, dict(platforms)


MAX_CHECKS = 10_000
MAX_TEXT = (
    200  # a GPU name, driver version, check name: what a signed claim copies must stay a short plain line
)


def _plain(value: object, most: int = MAX_TEXT) -> bool:
    """A short printable string (no control character, no terminal escape): what a claim may carry as text."""
    return isinstance(value, str) and len(value) <= most and value.isprintable()


def _signed_fields(data: dict[str, Any], where: str, fix: str) -> None:
    """The fields the claim copies out of the report (cosign.verify_claim): their types, before any signing."""
    image_id = data.get("image_id")
    if image_id is not None and not (isinstance(image_id, str) and plan_digest(image_id)):
        raise SigningError(
            f"{where}: 'image_id' must be sha256: and 64 lowercase hex digits, found {image_id!r:.80}; {fix}"
        )
    gpu, suite = data.get("gpu"), data.get("suite")
    if gpu is not None and (
        not isinstance(gpu, dict) or not all(_fact(gpu.get(k)) for k in ("name", "capability", "driver"))
    ):
        raise SigningError(
            f"{where}: 'gpu' must be an object of short plain name, capability and driver; {fix}"
        )
    if suite is not None and not (
        isinstance(suite, dict) and ("sha256" not in suite or _sha256_hex(suite["sha256"]))
    ):
        raise SigningError(
            f"{where}: 'suite' must be an object with a 'sha256' of sha256: and 64 lowercase hex digits; {fix}"
        )
    gpus = data.get("gpus") or {}
    if not isinstance(gpus.get("used", False), bool) or not (
        gpus.get("why") is None or _plain(gpus.get("why"))
    ):
        raise SigningError(f"{where}: 'gpus' must hold a true/false 'used' and a short plain 'why'; {fix}")


def _fact(value: object) -> bool:
    """A GPU fact: absent, a short plain string, or a number (a compute capability such as 12.1)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return value is None or number or _plain(value)


def _sha256_hex(value: object) -> bool:
    """The suite digest as verify writes it (evidence.suite_digest): sha256: and 64 lowercase hex digits."""
    if not isinstance(value, str) or not value.startswith("sha256:"):
        return False
    hexpart = value.removeprefix("sha256:")
    return len(hexpart) == 64 and all(c in "0123456789abcdef" for c in hexpart)


def parse_verify_report(data: object, where: str) -> dict[str, Any]:
    """A verify report's shape, type-checked before any of it is signed (what 'invoke verify --report' writes)."""
    fix = "fix: pass the report 'invoke verify --report' wrote, unedited"
    if not isinstance(data, dict):
        raise SigningError(f"{where}: a JSON object is expected, found {type(data).__name__}; {fix}")
    for key in ("command", "recipe", "status"):
        if not isinstance(data.get(key), str):
            raise SigningError(f"{where}: '{key}' must be a string, found {data.get(key)!r:.80}; {fix}")
    if data["status"] not in ("passed", "failed"):
        raise SigningError(f"{where}: 'status' must be passed or failed, found {data['status']!r:.80}; {fix}")
    if not isinstance(data.get("gpus", {}), dict) or not isinstance(data.get("platform", ""), str | None):
        raise SigningError(f"{where}: 'gpus' must be an object and 'platform' a string; {fix}")
    _signed_fields(data, where, fix)
    checks = data.get("checks")
    if not isinstance(checks, list) or len(checks) > MAX_CHECKS:
        raise SigningError(
            f"{where}: 'checks' must be a list of at most {MAX_CHECKS}, found {type(checks).__name__}; {fix}"
        )
    for index, check in enumerate(checks):
        if (
            not isinstance(check, dict)
            or not isinstance(check.get("name"), str)
            or not _plain(check["name"])
            or check.get("status") not in ("passed", "failed", "skipped")
            or not isinstance(check.get("details", {}), dict)
        ):
            raise SigningError(
                f"{where}: checks[{index}] must be an object with a string 'name', a 'status' of passed, failed or "
                f"skipped and an object 'details'; {fix}"
            )
    return data


def published_image(
    repository: str, published: object, where: str, platform: str, fetch: Any
) -> tuple[str, str]:
    """The sign job decides what it signs: (index, repository@platform image) from the merge job's own record
    ('invoke publish --json'), the platform image read from that index in the registry (`fetch`: Manifests.fetch),
    never from what the GPU job names."""
    from sparkforge.registry.manifests import index_platforms

    index, recorded = parse_published(published, where)
    manifest = fetch(f"{repository}@{index}") or {}
    images = dict(index_platforms(manifest)) if "manifests" in manifest else {}
    if platform not in recorded or images.get(platform) != recorded[platform]:
        raise SigningError(
            f"{where}: the published index {index[:19]} has {platform} image {images.get(platform)!r:.80} in the "
            f"registry, the record names {recorded.get(platform)!r:.80}; nothing was signed. fix: sign the index "
            "this run's merge job published"
        )
    return index, f"{repository}@{recorded[platform]}"


def check_subject(report: dict[str, Any], image: str, where: str) -> None:
    """A verify report about another image than `image` (its subject names another digest) is refused."""
    subject = str(report.get("subject") or "")
    if subject.rpartition("@")[2] != image.rpartition("@")[2]:
        raise SigningError(
            f"{where}: the report is about {subject[:120]!r}, not {image} (the image this run published); nothing "
            "was signed. fix: verify the published image and attest that report"
        )
