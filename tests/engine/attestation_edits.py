"""Edits of an image's cosign attestations in a test registry, as someone with write access could make them:
the `.att` manifest is deleted and the envelopes (each possibly edited or dropped) attached again with cosign,
their signatures untouched."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from registry import LocalRegistry

# statement -> the statement to attach (edited or not), or None to drop it
Edit = Callable[[dict[str, Any]], dict[str, Any] | None]


def rewrite_attestations(registry: LocalRegistry, image: str, edit: Edit, folder: Path) -> int:
    """Apply `edit` to every in-toto statement attached to `image` (repository@sha256:...); returns how many it
    changed or dropped."""
    out = subprocess.run(
        ["cosign", "download", "attestation", image], check=True, capture_output=True, text=True
    ).stdout
    envelopes = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    name, digest = image.split("/", 1)[1].split("@")
    found = registry.manifest(name, digest.replace(":", "-") + ".att")
    assert found is not None, f"{image} has no attestations"
    response = requests.delete(f"{registry.url}/v2/{name}/manifests/{found[0]}", timeout=10)
    assert response.status_code == 202, response.text
    folder.mkdir(parents=True, exist_ok=True)
    changed = 0
    for i, envelope in enumerate(envelopes):
        statement = json.loads(base64.b64decode(envelope["payload"]))
        edited = edit(json.loads(json.dumps(statement)))
        if edited != statement:
            changed += 1
        if edited is None:
            continue
        if edited != statement:  # an unchanged statement keeps its signed bytes
            envelope["payload"] = base64.b64encode(json.dumps(edited).encode()).decode()
        path = folder / f"envelope-{digest[7:19]}-{i}.json"
        path.write_text(json.dumps(envelope))
        subprocess.run(
            ["cosign", "attach", "attestation", "--attestation", str(path), image],
            check=True,
            capture_output=True,
        )
    return changed
