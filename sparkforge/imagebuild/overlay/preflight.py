"""An overlay's preflight, in seconds: the patches obey the rules, the base is the pinned image, and every patch
applies to the very files the image carries (read out of a created, never started, container).

The rules: a patch changes only `.py` files inside one installed package's folder (vLLM's, transformers',
flashinfer's). Compiled sources (csrc/, CUDA, C++, CMake) need a compile: refused, with the source recipe as
the fix. Anything else (upstream tests, docs) is not installed: refused, with `invoke overlay` (which leaves
such files out of a pull request's diff) as the fix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sparkforge import engine
from sparkforge.context import Session
from sparkforge.errors import EngineError, PreflightError, RecipeError
from sparkforge.imagebuild.overlay import unidiff
from sparkforge.imagebuild.overlay.model import PACKAGES, Overlay, OverlayPatch
from sparkforge.recipe import plan
from sparkforge.report import Check, Report

COMPILED_SUFFIXES = (
    ".cu",
    ".cuh",
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".h",
    ".hpp",
    ".so",
    ".cmake",
    ".pyx",
    ".pxd",
)
COMPILED_NAMES = ("CMakeLists.txt", "setup.py", "pyproject.toml", "MANIFEST.in")
COMPILED_DIRS = ("csrc/", "cmake/", "include/", "3rdparty/", "cuda/", "kernels/")
SOURCE_FIX = (
    "a change to compiled sources needs a compile: use the source recipe (components.{package}: source: git, "
    "commit, patches: [...]) and 'invoke build', not an overlay"
)


@dataclass(frozen=True)
class PathVerdict:
    path: str  # as the diff names it
    installed: str | None  # the path under site-packages, when allowed
    refusal: str | None  # why not, with the fix
    kind: str = "python"  # python | compiled (needs a compile) | outside (not installed: tests, docs)


def judge_path(path: str, package: str, *, installed: bool = False) -> PathVerdict:
    """Whether an overlay may change `path`, and where it lies under site-packages. `installed`: the path is as
    an overlay's patch names it (relative to site-packages); else as `package`'s upstream repository names it."""
    layout = PACKAGES[package]
    prefix = "" if installed else layout.repo_prefix
    name = path.rsplit("/", 1)[-1]
    inside = path.startswith(prefix + layout.import_dir + "/")
    if installed and layout.repo_prefix and path.startswith(layout.repo_prefix + layout.import_dir + "/"):
        return PathVerdict(
            path,
            None,
            f"{path} is in {package}'s repository layout; an overlay's patch names installed paths; fix: "
            f"'{path.removeprefix(layout.repo_prefix)}' ('invoke overlay' rewrites them)",
            "outside",
        )
    compiled = (
        path.endswith(COMPILED_SUFFIXES)
        or name in COMPILED_NAMES
        or any(path.startswith(d) or f"/{d}" in path for d in COMPILED_DIRS)
    )
    if compiled and not (inside and path.endswith(".py")):
        return PathVerdict(
            path,
            None,
            f"{path} is a compiled source or build file; {SOURCE_FIX.format(package=package)}",
            "compiled",
        )
    if not inside:
        return PathVerdict(
            path,
            None,
            f"{path} is outside {package}'s installed folder ({layout.repo_prefix}{layout.import_dir}/), so the "
            "image has no such file (upstream tests, docs); fix: leave it out of the patch ('invoke overlay' "
            "keeps only the installed .py files of a pull request)",
            "outside",
        )
    if not path.endswith(".py"):
        return PathVerdict(
            path,
            None,
            f"{path} is not a Python file; an overlay changes only .py files of installed packages; "
            f"{SOURCE_FIX.format(package=package)}",
            "compiled",
        )
    return PathVerdict(path, path.removeprefix(prefix), None)


def judge_diff(diff: unidiff.Diff, package: str, *, installed: bool = False) -> list[PathVerdict]:
    """Every path of a diff judged (`installed`: as judge_path); binary, mode and rename changes are refused."""
    out = []
    for change in diff.changes:
        if change.binary or change.mode_change:
            out.append(
                PathVerdict(
                    change.path,
                    None,
                    f"{change.path}: a binary, mode or rename change; an overlay applies text hunks to .py files "
                    f"only; {SOURCE_FIX.format(package=package)}",
                    "compiled",
                )
            )
            continue
        paths = dict.fromkeys(p for p in (change.old_path, change.new_path) if p != "/dev/null")
        out.extend(judge_path(p, package, installed=installed) for p in paths)
    return out


@dataclass(frozen=True)
class Installed:
    """The installed files a series touches, read out of the base image, and the result of applying it."""

    site: str  # site-packages inside the image
    before: dict[str, str | None]  # installed path -> text (None: absent)
    after: dict[str, str | None]


@dataclass
class PreflightResult:
    report: Report
    image_id: str = ""
    base_lock: bytes | None = None
    installed: Installed | None = None
    patches: list[tuple[OverlayPatch, bytes]] = field(default_factory=list)


def site_packages(overlay: Overlay) -> str:
    return f"/opt/venv/lib/python{overlay.base_recipe.model.python}/site-packages"


def resolve_base(overlay: Overlay) -> str:
    """The engine's image ID of the pinned base: the digest is its registry digest or its local image ID."""
    ref = overlay.model.base.image
    try:
        info = engine.inspect_image(ref)
    except EngineError:
        try:
            info = engine.inspect_image(overlay.base_digest)
        except EngineError:
            raise PreflightError(
                f"{overlay.path}: base.image {ref} is not on this engine; fix: 'invoke pull' the verified image "
                "(or build it) first; the overlay never builds on another image"
            ) from None
    image_id = str(info["Id"])
    digests = [str(d).rsplit("@", 1)[-1] for d in info.get("RepoDigests") or []]
    if overlay.base_digest != image_id and overlay.base_digest not in digests:
        raise PreflightError(
            f"{overlay.path}: base.image pins {overlay.base_digest}, but the engine's image is {image_id} "
            f"(registry digests: {', '.join(digests) or 'none'}); fix: pin the digest of the verified image"
        )
    return image_id


def _check_patches(
    overlay: Overlay, report: Report
) -> tuple[list[tuple[OverlayPatch, bytes]], list[unidiff.Diff]]:
    started = time.monotonic()
    try:
        patches = overlay.patch_bytes()
    except RecipeError as exc:
        report.add(Check("patches", "failed", str(exc)))
        return [], []
    diffs, refusals = [], []
    for patch, data in patches:
        try:
            diff = unidiff.parse(data.decode("utf-8"))
        except (UnicodeDecodeError, unidiff.PatchError) as exc:
            refusals.append(f"{patch.file}: {exc}; fix: give 'git diff' or 'git format-patch' output")
            continue
        diffs.append(diff)
        refusals += [
            f"{patch.file}: {v.refusal}" for v in judge_diff(diff, patch.package, installed=True) if v.refusal
        ]
    if refusals:
        report.add(Check("patches", "failed", "; ".join(refusals), {"refused": refusals}))
        return patches, []
    report.add(
        Check(
            "patches",
            "passed",
            f"{len(patches)} patch(es), sha256 as pinned, only installed .py files",
            {"patches": [{"file": p.file, "package": p.package, "sha256": p.sha256} for p, _ in patches]},
            time.monotonic() - started,
        )
    )
    return patches, diffs


def _check_base(overlay: Overlay, report: Report) -> tuple[str, dict[str, str]]:
    started = time.monotonic()
    image_id = resolve_base(overlay)
    labels = engine.image_labels(image_id)
    drift = plan.label_drift(overlay.base_recipe, labels)
    if drift:
        report.add(
            Check(
                "base",
                "failed",
                f"the base image is not recipe {overlay.base_recipe.name}'s build: {plan.drift_text(drift)}; fix: "
                "name the recipe the image was built from in base.recipe",
            )
        )
    else:
        report.add(
            Check(
                "base",
                "passed",
                f"{overlay.model.base.image} is {image_id[:19]}, built from {overlay.base_recipe.name} "
                f"({overlay.base_recipe.hash[:12]})",
                {"image_id": image_id, "recipe_hash": overlay.base_recipe.hash},
                time.monotonic() - started,
            )
        )
    return image_id, labels


def _dist_info(overlay: Overlay, package: str) -> str:
    component = getattr(overlay.base_recipe.model.components, package)
    if component is None:
        raise PreflightError(
            f"{overlay.path}: a patch changes {package}, which recipe {overlay.base_recipe.name} does not install; "
            "fix: patch a component of the base recipe"
        )
    dist = (component.package or package).replace("-", "_")
    return f"{dist}-{component.version}.dist-info/METADATA"


def run_overlay_preflight(session: Session, overlay: Overlay) -> PreflightResult:
    """Every overlay check; the files the series changes are read from the base image in one created container."""
    report = Report(command="preflight", subject=overlay.model.base.image, recipe=overlay.name)
    result = PreflightResult(report)
    patches, diffs = _check_patches(overlay, report)
    result.patches = patches
    image_id, _ = _check_base(overlay, report)
    result.image_id = image_id
    if report.status != "passed":
        return result
    started = time.monotonic()
    site = site_packages(overlay)
    touched = {
        v.installed: p.package
        for (p, _), d in zip(patches, diffs, strict=True)
        for v in judge_diff(d, p.package, installed=True)
        if v.installed
    }
    metadata = {f"{site}/{_dist_info(overlay, pkg)}": pkg for pkg in sorted(set(touched.values()))}
    read = engine.read_image_files(
        image_id, [*metadata, *(f"{site}/{p}" for p in touched), "/opt/sparkforge/lock.json"]
    )
    result.base_lock = read.pop("/opt/sparkforge/lock.json")
    missing = [pkg for path, pkg in metadata.items() if read.get(path) is None]
    if missing:
        report.add(
            Check(
                "versions",
                "failed",
                f"the image has no {', '.join(missing)} at the base recipe's version ({', '.join(metadata)} absent); "
                "fix: name the image's own recipe in base.recipe",
            )
        )
        return result
    versions = {pkg: getattr(overlay.base_recipe.model.components, pkg).version for pkg in metadata.values()}
    report.add(
        Check(
            "versions",
            "passed",
            ", ".join(f"{k} {v}" for k, v in versions.items()) + " installed",
            versions,
            time.monotonic() - started,
        )
    )
    started = time.monotonic()
    before = {
        p: (read[f"{site}/{p}"] or b"").decode("utf-8") if read[f"{site}/{p}"] is not None else None
        for p in touched
    }
    current = dict(before)
    applied = []
    for (patch, _), diff in zip(patches, diffs, strict=True):
        try:
            for change in diff.changes:
                current[change.path] = unidiff.apply_hunks(current[change.path], change)
        except unidiff.PatchError as exc:
            report.add(
                Check(
                    "apply",
                    "failed",
                    f"{patch.file} does not apply to {patch.package} {versions[patch.package]} in the base image: {exc}; "
                    f"fix: rebase the patch on {patch.package} {versions[patch.package]} (or pin a base image of the "
                    "version it was written for)",
                    {"patch": patch.file},
                    time.monotonic() - started,
                )
            )
            return result
        applied.append(
            {
                "file": patch.file,
                "files": [c.path for c in diff.changes],
                "hunks": sum(len(c.hunks) for c in diff.changes),
            }
        )
    report.add(
        Check(
            "apply",
            "passed",
            f"{len(applied)} patch(es) apply at the image's versions ({len(touched)} file(s))",
            {"applied": applied},
            time.monotonic() - started,
        )
    )
    result.installed = Installed(site, before, current)
    return result


def file_hashes(installed: Installed) -> dict[str, dict[str, str | None]]:
    """Per patched file, its sha256 before and after (what the overlay's lock records)."""
    return {
        path: {
            "before": unidiff.sha256_text(installed.before[path]),
            "after": unidiff.sha256_text(installed.after[path]),
        }
        for path in sorted(installed.before)
    }


def require_passed(result: PreflightResult) -> None:
    if result.report.status != "passed":
        failed = "; ".join(f"{c.name}: {c.reason}" for c in result.report.failed)
        raise PreflightError(f"overlay preflight failed ({failed}); nothing was built")
