"""`--weights shared`: the head downloads once; its model folder is streamed to every peer over the fabric link.

A throwaway container of the image on the head serves the folder (read-only, bound to the head's link address,
a per-run token in every request); one on each peer pulls it into that node's cache: files by size with HTTP
ranges, so an interrupted transfer resumes where it stopped (`NAME.sparkforge-part`), symlinks (the Hugging Face
cache's snapshots/) recreated, progress as JSON lines. Standard library only, inside the image.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from sparkforge.errors import RunError
from sparkforge.run.nodes import LABEL, ContainerSpec, NodeEngine
from sparkforge.run.postmortem import keep_logs

PORT = 29531
_SERVE = r"""
import http.server, json, os, sys, urllib.parse
root, host, port, token = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
real = os.path.realpath(root)
def manifest():
    out = []
    for base, dirs, files in os.walk(root):
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(base, d))]):
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out.append({"path": rel, "link": os.readlink(full)})
            elif not name.endswith((".incomplete", ".lock", ".sparkforge-part")):
                out.append({"path": rel, "size": os.path.getsize(full)})
    return out
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_GET(self):
        path, _, query = self.path.partition("?")
        if urllib.parse.parse_qs(query).get("token") != [token]:
            return self.send_error(403)
        if path == "/manifest":
            body = json.dumps(manifest()).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            return self.wfile.write(body)
        full = os.path.realpath(os.path.join(root, urllib.parse.unquote(path.removeprefix("/file/"))))
        if not full.startswith(real + os.sep) or not os.path.isfile(full):
            return self.send_error(404)
        size = os.path.getsize(full)
        start = int(self.headers.get("Range", "bytes=0-").removeprefix("bytes=").split("-")[0] or 0)
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(size - start)); self.end_headers()
        with open(full, "rb") as handle:
            handle.seek(start)
            while chunk := handle.read(1 << 22):
                self.wfile.write(chunk)
server = http.server.ThreadingHTTPServer((host, port), Handler)
print(json.dumps({"event": "serving", "address": f"{host}:{port}", "files": len(manifest())}), flush=True)
server.serve_forever()
"""
_PULL = r"""
import json, os, sys, time, urllib.parse, urllib.request
base, dest, token = sys.argv[1], sys.argv[2], sys.argv[3]
every = float(os.environ.get("SPARKFORGE_PROGRESS_S", "2"))
q = "?token=" + urllib.parse.quote(token)
fetch = urllib.request.build_opener(urllib.request.ProxyHandler({})).open  # the link is direct: never a proxy
entries = json.loads(fetch(base + "/manifest" + q, timeout=60).read())
total = sum(e.get("size", 0) for e in entries)
start = last = time.monotonic(); moved = done = resumed = 0
def report(event, **more):
    print(json.dumps({"event": event, "bytes": done, "total": total, "moved": moved, "resumed": resumed,
                      "seconds": round(time.monotonic() - start, 2), **more}), flush=True)
for entry in sorted(entries, key=lambda e: "link" in e):
    target = os.path.join(dest, entry["path"])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if "link" in entry:
        if os.path.islink(target) and os.readlink(target) == entry["link"]:
            continue
        if os.path.lexists(target):
            os.remove(target)
        os.symlink(entry["link"], target)
        continue
    if os.path.isfile(target) and not os.path.islink(target) and os.path.getsize(target) == entry["size"]:
        done += entry["size"]
        continue
    part = target + ".sparkforge-part"
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    have = have if have <= entry["size"] else 0
    resumed += bool(have)
    done += have
    request = urllib.request.Request(base + "/file/" + urllib.parse.quote(entry["path"]) + q,
                                     headers={"Range": f"bytes={have}-"})
    with fetch(request, timeout=60) as response, open(part, "ab" if have else "wb") as out:
        while chunk := response.read(1 << 22):
            out.write(chunk); moved += len(chunk); done += len(chunk)
            if time.monotonic() - last >= every:
                last = time.monotonic(); report("progress", file=entry["path"])
    if os.path.getsize(part) != entry["size"]:
        report("failed", error=f"{entry['path']}: {os.path.getsize(part)} of {entry['size']} bytes arrived")
        sys.exit(1)
    os.replace(part, target)
report("done")
"""


def _spec(name: str, image: str, script: str, args: Sequence[str], mount: str, role: str) -> ContainerSpec:
    return ContainerSpec(
        name=name,
        image=image,
        entrypoint="python3",
        args=("-c", script, *args),
        env={"PYTHONUNBUFFERED": "1"},
        labels={LABEL: "weights", f"{LABEL}.weights": role},
        mounts=(mount,),
    )


def json_events(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a container's log (progress events), other lines skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def share_weights(
    head: NodeEngine,
    peers: Sequence[NodeEngine],
    image: str,
    address: str,
    source: str,
    dest: str,
    *,
    echo: Callable[[str], None],
    port: int = PORT,
    timeout_s: float = 3600,
) -> dict[str, dict[str, Any]]:
    """Stream `source` (a folder on the head) into `dest` on every peer through `address:port`; per peer the
    final event (bytes, moved, resumed, seconds). RunError names the node, what stopped and the fix."""
    token = secrets.token_hex(16)
    server = _spec(
        "sparkforge-weights-serve", image, _SERVE, ("/weights", address, str(port), token),
        f"{source}:/weights:ro", "serve",
    )  # fmt: skip
    pulls = {
        peer.node.label: _spec(
            f"sparkforge-weights-pull-{peer.node.rank}",
            image,
            _PULL,
            (f"http://{address}:{port}", "/weights", token),
            f"{dest}:/weights",
            "pull",
        )
        for peer in peers
    }
    started: list[tuple[NodeEngine, str]] = []
    try:
        head.remove([server.name])
        head.start(server)
        started.append((head, server.name))
        end = time.monotonic() + 60
        while not any(e.get("event") == "serving" for e in json_events(head.logs(server.name))):
            if head.state(server.name).status != "running" or time.monotonic() > end:
                tail = head.logs(server.name, tail=5).strip()[-400:]
                raise RunError(
                    f"stage weights: the head's weights server did not start on {address}:{port} ({tail}); fix: "
                    "free that port on the head or check that the address is the head's link address"
                )
            time.sleep(0.5)
        by_label = {p.node.label: p for p in peers}
        for label, spec in pulls.items():
            by_label[label].remove([spec.name])
            by_label[label].start(spec)
            started.append((by_label[label], spec.name))
        return _watch(by_label, pulls, echo, time.monotonic() + timeout_s, address)
    finally:
        for engine, name in started:
            engine.remove([name])


def _watch(
    by_label: dict[str, NodeEngine],
    pulls: dict[str, ContainerSpec],
    echo: Callable[[str], None],
    end: float,
    address: str,
) -> dict[str, dict[str, Any]]:
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
