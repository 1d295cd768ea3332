"""When a signed claim was made: the transparency log's integrated time where its bundle has one.

cosign stores each attestation as a layer of the image's `sha256-<hex>.att` manifest; a keyless (or
tlog-uploaded) one carries its Rekor bundle in the layer annotation `dev.sigstore.cosign/bundle`, whose
`Payload.integratedTime` is the log's clock (cosign verified the bundle's signed entry timestamp when it
accepted a keyless attestation). Key-signed attestations are verified with `--insecure-ignore-tlog`, so a bundle
annotation on them is unverified bytes: trust.verify_remote reads times for keyless policies only, and key claims
have only the time the signer wrote into the predicate (`attestedAt`): labelled "signer clock" wherever shown.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from sparkforge.boundary import parse_json
from sparkforge.errors import InputError, PublishError
from sparkforge.registry.cosign import Statement
from sparkforge.registry.ocidist import Registry

BUNDLE = "dev.sigstore.cosign/bundle"
MAX_ENVELOPE = 4 << 20
TLOG, SIGNER = "transparency log (integrated time)", "signer clock"


def integrated_times(registry: Registry, digest: str) -> dict[str, str]:
    """DSSE payload (base64, as cosign prints it) -> the log's integrated time (ISO 8601 UTC), for one image."""
    try:
        found = registry.manifest(digest.replace(":", "-") + ".att")
        if found is None:
            return {}
        layers = parse_json(found[0].decode(), "attestation manifest").get("layers") or []
        out = {}
        for layer in layers:
            bundle = (layer.get("annotations") or {}).get(BUNDLE)
            if not bundle:
                continue
            when = int(parse_json(bundle, "Rekor bundle")["Payload"]["integratedTime"])
            envelope = parse_json(registry.blob(str(layer["digest"]), MAX_ENVELOPE).decode(), "DSSE envelope")
            out[str(envelope["payload"])] = dt.datetime.fromtimestamp(when, dt.UTC).isoformat()
        return out
    except (InputError, PublishError, ValueError, KeyError, TypeError):
        return {}  # no readable bundle: every claim falls back to the signer's clock, labelled so


def time_and_source(statement: Statement, times: Mapping[str, str]) -> tuple[str, str]:
    if statement.payload in times:
        return times[statement.payload], TLOG
    return str(statement.predicate.get("attestedAt") or ""), SIGNER


def when(statement: Statement, times: Mapping[str, str]) -> str:
    time, source = time_and_source(statement, times)
    return f"{time or 'an unknown time'}, {source}"


def sort_key(statement: Statement, times: Mapping[str, str]) -> tuple[int, str]:
    """Log times rank above signer clocks (a signer can write any time); then by time."""
    time, source = time_and_source(statement, times)
    return (1 if source == TLOG else 0, _normal(time))


def _normal(time: str) -> str:
    try:
        return dt.datetime.fromisoformat(time.replace("Z", "+00:00")).astimezone(dt.UTC).isoformat()
    except ValueError:
        return ""
