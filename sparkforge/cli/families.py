"""Option families: an option that several tasks share is declared once, here, with its default and help, and
a task names the families it takes (`@task(families=(NETWORK,))`). Every task takes GLOBAL. The task's body
declares `session: Session` after the Invoke context instead of the family options: the decorator shows Invoke
the family options in their place, builds the one Session of the call from their values and passes it on.

Adding a global flag is one `Option(...)` line in GLOBAL (and, when the Session must carry it, one field).
A family with `into` is not the Session's: its options become one typed value (`make(**values)`) that the body
declares under that name, e.g. `def push(c, session: Session, outputs: Outputs, ...)` with
`families=(REPORT,)`. A value family is built from its frozen dataclass (`Family.of`): each option is one field,
declared once with its default and help (`name: str = opt("", "help")`). The families every task shares: GLOBAL, NETWORK, DRY (the Session); JSON, JSON_REPORT and
REPORT (`Outputs`: --json, --junit), SIGNING (`Signing`: --key), IMAGE (`ImageChoice`: --image, --allow-unverified),
PULL (`PullChoice`: --platform,
--allow-drift, --allow-unsigned, --allow-unverified), PLATFORM (`--platform`, checked).
Nothing happens at import time beyond building these small frozen declarations.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sparkforge.context import Session

if TYPE_CHECKING:
    from sparkforge.report import Report

T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """One shared option: its Python name (the flag is the dashed form), default and help line."""

    name: str
    default: Any
    help: str


@dataclass(frozen=True)
class Family:
    """Options that travel together: into the Session (`into` empty), or into one value, `make(**values)`, that
    the body declares as its parameter `into`."""

    name: str
    options: tuple[Option, ...]
    into: str = ""
    make: Callable[..., Any] | None = None

    @classmethod
    def of(cls, value: type, into: str, **helps: str) -> Family:
        """A value family from its frozen dataclass: one option per field that has a help (`opt`), the body's
        parameter `into` an instance built from their values. `helps` gives fields a help in this family's
        words (one dataclass, several families: Outputs' --json); a field with neither is no option."""
        options = tuple(
            Option(f.name, f.default, helps.get(f.name, f.metadata.get("help")))
            for f in fields(value)
            if f.name in helps or "help" in f.metadata
        )
        return cls(into, options, into, value)


def opt(default: T, help: Any) -> T:
    """A value family's field that is an option (`port: int = opt(Whole(8000), "the port")`): its default and
    its help line in one declaration (a str, or a LazyHelp computed when help is shown)."""
    return field(default=default, metadata={"help": help})  # type: ignore[return-value]


RECIPE_HELP = "recipe name in recipes/ or path to a recipe file"  # the --recipe of most tasks
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


@dataclass(frozen=True)
class Outputs:
    """Where a task writes its result files (--json; --junit for checking tasks). Checked at the boundary when
    the task is called, before any work: never through a link, never into a system folder."""

    json: str = ""
    junit: str = ""

    def __post_init__(self) -> None:
        from sparkforge.boundary import check_output

        check_output(self.json, "--json")
        check_output(self.junit, "--junit")

    def write(self, session: Session, data: object) -> None:
        """The result as JSON at --json (atomic), when asked for."""
        if self.json:
            import json

            from sparkforge.boundary import write_output

            write_output(self.json, json.dumps(data, indent=2, sort_keys=True) + "\n", "--json")
            session.out(f"wrote {self.json}")

    def finish(self, session: Session, report: Report, hint: str = "see the table above") -> None:
        """A checking task's ending (REPORT): the table, --json and --junit, exit 1 when a check failed."""
        finish_report(report, self.json, self.junit, hint=hint, out=session.out)


UNVERIFIED_HELP = "take an image without a signed GPU-verified claim for the platform, LOUDLY"


@dataclass(frozen=True)
class Signing:
    """--key: the cosign key a signing task signs with (none: keyless, the CI job's OIDC identity)."""

    key: str = opt(
        "",
        "cosign private key (path or cosign key URI; default: $SPARKFORGE_SIGNING_KEY; none: keyless, the CI job's OIDC identity). The key's password comes from $COSIGN_PASSWORD",
    )

    def tools(self, session: Session):  # -> tuple[Cosign, Signer]
        """cosign through the session's runner, and the signer the key (or its absence) names."""
        from sparkforge.registry.cosign import Cosign, Signer

        return Cosign(session.runner), Signer.from_env(self.key)


@dataclass(frozen=True)
class ImageChoice:
    """--image and --allow-unverified: the image a task runs (default: the recipe's verified candidate)."""

    image: str = opt("", "image reference (default: the recipe's verified candidate tag)")
    allow_unverified: bool = opt(False, UNVERIFIED_HELP)


@dataclass(frozen=True)
class PullChoice:
    """The platform to pull (checked; None: this machine's) and what the pulled image may lack, each said
    loudly: labels that match the recipe, a signature, a signed GPU-verified claim."""

    # the flag's value; None once checked and empty (this machine's)
    platform: str | None = opt("", "linux/arm64 or linux/amd64 (default: this machine's)")
    allow_drift: bool = opt(False, "accept an image whose labels differ from the recipe, with a warning")
    allow_unsigned: bool = opt(
        False, "accept an image without a valid signature, LOUDLY (never for moving tags)"
    )
    allow_unverified: bool = opt(False, UNVERIFIED_HELP)

    def __post_init__(self) -> None:
        object.__setattr__(self, "platform", checked_platform(self.platform or ""))


def checked_platform(platform: str = "") -> str | None:
    """--platform: one of sparkforge's platforms (sparkforge/oci.py), checked before any engine or registry;
    None: the default."""
    if platform:
        from sparkforge.oci import check_platform

        check_platform("--platform", platform)
    return platform or None


JSON = Family.of(Outputs, "outputs", json="write the result (JSON) here")
JSON_REPORT = Family.of(Outputs, "outputs", json="write the JSON report here")  # a checking task's --json
REPORT = Family.of(Outputs, "outputs", json="write the JSON report here", junit="write JUnit XML here")
SIGNING = Family.of(Signing, "signing")
IMAGE = Family.of(ImageChoice, "chosen")
PULL = Family.of(PullChoice, "pulling")
PLATFORM = Family(
    "platform",
    (Option("platform", "", "linux/arm64 or linux/amd64 (default: the recipe's first platform)"),),
    "platform",
    checked_platform,
)


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
    """`fn(c, session, ...)` as Invoke sees it: `session` (and each value family's parameter) replaced by the
    families' options (keyword-only, after the task's own), their help lines merged into `help`. A family
    option the body also declares is an error in the declaration, said at once (two meanings for one flag),
    and so is a value family whose parameter the body lacks."""
    signature = inspect.signature(fn)
    valued = {f.into: f for f in families if f.into}
    missing = sorted(set(valued) - set(signature.parameters))
    if missing:
        raise TypeError(f"{fn.__qualname__}: declare {missing} (its families' value) in the body")
    own = [p for name, p in signature.parameters.items() if name != "session" and name not in valued]
    taken = {p.name for p in own}
    shared = list({o.name: o for family in families for o in family.options}.values())
    clash = sorted(taken & {o.name for o in shared})
    if clash:
        raise TypeError(f"{fn.__qualname__}: {clash} belong to an option family; drop them from the body")
    given_session = "session" in signature.parameters
    extra = [
        inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o.default) for o in shared
    ]
    for option in shared:
        help.setdefault(option.name, option.help)
    names = {o.name for o in shared}

    @functools.wraps(fn)
    def call(c: Any, *args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
        for into, family in valued.items():
            kwargs[into] = family.make(**{o.name: values.get(o.name, o.default) for o in family.options})  # type: ignore[misc]
        if not given_session:
            return fn(c, *args, **kwargs)
        return fn(c, session_from(values), *args, **kwargs)

    positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    call.__signature__ = signature.replace(parameters=[*positional, *keyword, *extra])  # type: ignore[attr-defined]
    del call.__wrapped__  # Invoke reads __signature__; inspect must not unwrap to the body
    call.families = tuple(f.name for f in families)  # type: ignore[attr-defined]  # read by the structure test
    return call


def finish_report(
    report: Report,
    json_path: str = "",
    junit_path: str = "",
    *,
    hint: str = "see the table above",
    out: Callable[[str], None] | None = None,
) -> None:
    """A checking task's ending: the table, the JSON/JUnit files asked for, a non-zero exit when a check failed.
    (A task with the REPORT family calls `outputs.finish(session, report, hint)`.)"""
    from invoke.exceptions import Exit

    from sparkforge.console import say
    from sparkforge.report import print_report

    out = out or say
    print_report(report, out)
    if json_path:
        report.write_json(Path(json_path))
        out(f"report: {json_path}")
    if junit_path:
        report.write_junit(Path(junit_path))
    if report.status != "passed":
        failed = ", ".join(c.name for c in report.failed)
        raise Exit(f"sparkforge: {report.command} failed ({failed}); {hint}", code=1)
