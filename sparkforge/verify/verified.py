"""Verify records: what verify found for one exact image (by image ID), and which registry digests are it.

A record is written after every verify, passed or failed: a later failed verify of the same image replaces
(revokes) an earlier pass. `push` links the registry digest it pushed to the image ID, so `publish` and
`promote` can ask, for a digest, whether that image passed verify and whether it is GPU-verified.
Standard library only: records are plain JSON files under build/verified/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sparkforge.boundary import read_json, write_output
from sparkforge.verify.evidence import GpuVerdict, capability_of, gpu_verdict, sm_of

VERIFIED_DIR = Path(__file__).resolve().parents[2] / "build" / "verified"
_ID = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


def _hex(value: str) -> str:
    match = _ID.fullmatch(value)
    if not match:
        raise ValueError(f"not a sha256 image ID or digest: {value!r}")
    return match.group(1)


def write_record(image_id: str, data: dict[str, Any], directory: Path = VERIFIED_DIR) -> Path:
    """Store the verify result of `image_id` (replacing any earlier one: a failure revokes a pass)."""
    path = directory / f"{_hex(image_id)}.json"
    # The boundary's writer: atomic, and a link planted in build/ is replaced, never written through.
    write_output(
        path, json.dumps({**data, "image_id": f"sha256:{_hex(image_id)}"}, indent=2) + "\n", "record"
    )
    return path


def read_record(image_id: str, directory: Path = VERIFIED_DIR) -> dict[str, Any] | None:
    path = directory / f"{_hex(image_id)}.json"
    return (
        read_json(path, "verify record") if path.is_file() else None
    )  # bounded; a corrupt one is one paragraph


def passed_record(image_id: str, directory: Path = VERIFIED_DIR) -> dict[str, Any] | None:
    """The record of this image if its latest verify passed."""
    record = read_record(image_id, directory)
    return record if record and record.get("status") == "passed" else None


def record_verdict(record: dict[str, Any] | None, target: str) -> GpuVerdict:
    """THE rule (evidence.gpu_verdict), applied again to a record's own checks, on the GPU the host passed in.

    The verdict stored in the record is never trusted: a record without `gpus.used` (the host passed no GPU
    to the container) has no GPU, whatever its suite claimed.
    """
    sm = sm_of(capability_of(target))
    if not record:
        return GpuVerdict(False, "no verify record", None, sm)
    if record.get("status") != "passed":
        return GpuVerdict(False, "its latest verify failed (the pass is revoked)", None, sm)
    gpu = record.get("gpu") if (record.get("gpus") or {}).get("used") is True else None
    return gpu_verdict(record.get("checks") or [], gpu, target)


def is_gpu_verified(record: dict[str, Any] | None, target: str) -> bool:
    """A passed record whose checks make the image GPU-verified for `target` (record_verdict)."""
    return record_verdict(record, target).verified


def link_digest(digest: str, image_id: str, repository: str, directory: Path = VERIFIED_DIR) -> Path:
    """Remember that `repository@digest` is the local image `image_id` (written by push)."""
    path = directory / "digests" / f"{_hex(digest)}.json"
    data = {"digest": f"sha256:{_hex(digest)}", "image_id": image_id, "repository": repository}
    write_output(path, json.dumps(data, indent=2) + "\n", "record")
    return path


def digest_link(digest: str, directory: Path = VERIFIED_DIR) -> dict[str, Any] | None:
    """What push (or pull) linked to `digest`: its image ID and repository (None when never linked here)."""
    link = directory / "digests" / f"{_hex(digest)}.json"
    return dict(read_json(link, "digest link")) if link.is_file() else None


def record_for_digest(digest: str, directory: Path = VERIFIED_DIR) -> dict[str, Any] | None:
    """The current verify record of the image pushed as `digest` (None when unknown or never pushed from here)."""
    link = digest_link(digest, directory)
    return None if link is None else read_record(str(link["image_id"]), directory)
