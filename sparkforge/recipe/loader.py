"""Recipes: YAML files -> one strictly validated, typed model (with `extends` resolved)."""

from __future__ import annotations

import hashlib
import json
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sparkforge.boundary import MAX_PATCH_BYTES, is_system_path, sha256_file
from sparkforge.errors import RecipeError, SparkforgeError
from sparkforge.recipe.schema import RecipeModel
from sparkforge.recipe.yamlfile import YamlDoc, read_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPES_DIR = REPO_ROOT / "recipes"
PATCHES_DIR = REPO_ROOT / "patches"


def patch_file(patch: str) -> Path:
    """A recipe's patch as a regular file inside patches/ (never a symlink: its target would be read and shipped)."""
    path = REPO_ROOT / patch
    try:
        info = path.lstat()
    except OSError:
        raise RecipeError(
            f"patch {patch} does not exist; fix: add the file or remove it from the recipe"
        ) from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise RecipeError(
            f"patch {patch} is {'a symlink' if stat.S_ISLNK(info.st_mode) else 'not a regular file'}; its "
            "contents would be copied into build/ and the image; fix: put the patch itself in patches/ "
            "(a regular file, 'git format-patch' output)"
        )
    if not path.resolve().is_relative_to(PATCHES_DIR.resolve()):
        raise RecipeError(
            f"patch {patch} resolves to {path.resolve()}, outside {PATCHES_DIR} (a symlinked folder); fix: keep "
            "patch folders as real folders inside patches/"
        )
    return path


@dataclass(frozen=True)
class Recipe:
    """A validated recipe with where it came from."""

    name: str
    path: Path
    model: RecipeModel
    chain: tuple[Path, ...]  # the file and every file it extends, nearest first

    @property
    def hash(self) -> str:
        """sha256 over the resolved recipe and the bytes of every patch it names."""
        digest = hashlib.sha256(json.dumps(self.model.model_dump(mode="json"), sort_keys=True).encode())
        for name, component in self.model.components.items():
            for patch in component.patches:
                digest.update(f"{name}:{patch}:".encode())
                digest.update(bytes.fromhex(sha256_file(patch_file(patch), "patch", MAX_PATCH_BYTES)))
        return digest.hexdigest()

    def patch_paths(self) -> list[Path]:
        return [patch_file(p) for _, c in self.model.components.items() for p in c.patches]

    def resolved(self) -> dict[str, Any]:
        return self.model.model_dump(mode="json", exclude_none=True)


# ---- loading ------------------------------------------------------------------------------------

__all__ = ["Recipe", "YamlDoc", "load_recipe", "read_yaml"]


def resolve_named_file(
    ref: str | Path,
    folder: Path,
    kind: str,
    known: list[str],
    error: type[SparkforgeError],
    relative_to: Path | None = None,
) -> Path:
    """A name in `folder` (NAME.yaml) or a path; relative paths from `relative_to`'s folder, else the working directory.

    The one lookup for recipes and serve profiles: a value ending in .yaml/.yml or holding a '/' is a path.
    """
    text = str(ref)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        base = relative_to.parent if relative_to else Path.cwd()
        path = (base / text).resolve()
        if is_system_path(path) and not is_system_path(base / text, resolve=False):
            raise error(
                f"{kind} {text!r} is a link to {path}, a system file, not a {kind}; fix: name the {kind} file itself"
            )
    else:
        path = folder / f"{text}.yaml"
    if not path.is_file():
        raise error(
            f"{kind} {text!r} not found (looked for {path}); fix: use a name from {folder.name}/ "
            f"({', '.join(known) or 'none'}) or a path"
        )
    return path


def resolve_recipe_path(ref: str | Path, relative_to: Path | None = None) -> Path:
    """A recipe name in recipes/ or a path (relative paths from `relative_to` or the working directory)."""
    return resolve_named_file(ref, RECIPES_DIR, "recipe", list_recipe_names(), RecipeError, relative_to)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key; lists and scalars from `over` replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


MAX_EXTENDS = 8


def _check_extends_target(parent: Path, top: Path, where: str) -> None:
    """`extends` reaches this project's files or the folder of the recipe file the user named (its opt-in), never a
    system folder."""
    real = parent.resolve()
    roots = (REPO_ROOT.resolve(), top.resolve().parent)
    system = is_system_path(
        real
    )  # the boundary's one list: system configuration, kernel and device trees, secrets
    if system or not any(real.is_relative_to(root) for root in roots):
        raise RecipeError(
            f"{where}: extends reaches {real}, outside this project and the folder of the recipe you named "
            f"({top.resolve().parent}){' (a system folder)' if system else ''}; fix: extend a recipe in recipes/ "
            "by name, or copy the base next to your recipe file (naming a recipe file by path is the opt-in for "
            "its own folder)"
        )


def _load_chain(
    path: Path, stack: tuple[Path, ...]
) -> tuple[dict[str, Any], dict[tuple[str, ...], tuple[Path, int]], tuple[Path, ...]]:
    if path in stack:
        cycle = " -> ".join(p.name for p in (*stack, path))
        raise RecipeError(f"{stack[-1]}: 'extends' forms a cycle ({cycle}); fix: remove one of the extends")
    doc = read_yaml(path)
    data = dict(doc.data)
    origins = {k: (path, line) for k, line in doc.lines.items()}
    parent = data.pop("extends", None)
    if parent is None:
        return data, origins, (path,)
    if not isinstance(parent, str):
        raise RecipeError(
            f"{path}:{doc.lines[('extends',)]}: extends: must be a recipe name or path string; "
            "fix: e.g. 'extends: vllm-qwen35-wheels'"
        )
    where = f"{path}:{doc.lines[('extends',)]}"
    if len(stack) + 1 >= MAX_EXTENDS:
        raise RecipeError(
            f"{where}: 'extends' goes more than {MAX_EXTENDS} files deep; fix: shorten the chain "
            "(merge some of the partials)"
        )
    parent_path = resolve_recipe_path(parent, relative_to=path)
    _check_extends_target(parent_path, (*stack, path)[0], where)
    base, base_origins, chain = _load_chain(parent_path, (*stack, path))
    merged = _merge(base, data)
    return merged, {**base_origins, **origins}, (path, *chain)


def _allowed_keys(loc: tuple[Any, ...], schema: type[BaseModel] = RecipeModel) -> list[str]:
    model: Any = schema
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return sorted(getattr(model, "model_fields", {}))


_TYPE_FIXES = {
    "string_type": "write a quoted string",
    "int_type": "write a whole number",
    "bool_type": "write true or false",
    "list_type": "write a YAML list (- item)",
    "dict_type": "write a YAML mapping (key: value)",
    "model_type": "write a YAML mapping (key: value)",
    "missing": "add this key",
    "too_short": "list at least one item",
    "greater_than_equal": "use a larger number",
    "less_than_equal": "use a smaller number",
    "literal_error": "use one of the allowed values",
}


def explain_errors(
    error: Mapping[str, Any],
    origins: Mapping[tuple[str, ...], tuple[Path, int]],
    path: Path,
    schema: type[BaseModel] = RecipeModel,
) -> str:
    loc = tuple(
        p
        for p in error["loc"]
        if not (isinstance(p, str) and ("[" in p or ("-" in p and p.startswith("function"))))
    )
    loc = tuple(str(p) for p in loc if p not in ("function-after",))
    key_path = ".".join(loc) or "(top level)"
    where_path, line = path, None
    for depth in range(len(loc), 0, -1):
        if loc[:depth] in origins:
            where_path, line = origins[loc[:depth]]
            break
    where = f"{where_path}:{line}" if line else str(where_path)
    kind = error["type"]
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(error["loc"]), schema)
        return f"{where}: {key_path}: unknown key; fix: remove it or use one of: {', '.join(allowed)}"
    if kind == "value_error":
        return f"{where}: {key_path}: {message}"
    fix = _TYPE_FIXES.get(kind, "see docs/reference.md 'Recipe reference'")
    if kind == "literal_error":
        fix = message.replace("Input should be", "use")
    return f"{where}: {key_path}: {message}; fix: {fix}"


def load_recipe(ref: str | Path) -> Recipe:
    """Load, merge (`extends`) and validate a recipe; errors name file, line, key path and fix."""
    path = resolve_recipe_path(ref)
    data, origins, chain = _load_chain(path, ())
    try:
        model = RecipeModel.model_validate(data)
    except ValidationError as exc:
        problems = [explain_errors(e, origins, path) for e in exc.errors()]
        raise RecipeError(f"recipe {path.stem} is invalid:\n  " + "\n  ".join(problems)) from None
    for name, component in model.components.items():
        for index, patch in enumerate(component.patches):
            try:
                patch_file(patch)
            except RecipeError as exc:
                key = ("components", name, "patches", str(index))
                where, line = origins.get(key, origins.get(("components",), (path, 0)))
                raise RecipeError(f"{where}:{line}: {exc}") from None
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", path.stem):
        raise RecipeError(
            f"{path}: the file name {path.stem!r} is the recipe name and becomes image tags; fix: rename it to "
            "lowercase letters, digits, '.', '_' and '-'"
        )
    return Recipe(name=path.stem, path=path, model=model, chain=chain)


def recipe_ref(recipe: Recipe) -> str:
    """What `--recipe` takes for this recipe on a CI checkout: its name in recipes/, else its repo path."""
    if recipe.path.parent == RECIPES_DIR:
        return recipe.name
    return (
        str(recipe.path.relative_to(REPO_ROOT)) if recipe.path.is_relative_to(REPO_ROOT) else str(recipe.path)
    )


def list_recipe_names() -> list[str]:
    """Buildable recipes in recipes/ (files starting with '_' are shared partials)."""
    if not RECIPES_DIR.is_dir():
        return []
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml") if not p.name.startswith("_"))
