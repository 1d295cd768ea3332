"""Installing cosign on a machine without it (`invoke sign.install`)."""

from __future__ import annotations

from pathlib import Path

from sparkforge.boundary import write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.registry.cosign import SigningError


def install_cosign(session: Session, mirror: str, workdir: Path) -> str:
    """cosign from Debian trixie's archive (the .deb only: its one dependency is libc6 >= 2.34), via dpkg.

    The trixie suite is read through a private apt state under `workdir`; the system is not upgraded.
    """
    runner = session.runner
    state = workdir / "apt"
    sources = state / "sources.list.d"
    for sub in (sources, state / "lists" / "partial", state / "cache" / "archives" / "partial"):
        sub.mkdir(parents=True, exist_ok=True)
    write_output(
        sources / "trixie.sources",
        f"Types: deb\nURIs: {mirror}\nSuites: trixie\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        "apt sources",
    )
    opts = (
        "-o",
        "Dir::Etc::SourceList=/dev/null",
        "-o",
        f"Dir::Etc::SourceParts={sources}",
        "-o",
        f"Dir::State::Lists={state / 'lists'}",
        "-o",
        f"Dir::Cache={state / 'cache'}",
    )
    runner.run(Command(("apt-get", "-q", *opts, "update")), "apt-trixie-update")
    runner.run(Command(("apt-get", "-q", *opts, "download", "cosign"), cwd=workdir), "apt-download-cosign")
    debs = sorted(workdir.glob("cosign_*.deb"))
    if not debs:
        raise SigningError(f"apt-get download cosign wrote no .deb into {workdir}; see the log above")
    runner.run(Command.of("dpkg", "-i", str(debs[-1])), "dpkg-install-cosign")
    return runner.capture(Command.of("cosign", "version"), "cosign-version").output
