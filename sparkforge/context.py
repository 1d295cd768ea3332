"""One command's shared context: built once in cli/ from the task's options and the environment, then passed
down, so that library functions take (session, subject, options) instead of threading echo, runner, offline
and the CA bundle through every call (as cibuildwheel passes its one frozen Options object). The download
cache the session names lives here too: its root, paths in it, and atomic writes so concurrent runs never see
partial files.

The library stays usable without Invoke: build a `Session` by hand (`Session(echo=print, runner=Runner())`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from sparkforge.boundary import write_output
from sparkforge.commands import Runner
from sparkforge.console import say, warn

if TYPE_CHECKING:
    from sparkforge.engine import Engine


def cache_root() -> Path:
    """$SPARKFORGE_CACHE, else $XDG_CACHE_HOME/sparkforge, else ~/.cache/sparkforge."""
    explicit = os.environ.get("SPARKFORGE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sparkforge"


def cache_path(*parts: str, root: Path | None = None) -> Path:
    """A path inside the cache (`root`, else `cache_root()`); its parent directory exists."""
    path = (root or cache_root()).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file and an atomic rename (the boundary's writer)."""
    write_output(path, data, "cache")
    return path


@dataclass(frozen=True)
class Session:
    """What every step of one command shares; nothing in it changes while the command runs."""

    echo: Callable[[str], None]  # progress lines for the user (cli: console.say)
    runner: Runner  # the command seam every external program goes through
    offline: bool = False  # only the download cache; nothing that needs the network
    ca_bundle: Path | None = None  # a TLS-intercepting proxy's CA, trusted for HTTPS (--ca-bundle or env)
    cache_dir: Path = field(default_factory=cache_root)  # the download and result cache
    engine: Engine | None = None  # this host's container engine (None: detected where one is needed)
    warn: Callable[[str], None] = warn  # warnings for the user (cli: console.warn, to stderr)
    out: Callable[[str], None] = say  # results (tables, paths written): printed even with --quiet
    quiet: bool = False  # --quiet: `echo` (progress) is silent; `out` and `warn` still print

    def cache(self, *parts: str) -> Path:
        """A path inside this session's cache; its parent directory exists."""
        return cache_path(*parts, root=self.cache_dir)

    @cached_property
    def container_engine(self) -> Engine:
        """This host's container engine: the one given, else detected once (through this session's runner)
        the first time a step needs it; a task that never touches an engine never looks for one."""
        if self.engine is not None:
            return self.engine
        from sparkforge.engine import detect_engine

        return detect_engine(self.runner)

    def with_runner(self, runner: Runner) -> Session:
        """The same session with another runner (a step that logs its commands to a folder of its own)."""
        return replace(self, runner=runner)

    def logged(self, log_dir: Path) -> Session:
        """The same session whose runner also saves every command and its log under `log_dir` (NN-step.sh,
        NN-step.log), dry and streaming as this one's: the one place a step's own log folder gets a runner."""
        runner = Runner(log_dir=log_dir, dry=self.runner.dry, echo=self.echo, stream=self.runner.stream)
        return self.with_runner(runner)


def quiet_session() -> Session:
    """A session of defaults for a library call that is given none (a callback such as verify's `carried`):
    progress on the console, commands run without streaming their output."""
    return Session(echo=say, runner=Runner(stream=False))
