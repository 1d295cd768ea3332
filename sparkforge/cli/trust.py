"""Invoke tasks for a publisher's own TUF root: trust.init, trust.rotate, trust.recover, trust.status (thin: the
work is in sparkforge.registry.ceremony; docs/trust.md: Publishers own their roots)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from invoke import Collection, Context

from sparkforge.cli import Whole, task, user_errors
from sparkforge.cli.families import JSON, Family, Outputs, opt
from sparkforge.context import Session

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file (it names publish.signing.trust_root)"


@dataclass(frozen=True)
class OnlineChoice:
    """--online-key PATH or --online-identity URL: who signs the online roles (targets, snapshot, timestamp)."""

    online_key: str = opt(
        "", "PATH: the online roles' private key file (PEM); CI holds it as SPARKFORGE_TUF_SIGNER=file2:PATH"
    )
    online_identity: str = opt(
        "",
        "URL: keyless online roles: the signing workflow at its ref, e.g. https://github.com/ME/sparkforge/.github/workflows/gpu-attest.yml@refs/heads/main",
    )

    def given(self):  # -> ceremony.Online | None
        """The online signer asked for (None: neither option given); both at once is refused."""
        if not (self.online_key or self.online_identity):
            return None
        return self.required()

    def required(self):  # -> ceremony.Online
        from sparkforge.errors import PublishError
        from sparkforge.registry.ceremony import Online

        if bool(self.online_key) == bool(self.online_identity):
            raise PublishError("give exactly one of --online-key PATH or --online-identity URL")
        return Online(Path(self.online_key) if self.online_key else None, self.online_identity)


ONLINE = Family.of(OnlineChoice, "online")


@task(
    families=(ONLINE,),
    iterable=["root_key"],
    help={
        "recipe": RECIPE_HELP,
        "root_key": "PATH: an offline root private key file (PEM); repeat for each maintainer",
        "threshold": "N: how many root keys must sign a root (default 1)",
    },
)
@user_errors
def init(
    c: Context,
    session: Session,
    online: OnlineChoice,
    recipe: str,
    root_key: list[str] | None = None,
    threshold: int = Whole(1),
) -> None:
    """The root ceremony: root v1 of the recipe's repository, written to its trust_root file and the registry."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import ceremony, tufrepo

    loaded = load_recipe(recipe)
    fingerprint = ceremony.init(loaded, [Path(p) for p in root_key or []], threshold, online.required())
    repository = loaded.model.publish.repository
    session.out(
        f"sparkforge: TUF root v1 of {repository} (fingerprint {fingerprint}) written to "
        f"{loaded.model.publish.signing.trust_root if loaded.model.publish.signing else '?'}; commit it and "
        f"{tufrepo.committed_dir(repository)} (git is the source of truth), keep the root keys offline"
    )


@task(
    families=(ONLINE,),
    iterable=["sign_key", "root_key"],
    help={
        "recipe": RECIPE_HELP,
        "sign_key": "PATH: a current root private key that signs the new root (repeat up to the threshold)",
        "root_key": "PATH: a new root private key (repeat; replaces the root keys); it signs too",
        "threshold": "N: the new root threshold (default: unchanged)",
    },
)
@user_errors
def rotate(
    c: Context,
    session: Session,
    online: OnlineChoice,
    recipe: str,
    sign_key: list[str] | None = None,
    root_key: list[str] | None = None,
    threshold: int = Whole(0),
) -> None:
    """Root N+1: new root keys, threshold or online key, signed by the current and the new root keys."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import ceremony

    version = ceremony.rotate(
        load_recipe(recipe),
        [Path(p) for p in sign_key or []],
        [Path(p) for p in root_key or []],
        threshold,
        online.given(),
    )
    session.out(
        f"sparkforge: TUF root v{version} written; commit the metadata folder (clients follow the chain)"
    )


@task(
    families=(ONLINE,),
    iterable=["sign_key"],
    help={"recipe": RECIPE_HELP, "sign_key": "PATH: a root private key (repeat up to the threshold)"},
)
@user_errors
def recover(
    c: Context, session: Session, online: OnlineChoice, recipe: str, sign_key: list[str] | None = None
) -> None:
    """After an online-key leak: a root naming the new online key, and the metadata signed again with it."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import ceremony

    version = ceremony.recover(
        load_recipe(recipe), [Path(p) for p in sign_key or []], online.required(), session.warn
    )
    session.out(
        f"sparkforge: TUF root v{version} names the new online key; what the leaked key signed no longer "
        "verifies. Commit the metadata folder; revoke the leaked key wherever else it was used"
    )


@task(families=(JSON,), help={"recipe": RECIPE_HELP, "json": "PATH: write the status (JSON) here"})
@user_errors
def status(c: Context, session: Session, outputs: Outputs, recipe: str) -> None:
    """What this machine trusts for the recipe's repository: root, fingerprint, versions, expiries."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import ceremony

    found = ceremony.status(load_recipe(recipe), session.warn)
    echo = session.out
    echo(f"{found['repository']}: root {found['root']} (fingerprint {found['fingerprint']})")
    for role, seen in found["trusted"].items():
        echo(f"  trusted {role:9} v{seen['version']:<5} expires {seen['expires']}")
    if not found["trusted"]:
        echo("  nothing trusted yet on this machine (the first pull starts from the root above)")
    echo(f"  refused heads {found['refused_heads']}, revocations remembered {found['revoked_seen']}")
    echo(f"  committed metadata: {found['committed']}")
    outputs.write(session, found)


ns = Collection("trust")
ns.add_task(init)
ns.add_task(rotate)
ns.add_task(recover)
ns.add_task(status)
