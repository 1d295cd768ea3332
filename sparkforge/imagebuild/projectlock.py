"""sparkforge's own dependency lock (uv.lock): what it pins, re-resolving it with the changes shown, the
hashed uv requirement `.ci/install` bootstraps from (.ci/uv.txt), and pip-audit of every locked pin."""

from __future__ import annotations

import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkforge.boundary import read_text, write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.urlfetch import FetchError, fetch_url, proxied_session

LOCK = REPO_ROOT / "uv.lock"
UV_REQUIREMENT = REPO_ROOT / ".ci" / "uv.txt"
MACHINES = ("x86_64", "aarch64")  # linux/amd64 and linux/arm64: the platforms the lock must install on
# The service pip-audit asks by default (its "pypi" vulnerability source): one JSON document per release.
VULNERABILITY_SERVICE = "https://pypi.org/pypi"
MAX_LOCK_BYTES = 16 << 20  # uv.lock of every dependency with each wheel's hash: a few hundred KiB today


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    wheels: tuple[tuple[str, str], ...]  # (file name, "sha256:...")


def locked_packages(lock_text: str) -> list[LockedPackage]:
    """Every package of a uv.lock text, the project itself (no version source) left out."""
    packages = []
    for entry in tomllib.loads(lock_text).get("package", []):
        if "editable" in entry.get("source", {}) or "virtual" in entry.get("source", {}):
            continue
        wheels = tuple((w["url"].rsplit("/", 1)[-1], w["hash"]) for w in entry.get("wheels", []))
        packages.append(LockedPackage(entry["name"], entry["version"], wheels))
    return packages


def pins(lock_text: str) -> set[str]:
    """`name==version` for every locked package (a name can be locked at two versions, per Python)."""
    return {f"{p.name}=={p.version}" for p in locked_packages(lock_text)}


def pin_changes(old: Iterable[str], new: Iterable[str]) -> list[str]:
    """A diff of two pin sets: `- name==old` and `+ name==new` lines, sorted by name."""
    before, after = set(old), set(new)
    lines = [(p.split("==")[0], 0, f"- {p}") for p in before - after]
    lines += [(p.split("==")[0], 1, f"+ {p}") for p in after - before]
    return [text for _, _, text in sorted(lines)]


def uv_requirement(lock_text: str) -> str:
    """The text of .ci/uv.txt: the lock's uv with the hash of each of its Linux wheels for our machines."""
    uv = [p for p in locked_packages(lock_text) if p.name == "uv"]
    if len(uv) != 1:
        raise ValueError("uv.lock must lock exactly one uv (the dev extra declares it)")
    hashes = [h for name, h in uv[0].wheels if "linux" in name and any(m in name for m in MACHINES)]
    lines = [f"uv=={uv[0].version}", *(f"--hash={h}" for h in hashes)]
    return (
        "# uv for .ci/install, the lock's own uv with its Linux wheels' hashes.\n"
        "# Written by `invoke lock.update` from uv.lock; tests/unit/test_install_lock.py keeps the two equal.\n"
        + " \\\n    ".join(lines)
        + "\n"
    )


def update_lock(session: Session, packages: Sequence[str] = (), root: Path = REPO_ROOT) -> list[str]:
    """Re-resolve uv.lock (every package to its newest allowed version, or only `packages`), rewrite
    .ci/uv.txt, and return what changed as pin_changes lines."""
    lock, requirement = root / LOCK.relative_to(REPO_ROOT), root / UV_REQUIREMENT.relative_to(REPO_ROOT)
    old = read_text(lock, "uv.lock", MAX_LOCK_BYTES) if lock.exists() else ""
    upgrade = [a for p in packages for a in ("--upgrade-package", p)] if packages else ["--upgrade"]
    uv = (sys.executable, "-m", "uv", "lock", "--system-certs", "--project", str(root), *upgrade)
    session.runner.run(Command(uv, cwd=root), "uv-lock")
    new = read_text(lock, "uv.lock", MAX_LOCK_BYTES)
    write_output(requirement, uv_requirement(new), ".ci/uv.txt")
    return pin_changes(pins(old), pins(new))


def service_unreachable(probe: LockedPackage, base: str = VULNERABILITY_SERVICE) -> str | None:
    """Why the vulnerability service cannot answer for the locked set here, or None when it can."""
    url = f"{base}/{probe.name}/{probe.version}/json"
    try:
        answer = fetch_url(
            proxied_session(),
            url,
            what="the vulnerability service",
            max_bytes=4 << 20,
            deadline=15,
            ok_status=tuple(range(400, 600)),
        )
    except FetchError as exc:
        return f"{url}: {str(exc)[:200]}"
    if answer.status_code != 200:
        return f"{url} answered HTTP {answer.status_code}"
    return None


def audit_argv(requirements: Path) -> tuple[str, ...]:
    # --strict: a pin the service cannot answer for fails the audit instead of being skipped.
    return (
        sys.executable, "-m", "pip_audit", "--requirement", str(requirements), "--no-deps", "--disable-pip",
        "--strict", "--progress-spinner", "off",
    )  # fmt: skip


def audit_lock(session: Session, service: str = VULNERABILITY_SERVICE) -> bool | None:
    """pip-audit of every pin in uv.lock: True clean, False vulnerable (or unanswered), None not checked
    because the vulnerability service is unreachable from here (said so, never a silent pass)."""
    packages = locked_packages(read_text(LOCK, "uv.lock", MAX_LOCK_BYTES))
    reason = service_unreachable(packages[0], service)
    if reason:
        session.echo(f"pip-audit: not checked: offline ({reason})")
        return None
    # pip-audit takes one version per name: a name locked twice (one per Python) is audited in a second run.
    rounds: list[list[str]] = []
    for package in packages:
        pin = f"{package.name}=={package.version}"
        free = next((r for r in rounds if all(not p.startswith(f"{package.name}==") for p in r)), None)
        if free is None:
            rounds.append(free := [])
        free.append(pin)
    clean = True
    with tempfile.TemporaryDirectory() as tmp:
        for i, round_pins in enumerate(rounds):
            requirements = Path(tmp) / f"locked-{i}.txt"
            write_output(requirements, "\n".join(round_pins) + "\n", "pip-audit requirements")
            result = session.runner.run(Command(audit_argv(requirements)), f"pip-audit-{i}", check=False)
            clean = clean and result.returncode == 0
    return clean
