"""Option families: an option that several tasks share is declared once, here, with its default and help, and
a task names the families it takes (`@task(families=(NETWORK,))`). Every task takes GLOBAL. The task's body
declares `session: Session` after the Invoke context instead of the family options: the decorator shows Invoke
the family options in their place, builds the one Session of the call from their values and passes it on.

Adding a global flag is one `Option(...)` line in GLOBAL (and, when the Session must carry it, one field).
Nothing happens at import time beyond building these small frozen declarations.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.context import Session


@dataclass(frozen=True)
class Option:
    """One shared option: its Python name (the flag is the dashed form), default and help line."""

    name: str
    default: Any
    help: str


@dataclass(frozen=True)
class Family:
    """Options that travel together into the Session."""

    name: str
    options: tuple[Option, ...]


GLOBAL = Family(
    "global",
    (Option("quiet", False, "print only results, warnings and errors (no progress lines)"),),
)
NETWORK = Family(
    "network",
    (
        Option("offline", False, "use only the download cache; nothing that needs the network"),
        Option("ca_bundle", "", "CA bundle for a TLS-intercepting proxy (default: $SPARKFORGE_CA_BUNDLE)"),
    ),
)
DRY = Family("dry", (Option("dry", False, "print every command and the plan; run nothing"),))


def session_from(values: Mapping[str, Any], *, stream: bool = True) -> Session:
    """The one Session of a task call, from the family options' values (those a task lacks take defaults).
    The CA bundle comes from --ca-bundle or $SPARKFORGE_CA_BUNDLE, read here once, not deep in the library."""
    from sparkforge.commands import Runner
    from sparkforge.console import say, warn

    quiet = bool(values.get("quiet", False))
    echo = _silent if quiet else say
    bundle = values.get("ca_bundle") or os.environ.get("SPARKFORGE_CA_BUNDLE", "")
    return Session(
        echo=echo,
        runner=Runner(stream=stream and not quiet, dry=bool(values.get("dry", False)), echo=echo),
        offline=bool(values.get("offline", False)),
        ca_bundle=Path(bundle) if bundle else None,
        warn=warn,
        out=say,
        quiet=quiet,
    )


def _silent(line: str) -> None:
    """--quiet's progress output: nothing."""


def takes_session(fn: Callable[..., Any]) -> bool:
    """Whether a task body declares `session` (then it is given one, built from its families' options)."""
    return "session" in inspect.signature(fn).parameters


def with_families(
    fn: Callable[..., Any], families: tuple[Family, ...], help: dict[str, Any]
) -> Callable[..., Any]:
    """`fn(c, session, ...)` as Invoke sees it: `session` replaced by the families' options (keyword-only,
    after the task's own), their help lines merged into `help`. A family option the body also declares is
    an error in the declaration, said at once (two meanings for one flag)."""
    signature = inspect.signature(fn)
    own = [p for name, p in signature.parameters.items() if name != "session"]
    taken = {p.name for p in own}
    shared = [o for family in families for o in family.options]
    clash = sorted(taken & {o.name for o in shared})
    if clash:
        raise TypeError(f"{fn.__qualname__}: {clash} belong to an option family; drop them from the body")
    extra = [
        inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o.default) for o in shared
    ]
    for option in shared:
        help.setdefault(option.name, option.help)
    names = {o.name for o in shared}

    @functools.wraps(fn)
    def call(c: Any, *args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
        return fn(c, session_from(values), *args, **kwargs)

    positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    call.__signature__ = signature.replace(parameters=[*positional, *keyword, *extra])  # type: ignore[attr-defined]
    del call.__wrapped__  # Invoke reads __signature__; inspect must not unwrap to the body
    call.families = tuple(f.name for f in families)  # type: ignore[attr-defined]  # read by the structure test
    return call
