"""The two programs `--weights shared` runs inside the image (standard library only): the head's weight server
and a peer's puller. Kept as text here so that sparkforge/run/weights/weightstream.py only plans and watches them, and
so that tests run the very same programs on the host against hostile peers and servers.

Who may read: the owner only. A per-run key reaches the head's server and every puller through sparkforge, and is
never sent over the link. The puller first asks `/hello` with a fresh nonce; the head answers with a nonce of its
own (bound to the asking address) and the HMAC of both nonces and the address it listens on. Only a server that
proves the key this way gets anything from the puller: per request, an HMAC of the head's nonce, a sequence number
(the head refuses one used before: a captured request cannot be replayed) and the request's target and range.

The server: the manifest (size and sha256 of every file, links with their targets) computed once per snapshot and
cached beside the HF cache; its sha256 printed as a JSON event that sparkforge reads over the node's control
channel (the engine's logs); the document itself served to a proven peer at `/manifest`. It serves only the
manifest's regular files, opened without following links; strict paths and Range headers (4xx, never a
traceback); the request head must arrive whole within HEAD_S of the connect (a dripping client is cut off); a
client address not yet proven holds at most PER_ADDRESS connections, so unproven clients never take the slots of
the proven peers (MAX_CLIENTS transfers). All unproven connections together hold at most MAX_UNPROVEN: when a new
one would pass it, the oldest waiting connection of the address holding the most is cut, never the newcomer
refused. A flood from any number of addresses then cannot starve the owner's puller, which sends its request
the moment it connects and holds one connection: the flood's own connections are cut first.

TLS (as share_weights runs them): the server makes a per-run self-signed certificate at start (the image's
`openssl`; its key never leaves the container) and prints its sha256 beside the manifest's on the control channel;
sparkforge passes it to each puller, which completes the handshake, compares the certificate's sha256 with it and
sends nothing to any other. The handshake and the request head share HEAD_S. (Without a fingerprint both
programs speak plain HTTP: the HMAC layer on its own, as the hostile-head tests exercise it.)

The puller: proves the head, fetches the manifest and checks it against the sha256 sparkforge passed (64 hex
characters on its command line, whatever the model's file count), reads it as strict JSON and validates every
entry (relative paths inside the folder, hex sha256, integer sizes, no path twice, no path both a file and a
folder, links only to manifest files) before anything is written, by the boundary's own functions
(boundary.loads_strict, check_manifest: their source travels in the program, `program`); never follows a redirect; one total deadline (SPARKFORGE_DEADLINE_S) over
everything the server does, each read and connect bounded too; never writes through a link planted in the folder;
each file is written to a part file named by its sha256, read at most to the manifest's size, checked, and only
then renamed into place (resumable: a part is re-hashed before it is continued).
"""

from __future__ import annotations

import functools

from sparkforge.boundary import portable_source

AUTH_HEADER = "X-Sparkforge-Auth"  # a peer's per-request proof

SERVE_SCRIPT = r"""
import hashlib, hmac, json, os, re, secrets, socket, stat, sys, threading, time, urllib.parse
root, host, port, key, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode(), sys.argv[5]
tls = sys.argv[6:] == ["tls"]
IDLE_S = float(os.environ.get("SPARKFORGE_IDLE_S", "30"))  # a proven peer's silence before it is dropped
HEAD_S = float(os.environ.get("SPARKFORGE_HEAD_S", "5"))  # the whole request head, from connect to blank line
MAX_CLIENTS = int(os.environ.get("SPARKFORGE_MAX_CLIENTS", "16"))  # proven transfers at once
PER_ADDRESS = int(os.environ.get("SPARKFORGE_PER_ADDRESS", "4"))  # unproven connections of one address
MAX_UNPROVEN = int(os.environ.get("SPARKFORGE_MAX_UNPROVEN", "64"))  # unproven connections of all addresses
SKIP = (".incomplete", ".lock", ".sparkforge-part")
HEX64 = re.compile(r"[0-9a-f]{64}")
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
            cached = {e["path"]: e for e in loads_strict(handle.read()) if HEX64.fullmatch(str(e.get("sha256")))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
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
document = json.dumps([{k: v for k, v in e.items() if k != "mtime_ns"} for e in entries]).encode()
def mac(*parts):
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()
lock = threading.Lock()
# pending: connection id -> [address, socket, cut]: unproven connections whose request is awaited.
pending, proven, known, last_seq, ids = {}, [0], set(), {}, [0]
RANGE = re.compile(r"bytes=([0-9]{1,15})-")
AUTH = re.compile(r"([0-9a-f]{64}) ([0-9]{1,15}) ([0-9a-f]{64})")
NONCE = re.compile(r"[0-9a-f]{64}")
def reply(sock, code, headers=(), body=b""):
    head = f"HTTP/1.0 {code} {dict(((200, 'OK'), (206, 'Partial Content'))).get(code, 'Refused')}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers) + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    try:
        sock.sendall(head.encode() + body)
    except OSError:
        pass
def read_head(sock, began):
    # The request line and headers within HEAD_S of the connect, at most 8 KiB: a dripping client is cut off.
    end, data = began + HEAD_S, b""
    while b"\r\n\r\n" not in data:
        left = end - time.monotonic()
        if left <= 0 or len(data) > 8192:
            return None
        sock.settimeout(left)
        chunk = sock.recv(4096)
        if not chunk:
            return None
        data += chunk
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return ()
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            return ()
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers
def session_nonce(address):
    r = secrets.token_hex(16)
    return r + mac("nonce", r, address)[:32]
def proven_by(address, target, headers):
    # The peer's proof for this one request: the head's nonce (bound to its address), a sequence number never
    # used before with that nonce, and the HMAC of both with the target and range under the per-run key.
    match = AUTH.fullmatch(headers.get("x-sparkforge-auth", ""))
    if match is None:
        return False
    nonce, seq, proof = match.groups()
    if not hmac.compare_digest(nonce[32:], mac("nonce", nonce[:32], address)[:32]):
        return False
    if not hmac.compare_digest(proof, mac("peer", nonce, seq, target, headers.get("range", ""))):
        return False
    with lock:
        if int(seq) <= last_seq.get(nonce, -1):
            return False  # a replay
        last_seq[nonce] = int(seq)
        known.add(address)
    return True
def send_file(sock, rel, headers):
    entry = files.get(rel)
    if entry is None:
        return reply(sock, 404)
    match = RANGE.fullmatch(headers.get("range", "bytes=0-"))
    if match is None or int(match.group(1)) > entry["size"]:
        return reply(sock, 416)
    start = int(match.group(1))
    try:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return reply(sock, 404)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size != entry["size"]:
            return reply(sock, 409)
        handle.seek(start)
        left = entry["size"] - start
        sock.sendall(f"HTTP/1.0 {206 if start else 200} OK\r\nContent-Length: {left}\r\nConnection: close\r\n\r\n".encode())
        while left > 0 and (chunk := handle.read(min(1 << 22, left))):
            sock.sendall(chunk); left -= len(chunk)
def waiting(address=None):
    return sum(1 for a, _, cut in pending.values() if not cut and address in (None, a))
def make_room():
    # The oldest waiting connection of the address holding the most is cut (lock held): a flood of many
    # addresses loses its own connections first; a peer that sent its request at once is not kept out.
    counts = {}
    for a, _, cut in pending.values():
        if not cut:
            counts[a] = counts.get(a, 0) + 1
    most = max(counts.values())
    victim = next(entry for entry in pending.values() if not entry[2] and counts[entry[0]] == most)
    victim[2] = True
    try:
        victim[1].shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
def handshake(sock, cid):
    # TLS within HEAD_S of the connect, however slowly the client drips it: a twin of the socket cuts it.
    twin = sock.dup()
    with lock:
        if cid in pending:
            pending[cid][1] = twin
    def cut():
        try:
            twin.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    timer = threading.Timer(HEAD_S, cut)
    timer.daemon = True
    timer.start()
    try:
        sock.settimeout(HEAD_S)
        return context.wrap_socket(sock, server_side=True), twin
    finally:
        timer.cancel()
def handle(sock, address, cid):
    counted, twin, began = True, None, time.monotonic()
    try:
        if context is not None:
            sock, twin = handshake(sock, cid)
        request = read_head(sock, began)
        if request is None:
            return reply(sock, 408)
        if request == ():
            return reply(sock, 400)
        method, target, headers = request
        if method != "GET":
            return reply(sock, 405)
        if target == "/hello":
            # The head proves itself first: the HMAC of the peer's fresh nonce, its own and the address it
            # listens on. A spoofer without the key cannot answer; a relay to the real head signs another address.
            nonce = headers.get("x-sparkforge-nonce", "")
            if not NONCE.fullmatch(nonce):
                return reply(sock, 400)
            mine = session_nonce(address)
            proof = mac("head", nonce, mine, f"{host}:{server.getsockname()[1]}")
            return reply(sock, 200, (("X-Sparkforge-Nonce", mine), ("X-Sparkforge-Proof", proof)))
        if not proven_by(address, target, headers):
            return reply(sock, 403)
        with lock:
            pending.pop(cid, None)
            counted = False
            if proven[0] >= MAX_CLIENTS:
                return reply(sock, 503)
            proven[0] += 1
        try:
            sock.settimeout(IDLE_S)
            if target == "/manifest":
                return reply(sock, 200, (("Content-Type", "application/json"),), document)
            if not target.startswith("/file/") or "?" in target or "#" in target:
                return reply(sock, 404)
            try:
                rel = urllib.parse.unquote(target[len("/file/"):], errors="strict")
            except UnicodeDecodeError:
                return reply(sock, 400)
            return send_file(sock, rel, headers)
        finally:
            with lock:
                proven[0] -= 1
    except OSError:
        pass  # a peer that hangs up or stalls: the connection is closed, no traceback
    finally:
        if counted:
            with lock:
                pending.pop(cid, None)
        for each in (sock, twin):
            try:
                each.close() if each is not None else None
            except OSError:
                pass
context, cert_sha256 = None, ""
if tls:
    import ssl, subprocess, tempfile
    with tempfile.TemporaryDirectory() as folder:  # the key lives in memory once loaded; the files go
        cert, pem_key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        try:
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                            "-nodes", "-keyout", pem_key, "-out", cert, "-days", "2", "-subj", "/CN=sparkforge-weights"],
                           check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            print(json.dumps({"event": "failed", "error": f"no per-run certificate (openssl in the image): {exc}"}),
                  flush=True)
            sys.exit(1)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, pem_key)
        with open(cert) as handle_:
            cert_sha256 = hashlib.sha256(ssl.PEM_cert_to_DER_cert(handle_.read())).hexdigest()
server = socket.create_server((host, port), backlog=128)
print(json.dumps({"event": "serving", "address": f"{host}:{server.getsockname()[1]}", "files": len(files),
                  "entries": len(entries), "manifest_sha256": hashlib.sha256(document).hexdigest(),
                  **({"cert_sha256": cert_sha256} if tls else {})}), flush=True)
while True:
    try:
        sock, peer = server.accept()
    except OSError:
        continue
    address = peer[0]
    with lock:
        full = waiting(address) >= PER_ADDRESS
        if not full:
            # The total: an address that has proven the key once is not held to it; for the others room is
            # made by cutting the flood's oldest, never by refusing the newcomer.
            if address not in known and waiting() >= MAX_UNPROVEN:
                make_room()
            ids[0] += 1
            cid = ids[0]
            pending[cid] = [address, sock, False]
    if full:
        # Per address: unproven clients of one address never hold more than PER_ADDRESS connections.
        sock.settimeout(1)
        reply(sock, 503)
        sock.close()
        continue
    threading.Thread(target=handle, args=(sock, address, cid), daemon=True).start()
"""

PULL_SCRIPT = r"""
import hashlib, hmac, http.client, json, os, posixpath, re, secrets, stat, sys, threading, time, urllib.parse
base, dest, key, want = sys.argv[1], sys.argv[2], sys.argv[3].encode(), sys.argv[4]
pin = sys.argv[5] if len(sys.argv) > 5 else ""  # the sha256 of the head's per-run certificate: TLS
every = float(os.environ.get("SPARKFORGE_PROGRESS_S", "2"))
DEADLINE_S = float(os.environ.get("SPARKFORGE_DEADLINE_S", "3600"))  # the whole transfer, whatever the server does
IO_S = float(os.environ.get("SPARKFORGE_IO_S", "60"))  # one silent read or connect
MAX_MANIFEST = 64 << 20
HEX64 = re.compile(r"[0-9a-f]{64}")
start = last = time.monotonic(); moved = done = resumed = total = 0
def report(event, **more):
    print(json.dumps({"event": event, "bytes": done, "total": total, "moved": moved, "resumed": resumed,
                      "seconds": round(time.monotonic() - start, 2), **more}), flush=True)
def fail(message):
    report("failed", error=message); sys.stdout.flush(); os._exit(1)
def expire():
    fail(f"the transfer did not finish within its deadline of {DEADLINE_S:g} s; the parts are kept (resumable)")
watchdog = threading.Timer(DEADLINE_S, expire); watchdog.daemon = True; watchdog.start()
url = urllib.parse.urlsplit(base)
scheme = "https" if pin else "http"
if url.scheme != scheme or not url.hostname or url.port is None or url.path or url.query or not HEX64.fullmatch(want) or (pin and not HEX64.fullmatch(pin)):
    fail(f"{base!r}: not {scheme}://HOST:PORT with the manifest's sha256 (and, for https, the certificate's); nothing asked")
context = None
if pin:
    import ssl
    # The certificate is the run's own, self-signed: no CA decides; its sha256, from the control channel, does.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
dialled = f"{url.hostname}:{url.port}"
def mac(*parts):
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()
def get(target, headers):
    # One request on its own connection (headers() is called per attempt: a fresh proof each time); http.client
    # follows no redirect and reads no proxy from the environment. A busy head (503) is asked again.
    for attempt in range(60):
        if context is None:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=IO_S)
        else:
            conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=IO_S, context=context)
        try:
            conn.connect()
            seen = hashlib.sha256(conn.sock.getpeercert(binary_form=True) or b"").hexdigest() if pin else ""
            if not hmac.compare_digest(seen, pin):
                conn.close()
                fail(f"the server at {dialled} presented a certificate with sha256 {seen[:16]}..., not this run's "
                     f"{pin[:16]}...: it is not the head; nothing was sent")
            conn.request("GET", target, headers=headers())
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            fail(f"{target}: {exc.__class__.__name__}: {exc}")
        if response.status != 503:
            return conn, response
        conn.close(); time.sleep(min(0.05 * 2 ** attempt, 2))
    fail(f"{target}: the server stayed busy (503)")
def refused(target, response):
    if 300 <= response.status < 400:
        return f"{target}: the server answered {response.status} (a redirect): refused, never followed"
    return f"{target}: the server answered {response.status}"
# The head proves itself before anything secret is sent: an HMAC, under the per-run key, of our fresh nonce, its
# nonce and the address we dialled. Our own proofs (per request, never the key) go only to a server that passed.
ours = secrets.token_hex(32)
conn, response = get("/hello", lambda: {"X-Sparkforge-Nonce": ours})
session, proof = response.getheader("X-Sparkforge-Nonce", ""), response.getheader("X-Sparkforge-Proof", "")
conn.close()
if response.status != 200 or not HEX64.fullmatch(session) or not hmac.compare_digest(proof, mac("head", ours, session, dialled)):
    fail(f"the server at {dialled} did not prove it holds this run's key (answer {response.status}): it is not "
         "the head; nothing secret was sent")
seq = [0]
def authed(target, rng=""):
    def headers():
        seq[0] += 1
        out = {"X-Sparkforge-Auth": f"{session} {seq[0]} {mac('peer', session, str(seq[0]), target, rng)}"}
        return {**out, "Range": rng} if rng else out
    return get(target, headers)
# The manifest travels as a document of its own, checked against the sha256 the head printed on the control channel.
conn, response = authed("/manifest")
if response.status != 200:
    fail(refused("/manifest", response))
raw = response.read(MAX_MANIFEST + 1); conn.close()
if len(raw) > MAX_MANIFEST or hashlib.sha256(raw).hexdigest() != want:
    fail(f"the manifest's sha256 is not the {want} the head printed; nothing written")
# The boundary's own rules (shipped above this program's text): strict JSON, then every entry checked.
try:
    files, links = check_manifest(loads_strict(raw.decode("utf-8")))
except (ValueError, RecursionError) as exc:
    fail(f"{str(exc)[:300]}; nothing written")
total = sum(size for size, _ in files.values())
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
for rel, (size, want_file) in sorted(files.items()):
    folder = real_dir(posixpath.dirname(rel))
    target = os.path.join(folder, posixpath.basename(rel))
    try:
        info = os.lstat(target)
        if stat.S_ISREG(info.st_mode) and info.st_size == size and hashed(target, size)[0].hexdigest() == want_file:
            done += size
            continue
    except FileNotFoundError:
        pass
    part = os.path.join(parts, want_file)
    try:
        info = os.lstat(part)
        if not stat.S_ISREG(info.st_mode) or info.st_size > size:
            os.remove(part); raise FileNotFoundError
        digest, have = hashed(part, size)
    except FileNotFoundError:
        digest, have = hashlib.sha256(), 0
    resumed += bool(have); done += have
    path = "/file/" + urllib.parse.quote(rel)
    conn, response = authed(path, f"bytes={have}-")
    try:
        if response.status not in (200, 206):
            fail(refused(path, response))
        if have and response.status != 206:
            digest, done, have = hashlib.sha256(), done - have, 0  # the server restarted the file
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if have else os.O_TRUNC), 0o644)
        with os.fdopen(fd, "ab" if have else "wb") as out:
            while chunk := response.read(min(1 << 22, size - have + 1)):
                if have + len(chunk) > size:
                    out.close(); os.remove(part)
                    fail(f"{rel}: the server sent more than the manifest's {size} bytes; refused, nothing kept")
                out.write(chunk); digest.update(chunk); have += len(chunk); moved += len(chunk); done += len(chunk)
                if time.monotonic() - last >= every:
                    last = time.monotonic(); report("progress", file=rel)
    except (OSError, http.client.HTTPException) as exc:
        fail(f"{rel}: {exc.__class__.__name__}: {exc}")
    finally:
        conn.close()
    if have != size:
        fail(f"{rel}: {have} of {size} bytes arrived")
    if digest.hexdigest() != want_file:
        os.remove(part)
        fail(f"{rel}: sha256 {digest.hexdigest()} is not the head's {want_file}: refused, nothing kept")
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


@functools.cache
def program(script: str) -> str:
    """`script` after the boundary's portable rules (boundary.portable_source): the image has no sparkforge, so
    the very functions the host runs travel in the program's text."""
    return f"from __future__ import annotations\nimport json, math, posixpath\n{portable_source()}\n{script}"


def serve_args(root: str, host: str, port: int, key: str, cache: str, *, tls: bool = True) -> tuple[str, ...]:
    """`python3` arguments of the head's server: the folder, where it listens, the per-run key, the manifest cache;
    `tls`: a per-run certificate, its sha256 printed in the `serving` event."""
    return ("-c", program(SERVE_SCRIPT), root, host, str(port), key, cache, *(("tls",) if tls else ()))


def pull_args(base: str, dest: str, key: str, manifest_sha256: str, cert_sha256: str = "") -> tuple[str, ...]:
    """`python3` arguments of a peer's puller: the server's URL, the folder, the per-run key and the sha256 of the
    manifest the head printed (the manifest itself is fetched from the proven head and checked against it); with
    `cert_sha256` (an https:// URL), the only certificate it talks to."""
    return (
        "-c",
        program(PULL_SCRIPT),
        base,
        dest,
        key,
        manifest_sha256,
        *((cert_sha256,) if cert_sha256 else ()),
    )
