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
    checks = data.get("checks")
    if not isinstance(checks, list):
        raise SigningError(f"{where}: 'checks' must be a list, found {type(checks).__name__}; {fix}")
    for index, check in enumerate(checks):
        if (
            not isinstance(check, dict)
            or not isinstance(check.get("name"), str)
            or check.get("status") not in ("passed", "failed", "skipped")
            or not isinstance(check.get("details", {}), dict)
        ):
            raise SigningError(
                f"{where}: checks[{index}] must be an object with a string 'name', a 'status' of passed, failed or "
                f"skipped and an object 'details'; {fix}"
            )
    return data
