"""The two programs `--weights shared` runs inside the image (standard library only): the head's weight server
and a peer's puller. Kept as text here so that sparkforge/run/weights/weightstream.py only plans and watches them, and
so that tests run the very same programs on the host against hostile peers and servers.

The server: the manifest (size and sha256 of every file, links with their targets) computed once per snapshot
and cached beside the HF cache; printed as a JSON event that sparkforge reads over the node's control channel
(the engine's logs), never served over HTTP. It serves only the manifest's regular files, opened without
following links, to requests carrying the per-launch secret in a header; strict paths and Range headers (4xx,
never a traceback); at most MAX_CLIENTS connections, each dropped after IDLE_S seconds of silence.

The puller: takes the manifest from its argument (the control channel), refuses `..`, absolute paths, links
that leave the folder or point at no manifest file, and never writes through a link planted in the folder;
each file is written to a part file, read at most to the manifest's size, checked against its sha256, and only
then renamed into place (resumable: a part is re-hashed before it is continued).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

SECRET_HEADER = "X-Sparkforge-Secret"

SERVE_SCRIPT = r"""
import hashlib, hmac, http.server, json, os, re, socket, stat, sys, threading, urllib.parse
root, host, port, secret, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
IDLE_S = float(os.environ.get("SPARKFORGE_IDLE_S", "30"))
MAX_CLIENTS = int(os.environ.get("SPARKFORGE_MAX_CLIENTS", "16"))
SKIP = (".incomplete", ".lock", ".sparkforge-part")
def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
def manifest():
    cached = {}
    try:
        with open(cache) as handle:
            cached = {e["path"]: e for e in json.load(handle) if "sha256" in e}
    except (OSError, ValueError, KeyError, TypeError):
        cached = {}
    out = []
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != ".sparkforge-part")  # a peer's parts, on a shared cache
        for entry in sorted(files + [d for d in dirs if os.path.islink(os.path.join(base, d))]):
            full = os.path.join(base, entry)
            rel = os.path.relpath(full, root)
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                out.append({"path": rel, "link": os.readlink(full)})
            elif stat.S_ISREG(info.st_mode) and not entry.endswith(SKIP):
                old = cached.get(rel, {})
                same = old.get("size") == info.st_size and old.get("mtime_ns") == info.st_mtime_ns
                digest = old["sha256"] if same else sha256(full)
                out.append({"path": rel, "size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": digest})
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache + ".tmp", "w") as handle:
            json.dump(out, handle)
        os.replace(cache + ".tmp", cache)
    except OSError:
        pass  # a read-only cache: computed again next time
    return out
entries = manifest()
files = {e["path"]: e for e in entries if "sha256" in e}
RANGE = re.compile(r"bytes=([0-9]{1,15})-")
class Handler(http.server.BaseHTTPRequestHandler):
    timeout = IDLE_S
    protocol_version = "HTTP/1.0"
    default_request_version = "HTTP/1.0"  # a garbage request line still gets a status line
    def log_message(self, *args):
        pass
    def refuse(self, code):
        try:
            self.send_response(code); self.send_header("Content-Length", "0"); self.end_headers()
        except OSError:
            pass
    def do_GET(self):
        given = self.headers.get("X-Sparkforge-Secret", "")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), secret.encode()):
            return self.refuse(403)
        if not self.path.startswith("/file/") or "?" in self.path or "#" in self.path:
            return self.refuse(404)
        try:
            rel = urllib.parse.unquote(self.path[len("/file/"):], errors="strict")
        except UnicodeDecodeError:
            return self.refuse(400)
        entry = files.get(rel)
        if entry is None:
            return self.refuse(404)
        wanted = self.headers.get("Range", "bytes=0-")
        match = RANGE.fullmatch(wanted)
        if match is None or int(match.group(1)) > entry["size"]:
            return self.refuse(416)
        start = int(match.group(1))
        try:
            fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return self.refuse(404)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size != entry["size"]:
                return self.refuse(409)
            handle.seek(start)
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(entry["size"] - start)); self.end_headers()
            left = entry["size"] - start
            while left > 0 and (chunk := handle.read(min(1 << 22, left))):
                self.wfile.write(chunk); left -= len(chunk)
    def do_POST(self):
        self.refuse(405)
    do_PUT = do_DELETE = do_HEAD = do_POST
class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    slots = threading.BoundedSemaphore(MAX_CLIENTS)
    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
            return self.shutdown_request(request)
        request.settimeout(IDLE_S)
        super().process_request(request, client_address)
    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
    def handle_error(self, request, client_address):
        pass  # a peer that hangs up or sends garbage: no traceback, the connection is closed
server = Server((host, port), Handler)
print(json.dumps({"event": "serving", "address": f"{host}:{server.server_address[1]}", "files": len(files),
                  "manifest": [{k: v for k, v in e.items() if k != "mtime_ns"} for e in entries]}), flush=True)
server.serve_forever()
"""

PULL_SCRIPT = r"""
import hashlib, json, os, posixpath, stat, sys, time, urllib.error, urllib.parse, urllib.request
base, dest, secret, entries = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
every = float(os.environ.get("SPARKFORGE_PROGRESS_S", "2"))
fetch = urllib.request.build_opener(urllib.request.ProxyHandler({})).open  # the link is direct: never a proxy
start = last = time.monotonic(); moved = done = resumed = 0
def report(event, **more):
    print(json.dumps({"event": event, "bytes": done, "total": total, "moved": moved, "resumed": resumed,
                      "seconds": round(time.monotonic() - start, 2), **more}), flush=True)
def fail(message):
    report("failed", error=message); sys.exit(1)
def clean(rel):
    # A manifest path: relative, normalised, no '..', no NUL or control characters, not the part folder.
    if not isinstance(rel, str) or not rel or rel.startswith("/") or any(ord(c) < 32 for c in rel):
        return None
    norm = posixpath.normpath(rel)
    if norm != rel or norm == "." or norm.split("/")[0] in ("..", ".sparkforge-part") or "/../" in "/" + norm:
        return None
    return norm
total = 0
files, links = {}, {}
for entry in entries if isinstance(entries, list) else [None]:
    rel = clean(entry.get("path")) if isinstance(entry, dict) else None
    if rel is None:
        fail(f"manifest entry {str(entry)[:200]!r}: not a relative path inside the model folder; nothing written")
    if "link" in entry:
        target = entry["link"]
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target)) if isinstance(target, str) else ""
        if not isinstance(target, str) or target.startswith("/") or resolved.startswith("..") or resolved == ".":
            fail(f"{rel}: link to {str(target)[:200]!r} leaves the model folder; nothing written")
        links[rel] = (target, resolved)
    else:
        size, digest = entry.get("size"), entry.get("sha256")
        if not isinstance(size, int) or size < 0 or not isinstance(digest, str) or len(digest) != 64:
            fail(f"{rel}: the manifest gives no size and sha256; nothing written")
        files[rel] = (size, digest)
        total += size
for rel, (target, resolved) in links.items():
    if resolved not in files:
        fail(f"{rel}: link to {target!r} points at no file of the manifest; nothing written")
def real_dir(rel):
    # Every folder from dest down to rel is a real folder (created here), never a link planted in dest.
    path = dest
    for part in [p for p in rel.split("/") if p]:
        path = os.path.join(path, part)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path, 0o755); continue
        if not stat.S_ISDIR(info.st_mode):
            fail(f"{path} is a link or a file where the manifest has a folder; nothing written through it")
    return path
def hashed(path, limit):
    digest, size = hashlib.sha256(), 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        while size < limit and (chunk := handle.read(min(1 << 22, limit - size))):
            digest.update(chunk); size += len(chunk)
    return digest, size
os.makedirs(dest, exist_ok=True)  # the mount point in the image; a fresh folder on a host run
parts = real_dir(".sparkforge-part")
for rel, (size, want) in sorted(files.items()):
    folder = real_dir(posixpath.dirname(rel))
    target = os.path.join(folder, posixpath.basename(rel))
    try:
        info = os.lstat(target)
        if stat.S_ISREG(info.st_mode) and info.st_size == size and hashed(target, size)[0].hexdigest() == want:
            done += size
            continue
    except FileNotFoundError:
        pass
    part = os.path.join(parts, want)
    try:
        info = os.lstat(part)
        if not stat.S_ISREG(info.st_mode) or info.st_size > size:
            os.remove(part); raise FileNotFoundError
        digest, have = hashed(part, size)
    except FileNotFoundError:
        digest, have = hashlib.sha256(), 0
    resumed += bool(have); done += have
    request = urllib.request.Request(base + "/file/" + urllib.parse.quote(rel),
                                     headers={"Range": f"bytes={have}-", "X-Sparkforge-Secret": secret})
    try:
        with fetch(request, timeout=60) as response:
            if have and response.status != 206:
                digest, done, have = hashlib.sha256(), done - have, 0  # the server restarted the file
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if have else os.O_TRUNC), 0o644)
            with os.fdopen(fd, "ab" if have else "wb") as out:
                while chunk := response.read(1 << 22):
                    if have + len(chunk) > size:
                        out.close(); os.remove(part)
                        fail(f"{rel}: the server sent more than the manifest's {size} bytes; refused, nothing kept")
                    out.write(chunk); digest.update(chunk); have += len(chunk); moved += len(chunk); done += len(chunk)
                    if time.monotonic() - last >= every:
                        last = time.monotonic(); report("progress", file=rel)
    except (urllib.error.URLError, OSError) as exc:
        fail(f"{rel}: {exc}")
    if have != size:
        fail(f"{rel}: {have} of {size} bytes arrived")
    if digest.hexdigest() != want:
        os.remove(part)
        fail(f"{rel}: sha256 {digest.hexdigest()} is not the head's {want}: refused, nothing kept")
    os.replace(part, target)
for rel, (target, _) in sorted(links.items()):
    folder = real_dir(posixpath.dirname(rel))
    path = os.path.join(folder, posixpath.basename(rel))
    if os.path.islink(path) and os.readlink(path) == target:
        continue
    if os.path.lexists(path) and not os.path.islink(path) and not os.path.isfile(path):
        fail(f"{path}: a folder where the manifest has a link")
    temporary = os.path.join(parts, "link-" + hashlib.sha256(rel.encode()).hexdigest())
    if os.path.lexists(temporary):
        os.remove(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)
report("done")
"""


def serve_args(root: str, host: str, port: int, secret: str, cache: str) -> tuple[str, ...]:
    """`python3` arguments of the head's server: the folder, where it listens, the secret, the manifest cache file."""
    return ("-c", SERVE_SCRIPT, root, host, str(port), secret, cache)


def pull_args(base: str, dest: str, secret: str, manifest: Sequence[object]) -> tuple[str, ...]:
    """`python3` arguments of a peer's puller: the server's URL, the folder, the secret, the head's manifest."""
    return ("-c", PULL_SCRIPT, base, dest, secret, json.dumps(manifest))
