"""The Session an engine test's build runs with (the CA bundle is the session's, as `invoke build` holds it)."""

from __future__ import annotations

from pathlib import Path

from sparkforge.commands import Runner
from sparkforge.console import say
from sparkforge.context import Session


def build_session(ca: Path | None = None, *, quiet: bool = False) -> Session:
    """A session that streams the build's output (unless `quiet`) and passes `ca` as the BuildKit secret 'ca'."""
    echo = (lambda _: None) if quiet else say
    return Session(echo=echo, runner=Runner(echo=echo, stream=not quiet), ca_bundle=ca, quiet=quiet)
