"""Community recipes against a sparkforge recipe's pinned vLLM: read them (file or https URL), check what they
import into (serve flags, parsers, model class registered, packages the image lacks), list a whole catalog.

Everything upstream comes from what preflight already reads (the pinned vLLM's arg_utils/cli_args, parser
registrations and model registry, from its wheel by range requests or its source tree, cached), so a catalog
of a few hundred recipes is checked in seconds after the first read.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.utils import canonicalize_name

from sparkforge.boundary import read_json, walk_tree, write_output
from sparkforge.errors import InputError, PreflightError, RecipeError, SparkforgeError
from sparkforge.preflight.fetch import Fetcher, hub_url
from sparkforge.preflight.pypi import WheelTarget
from sparkforge.preflight.registry import registered_architectures
from sparkforge.preflight.requirements import marker_environment, source_requirements, wheel_requirements
from sparkforge.preflight.serveflags import ServeSurface, check_profile, recipe_surface
from sparkforge.preflight.sources import (
    GITHUB,
    REGISTRY_PY,
    UpstreamTree,
    extract_archive,
    fetch_upstream,
    from_pypi_wheel,
)
from sparkforge.recipe.community.formats import Format, read_community
from sparkforge.recipe.community.toprofile import Attention, Imported, import_recipe
from sparkforge.recipe.community.vllmargv import FALLBACK_ALIASES
from sparkforge.recipe.loader import Recipe
from sparkforge.recipe.yamlfile import MAX_YAML_BYTES, YamlDoc, read_yaml
from sparkforge.report import Check

ARCHIVES = (".tar.gz", ".tgz", ".zip")
MAX_CONFIG_BYTES = 4 << 20  # a checkpoint's config.json (the largest are tens of KiB)


def read_source(ref: str, fetcher: Fetcher) -> tuple[YamlDoc, str]:
    """A community recipe file or https URL -> its YAML document and the name messages use."""
    if "://" not in ref:
        return read_yaml(Path(ref)), ref
    if not ref.startswith("https://"):
        raise RecipeError(
            f"{ref}: only https:// URLs are read (a recipe fetched in clear text can be changed on the way); "
            "fix: use the https:// address, or download the file and pass its path"
        )
    try:
        body = fetcher.get(
            ref, what="the community recipe", max_bytes=MAX_YAML_BYTES
        ).content  # capped while read
    except PreflightError as exc:
        reason = str(exc).split("; fix:", 1)[0]
        raise RecipeError(
            f"{ref}: the URL does not answer with a recipe ({reason}); nothing was written; fix: check the address "
            "(the raw file, e.g. https://raw.githubusercontent.com/OWNER/REPO/COMMIT/recipes/NAME.yaml) and the network"
        ) from None
    if len(body) > MAX_YAML_BYTES:
        raise RecipeError(
            f"{ref}: {len(body)} bytes, more than a recipe holds ({MAX_YAML_BYTES}); fix: name the recipe file"
        )
    with tempfile.TemporaryDirectory(prefix="sparkforge-fetch-") as tmp:
        path = Path(tmp) / (ref.rstrip("/").rsplit("/", 1)[-1] or "recipe.yaml")
        write_output(path, body, "the fetched recipe")
        try:
            return read_yaml(path), ref
        except RecipeError as exc:
            raise RecipeError(str(exc).replace(str(path), ref)) from None


@dataclass
class PinnedVllm:
    """The sparkforge recipe's vLLM as preflight reads it: serve surface and model registry, read lazily once."""

    recipe: Recipe
    fetcher: Fetcher
    _surface: ServeSurface | None = None
    _registry: dict[str, object] | None = None
    _tree: UpstreamTree | None = None

    @property
    def subject(self) -> str:
        return f"vLLM {self.recipe.model.components.vllm.version} (recipe {self.recipe.name})"

    def surface(self) -> ServeSurface:
        if self._surface is None:
            self._surface = recipe_surface(self.recipe, self.fetcher)
        return self._surface

    def tree(self) -> UpstreamTree:
        """The pinned vLLM as preflight resolves it: the wheel's members (range requests) or the source tree."""
        if self._tree is None:
            component = self.recipe.model.components.vllm
            if component.source == "wheel":
                target = WheelTarget.of(self.recipe.model.platforms[0], self.recipe.model.python)
                self._tree = from_pypi_wheel(
                    self.fetcher, component.package or "vllm", component.version, target
                )
            else:
                self._tree = fetch_upstream(
                    self.recipe, source=None, github_base=GITHUB, fetcher=self.fetcher
                )
        return self._tree

    def registry(self) -> dict[str, object]:
        if self._registry is None:
            self._registry = dict(registered_architectures(self.tree().source_text(REGISTRY_PY) or ""))
        return self._registry

    def installs(self, package: str) -> str:
        """Why the recipe's image has `package` (a component, or a requirement of its vLLM), or ''."""
        if any(canonicalize_name(c.package or n) == package for n, c in self.recipe.model.components.items()):
            return f"recipe {self.recipe.name} pins it as a component"
        tree = self.tree()
        metadata = tree.wheel_metadata() if tree.kind == "wheel" else None
        declared = wheel_requirements(metadata) if metadata else source_requirements(tree.source_text)
        env = marker_environment(self.recipe.model.platforms[0], self.recipe.model.python)
        for item in declared:
            req = item.requirement
            if canonicalize_name(req.name) == package and (req.marker is None or req.marker.evaluate(env)):
                return f"{self.subject} requires {req} ({item.origin}), and the image installs vLLM's requirements"
        return ""


@dataclass(frozen=True)
class ImportOptions:
    """How a community recipe becomes a serve profile (`invoke import`'s options)."""

    fmt: Format | None = None  # eugr or sparkarena (None: told from the document)
    extra: tuple[str, ...] = ()  # vLLM flags added to the recipe's command
    name: str | None = None  # the profile's name (None: the recipe's)
    overrides: Mapping[str, str] = field(default_factory=dict)  # --set KEY=VALUE
    allow: Mapping[str, str] = field(default_factory=dict)  # --allow ENTRY=REASON: the owner's opt-ins


def import_with(
    pinned: PinnedVllm | None, source: tuple[YamlDoc, str], options: ImportOptions | None = None
) -> Imported:
    """Import `source` (the document and where it was read) with the pinned vLLM's own aliases (the documented
    fallback without a recipe)."""
    doc, where = source
    options = options or ImportOptions()
    community = read_community(doc, where, options.fmt, dict(options.overrides) or None)
    surface = pinned.surface() if pinned else None
    aliases = {**FALLBACK_ALIASES, **(surface.aliases if surface else {})}
    return import_recipe(
        community,
        aliases=aliases,
        negatable=surface.negatable if surface else None,
        extra=list(options.extra),
        name=options.name,
        allow=dict(options.allow) or None,
    )


def preflight_notes(imported: Imported, pinned: PinnedVllm) -> tuple[Attention, ...]:
    """The import's notes with what the pinned vLLM and the recipe's image add: flags, parsers, packages."""
    where = imported.recipe.at("command")
    check = Check("serve-flags", "passed")
    args = dict(imported.document.get("args") or {})  # type: ignore[call-overload]
    check_profile(check, imported.name, args, pinned.surface(), lambda key: f"args.{key}", pinned.subject)
    notes = list(imported.attention)
    notes += [Attention(where, p) for p in check.reason.split("; ")] if check.status == "failed" else []
    if args.get("load-format") == "fastsafetensors":
        notes = [n for n in notes if not n.message.startswith("--load-format fastsafetensors needs")]
        why = pinned.installs("fastsafetensors")
        notes += (
            []
            if why
            else [
                Attention(
                    where,
                    f"--load-format fastsafetensors: recipe {pinned.recipe.name}'s image does not install fastsafetensors "
                    f"(neither a component nor a requirement of {pinned.subject} on {pinned.recipe.model.platforms[0]}); "
                    "fix: use a recipe that installs it, or --load-format safetensors (the same weights, read without "
                    "GPU direct storage)",
                )
            ]
        )
    return tuple(notes)


def image_facts(imported: Imported, pinned: PinnedVllm) -> list[str]:
    """What the recipe's image has that the imported profile needs (said, not only what it lacks)."""
    args = dict(imported.document.get("args") or {})  # type: ignore[call-overload]
    why = pinned.installs("fastsafetensors") if args.get("load-format") == "fastsafetensors" else ""
    return [f"--load-format fastsafetensors: the image has fastsafetensors: {why}"] if why else []


def with_architecture(imported: Imported, pinned: PinnedVllm, hub: Fetcher | None) -> tuple[Imported, str]:
    """The profile with its model class (`architecture`, which serve checks in the image before any download)
    when config.json is at hand and the pinned vLLM registers it; and a line saying what was found."""
    model = str(imported.document["model"])
    arch, origin = model_class(model, imported.recipe.model_revision, hub)
    if arch is None:
        return imported, f"model class unknown: {origin}"
    if arch not in pinned.registry():
        note = Attention(
            imported.recipe.at("command"),
            f"{pinned.subject} does not register {arch} (from {origin}); fix: use a recipe whose vLLM does",
        )
        return replace(imported, attention=(*imported.attention, note)), f"model class {arch}: NOT registered"
    document = dict(imported.document)
    items = list(document.items())
    at = [k for k, _ in items].index("model") + 1
    document = dict([*items[:at], ("architecture", arch), *items[at:]])
    return replace(
        imported, document=document
    ), f"model class {arch} (from {origin}): registered in {pinned.subject}"


def hf_cache_dirs() -> list[Path]:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", "~/.cache/huggingface"), "hub"
    )
    return [Path(hub).expanduser()]


def cached_configs(model: str, revision: str | None) -> list[Path]:
    """The checkpoint's config.json files in the local HF caches (at `revision`, else any snapshot)."""
    found: list[Path] = []
    for hub in hf_cache_dirs():
        snapshots = hub / f"models--{model.replace('/', '--')}" / "snapshots"
        found += sorted(snapshots.glob(f"{revision or '*'}/config.json")) if snapshots.is_dir() else []
    return found


def model_class(
    model: str, revision: str | None, fetcher: Fetcher | None, no_hub: str = "offline: the hub was not asked"
) -> tuple[str | None, str]:
    """The checkpoint's model class (config.json `architectures[0]`) and where it was read, or None and why."""
    for config in cached_configs(model, revision):
        try:
            # A snapshot's files are links into its blobs: read inside the HF cache only, through the boundary.
            data = read_json(config, "", max_bytes=MAX_CONFIG_BYTES, named=False, within=hf_cache_dirs())
        except InputError:
            continue
        archs = data.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            continue
        if archs:
            return str(archs[0]), f"the HF cache ({config.parent.name[:12]})"
    if fetcher is None:
        return None, f"config.json is not in the HF cache ({no_hub})"
    url = f"{hub_url()}/{model}/resolve/{revision or 'main'}/config.json"
    try:
        archs = fetcher.get_json(url, what=f"{model}'s config.json").get("architectures") or []
    except (PreflightError, AttributeError) as exc:
        return None, f"config.json is not in the HF cache and the hub did not answer ({exc})"
    return (str(archs[0]), "the hub") if archs else (None, "config.json names no architectures")


@dataclass
class CatalogRow:
    file: str
    status: str  # "imports cleanly" | "needs attention" | "does not import"
    model: str = ""
    model_class: str | None = None
    registered: bool | None = None
    notes: list[str] = field(default_factory=list)
    model_class_from: str = ""

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def catalog_files(root: Path) -> list[Path]:
    """The YAML files of a catalog folder (recursively; a repository's `recipes/` folder when it has one)."""
    if not root.is_dir():
        raise RecipeError(
            f"{root}: not a folder of recipes; fix: pass a folder (or an https:// recipe or archive URL)"
        )
    if (root / "recipes").is_dir():
        root = root / "recipes"
    real = root.resolve()  # the folder the user named, through a link of theirs; nothing inside is followed
    files = walk_tree(real, "the catalog folder")
    return [root / p.relative_to(real) for p in files if p.suffix in (".yaml", ".yml")]


def catalog_refs(source: str, fetcher: Fetcher) -> list[tuple[str, str]]:
    """(what to read, what to call it) per recipe of a folder, an https:// recipe, or an https:// archive of a
    repository (.tar.gz/.tgz/.zip, e.g. GitHub's archive of a commit; downloaded once into the cache)."""
    if "://" not in source:
        return [(str(p), str(p)) for p in catalog_files(Path(source))]
    if not source.startswith("https://"):
        read_source(source, fetcher)  # the one refusal of clear-text URLs
    if not source.endswith(ARCHIVES):
        return [(source, source)]
    try:
        blob = fetcher.download(source, what="the recipe archive")
        root = extract_archive(blob, blob.name)
    except PreflightError as exc:
        raise RecipeError(f"{source}: {exc}") from None
    base = root / "recipes" if (root / "recipes").is_dir() else root
    return [(str(p), f"{source}!/{p.relative_to(base)}") for p in catalog_files(root)]


def check_one(
    ref: str, pinned: PinnedVllm, fetcher: Fetcher, hub: Fetcher | None, no_hub: str = "offline"
) -> CatalogRow:
    """One catalog row: the import's verdict, the model class and whether the pinned vLLM registers it."""
    try:
        imported = import_with(pinned, read_source(ref, fetcher))
    except SparkforgeError as exc:
        return CatalogRow(ref, "does not import", notes=[str(exc)])
    refused = [f"refused: {a}" for a in imported.refused]
    notes = refused + [str(a) for a in preflight_notes(imported, pinned)]
    model = str(imported.document["model"])
    arch, origin = model_class(model, imported.recipe.model_revision, hub, no_hub)
    registered = None if arch is None else arch in pinned.registry()
    if registered is False:
        notes.append(f"{pinned.subject} does not register {arch}; fix: use a recipe whose vLLM does")
    status = "refused" if refused else "imports cleanly" if not notes else "needs attention"
    return CatalogRow(ref, status, model, arch, registered, notes, origin)


def run_catalog(
    refs: list[str],
    pinned: PinnedVllm,
    fetcher: Fetcher,
    hub: Fetcher | None,
    echo: Callable[[str], None] | None = None,
) -> tuple[list[CatalogRow], float]:
    """Every recipe checked; the hub is asked until it first fails to answer (then the HF cache only)."""
    start = time.monotonic()
    rows: list[CatalogRow] = []
    no_hub = "offline: the hub was not asked"
    for ref, shown in refs:
        rows.append(check_one(ref, pinned, fetcher, hub, no_hub))
        rows[-1].file = shown
        if hub is not None and "the hub did not answer" in rows[-1].model_class_from:
            hub, no_hub = None, "the hub did not answer earlier in this run"
        if echo:
            echo(format_row(rows[-1]))
    return rows, time.monotonic() - start


def format_row(row: CatalogRow) -> str:
    cls = row.model_class or "?"
    reg = {True: "registered", False: "NOT registered", None: row.model_class_from}[row.registered]
    lines = [
        f"{row.file}: {row.status}" + (f" | {row.model} | model class {cls} ({reg})" if row.model else "")
    ]
    lines += [f"    - {n[:400]}" for n in row.notes]
    return "\n".join(lines)
