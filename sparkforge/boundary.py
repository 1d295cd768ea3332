"""The one input boundary: user files read, outputs written, numbers checked, before any engine or network.

Every task reads the files a user hands it through `read_bytes` / `read_text` / `read_json` and writes every
output through `write_output`; docs/inputs.md lists the rules once, with the tasks they cover.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import posixpath
import stat
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO

from sparkforge.errors import InputError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Never read through a path that was not named, never written: a received file cannot point sparkforge there.
SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/var/run", "/var/lib", "/usr", "/bin", "/sbin",
               "/lib", "/lib64")  # fmt: skip
MAX_JSON_BYTES = 16 << 20
MAX_PATCH_BYTES = 64 << 20  # a patch of a series (patches/): the largest upstream diffs are a few MiB
MAX_JSON_DEPTH = 64
MAX_JSON_ITEMS = 1_000_000
MAX_INT_DIGITS = 40  # a JSON integer's digits: a count or size never needs more (Python parses 4,300)


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _in_system(path: Path, dirs: Sequence[str] = SYSTEM_DIRS) -> bool:
    return any(str(path) == d or str(path).startswith(d + "/") for d in dirs)


def is_system_path(path: Path, *, resolve: bool = True) -> bool:
    """Under a system folder or root's home: never read through a path a file names (recipes' `extends` too).
    `resolve=False`: the path as written (so a link in /tmp to /etc/passwd is told from /etc/passwd itself)."""
    return _in_system(path.resolve() if resolve else Path(os.path.abspath(path)), (*SYSTEM_DIRS, "/root"))


def _open_regular(path: Path, where: str, max_bytes: int) -> int:
    """A descriptor on a regular file of at most `max_bytes` (checked on the descriptor, so no race)."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once (fstat then refuses it) instead of hanging.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{where}: cannot open it ({exc.strerror}); fix: check the path") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
            raise InputError(f"{where}: {kind}, not a regular file; fix: name a regular file")
        if info.st_size > max_bytes:
            raise InputError(
                f"{where}: {info.st_size} bytes, more than this input may hold ({max_bytes}); fix: name the file "
                "sparkforge wrote, not another one"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_system_link(path: Path, where: str) -> Path:
    """`path` resolved; a symlink (anywhere on the way) into a system folder is refused: a file that names
    /etc/passwd is read only when the user names /etc/passwd itself."""
    real = path.resolve()
    if is_system_path(real) and not is_system_path(path, resolve=False):
        raise InputError(
            f"{where}: a link to {real}, a system file; fix: name the file itself, not a link to it"
        )
    return real


MAX_PEM_BYTES = 4 << 20  # the Mozilla bundle is ~220 KiB


def check_pem(path: Path | str, option: str) -> Path:
    """A CA bundle: a regular UTF-8 file of at most 4 MiB holding at least one PEM certificate (a key or any
    other file is refused before it is handed to BuildKit as a secret)."""
    text = read_text(path, option, MAX_PEM_BYTES)
    if "-----BEGIN CERTIFICATE-----" not in text or "PRIVATE KEY-----" in text:
        raise InputError(
            f"{option} {path}: holds no PEM certificate (or holds a private key); fix: name the proxy's CA "
            "bundle, e.g. /etc/ssl/certs/ca-certificates.crt"
        )
    return Path(path)


def check_input(path: Path | str, option: str, max_bytes: int) -> Path:
    """What `read_bytes` would refuse (a FIFO, device, folder, missing or oversized file, a link to a system
    file), checked without reading: for a file another program reads later (a corpus handed to a container)."""
    _refuse_system_link(Path(path), f"{option} {path}")
    os.close(_open_regular(Path(path), f"{option} {path}", max_bytes))
    return Path(path)


def read_bytes(
    path: Path | str, option: str, max_bytes: int, *, named: bool = True, within: Sequence[Path] = ()
) -> bytes:
    """A regular file's bytes, at most `max_bytes`; never blocks on a FIFO, never reads a device or a folder.

    `named`: the user named this path (on the command line): it is read wherever it leads. Otherwise (a path a
    file names) it must resolve, symlinks followed, inside one of `within` (folders sparkforge chose, such as its
    cache), or inside the project and never under a system directory.
    """
    path = Path(path)
    where = f"{option} {path}" if option else str(path)
    real = _refuse_system_link(path, where)
    # `within`: folders sparkforge itself chose (its cache lies in root's home when it runs as root): inside one,
    # root's home is no refusal; system folders always are.
    own = _inside(real, [r.resolve() for r in within])
    system = _in_system(real, SYSTEM_DIRS) or (not own and is_system_path(real))
    if not named and (system or not (own or _inside(real, [PROJECT_ROOT]))):
        raise InputError(
            f"{where}: resolves to {real}, outside this project and the folders it may read; fix: copy the "
            "file into the project (or name it yourself on the command line)"
        )
    fd = _open_regular(path, where, max_bytes)
    try:
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise InputError(f"{where}: cannot read it ({exc.strerror}); fix: check the file") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise InputError(
            f"{where}: grew past {max_bytes} bytes while read; fix: name a file that is not written now"
        )
    return b"".join(chunks)


MAX_SOURCE_BYTES = 16 << 20  # one file of an upstream source tree (vLLM's largest are under 1 MiB)


def read_source(path: Path | str, root: Path | str, max_bytes: int = MAX_SOURCE_BYTES) -> str | None:
    """A text file of a tree sparkforge extracted or wrote itself (an upstream checkout, a scratch folder),
    decoded leniently (an upstream file may hold stray bytes); None when no regular file is there; a link that
    leads out of `root` and the project, or an oversized file, is refused."""
    if not Path(path).is_file():
        return None
    raw = read_bytes(path, "", max_bytes, named=False, within=[Path(root)])
    return raw.decode("utf-8", errors="replace")


def sha256_file(path: Path | str, option: str, max_bytes: int) -> str:
    """The sha256 of a regular file read in 16 MiB pieces (a checkpoint's weights: never whole in memory); the same
    refusals as `read_bytes` (no FIFO, device, folder or system link)."""
    path = Path(path)
    where = f"{option} {path}" if option else str(path)
    _refuse_system_link(path, where)
    fd = _open_regular(path, where, max_bytes)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, 16 << 20):
            digest.update(chunk)
    except OSError as exc:
        raise InputError(f"{where}: cannot read it ({exc.strerror}); fix: check the file") from None
    finally:
        os.close(fd)
    return digest.hexdigest()


def read_text(
    path: Path | str, option: str, max_bytes: int, *, named: bool = True, within: Sequence[Path] = ()
) -> str:
    """`read_bytes` decoded as UTF-8 (a NUL byte is refused: no text sparkforge reads holds one)."""
    raw = read_bytes(path, option, max_bytes, named=named, within=within)
    where = f"{option} {path}" if option else str(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: byte {exc.start} is not UTF-8; fix: name a UTF-8 text file") from None
    if "\x00" in text:
        raise InputError(f"{where}: holds a NUL byte, so it is not text; fix: name a text file")
    return text


# Portable rules: standard library only and no other name of this module (but MAX_INT_DIGITS), so that programs
# running inside an image without sparkforge (the weight server and puller) run these very functions: their
# source is shipped into the programs' text (run/weights/weightscripts.py, PORTABLE), a test proves it.


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} overflows to infinity")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:80]!r} appears twice")
        out[key] = value
    return out


def loads_strict(text: str | bytes) -> Any:
    """JSON with finite numbers only (no NaN, Infinity, 1e309), integers of at most MAX_INT_DIGITS digits and no
    key twice; a ValueError (or RecursionError) otherwise. parse_json's core, and the weight puller's."""
    return json.loads(
        text,
        parse_constant=_refuse_constant,
        parse_float=_finite_float,
        parse_int=_bounded_int,
        object_pairs_hook=_unique_keys,
    )


def manifest_path(rel: object) -> str | None:
    """A weight manifest's path as given when it is relative, normalised POSIX, free of '..' and control
    characters and outside the part folder; None otherwise."""
    if (
        not isinstance(rel, str)
        or not rel
        or rel.startswith("/")
        or any(ord(c) < 32 or c == "\x7f" for c in rel)
    ):
        return None
    norm = posixpath.normpath(rel)
    if norm != rel or norm == "." or norm.split("/")[0] in ("..", ".sparkforge-part") or "/../" in "/" + norm:
        return None
    return norm


def check_manifest(
    entries: object, max_size: int = 1 << 42, max_entries: int = 1_000_000
) -> tuple[dict[str, tuple[int, str]], dict[str, tuple[str, str]]]:
    """A weight manifest's files {path: (size, sha256)} and links {path: (target, resolved path)}: every path
    `manifest_path`'s, none twice nor both a file and a folder, sizes whole numbers in 0..`max_size`, sha256s 64
    lower-case hex characters, links only to files of the manifest; a ValueError naming the entry otherwise."""
    files: dict[str, tuple[int, str]] = {}
    links: dict[str, tuple[str, str]] = {}
    folders: set[str] = set()
    if isinstance(entries, list) and len(entries) > max_entries:
        raise ValueError(f"the manifest lists {len(entries)} entries, more than {max_entries}")
    for entry in entries if isinstance(entries, list) else [None]:
        rel = manifest_path(entry.get("path")) if isinstance(entry, dict) else None
        if rel is None or not isinstance(entry, dict):
            raise ValueError(
                f"manifest entry {str(entry)[:200]!r}: not a relative path inside the model folder"
            )
        if rel in files or rel in links:
            raise ValueError(f"{rel}: listed twice in the manifest")
        folders.update("/".join(rel.split("/")[:i]) for i in range(1, rel.count("/") + 1))
        if "link" in entry:
            target = entry["link"]
            joined = posixpath.join(posixpath.dirname(rel), target) if isinstance(target, str) else ""
            resolved = posixpath.normpath(joined) if joined else ""
            if (
                not isinstance(target, str)
                or target.startswith("/")
                or resolved.startswith("..")
                or resolved in (".", "")
            ):
                raise ValueError(f"{rel}: link to {str(target)[:200]!r} leaves the model folder")
            links[rel] = (target, resolved)
            continue
        size, digest = entry.get("size"), entry.get("sha256")
        hexdigits = (
            isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        )
        if type(size) is not int or not 0 <= size <= max_size or not hexdigits:
            raise ValueError(
                f"{rel}: the manifest gives no size in 0..{max_size} and hex sha256 ({str(digest)[:80]!r})"
            )
        files[rel] = (size, str(digest))
    for rel in sorted(folders & (set(files) | set(links))):
        raise ValueError(f"{rel}: both a file and a folder in the manifest")
    for rel, (target, resolved) in links.items():
        if resolved not in files:
            raise ValueError(f"{rel}: link to {target!r} points at no file of the manifest")
    return files, links


PORTABLE = (
    _refuse_constant,
    _finite_float,
    _bounded_int,
    _unique_keys,
    loads_strict,
    manifest_path,
    check_manifest,
)


def portable_source() -> str:
    """The portable rules as program text (MAX_INT_DIGITS, then each function's own source), for a program
    that runs where sparkforge is not installed; it needs `json`, `math` and `posixpath` imported."""
    import inspect

    return "\n\n".join([f"MAX_INT_DIGITS = {MAX_INT_DIGITS!r}", *(inspect.getsource(f) for f in PORTABLE)])


def parse_json(
    text: str | bytes,
    where: str,
    *,
    max_depth: int = MAX_JSON_DEPTH,
    max_items: int = MAX_JSON_ITEMS,
    max_bytes: int | None = None,
    nonfinite: bool = False,
    fix: str = "name the file sparkforge wrote",
) -> Any:
    """JSON as the boundary takes it: finite numbers only (no NaN, Infinity, 1e309), no key twice, bounded
    nesting and size. `nonfinite`: NaN and Infinity are read as floats (what a program printed about a GPU
    check); `fix`: the refusal's fix (e.g. which program printed it); `max_bytes`: a cap on the text where no
    file read capped it (a program's output)."""
    if max_bytes is not None and len(text) > max_bytes:
        raise InputError(f"{where}: {len(text)} characters of JSON, more than {max_bytes}; fix: {fix}")
    try:
        if nonfinite:  # loads_strict, but NaN and +-Infinity read as floats
            data = json.loads(text, parse_int=_bounded_int, object_pairs_hook=_unique_keys)
        else:
            data = loads_strict(text)
    except RecursionError:
        raise InputError(
            f"{where}: cannot read it: nested deeper than {max_depth} levels; fix: {fix}"
        ) from None
    except ValueError as exc:
        reason = str(exc).splitlines()[0][:200]
        if isinstance(exc, json.JSONDecodeError) and exc.pos >= len(text.rstrip()):
            reason = f"empty or truncated: {reason}"  # the text ended where more was expected
        raise InputError(f"{where}: cannot read it as JSON ({reason}); fix: {fix}") from None
    stack, items = [(data, 1)], 0
    while stack:
        node, depth = stack.pop()
        items += 1
        if depth > max_depth or items > max_items:
            why = (
                f"nested deeper than {max_depth} levels"
                if depth > max_depth
                else f"more than {max_items} values"
            )
            raise InputError(f"{where}: cannot read it: {why}; fix: {fix}")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return data


_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def read_json(
    path: Path | str,
    option: str,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    named: bool = True,
    within: Sequence[Path] = (),
    expect: type | None = dict,
    fix: str = "",
) -> Any:
    """A JSON file through the boundary: `read_text` then `parse_json`; `expect`: the top-level type; `fix`: the
    caller's own fix (which file it wants, e.g. "pass a file written by 'invoke bench --json'") in every refusal,
    in place of the generic one."""
    where = f"{option} {path}" if option else str(path)
    try:
        data = parse_json(read_text(path, option, max_bytes, named=named, within=within), where)
        if expect is not None and not isinstance(data, expect):
            raise InputError(
                f"{where}: a JSON {_JSON_NAMES.get(expect, expect.__name__)} is expected, found a JSON "
                f"{_JSON_NAMES.get(type(data), type(data).__name__)}; fix: name the file sparkforge wrote"
            )
    except InputError as exc:
        if not fix:
            raise
        raise InputError(f"{str(exc).rpartition('; fix:')[0]}; fix: {fix}") from None
    return data


def list_files(folder: Path | str, option: str, *, max_entries: int = 10_000) -> list[Path]:
    """The files directly in `folder`, sorted: regular files and links to regular files (a Hugging Face snapshot
    is links into its blobs; read each with `read_bytes`, which refuses a link into a system folder); more than
    `max_entries` entries is refused."""
    top = Path(folder)
    try:
        with os.scandir(top) as it:
            entries = [e for _, e in zip(range(max_entries + 1), it, strict=False)]
    except OSError as exc:
        raise InputError(f"{option} {top}: cannot list it ({exc.strerror}); fix: name a folder") from None
    if len(entries) > max_entries:
        raise InputError(f"{option} {top}: more than {max_entries} entries; fix: name the model's own folder")
    return sorted(Path(e.path) for e in entries if e.is_file())


def _output_parent(path: Path, option: str) -> Path:
    """The real folder an output goes into, refused when a symlink leads it out of the project unasked."""
    lexical = Path(os.path.abspath(path)).parent
    existing = lexical
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(
            f"{option} {path}: {existing} is a file, not a folder; fix: name a path under a folder"
        )
    real = existing.resolve() / lexical.relative_to(existing)
    if (_in_system(real) or _in_system(lexical)) and not _inside(real, [PROJECT_ROOT]):
        raise InputError(
            f"{option} {path}: writes under {real}, a system folder; fix: write the output under the project "
            "or a folder of your own (e.g. build/ or /tmp)"
        )
    if real != lexical and not _inside(real, [PROJECT_ROOT]) and _inside(lexical, [PROJECT_ROOT]):
        raise InputError(
            f"{option} {path}: a symlink in {lexical} leads out of the project to {real}; fix: remove the link, "
            "or name the real path yourself"
        )
    return real


def check_output(path: Path | str, option: str) -> None:
    """What `write_output` would refuse, checked before any work (empty: no output asked for)."""
    if path:
        _final(Path(path), option)


def _final(path: Path, option: str) -> Path:
    parent = _output_parent(path, option)
    final = parent / path.name
    if not path.name or path.name in (".", ".."):
        raise InputError(f"{option} {path}: names no file; fix: name a file, e.g. build/report.json")
    if not final.is_symlink() and final.exists() and not final.is_file():
        raise InputError(f"{option} {path}: a folder, device or pipe is there; fix: name a file")
    return final


def check_output_dir(path: Path | str, option: str) -> Path:
    """What `output_dir` would refuse (a symlink, file, pipe or device there, a system folder, a link out of the
    project on the way), checked without creating it: the folder it would use (an existing folder is fine)."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        path = Path(os.path.abspath(path))  # `--out .` or `build/..`: the folder itself
    folder = _output_parent(path, option) / path.name
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError(f"{option} {path}: a symlink or file is there, not a folder; fix: name a new folder")
    return folder


def output_dir(path: Path | str, option: str) -> Path:
    """A folder for several outputs (`--png DIR`), created if missing: never a symlink, never a system folder,
    never reached through a link that leads out of the project; files go in with `write_output`."""
    folder = check_output_dir(path, option)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"{option} {path}: cannot create it ({exc.strerror}); fix: name a folder you can write"
        ) from None
    return folder


@contextlib.contextmanager
def atomic_writer(path: Path | str, option: str = "output", *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to stream an output into (a download, a cache entry); it appears at `path` whole, by an
    atomic rename, only when the block ends without an error; `write_output`'s refusals and rules otherwise
    (`mode`: its exact permissions, 0o755 for a script; else 0o666 less the umask, as open() gives)."""
    final = _final(Path(path), option)
    temp = ""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name[:40]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            yield out
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temp, 0o666 & ~mask if mode is None else mode)
        os.replace(temp, final)
    except OSError as exc:
        raise InputError(
            f"{option} {path}: cannot write it ({exc.strerror or exc}); fix: name a file in a folder you can write"
        ) from None
    finally:
        if temp and os.path.exists(temp):
            os.unlink(temp)


def write_output(
    path: Path | str, data: bytes | str, option: str = "output", *, mode: int | None = None
) -> Path:
    """Write an output as named, atomically (a temporary file in the same folder, then rename): the final
    component is replaced, never followed, when it is a symlink; a folder or device there is refused."""
    with atomic_writer(path, option, mode=mode) as out:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)
    return _final(Path(path), option)


def open_log(path: Path | str, option: str = "log", *, append: bool = False) -> BinaryIO:
    """A log file sparkforge writes as a program runs (a step's output, a daemon's), opened for writing: created
    or truncated (`append`: appended to), never through a symlink at its name, never a FIFO or device there;
    `write_output`'s refusals for the folder."""
    final = _final(Path(path), option)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(final, flags | (os.O_APPEND if append else 0), 0o666)
    except OSError as exc:
        raise InputError(
            f"{option} {path}: cannot open it for writing ({exc.strerror}); fix: remove a link or pipe there"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{option} {path}: not a regular file; fix: remove what is there")
    if not append:
        os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab" if append else "wb")


def open_binary(path: Path | str, option: str, max_bytes: int) -> BinaryIO:
    """A regular file of at most `max_bytes`, opened to read in pieces or map (a library, an archive, a layer):
    `read_bytes`'s refusals (no FIFO, device, folder or link to a system file), checked on the descriptor."""
    path = Path(path)
    where = f"{option} {path}" if option else str(path)
    _refuse_system_link(path, where)
    fd = _open_regular(path, where, max_bytes)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def open_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> IO[bytes]:
    """One member of an archive the caller opened through `open_binary` (a member, never a path on disk); the
    caller bounds what it reads (audit/members.py BoundedStream), whatever size the member claims."""
    return archive.open(info)


def read_tail(path: Path | str, option: str, max_bytes: int) -> str:
    """The last `max_bytes` of a log sparkforge's own program wrote, decoded leniently (a cut character or a
    program's stray bytes shown as U+FFFD); "" when it is missing; a FIFO, device or folder is refused."""
    if not os.path.lexists(path):
        return ""
    with open_binary(path, option, 1 << 62) as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - max_bytes))
        return handle.read(max_bytes).decode("utf-8", errors="replace")


# The bounded parsers: option numbers written in ASCII and in range, lists of them, flags that exclude each
# other, regexes that run in linear time over untrusted text, walks of untrusted trees with a depth and a count.

MAX_NUMBER_CHARS = 40  # a count or size never needs more; Python would parse 4,300 digits


def check_number(
    option: str,
    value: object,
    *,
    low: float,
    high: float,
    integer: bool = False,
    low_open: bool = False,
    text: bool = True,
) -> float | int:
    """A number from the command line or a file: finite, in [low, high] ((low, high] with `low_open`), whole
    when a count is meant; a string is parsed first ("1e309", "nan" refused), or refused with text=False (a
    JSON value where the file's format says number)."""
    parsed: object = value
    if isinstance(value, str) and text:
        parsed = ascii_number(value.strip(), integer)
    if isinstance(parsed, float) and integer and parsed.is_integer():
        parsed = int(parsed)
    kind = "a whole number" if integer else "a number"
    good = not isinstance(parsed, bool) and isinstance(parsed, int if integer else int | float)
    good = good and (isinstance(parsed, int) or math.isfinite(parsed))  # type: ignore[arg-type]
    good = good and (low < parsed if low_open else low <= parsed) and parsed <= high  # type: ignore[operator]
    if not good:
        bounds = (
            f"{'above' if low_open else 'from'} {_bound(low)} {'up ' if low_open else ''}to {_bound(high)}"
        )
        raise InputError(f"{option} {str(value)[:60]!r} is not {kind} {bounds}; fix: pass {kind} {bounds}")
    return parsed  # type: ignore[return-value]


def _bound(value: float) -> str:
    """A bound as a reader writes it: 10000000, not 1e+07."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


def check_label(
    option: str, value: object, *, max_len: int, forbid: str = "", optional: bool = False
) -> str | None:
    """Text from a file that is shown as a label or a table cell: a string of at most `max_len` printable
    characters (no control character, no terminal escape) and none of `forbid` (e.g. '$', which matplotlib
    reads as mathtext); None passes when `optional`."""
    if optional and value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) > max_len
        or not value.isprintable()
        or set(forbid) & set(value)
    ):
        banned = f", no {' '.join(repr(c) for c in forbid)}" if forbid else ""
        raise InputError(
            f"{option} {str(value)[:60]!r} is not a short plain text (at most {max_len} printable characters"
            f"{banned}); fix: name the file sparkforge wrote"
        )
    return value


_FLOAT_CHARS = frozenset("0123456789+-.eE")


def ascii_number(text: str, integer: bool) -> int | float | None:
    """`text` as a number written in ASCII only: Python's int()/float() also take '1_0' (10), '٣' (3), '²'
    (error) and 'nan'; the boundary takes digits, one sign, a point and an exponent, and at most 40 of them."""
    if not text or len(text) > MAX_NUMBER_CHARS or not text.isascii():
        return None
    body = text[1:] if text[0] in "+-" else text
    if integer:
        return int(text) if body.isdigit() else None
    if not set(text) <= _FLOAT_CHARS or not any(c.isdigit() for c in body):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_int(option: str, text: str, *, low: int, high: int) -> int:
    """A whole number from an option's text: ASCII digits only (no '1_0', '٣', '²', '0x10', '+-3'), in range."""
    return int(check_number(option, str(text), low=low, high=high, integer=True))


def parse_int_list(option: str, text: str, *, low: int, high: int, max_items: int = 64) -> list[int]:
    """A comma-separated list of whole numbers (`--concurrency 1,4,16`): each by `parse_int`; an empty entry
    or more than `max_items` entries is refused, never dropped."""
    parts = str(text).split(",")
    if len(parts) > max_items:
        raise InputError(f"{option}: {len(parts)} entries, at most {max_items}; fix: pass fewer values")
    if any(not p.strip() for p in parts):
        raise InputError(f"{option} {str(text)[:60]!r}: an empty entry; fix: remove the extra comma")
    return [parse_int(option, p, low=low, high=high) for p in parts]


def check_exclusive(**flags: object) -> None:
    """Flags that exclude each other: two given at once are refused, never one silently ignored."""
    given = [name for name, value in flags.items() if value]
    if len(given) > 1:
        names = " and ".join("--" + n.replace("_", "-") for n in given)
        raise InputError(f"{names} exclude each other; fix: give one of them")


BUILD_NETWORKS = ("default", "host", "none")  # BuildKit's RUN --network modes; anything else is no mode


def check_build_network(option: str, value: str) -> str:
    """A BuildKit network mode for RUN steps (empty: the default), from an allow-list."""
    if value and value not in BUILD_NETWORKS:
        raise InputError(
            f"{option} {value[:60]!r} is not a BuildKit network mode; fix: use one of {', '.join(BUILD_NETWORKS)}"
        )
    return value


MAX_REGEX_MEM = 1 << 20  # RE2's budget for one compiled pattern: more (nested counted repeats) is refused
MAX_LINE = 8192  # a log line sparkforge searches: longer lines are cut there (vLLM's are under 1 KiB)


@functools.lru_cache(maxsize=512)
def linear_regex(pattern: str, *, max_mem: int = MAX_REGEX_MEM) -> Any:
    """`pattern` compiled by RE2: every regex over untrusted text (logs, answers, profile patterns) runs in time
    linear in the text, `(a+)+$` included; a pattern RE2 cannot run so (back-references, look-arounds, over the
    budget) is a ValueError naming it."""
    import re2

    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"{pattern!r} is not a regular expression sparkforge runs ({reason}; patterns run in linear time, "
            "without back-references or look-arounds); fix: e.g. '\\b391\\b'"
        ) from None


def bounded_lines(text: str, max_line: int = MAX_LINE) -> list[str]:
    """`text`'s lines, each cut at `max_line` characters (a 2 MB line is searched as its first 8 KiB)."""
    return [line[:max_line] for line in text.splitlines()]


def walk_tree(root: Path | str, option: str, *, max_depth: int = 16, max_entries: int = 10_000) -> list[Path]:
    """The regular files under `root`, sorted, without following a symlink (a linked file or folder is left out,
    so a link to /etc or a loop is never entered); deeper than `max_depth` or more than `max_entries` entries
    is refused, not cut short."""
    top = Path(root)
    if top.is_symlink() or not top.is_dir():
        raise InputError(f"{option} {top}: not a folder (or a symlink to one); fix: name a real folder")
    found: list[Path] = []
    stack, seen = [(top, 0)], 0
    while stack:
        folder, depth = stack.pop()
        if depth > max_depth:
            raise InputError(
                f"{option} {top}: nested deeper than {max_depth} folders; fix: name a shallower tree"
            )
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise InputError(
                f"{option} {folder}: cannot list it ({exc.strerror}); fix: check the folder"
            ) from None
        seen += len(entries)
        if seen > max_entries:
            raise InputError(f"{option} {top}: more than {max_entries} entries; fix: name a smaller tree")
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), depth + 1))
            elif entry.is_file(follow_symlinks=False):
                found.append(Path(entry.path))
    return sorted(found)
