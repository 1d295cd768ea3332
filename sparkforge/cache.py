"""The download cache: content under one root, written atomically so concurrent runs never see partial files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """$SPARKFORGE_CACHE, else $XDG_CACHE_HOME/sparkforge, else ~/.cache/sparkforge."""
    explicit = os.environ.get("SPARKFORGE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sparkforge"


def cache_path(*parts: str) -> Path:
    """A path inside the cache; its parent directory exists."""
    path = cache_root().joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
