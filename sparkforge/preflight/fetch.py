"""Network and cache for upstream facts: HTTP with retries, sha256-addressed downloads, ranged wheel reads.

Everything fetched lands under the sparkforge cache, keyed by content (sha256); every write is an
atomic rename, so concurrent runs share the cache without seeing partial files.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge.boundary import atomic_writer, parse_json, read_json, write_output
from sparkforge.context import cache_path, write_atomic
from sparkforge.errors import InputError, PreflightError
from sparkforge.urlfetch import Fetched, FetchError, HttpSession, Unreachable, fetch_url, retrying_session

_CHUNK = 1 << 20
_RANGE_BLOCK = 256 * 1024  # ranged reads fetch at least this much: a zip directory is read in few requests
MAX_ANSWER_BYTES = (
    64 << 20
)  # an index page, a config.json, a recipe: never more (PyPI's vllm index is ~2 MiB)
MAX_DOWNLOAD_BYTES = 8 << 30  # a wheel or source archive (torch's aarch64 CUDA wheel is ~3 GiB)
DOWNLOAD_DEADLINE_S = 3600.0  # a download in all, not per read: a server that drips its body is cut off


class UnreachableError(PreflightError):
    """A server did not answer (network, proxy, deadline): a check may skip, not fail, on it."""


def _preflight_error(exc: FetchError) -> PreflightError:
    return (UnreachableError if isinstance(exc, Unreachable) else PreflightError)(str(exc))


def preflight_cache(*parts: str) -> Path:
    """A path under the preflight part of the sparkforge cache (its parent exists)."""
    return cache_path("preflight", *parts)


def _session(retries: int, ca_bundle: Path | None = None) -> HttpSession:
    # The CA bundle builds use (a TLS-intercepting proxy's) is trusted for upstream facts too.
    bundle = str(ca_bundle) if ca_bundle else os.environ.get("SPARKFORGE_CA_BUNDLE")
    return retrying_session(retries, bundle, "sparkforge-preflight")


@dataclass(frozen=True)
class Fetcher:
    """HTTP access for preflight; with `offline`, only what the cache already holds is available."""

    offline: bool = False
    timeout: float = 30.0
    retries: int = 3
    session: HttpSession = field(default_factory=lambda: _session(3), compare=False, repr=False)

    def _refuse_offline(self, what: str) -> None:
        if self.offline:
            raise PreflightError(
                f"{what} is not in the cache and preflight runs offline; "
                "fix: run once with the network, or pass a local source (--source PATH)"
            )

    def get(
        self,
        url: str,
        *,
        what: str,
        headers: dict[str, str] | None = None,
        max_bytes: int = MAX_ANSWER_BYTES,
        ok_status: tuple[int, ...] = (),
    ) -> Fetched:
        """GET `url` through the one fetcher (total deadline, redirect rules, byte cap); a network failure or
        an error status is a PreflightError naming `what`."""
        self._refuse_offline(what)
        try:
            return fetch_url(
                self.session,
                url,
                what=what,
                headers=headers,
                max_bytes=max_bytes,
                deadline=self.timeout,
                ok_status=ok_status,
            )
        except FetchError as exc:
            raise _preflight_error(exc) from None

    def get_json(self, url: str, *, what: str, headers: dict[str, str] | None = None) -> Any:
        return self.json_of(self.get(url, what=what, headers=headers), what)

    def json_of(self, answer: Fetched, what: str) -> Any:
        """An answer's body as a strict JSON object (the boundary's rules), or a PreflightError naming `what`."""
        url, body = answer.url, answer.content
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise PreflightError(
                f"{what}: {url} did not answer UTF-8 JSON; fix: check the index URL"
            ) from None
        try:
            return parse_json(text, f"{what} ({url})")
        except InputError as exc:
            raise _preflight_error(exc) from None

    def download(self, url: str, *, what: str, sha256: str | None = None) -> Path:
        """The blob at `url` in the cache (downloaded once); with `sha256`, a cached copy needs no network."""
        if sha256 is not None:
            cached = preflight_cache("blobs", sha256)
            if cached.is_file():
                return cached
        self._refuse_offline(what)
        blobs = preflight_cache("blobs", "x").parent
        digest = hashlib.sha256()
        # Its name is its sha256, known at the end: streamed into a scratch folder of its own, then moved.
        scratch = scratch_dir("blobs")
        tmp = scratch / "download"
        try:
            with atomic_writer(tmp, "download") as out:

                def sink(chunk: bytes) -> None:
                    digest.update(chunk)
                    out.write(chunk)

                try:
                    fetch_url(
                        self.session,
                        url,
                        what=what,
                        max_bytes=MAX_DOWNLOAD_BYTES,
                        deadline=DOWNLOAD_DEADLINE_S,
                        sink=sink,
                    )
                except FetchError as exc:
                    raise _preflight_error(exc) from None
            actual = digest.hexdigest()
            if sha256 is not None and actual != sha256:
                raise PreflightError(
                    f"{what} from {url} has sha256 {actual}, the index says {sha256}; "
                    "fix: retry (a proxy may have altered it) or clear the cache entry"
                )
            final = blobs / actual
            os.replace(tmp, final)
            return final
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def open_remote_zip(self, url: str, size: int, *, what: str) -> zipfile.ZipFile | None:
        """A ZipFile read through HTTP range requests, or None when the server ignores ranges."""
        self._refuse_offline(what)
        try:
            probe = fetch_url(
                self.session,
                url,
                what=what,
                headers={"Range": "bytes=0-0"},
                max_bytes=_RANGE_BLOCK,
                deadline=self.timeout,
                ok_status=tuple(range(400, 600)),
            )
        except FetchError as exc:
            raise _preflight_error(exc) from None
        if probe.status_code != 206:
            return None
        raw = _RangeReader(self, url, size)
        return zipfile.ZipFile(io.BufferedReader(raw, _RANGE_BLOCK))


def hub_url() -> str:
    """The Hugging Face hub (or a mirror), as huggingface_hub reads it: $HF_ENDPOINT."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def make_fetcher(
    *, offline: bool = False, timeout: float = 30.0, retries: int = 3, ca_bundle: Path | None = None
) -> Fetcher:
    """A Fetcher with its own HTTP session (retries on 429/5xx and dropped reads); `ca_bundle`: a proxy's CA
    (default: $SPARKFORGE_CA_BUNDLE)."""
    return Fetcher(offline=offline, timeout=timeout, retries=retries, session=_session(retries, ca_bundle))


class _RangeReader(io.RawIOBase):
    """A seekable read-only file over HTTP range requests (enough for zipfile)."""

    def __init__(self, fetcher: Fetcher, url: str, size: int) -> None:
        self._fetcher, self._url, self._size, self._pos = fetcher, url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            return 0
        end = min(self._size, self._pos + len(buffer)) - 1
        response = self._fetcher.get(
            self._url,
            what="a byte range of a wheel",
            headers={"Range": f"bytes={self._pos}-{end}"},
            max_bytes=end + 1 - self._pos,
        )
        data = response.content
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


# ---- small JSON records: what a floating key (URL, index query) resolved to ----------------------


def record_path(key: str) -> Path:
    return preflight_cache("records", hashlib.sha256(key.encode()).hexdigest() + ".json")


def read_record(key: str) -> dict[str, Any] | None:
    path = record_path(key)
    if not path.is_file():
        return None
    try:
        data = read_json(path, "a preflight cache record", max_bytes=1 << 20)
    except InputError:
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def write_record(key: str, data: dict[str, Any]) -> None:
    write_atomic(record_path(key), json.dumps({"key": key, **data}, sort_keys=True).encode())


# ---- extracted archives ------------------------------------------------------------------------------


def publish_dir(tmp: Path, final: Path) -> Path:
    """Move a finished directory into place atomically; if another run won the race, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def scratch_dir(kind: str) -> Path:
    """A fresh temporary directory inside the cache (same filesystem as its final place)."""
    parent = preflight_cache(kind, "x").parent
    return Path(tempfile.mkdtemp(dir=parent, prefix=".tmp-"))


def extract_wheel_members(archive: zipfile.ZipFile, names: Iterable[str], dest: Path) -> list[str]:
    """Write the named members (those present) under `dest`; returns the names written."""
    present = set(archive.namelist())
    written = []
    for name in names:
        if name not in present or name.startswith("/") or ".." in Path(name).parts:
            continue
        write_output(dest / name, archive.read(name), "wheel member")
        written.append(name)
    return written
