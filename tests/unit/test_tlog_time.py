"""attestedAt from the transparency log: the integrated time of a claim's bundle in the registry, read from a
real registry; without a bundle, the signer's clock, labelled so."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import requests

from sparkforge.registry import tlogtime
from sparkforge.registry.cosign import Statement
from sparkforge.registry.ocidist import OCI_MANIFEST, Registry
from tests.engine.registry import local_registry, unavailable_reason
from tests.prerequisites import skip_or_fail

IMAGE = "sha256:" + "1" * 64


def _statement(when: str, n: int) -> Statement:
    payload = base64.b64encode(json.dumps({"predicate": {"attestedAt": when, "n": n}}).encode()).decode()
    return Statement("t", (IMAGE,), {"attestedAt": when, "n": n}, f"{n:064x}", payload)


def test_the_log_time_wins_over_the_signer_clock(tmp_path: Path) -> None:
    if unavailable_reason():
        skip_or_fail(str(unavailable_reason()))
    logged = _statement("2026-12-01T00:00:00Z", 1)  # its signer clock says December ...
    unlogged = _statement("2027-06-01T00:00:00Z", 2)  # ... this one's (no bundle) says later
    with local_registry(tmp_path / "registry") as local:
        registry = Registry(f"{local.host}/sparkforge/tlog")
        envelope = json.dumps(
            {"payloadType": "application/vnd.in-toto+json", "payload": logged.payload}
        ).encode()
        bundle = json.dumps(
            {"Payload": {"integratedTime": 1764547200, "logIndex": 1}}
        )  # 2025-12-01T00:00:00Z
        config = registry.put_blob(b"{}")
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
            "layers": [
                {
                    "mediaType": "application/vnd.dsse.envelope.v1+json",
                    "digest": registry.put_blob(envelope),
                    "size": len(envelope),
                    "annotations": {tlogtime.BUNDLE: bundle},
                }
            ],
        }
        url = f"{local.url}/v2/sparkforge/tlog/manifests/{IMAGE.replace(':', '-')}.att"
        requests.put(
            url, data=json.dumps(manifest), headers={"Content-Type": OCI_MANIFEST}, timeout=10
        ).raise_for_status()
        times = tlogtime.integrated_times(registry, IMAGE)
    assert times == {logged.payload: "2025-12-01T00:00:00+00:00"}
    assert tlogtime.time_and_source(logged, times) == ("2025-12-01T00:00:00+00:00", tlogtime.TLOG)
    assert tlogtime.time_and_source(unlogged, times) == ("2027-06-01T00:00:00Z", "signer clock")
    # a signer can write any time into its predicate: a logged claim ranks above every unlogged one
    assert max([unlogged, logged], key=lambda s: tlogtime.sort_key(s, times)) is logged
    assert tlogtime.when(unlogged, times).endswith("signer clock")


def test_no_att_manifest_means_no_log_times(tmp_path: Path) -> None:
    if unavailable_reason():
        pytest.skip(str(unavailable_reason()))
    with local_registry(tmp_path / "registry") as local:
        assert tlogtime.integrated_times(Registry(f"{local.host}/sparkforge/none"), IMAGE) == {}
