"""Recipes: YAML files -> one strictly validated, typed model (with `extends` resolved)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sparkforge.errors import RecipeError, SparkforgeError
from sparkforge.recipe.schema import RecipeModel

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPES_DIR = REPO_ROOT / "recipes"


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
                digest.update(hashlib.sha256((REPO_ROOT / patch).read_bytes()).digest())
        return digest.hexdigest()

    def patch_paths(self) -> list[Path]:
        return [REPO_ROOT / p for _, c in self.model.components.items() for p in c.patches]

    def resolved(self) -> dict[str, Any]:
        return self.model.model_dump(mode="json", exclude_none=True)


# ---- loading ------------------------------------------------------------------------------------


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise RecipeError(
                f"{loader.name}:{key_node.start_mark.line + 1}: key {key!r} appears twice; fix: keep one"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _key_lines(node: yaml.Node, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = (*prefix, str(key_node.value))
            out[path] = key_node.start_mark.line + 1
            _key_lines(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = (*prefix, str(index))
            out[path] = item.start_mark.line + 1
            _key_lines(item, path, out)


@dataclass(frozen=True)
class YamlDoc:
    path: Path
    data: dict[str, Any]
    lines: dict[tuple[str, ...], int]


def read_yaml(path: Path) -> YamlDoc:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc.strerror}); fix: check the path") from None
    try:
        loader = _LineLoader(text)
        loader.name = str(path)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError(
            f"{where}: invalid YAML ({problem}); fix: correct the syntax at that line"
        ) from None
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}:1: a recipe must be a YAML mapping of keys; fix: start with 'description: ...'"
        )
    lines: dict[tuple[str, ...], int] = {}
    _key_lines(node, (), lines)
    return YamlDoc(path, data, lines)


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
    parent_path = resolve_recipe_path(parent, relative_to=path)
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
    fix = _TYPE_FIXES.get(kind, "see README.md 'Recipe reference'")
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
    for _, component in model.components.items():
        for patch in component.patches:
            if not (REPO_ROOT / patch).is_file():
                line = origins.get(("components",), (path, 0))[1]
                raise RecipeError(
                    f"{path}:{line}: patch {patch} does not exist; fix: add the file or remove it"
                )
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
