"""The one default for what a person reads: progress and results on stdout, warnings on stderr.

Library functions take an `echo` (and sometimes a `warn`) so callers can collect or silence lines; when they
are not given one, they use these. The Invoke layer uses the same two (`sparkforge.cli.echo` is `say`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

Echo = Callable[[str], None]


def say(line: str) -> None:
    """A progress or result line: stdout, flushed at once (it interleaves with the programs Runner streams)."""
    print(line, flush=True)


def warn(line: str) -> None:
    """A warning the user must see even when stdout is piped or parsed: stderr."""
    print(line, file=sys.stderr, flush=True)
