"""`lock_recipe`: resolve the recipe's tags and refs online and compare them with its pins.

Base images: the tag is re-resolved to a digest through the registry API ("drift" when it moved).
vLLM: the release tag v<version> is resolved with `git ls-remote` (through the Runner); a wheel's
abbreviated commit is expanded to the full SHA. `check` fails on floating or drifted pins. A wheel's
abbreviated commit is not floating (decision): the artifact is the PyPI file of that version, immutable
there, and the short SHA is only the cross-check its own vllm/_version.py carries; lock reports the full
SHA and, with `write`, pins it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkforge import oci
from sparkforge.boundary import read_text, write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import CommandError, PreflightError
from sparkforge.preflight.fetch import Fetcher, UnreachableError, make_fetcher
from sparkforge.preflight.images import fetch_manifest, parse_image
from sparkforge.preflight.pypi import WheelTarget, resolve_file
from sparkforge.preflight.sources import same_commit
from sparkforge.recipe.loader import REPO_ROOT, Recipe
from sparkforge.recipe.yamlfile import MAX_YAML_BYTES
from sparkforge.urlfetch import check_url

# Exit codes of `invoke lock --check`: 0 every pin verified (lenient: or unreachable), 1 drift or floating
# pins (and any other error), 3 with --strict: some pin could not be verified (its registry or remote unreachable).
EXIT_UNVERIFIED = 3

State = Literal["pinned", "resolved", "drift", "floating", "unresolved"]
_FAILING: frozenset[str] = frozenset({"drift", "floating"})


class UnverifiedPinsError(PreflightError):
    """lock --check --strict: a pin could not be verified (distinct exit code from drift)."""

    exit_code = EXIT_UNVERIFIED


@dataclass(frozen=True)
class LockEntry:
    """One pin: what the recipe says, what upstream resolves it to now, and the verdict."""

    key: str
    pinned: str
    resolved: str | None
    state: State
    note: str = ""


@dataclass(frozen=True)
class LockResult:
    recipe: str
    entries: tuple[LockEntry, ...]
    check: bool
    written: tuple[Path, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not any(e.state in _FAILING for e in self.entries)

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe,
            "ok": self.ok,
            "entries": [e.__dict__ for e in self.entries],
            "written": [str(p) for p in self.written],
        }

    def __str__(self) -> str:
        width = max(len(e.key) for e in self.entries)
        unresolved = sum(e.state == "unresolved" for e in self.entries)
        verdict = "OK" if self.ok else "FAILED"
        if self.ok and unresolved:
            verdict += f" ({unresolved} pin(s) not verified: their registry or remote was unreachable)"
        lines = [f"lock {self.recipe}: {verdict}"]
        for e in self.entries:
            now = f" -> {e.resolved}" if e.resolved and e.resolved != e.pinned else ""
            lines.append(
                f"  {e.key:<{width}}  {e.state.upper():<10}  {e.pinned}{now}{'  (' + e.note + ')' if e.note else ''}"
            )
        lines += [f"  wrote {p}" for p in self.written]
        return "\n".join(lines)


def ls_remote(session: Session, repository: str, ref: str) -> str | None:
    """The commit `ref` (a tag or branch) names in `repository`, peeled; None when it does not exist."""
    command = Command.of("git", "ls-remote", repository, ref, f"{ref}^{{}}", env={"GIT_TERMINAL_PROMPT": "0"})
    output = session.runner.capture(command, "git-ls-remote").output
    found = dict(reversed(line.split("\t", 1)) for line in output.splitlines() if "\t" in line)
    return found.get(f"{ref}^{{}}") or found.get(ref)


def _image_entry(key: str, ref: str, fetcher: Fetcher) -> LockEntry:
    image = parse_image(ref)
    if not image.digest:
        return LockEntry(key, ref, None, "floating", "no digest")
    if image.tag is None:
        return LockEntry(key, ref, ref, "pinned", "digest only: nothing to re-resolve")
    try:
        _, digest = fetch_manifest(fetcher, image, image.tag)
    except UnreachableError as exc:
        return LockEntry(key, ref, None, "unresolved", f"{image.registry} unreachable ({str(exc)[:120]})")
    except PreflightError as exc:
        return LockEntry(key, ref, None, "unresolved", str(exc).split(";")[0])
    resolved = image.with_digest(digest)
    if digest == image.digest:
        return LockEntry(key, ref, resolved, "pinned")
    return LockEntry(key, ref, resolved, "drift", f"tag {image.tag} now points at {digest}")


def _vllm_entries(session: Session, recipe: Recipe, fetcher: Fetcher) -> list[LockEntry]:
    vllm = recipe.model.components.vllm
    commit = vllm.commit or ""
    repository = vllm.repository or "https://github.com/vllm-project/vllm"
    entries: list[LockEntry] = []
    try:
        tagged = ls_remote(session, repository, f"refs/tags/v{vllm.version}")
    except CommandError as exc:
        tagged, note = None, f"git ls-remote {repository} failed: {str(exc).splitlines()[-1][:160]}"
    else:
        note = "" if tagged else f"no tag v{vllm.version} in {repository}"
    if vllm.source == "git":
        if tagged is None:
            entries.append(LockEntry("components.vllm.commit", commit, None, "unresolved", note))
        else:
            agrees = same_commit(tagged, commit)
            entries.append(
                LockEntry(
                    "components.vllm.commit",
                    commit,
                    tagged,
                    "pinned",
                    "" if agrees else f"not the v{vllm.version} tag's commit; a deliberate pin is fine",
                )
            )
    else:
        if tagged is None:
            entries.append(LockEntry("components.vllm.commit", commit, None, "unresolved", note))
        elif same_commit(tagged, commit):
            state: State = "pinned" if len(commit) == 40 else "resolved"
            entries.append(LockEntry("components.vllm.commit", commit, tagged, state))
        else:
            entries.append(
                LockEntry(
                    "components.vllm.commit", commit, tagged, "drift", f"tag v{vllm.version} is {tagged[:12]}"
                )
            )
        target = WheelTarget.of(recipe.model.platforms[0], recipe.model.python)
        try:
            dist = resolve_file(fetcher, vllm.package or "vllm", vllm.version, wheel=target)
        except PreflightError as exc:
            entries.append(
                LockEntry("components.vllm.wheel", vllm.version, None, "unresolved", str(exc)[:160])
            )
        else:
            entries.append(
                LockEntry(
                    "components.vllm.wheel", vllm.version, f"{dist.filename} sha256:{dist.sha256}", "resolved"
                )
            )
    return entries


def _check_remotes(recipe: Recipe) -> None:
    """--strict verifies pins: never over plain http to another machine (anyone on the path could answer), and
    never through a remote that is not a URL; refused before any contact."""
    vllm = recipe.model.components.vllm
    remotes = [
        parse_image(recipe.model.images.builder).base_url,
        parse_image(recipe.model.images.runtime).base_url,
    ]
    remotes += [vllm.repository] if vllm.repository else []
    for remote in remotes:
        scheme, host, _ = check_url(remote, f"lock --check --strict: {recipe.name}'s remote")
        if scheme != "https" and not oci.is_local_registry(host):
            raise PreflightError(
                f"lock --check --strict: {recipe.name} names {remote}, plain http to another machine: a pin "
                "checked there proves nothing; fix: use the https:// URL of the remote"
            )


def _check_writable(recipe: Recipe) -> None:
    """`--write` edits the recipe files in place: never through a symlink whose target leaves the project."""
    for path in recipe.chain:
        real = path.resolve()
        if real != path.absolute() and not real.is_relative_to(REPO_ROOT.resolve()):
            raise PreflightError(
                f"lock --write: {path} is a symlink to {real}, outside this project ({REPO_ROOT}); writing the "
                "pins would change that file; fix: replace the link with a copy of the recipe, or run "
                "'invoke lock' without --write and edit the pins by hand"
            )
        if not real.is_file():
            raise PreflightError(f"lock --write: {path} is not a regular file; fix: name a recipe file")


def _write(recipe: Recipe, entries: list[LockEntry]) -> tuple[Path, ...]:
    """Replace each re-resolved value in the recipe file that states it (comments and layout kept)."""
    written: list[Path] = []
    for entry in entries:
        if (
            entry.state not in ("drift", "resolved")
            or not entry.resolved
            or entry.key == "components.vllm.wheel"
        ):
            continue
        for path in recipe.chain:
            text = read_text(path, "lock --write", MAX_YAML_BYTES)
            pattern = re.compile(rf"(?<![0-9A-Za-z]){re.escape(entry.pinned)}(?![0-9A-Za-z])")
            if pattern.search(text):
                # The recipe's real file (_check_writable allowed links inside the project): edited in place.
                write_output(path.resolve(), pattern.sub(entry.resolved, text), "lock --write")
                written.append(path)
                break
    return tuple(dict.fromkeys(written))


def lock_recipe(
    session: Session,
    recipe: Recipe,
    *,
    check: bool = False,
    strict: bool = False,
    write: bool = False,
    fetcher: Fetcher | None = None,
) -> LockResult:
    """Resolve the recipe's refs and tags now; with `check`, fail (PreflightError) on floating or drifted pins,
    and with `strict` also (UnverifiedPinsError, exit code 3) on any pin that could not be verified."""
    if session.offline:
        raise PreflightError(
            "lock resolves tags and refs against registries and git remotes, which needs the network; "
            "fix: run it online (offline, 'invoke preflight --offline' still checks that every pin is a digest/SHA)"
        )
    if write and not check:
        _check_writable(recipe)  # before the network: a refusal touches nothing
    if check and strict:
        _check_remotes(recipe)
    fetcher = fetcher or make_fetcher(ca_bundle=session.ca_bundle)
    model = recipe.model
    entries = [
        _image_entry("images.builder", model.images.builder, fetcher),
        _image_entry("images.runtime", model.images.runtime, fetcher),
        *_vllm_entries(session, recipe, fetcher),
    ]
    written = _write(recipe, entries) if write and not check else ()
    result = LockResult(recipe.name, tuple(entries), check, written)
    if check and not result.ok:
        bad = [e for e in entries if e.state in _FAILING]
        raise PreflightError(
            f"lock --check: {recipe.name} has "
            + "; ".join(f"{e.key} {e.state} ({e.note or e.pinned})" for e in bad)
            + "; fix: run 'invoke lock --recipe "
            + recipe.name
            + "' to re-resolve and write the pins, then review the diff"
        )
    unverified = [e for e in entries if e.state == "unresolved"]
    if check and strict and unverified:
        raise UnverifiedPinsError(
            f"lock --check --strict: {recipe.name} has {len(unverified)} pin(s) that could not be verified ("
            + "; ".join(f"{e.key} {e.pinned}: {e.note or 'unreachable'}" for e in unverified)
            + "); --strict expects a network that reaches every registry and remote; fix: run it where they "
            "are reachable, or drop --strict on an offline machine (the lenient check reports them instead)"
        )
    return result
