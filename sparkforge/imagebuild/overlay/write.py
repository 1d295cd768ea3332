"""`invoke overlay`: write an overlay recipe for a patch file, or for a pull request found in a local git checkout.

No network: a pull request is read from the checkout the owner already has (its merge or squash commit, found by
`(#N)` or `Merge pull request #N` in the subject) through `git`. Of its diff, only the installed package's .py
files are kept; upstream tests and docs are left out and named; a compiled source refuses the whole request.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from sparkforge.boundary import read_text, write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import EngineError, InputError, RecipeError
from sparkforge.imagebuild.overlay import unidiff
from sparkforge.imagebuild.overlay.model import MAX_PATCH_BYTES, OVERLAYS_DIR, PACKAGES
from sparkforge.imagebuild.overlay.preflight import judge_path
from sparkforge.recipe.loader import PATCHES_DIR, REPO_ROOT, Recipe


@dataclass(frozen=True)
class OverlaySource:
    """Where the patch comes from: a file, or pull request `pr` in the git checkout `checkout`."""

    patch: Path | None = None
    pr: int | None = None
    checkout: Path | None = None


@dataclass(frozen=True)
class OverlayRequest:
    recipe: Recipe  # the recipe the base image was built from
    base_image: str  # NAME@sha256:<digest> of the verified image
    package: str  # vllm, transformers or flashinfer
    source: OverlaySource
    name: str = ""  # default: <recipe>-pr<N> or <recipe>-<patch stem>
    out: Path | None = None  # default: recipes/overlays/<name>.yaml


@dataclass(frozen=True)
class WrittenOverlay:
    path: Path
    patch: Path
    kept: tuple[str, ...]
    dropped: tuple[str, ...]  # upstream files the image does not install (tests, docs), left out


def split_by_file(text: str) -> tuple[str, list[tuple[tuple[str, ...], str]]]:
    """(the mail header, [(paths, the file's section)]) of a `git diff`/`format-patch` text."""
    parts = re.split(r"(?m)^(?=diff --git )", text)
    head, sections = parts[0], parts[1:]
    out = []
    for section in sections:
        paths = tuple(unidiff.parse(section).paths) if "\n@@" in section or "Binary" in section else ()
        if not paths:
            match = re.match(r"diff --git a/(\S+) b/(\S+)", section)
            paths = tuple(dict.fromkeys(match.groups())) if match else ()
        out.append((paths, section))
    return head, out


def select_installed(text: str, package: str) -> tuple[str, list[str], list[str]]:
    """Keep the sections that change the package's installed .py files; drop upstream-only files; refuse the
    whole diff when it touches a compiled source (the fix: the source recipe)."""
    head, sections = split_by_file(text)
    kept_text, kept, dropped, refused = [], [], [], []
    for paths, section in sections:
        verdicts = [judge_path(p, package) for p in paths]
        if all(v.refusal is None for v in verdicts):
            kept_text.append(section)
            kept += list(paths)
        elif any(v.kind == "compiled" for v in verdicts):
            refused += [v.refusal for v in verdicts if v.kind == "compiled" and v.refusal]
        else:
            dropped += list(paths)
    if refused:
        raise RecipeError("the patch cannot be an overlay: " + "; ".join(dict.fromkeys(refused)))
    if not kept:
        raise RecipeError(
            f"the patch changes no installed .py file of {package} (it changes {', '.join(dropped) or 'nothing'}); "
            "fix: check --package, or build from source"
        )
    tail = "" if kept_text[-1].endswith("\n") else "\n"
    prefix = PACKAGES[package].repo_prefix
    text = head + "".join(installed_layout(section, prefix) for section in kept_text) + tail
    return text, [k.removeprefix(prefix) for k in kept], dropped


def installed_layout(section: str, prefix: str) -> str:
    """A file section of a diff with the repository's prefix (transformers' `src/`) dropped from its headers, so
    the overlay's patch names paths under site-packages, as the image applies them."""
    if not prefix:
        return section
    out = []
    for line in section.split("\n"):
        if line.startswith("diff --git "):
            line = line.replace(f" a/{prefix}", " a/").replace(f" b/{prefix}", " b/")
        elif line.startswith(("--- a/", "+++ b/")) and line[6:].startswith(prefix):
            line = line[:6] + line[6 + len(prefix) :]
        out.append(line)
    return "\n".join(out)


def pr_diff(session: Session, checkout: Path, pr: int) -> tuple[str, str]:
    """(the diff, the commit) of pull request `pr` as merged in the local checkout: squash or merge commit."""
    git = ("git", "-C", str(checkout))
    found = session.runner.capture(
        Command.of(
            *git,
            "log",
            "--all",
            "--format=%H %P%x00%s",
            "-E",
            f"--grep=(\\(#{pr}\\)$|^Merge pull request #{pr} )",
        ),
        "git-log",
        check=False,
    )
    if found.returncode != 0:
        raise InputError(
            f"--checkout {checkout}: not a git checkout ({found.output.strip()[-200:]}); fix: name a clone"
        )
    for line in found.output.splitlines():
        ids, _, subject = line.partition("\x00")
        commit, *parents = ids.split()
        if not (subject.endswith(f"(#{pr})") or subject.startswith(f"Merge pull request #{pr} ")):
            continue
        if len(parents) > 1:  # a merge commit: what the pull request brought, against the first parent
            result = session.runner.capture(
                Command.of(*git, "diff", "--no-color", f"{commit}^1", commit), "git-diff"
            )
            return f"From {commit}\nSubject: {subject}\n---\n" + result.output, commit
        result = session.runner.capture(
            Command.of(*git, "format-patch", "-1", "--stdout", "--no-signature", commit), "git-format-patch"
        )
        return result.output, commit
    raise InputError(
        f"--pr {pr}: no commit in {checkout} names pull request #{pr} ('(#{pr})' at the end of a squash commit's "
        f"subject, or 'Merge pull request #{pr}'); fix: fetch the branch that merged it, or give --patch FILE"
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "patch"


@dataclass(frozen=True)
class SeriesPatch:
    """One patch of a series to write: its package, text, where it came from, and its file's stem."""

    package: str
    text: str
    origin: str
    stem: str


def _plain(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9 .,:;()+/_=@%#\[\]-]", " ", text)[:200]


def write_series(request: OverlayRequest, name: str, series: list[SeriesPatch], notes: list[str]) -> Path:
    """Write each patch to patches/overlay-<package>/<stem>.patch and the overlay recipe naming them, pinned."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", name):
        raise InputError(
            f"overlay name {name!r}: use lowercase letters, digits, '.', '_' and '-' (it becomes image tags)"
        )
    out = request.out or OVERLAYS_DIR / f"{name}.yaml"
    entries = []
    for item in series:
        path = PATCHES_DIR / f"overlay-{item.package}" / f"{item.stem}.patch"
        data = item.text.encode("utf-8")
        write_output(path, data, "the overlay's patch")
        entries.append(
            {
                "file": path.relative_to(REPO_ROOT).as_posix(),
                "package": item.package,
                "sha256": hashlib.sha256(data).hexdigest(),
                "origin": _plain(item.origin),
            }
        )
    origins = ", ".join(item.origin for item in series)
    document = {
        "kind": "overlay",
        "description": _plain(f"{request.recipe.name} plus {origins}"),
        "base": {"image": request.base_image, "recipe": _relative(request.recipe.path, out.parent)},
        "patches": entries,
    }
    header = (
        f"# Written by sparkforge from {origins}. Review each patch: its sha256 below pins the reviewed bytes.\n"
        "# Build with `invoke overlay.build --overlay THIS_FILE`.\n"
    )
    header += "".join(f"# {note}\n" for note in notes)
    write_output(out, header + yaml.safe_dump(document, sort_keys=False), "--out")
    return out


def write_overlay(session: Session, request: OverlayRequest) -> WrittenOverlay:
    """Write patches/overlay-<package>/<name>.patch and the overlay recipe; return what was kept and dropped."""
    source = request.source
    if source.patch is not None:
        text = read_text(source.patch, "--patch", MAX_PATCH_BYTES)
        origin = f"patch file {source.patch.name}"
        default_name = f"{request.recipe.name}-{_slug(source.patch.stem)}"
    elif source.pr is not None and source.checkout is not None:
        text, commit = pr_diff(session, source.checkout, source.pr)
        origin = f"pull request {source.pr} at commit {commit}"
        default_name = f"{request.recipe.name}-pr{source.pr}"
    else:
        raise InputError("give --patch FILE, or --pr N with --checkout DIR (a local clone); fix: add one")
    if request.package not in PACKAGES:
        raise InputError(f"--package {request.package!r}: use one of {', '.join(PACKAGES)}")
    try:
        patch_text, kept, dropped = select_installed(text, request.package)
    except unidiff.PatchError as exc:
        raise RecipeError(
            f"the patch cannot be read: {exc}; fix: give 'git diff' or 'git format-patch' output"
        ) from None
    name = request.name or default_name
    notes = ["Left out (not installed in the image): " + ", ".join(dropped)] if dropped else []
    path = write_series(request, name, [SeriesPatch(request.package, patch_text, origin, name)], notes)
    return WrittenOverlay(
        path, PATCHES_DIR / f"overlay-{request.package}" / f"{name}.patch", tuple(kept), tuple(dropped)
    )


def local_base_image(recipe: Recipe, image: str = "") -> str | None:
    """NAME@sha256:<digest> of the verified base: `image` as given (a tag is resolved on this engine), else the
    recipe's own local candidate image; None when the engine has neither."""
    from sparkforge import engine
    from sparkforge.oci import check_reference
    from sparkforge.recipe import plan

    ref = image or plan.candidate_tag(recipe, recipe.model.platforms[0])
    check_reference("--image", ref)
    if "@sha256:" in ref:
        return ref
    try:
        if not engine.image_exists(ref):
            return None
        info = engine.inspect_image(ref)
    except EngineError:  # no engine here: nothing to pin (the caller says how to pin later)
        return None
    digests = [str(d) for d in info.get("RepoDigests") or []]
    name = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    return digests[0] if digests else f"{name}@{info['Id']}"


def _relative(target: Path, start: Path) -> str:
    import os

    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
