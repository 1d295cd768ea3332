"""An image's kernel audit on the real engine: the audit kept under the image ID (the same ID is the same bytes),
the scope part of the key; a scoped audit walks the layers without keeping their listings, an unscoped one keeps
each layer's listing under its digest; the offline base image, no device code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.verify import imagefs

pytestmark = pytest.mark.engine


def test_the_audit_of_an_image_is_kept_by_its_id_and_its_layers_by_digest(
    base_amd64: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if engine.image_layer_dirs(base_amd64) is None:
        pytest.skip("the engine's layer store is not readable here (not overlay2 or not root)")
    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    first = imagefs.audit_image(base_amd64, "sm_121", ["usr/lib/**/libc.so*"], only=["usr/lib/**/libc.so*"])
    layers = engine.inspect_image(base_amd64)["RootFS"]["Layers"]
    assert not (tmp_path / "cache" / "layers").exists()  # only the files in scope were stat'ed and merged
    assert (
        tmp_path / "cache" / "kernels" / "files"
    ).is_dir()  # libc's answer (no device code), by layer digest
    (kept,) = (tmp_path / "cache" / "kernels" / "image-audit").iterdir()
    assert first.extra["summary"]["files_scanned"] > 1000 and first.extra["summary"]["scope"]
    data = json.loads(kept.read_text())
    data["checks"][0]["reason"] = "answered from the cache"
    kept.write_text(json.dumps(data))
    again = imagefs.audit_image(base_amd64, "sm_121", ["usr/lib/**/libc.so*"], only=["usr/lib/**/libc.so*"])
    assert again.checks[0].reason == "answered from the cache" and again.subject == base_amd64
    every = imagefs.audit_image(base_amd64, "sm_121", ["usr/lib/**/libc.so*"])  # another scope: audited anew
    assert every.checks[0].reason != "answered from the cache" and "scope" not in every.extra["summary"]
    assert len(list((tmp_path / "cache" / "layers").glob("*.json"))) == len(layers)
    assert (
        every.checks[0].status == first.checks[0].status == "failed"
    )  # a host library carries no device code
