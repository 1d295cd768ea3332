"""A community recipe's `mods:` at import: a mod whose content is a patch becomes an overlay patch (written to
patches/, hashed, pinned in an overlay recipe, checked by its preflight); a mod that is a script is refused,
naming what it would run: it is the author's code, the same rule as the allow-list.

The community runner (eugr/spark-vllm-docker) names a mod as a path (`mods/fix-x`), relative to its repository:
a folder that it copies into the container at launch and whose `run.sh` it runs there (often `patch -p1 < x.patch`
into dist-packages), or a patch file. Spark Arena's experimental recipes carry the same list as a top-level `mods:`
(or under `runtime_config.mods`). The path is looked up beside the recipe file and in the folders above it (a
recipe in `recipes/` names `mods/...` from the repository's root); a recipe read from a URL has no mods here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sparkforge.boundary import list_files, read_text, write_output
from sparkforge.imagebuild.overlay import unidiff
from sparkforge.imagebuild.overlay.model import MAX_PATCH_BYTES, PACKAGES
from sparkforge.imagebuild.overlay.preflight import judge_diff
from sparkforge.imagebuild.overlay.write import (
    OverlayRequest,
    OverlaySource,
    SeriesPatch,
    local_base_image,
    write_series,
)
from sparkforge.recipe.community.formats import CommunityRecipe
from sparkforge.recipe.loader import PATCHES_DIR, REPO_ROOT, Recipe

PATCH_SUFFIXES = (".patch", ".diff")
SCRIPT_SUFFIXES = (".sh", ".bash", ".py", ".pl", ".rb")
MAX_SHOWN_COMMANDS = 6
# Where an installed package's files lie in a diff written against an installed tree (dist-packages of the
# runner's image, or a venv): everything up to site-packages/ or dist-packages/ goes.
_INSTALLED = re.compile(r"(?:site|dist)-packages/")


@dataclass(frozen=True)
class ModVerdict:
    """What one mod is, read from its files: a patch to carry, a script refused, or not found here."""

    mod: str  # as the recipe names it
    where: str  # file:line: key
    kind: Literal["patch", "script", "missing", "unreadable"]  # unreadable: refused (binary, compiled, mixed)
    package: str | None = None
    patch_text: str | None = None
    files: tuple[str, ...] = ()  # the mod's files, relative to the mod
    runs: tuple[str, ...] = ()  # a script's commands, as it would run them
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def locate(mod: str, recipe_file: Path) -> Path | None:
    """The mod's path beside the recipe file or in a folder above it (at most three up); None when absent."""
    if mod.startswith("/") or any(part == ".." for part in mod.split("/")):
        return None
    folder = recipe_file.resolve().parent
    for _ in range(4):
        candidate = folder / mod.rstrip("/")
        if candidate.exists():
            return candidate
        folder = folder.parent
    return None


def _site_relative(path: str) -> str:
    found = _INSTALLED.search(path)
    return path[found.end() :] if found else path


def installed_paths(text: str) -> str:
    """A diff against an installed tree (`/usr/local/lib/python3.12/dist-packages/vllm/...`) with its paths made
    relative to site-packages (`a/vllm/...`), as an overlay names them; other paths are left as they are."""
    out = []
    for line in text.split("\n"):
        if line.startswith("diff --git ") and _INSTALLED.search(line):
            old, new = line.split(" ")[2:4]
            line = f"diff --git a/{_site_relative(old)} b/{_site_relative(new)}"
        elif line.startswith(("--- ", "+++ ")) and _INSTALLED.search(line):
            path = line[4:].split("\t", 1)[0]
            line = line[:4] + ("a/" if line.startswith("-") else "b/") + _site_relative(path)
        out.append(line)
    return "\n".join(out)


def package_of(diff: unidiff.Diff) -> str | None:
    """The one installed package every path of the diff lies in; None when they are several or none."""
    found = set()
    for path in diff.paths:
        owner = [
            n
            for n, layout in PACKAGES.items()
            if path.startswith(layout.import_dir + "/")  # installed paths (site-relative)
        ]
        found.add(owner[0] if owner else None)
    return found.pop() if len(found) == 1 else None


def _commands(text: str) -> tuple[str, ...]:
    lines = [line.strip() for line in text.splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    shown = commands[:MAX_SHOWN_COMMANDS]
    return (
        (*shown, f"... ({len(commands) - len(shown)} more)") if len(commands) > len(shown) else tuple(shown)
    )


def _is_script(path: Path, text: str) -> bool:
    return path.suffix in SCRIPT_SUFFIXES or text.startswith("#!") or path.name in ("run", "Makefile")


def judge_mod(mod: str, where: str, recipe_file: Path | None) -> ModVerdict:
    """Read one mod's files and say what it is (nothing is run)."""
    found = locate(mod, recipe_file) if recipe_file is not None else None
    if found is None:
        place = "beside the recipe or above it" if recipe_file is not None else "(the recipe came from a URL)"
        return ModVerdict(
            mod,
            where,
            "missing",
            reason=f"mod {mod!r}: its files are not here {place}; fix: import the recipe from a clone of its "
            "repository, so the mod's files can be read and judged",
        )
    files = list_files(found, "mods") if found.is_dir() else [found]
    texts: dict[str, str] = {}
    for path in files:
        rel = path.name if not found.is_dir() else path.relative_to(found).as_posix()
        try:
            texts[rel] = read_text(path, "mod", MAX_PATCH_BYTES, named=True)
        except Exception as exc:  # a binary or oversized file: the mod cannot be reviewed as text
            return ModVerdict(
                mod, where, "unreadable", files=tuple(texts), reason=f"mod {mod!r}: {rel}: {exc}"
            )
    scripts = {rel: text for rel, text in texts.items() if _is_script(Path(rel), text)}
    if scripts:
        runs = tuple(f"{rel}: {cmd}" for rel, text in scripts.items() for cmd in _commands(text))
        patches = [rel for rel in texts if rel.endswith(PATCH_SUFFIXES)]
        fix = (
            f"carry its patch instead (mods: [{mod.rstrip('/')}/{patches[0]}]), once you have read it"
            if patches
            else "express the change as a patch of vLLM's Python files (an overlay) or as a recipe change"
        )
        return ModVerdict(
            mod,
            where,
            "script",
            files=tuple(texts),
            runs=runs,
            reason=f"mod {mod!r} is a script: it would run {'; '.join(runs)}; refused: it is the mod author's code "
            f"run in the container (the allow-list rule); fix: {fix}",
        )
    diffs = {rel: text for rel, text in texts.items() if rel.endswith(PATCH_SUFFIXES) or "\n@@ " in text}
    if len(diffs) != len(texts) or not diffs:
        other = sorted(set(texts) - set(diffs))
        return ModVerdict(
            mod,
            where,
            "unreadable",
            files=tuple(texts),
            reason=f"mod {mod!r}: {', '.join(other) or 'no file'} is neither a patch nor a script; fix: review the mod "
            "by hand (only patches are carried)",
        )
    text = "".join(installed_paths(diffs[rel]) for rel in sorted(diffs))
    try:
        diff = unidiff.parse(text)
    except unidiff.PatchError as exc:
        return ModVerdict(
            mod, where, "unreadable", files=tuple(texts), reason=f"mod {mod!r}: not a readable diff: {exc}"
        )
    package = package_of(diff)
    if package is None:
        return ModVerdict(
            mod,
            where,
            "unreadable",
            files=tuple(texts),
            reason=f"mod {mod!r} patches {', '.join(diff.paths)}: not the files of one installed package "
            f"({', '.join(PACKAGES)}); fix: split it by package",
        )
    refusals = [v.refusal for v in judge_diff(diff, package, installed=True) if v.refusal]
    if refusals:
        return ModVerdict(
            mod,
            where,
            "unreadable",
            package,
            files=tuple(texts),
            reason=f"mod {mod!r}: " + "; ".join(refusals),
        )
    return ModVerdict(
        mod,
        where,
        "patch",
        package,
        text,
        tuple(texts),
        reason=f"mod {mod!r} is a patch of {package} ({', '.join(diff.paths)})",
    )


def judge_mods(recipe: CommunityRecipe, recipe_file: Path | None) -> list[ModVerdict]:
    """Every mod of a community recipe, judged from its files."""
    out = []
    for index, mod in enumerate(recipe.mods):
        where = recipe.at("mods", str(index))
        out.append(judge_mod(mod, where, recipe_file))
    return out


@dataclass(frozen=True)
class CarriedMods:
    """What import did with a recipe's mods: each verdict, the patch files and overlay recipe written."""

    verdicts: tuple[ModVerdict, ...]
    patches: tuple[Path, ...] = ()
    overlay: Path | None = None
    next_step: str = ""

    @property
    def refused(self) -> list[ModVerdict]:
        return [v for v in self.verdicts if v.kind != "patch" and v.kind != "missing"]


def carry_mods(recipe: CommunityRecipe, recipe_file: Path | None, base: Recipe, name: str) -> CarriedMods:
    """Judge every mod; write the patch mods as an overlay series on `base`'s verified image (when this engine has
    it: pinned by digest), else as patch files with the command that pins them once the image is built."""
    verdicts = judge_mods(recipe, recipe_file)
    carried = [v for v in verdicts if v.kind == "patch"]
    if not carried:
        return CarriedMods(tuple(verdicts))
    series = [
        SeriesPatch(v.package or "vllm", v.patch_text or "", f"mod {v.mod}", f"{name}-mod-{_stem(v.mod)}")
        for v in carried
    ]
    paths = tuple(PATCHES_DIR / f"overlay-{p.package}" / f"{p.stem}.patch" for p in series)
    image = local_base_image(base)
    if image is None:
        for item, path in zip(series, paths, strict=True):
            write_output(path, item.text.encode("utf-8"), "the mod's patch")
        rel = " ".join(f"--patch {p.relative_to(REPO_ROOT)}" for p in paths)
        return CarriedMods(
            tuple(verdicts),
            paths,
            None,
            f"no verified image of recipe {base.name} on this engine to pin: build it ('invoke build --recipe "
            f"{base.name}'), then 'invoke overlay --recipe {base.name} {rel}' (one patch per overlay command)",
        )
    request = OverlayRequest(base, image, series[0].package, OverlaySource(), name)
    overlay = write_series(request, f"{name}-mods", series, [f"From the mods of {recipe.where}"])
    return CarriedMods(
        tuple(verdicts),
        paths,
        overlay,
        f"invoke overlay.preflight --overlay {overlay}, then invoke overlay.build --overlay {overlay}",
    )


def _stem(mod: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", mod.lower().rstrip("/").rsplit("/", 1)[-1]).strip("-")[:40] or "mod"
