"""The Session an engine test's build runs with (the CA bundle is the session's, as `invoke build` holds it)."""

from __future__ import annotations

import os
from pathlib import Path

from sparkforge.commands import Runner
from sparkforge.console import say
from sparkforge.context import Session


def build_session(ca: Path | None = None, *, quiet: bool = False) -> Session:
    """A session that streams the build's output (unless `quiet`) and passes `ca` as the BuildKit secret 'ca':
    by default $SPARKFORGE_CA_BUNDLE, as a task's session reads it (CI sets it to the proxy's bundle)."""
    echo = (lambda _: None) if quiet else say
    env = os.environ.get("SPARKFORGE_CA_BUNDLE", "")
    bundle = ca or (Path(env) if env else None)
    return Session(echo=echo, runner=Runner(echo=echo, stream=not quiet), ca_bundle=bundle, quiet=quiet)
