"""`invoke engine.up` and `engine.bases`: a working container engine on this host, and offline stand-in bases."""

from __future__ import annotations

from invoke import Collection, Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import DRY
from sparkforge.context import Session


@task(
    families=(DRY,),
    help={
        "qemu": "also register qemu-aarch64 (build and run arm64 images on x86)",
        "buildx": "also install buildx + Docker 26 from Debian trixie (pinned) and start that engine beside this one",
    },
)
@user_errors
def up(c: Context, session: Session, qemu: bool = False, buildx: bool = False) -> None:
    """Make a working Docker engine: install from the distribution if missing, start it, wait for it."""
    from sparkforge.imagebuild.hostsetup import buildx_up, engine_up

    for step in [*engine_up(session, qemu=qemu), *(buildx_up(session) if buildx else [])]:
        session.out(f"{step.name}: {step.done}")


@task(
    iterable=["platform"],
    help={"platform": "linux/amd64 and/or linux/arm64 (default both)", "force": "rebuild"},
)
@user_errors
def bases(c: Context, session: Session, platform: list[str] | None = None, force: bool = False) -> None:
    """Offline stand-in bases from Debian (debootstrap) for machines that cannot pull the recipe's bases."""
    from sparkforge.imagebuild.hostsetup import build_bases

    for step in build_bases(session, platform or ["linux/amd64", "linux/arm64"], force=force):
        session.out(step.done)


ns = Collection("engine")
ns.add_task(up, "up")
ns.add_task(bases, "bases")
