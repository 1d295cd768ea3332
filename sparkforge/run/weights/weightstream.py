"""`--weights shared`: the head downloads once; its model folder is streamed to every peer over the fabric link.

A throwaway container of the image on the head serves the folder (read-only, bound to the head's link address)
to peers that prove a per-run key, after proving the key to them first; it prints the sha256 of its manifest
(size and sha256 of every file, cached per snapshot), which sparkforge reads over the head's control channel (the
engine) and hands to one puller per peer; the puller fetches the manifest from the proven head, checks it against
that sha256, and verifies every byte against it before a file becomes visible (resumable; the Hugging Face
cache's snapshot links recreated only inside the folder; one deadline over the whole transfer). The programs: sparkforge/run/weights/weightscripts.py.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkforge.boundary import parse_json
from sparkforge.context import Session
from sparkforge.errors import InputError, RunError
from sparkforge.run.nodes import LABEL, ContainerSpec, NodeEngine
from sparkforge.run.postmortem import keep_logs
from sparkforge.run.weights.weightscripts import pull_args, serve_args

PORT = 29531
MANIFESTS = "sparkforge-manifests"  # beside the model folders (hub/): one cached manifest per model folder


def _spec(
    name: str,
    image: str,
    args: Sequence[str],
    mounts: tuple[str, ...],
    role: str,
    env: dict[str, str] | None = None,
) -> ContainerSpec:
    return ContainerSpec(
        name=name,
        image=image,
        entrypoint="python3",
        args=tuple(args),
        env={"PYTHONUNBUFFERED": "1", **(env or {})},
        labels={LABEL: "weights", f"{LABEL}.weights": role},
        mounts=mounts,
    )


def serving_event(logs: str) -> dict[str, Any] | None:
    """The head's server's `serving` event (entries, files, the manifest's sha256), or None while it has not."""
    for event in json_events(logs):
        if event.get("event") == "serving" and isinstance(event.get("manifest_sha256"), str):
            return event
    return None


def json_events(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a container's log (progress events), other lines skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                event = parse_json(line, "a weight transfer's progress line")
            except InputError:
                continue  # a line that is not strict JSON is not an event
            if isinstance(event, dict):
                out.append(event)
    return out


@dataclass(frozen=True)
class Transfer:
    """One model folder from the head to its peers: the image the server and pullers run, the head's link
    address the server listens on, the folder on the head and on each peer."""

    image: str
    address: str
    source: str
    dest: str
    port: int = PORT
    timeout_s: float = 3600


def share_weights(
    session: Session, head: NodeEngine, peers: Sequence[NodeEngine], transfer: Transfer
) -> dict[str, dict[str, Any]]:
    """Stream `transfer.source` (a folder on the head) into `transfer.dest` on every peer through the head's
    address; per peer the final event (bytes, moved, resumed, seconds). RunError names the node, what stopped
    and the fix."""
    image, address, source, dest = transfer.image, transfer.address, transfer.source, transfer.dest
    port, timeout_s, echo = transfer.port, transfer.timeout_s, session.echo
    if address in ("", "0.0.0.0", "::", "[::]"):
        raise RunError(
            f"stage weights: the weight server would listen on every interface ({address or 'no address'}); fix: "
            "give the head's link address (the fabric plan's: cluster.doctor finds it, or --nodes URL=ADDRESS)"
        )
    key = secrets.token_hex(32)  # per launch; never sent over the link (HMAC proofs only, both ways)
    parent, folder = source.rstrip("/").rsplit("/", 1)
    manifests = f"{parent}/.{MANIFESTS}"  # beside the model folder, not in it: one cached manifest per folder
    server = _spec(
        "sparkforge-weights-serve",
        image,
        serve_args("/weights", address, port, key, f"/manifests/{folder}.json"),
        (f"{source}:/weights:ro", f"{manifests}:/manifests"),
        "serve",
    )
    started: list[tuple[NodeEngine, str]] = []
    try:
        head.remove([server.name])
        head.start(server)
        started.append((head, server.name))
        end = time.monotonic() + 1800  # hashing a first snapshot of ~120 GB takes minutes; cached after
        while (serving := serving_event(head.logs(server.name))) is None:
            if head.state(server.name).status != "running" or time.monotonic() > end:
                tail = head.logs(server.name, tail=5).strip()[-400:]
                raise RunError(
                    f"stage weights: the head's weights server did not start on {address}:{port} ({tail}); fix: "
                    "free that port on the head or check that the address is the head's link address"
                )
            time.sleep(0.5)
        cert = str(serving.get("cert_sha256", ""))
        if not re.fullmatch(r"[0-9a-f]{64}", cert):
            raise RunError(
                f"stage weights: the head's weights server printed no certificate sha256 ({cert[:80]!r}); fix: "
                "check that the image has openssl (the server makes a per-run certificate with it)"
            )
        echo(
            f"  weights: the head's manifest lists {serving.get('entries')} entries (size and sha256 per file; "
            f"sha256 {serving['manifest_sha256'][:12]}; TLS certificate sha256 {cert[:12]})"
        )
        pulls = {
            peer.node.label: _spec(
                f"sparkforge-weights-pull-{peer.node.rank}",
                image,
                pull_args(f"https://{address}:{port}", "/weights", key, serving["manifest_sha256"], cert),
                (f"{dest}:/weights",),
                "pull",
                {"SPARKFORGE_DEADLINE_S": f"{timeout_s:g}"},
            )
            for peer in peers
        }
        by_label = {p.node.label: p for p in peers}
        for label, spec in pulls.items():
            by_label[label].remove([spec.name])
            by_label[label].start(spec)
            started.append((by_label[label], spec.name))
        return _watch(session, by_label, pulls, time.monotonic() + timeout_s, address)
    finally:
        for engine, name in started:
            engine.remove([name])


def _watch(
    session: Session,
    by_label: dict[str, NodeEngine],
    pulls: dict[str, ContainerSpec],
    end: float,
    address: str,
) -> dict[str, dict[str, Any]]:
    echo = session.echo
    done: dict[str, dict[str, Any]] = {}
    seen: dict[str, int] = {}
    while len(done) < len(pulls):
        for label, spec in pulls.items():
            if label in done:
                continue
            engine = by_label[label]
            events = json_events(engine.logs(spec.name))
            for event in events[seen.get(label, 0) :]:
                if event.get("event") == "progress":
                    echo(f"  weights -> {label}: {event['bytes'] / 1e9:.2f} of {event['total'] / 1e9:.2f} GB")
            seen[label] = len(events)
            state = engine.state(spec.name)
            if state.status in ("exited", "dead", "missing"):
                last = events[-1] if events else {}
                if state.exit_code != 0 or last.get("event") != "done":
                    kept = keep_logs([engine], [spec.name])
                    error = last.get("error") or engine.logs(spec.name, tail=4).strip()[-500:]
                    raise RunError(
                        f"stage weights: streaming the weights from the head ({address}) to {label} stopped: "
                        f"{error}; logs kept in {kept}; fix: rerun (the transfer resumes where it stopped) or "
                        "check the link with 'invoke cluster.doctor'"
                    )
                done[label] = last
                rate = last["moved"] / 1e6 / max(last["seconds"], 1e-3)
                echo(
                    f"  weights on {label}: {last['bytes'] / 1e9:.2f} GB ({last['moved'] / 1e9:.2f} GB moved, "
                    f"{last['resumed']} files resumed) in {last['seconds']:.1f} s, {rate:.0f} MB/s"
                )
        if time.monotonic() > end and len(done) < len(pulls):
            raise RunError(
                f"stage weights: the transfer to {', '.join(sorted(set(pulls) - set(done)))} did not finish in "
                "time; fix: rerun (it resumes) or pass --model-dir with the model already on every node"
            )
        if len(done) < len(pulls):
            time.sleep(1)
    return done
