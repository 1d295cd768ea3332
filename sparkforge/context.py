"""One command's shared context: built once in cli/ from the task's options and the environment, then passed
down, so that library functions take (session, subject, options) instead of threading echo, runner, offline
and the CA bundle through every call (as cibuildwheel passes its one frozen Options object).

The library stays usable without Invoke: build a `Session` by hand (`Session(echo=print, runner=Runner())`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkforge.commands import Runner


@dataclass(frozen=True)
class Session:
    """What every step of one command shares; nothing in it changes while the command runs."""

    echo: Callable[[str], None]  # progress lines for the user (cli: console.say)
    runner: Runner  # the command seam every external program goes through
    offline: bool = False  # only the download cache; nothing that needs the network
    ca_bundle: Path | None = None  # a TLS-intercepting proxy's CA, trusted for HTTPS (--ca-bundle or env)
