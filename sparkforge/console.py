"""The one default for what a person reads: progress and results on stdout, warnings on stderr.

Library functions take an `echo` (and sometimes a `warn`) so callers can collect or silence lines; when they
are not given one, they use these. The Invoke layer uses the same two (`sparkforge.cli.echo` is `say`).
Untrusted text (member names, net-device names, model output, registry strings) never reaches a terminal raw:
`say` and `warn` escape control characters but line breaks and tabs, and `cell` / `md_cell` escape a table
field entirely (a line break in a name would otherwise forge rows).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

Echo = Callable[[str], None]

# C0 and C1 controls, DEL, and the bidirectional overrides that reorder what a reader sees.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_LINE_CONTROL = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
_MARKDOWN = re.compile(r"([\\|`*_\[\]<>#])")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """One line of text with every control character (line breaks too) shown as an escape, e.g. '\\x1b'."""
    return _CONTROL.sub(_escape, str(text))


def cell(text: object) -> str:
    """A field of a plain-text table: one line, controls escaped."""
    return printable(text)


def md_cell(text: object) -> str:
    """A field of a Markdown table or inline text: controls escaped and Markdown's own characters too."""
    return _MARKDOWN.sub(r"\\\1", printable(text))


def md_code(text: object) -> str:
    """A Markdown code span (paths, versions) in a table: controls escaped, no backtick to close it early, '|'
    escaped so the table keeps its columns."""
    return "`" + printable(text).replace("`", "'").replace("|", "\\|") + "`"


def terminal(line: str) -> str:
    """What a terminal may be given: line breaks and tabs kept, every other control (escape sequences,
    carriage returns that overwrite a line) escaped."""
    return _LINE_CONTROL.sub(_escape, line)


def say(line: str) -> None:
    """A progress or result line: stdout, flushed at once (it interleaves with the programs Runner streams)."""
    print(terminal(str(line)), flush=True)


def warn(line: str) -> None:
    """A warning the user must see even when stdout is piped or parsed: stderr."""
    print(terminal(str(line)), file=sys.stderr, flush=True)


class Stages:
    """The wait of a step made of stages, shown: what runs now, the elapsed time and the stage count. On a
    terminal a live rich line (gone when the step ends); elsewhere (logs, CI, pipes) one plain line per stage.
    `stage` may be called from another thread (a container's output follower)."""

    def __init__(self, title: str, total: int, *, echo: Echo | None = None, live: bool | None = None) -> None:
        self.title = printable(title)
        self.total = total
        self.echo = echo or say
        self.live = sys.stdout.isatty() if live is None else live
        self.started = time.monotonic()
        self.current = ""
        self._lock = threading.Lock()
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Stages:
        if self.live:
            from rich.progress import (
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            columns = (
                SpinnerColumn(),
                TextColumn("{task.description}"),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            self._progress = Progress(*columns, transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=self.total)
        return self

    def stage(self, index: int, name: str) -> None:
        """Stage `index` (1-based) of the total, named `name` (untrusted text: escaped), starts now."""
        name = printable(name)[:80]
        with self._lock:
            self.current = name
            if self._progress is not None:
                self._progress.update(self._task, description=f"{self.title}: {name}", completed=index - 1)
            else:
                elapsed = time.monotonic() - self.started
                self.echo(f"{self.title}: {index}/{self.total} {name} (at {elapsed:.1f} s)")

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
            elapsed = time.monotonic() - self.started
            self.echo(f"{self.title}: {'done' if kind is None else 'stopped'} in {elapsed:.1f} s")
