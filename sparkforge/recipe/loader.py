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

import yaml
from pydantic import BaseModel, ValidationError

from sparkforge.errors import RecipeError, SparkforgeError
from sparkforge.recipe.schema import RecipeModel

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
                digest.update(hashlib.sha256(patch_file(patch).read_bytes()).digest())
        return digest.hexdigest()

    def patch_paths(self) -> list[Path]:
        return [patch_file(p) for _, c in self.model.components.items() for p in c.patches]

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


# Bounds for every recipe and profile file: a YAML file is read before anything can check what it says.
MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 40
MAX_YAML_ALIASES = 64
MAX_YAML_NODES = 50_000  # after alias expansion: what validation and hashing will walk


def _read_bounded(path: Path) -> str:
    """A regular file's text, at most MAX_YAML_BYTES (a FIFO or /dev/zero would otherwise hang or fill memory)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise RecipeError(f"{path}: not a regular file (a device, pipe or folder); fix: name a YAML file")
        if info.st_size > MAX_YAML_BYTES:
            raise RecipeError(
                f"{path}: {info.st_size} bytes, more than a recipe or profile needs ({MAX_YAML_BYTES}); "
                "fix: name the right file or split it with 'extends'"
            )
        with path.open("rb") as handle:
            raw = handle.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc.strerror}); fix: check the path") from None
    if len(raw) > MAX_YAML_BYTES:
        raise RecipeError(
            f"{path}: grew past {MAX_YAML_BYTES} bytes while read; fix: name a stable YAML file"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{path}: byte {exc.start} is not UTF-8; fix: save the file as UTF-8 text"
        ) from None


def _check_events(text: str, path: Path) -> None:
    """Nesting depth and alias count from the event stream (no recursion, nothing built yet)."""
    loader = _LineLoader(text)
    depth = aliases = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise RecipeError(
                        f"{path}:{event.start_mark.line + 1}: nested deeper than {MAX_YAML_DEPTH} levels; "
                        "fix: flatten the structure"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    raise RecipeError(
                        f"{path}:{event.start_mark.line + 1}: more than {MAX_YAML_ALIASES} YAML aliases (*name); "
                        "fix: write the values out or use 'extends'"
                    )
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, path: Path, sizes: dict[int, int], stack: set[int]) -> int:
    """How many nodes the document holds once aliases are expanded; RecipeError on a cycle or past the cap."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in stack:
        raise RecipeError(
            f"{path}:{node.start_mark.line + 1}: a YAML alias refers to itself; fix: remove the recursive alias"
        )
    stack.add(id(node))
    children: list[yaml.Node] = []
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    total = 1 + sum(_expanded_size(child, path, sizes, stack) for child in children)
    stack.discard(id(node))
    if total > MAX_YAML_NODES:
        raise RecipeError(
            f"{path}:{node.start_mark.line + 1}: aliases expand to more than {MAX_YAML_NODES} values (an alias "
            "bomb); fix: write the values out instead of nesting aliases"
        )
    sizes[id(node)] = total
    return total


def read_yaml(path: Path) -> YamlDoc:
    """One YAML mapping with key lines; bounded in size, depth and alias expansion; duplicate keys refused."""
    text = _read_bounded(path)
    try:
        _check_events(text, path)
        loader = _LineLoader(text)
        loader.name = str(path)
        try:
            node = loader.get_single_node()
            if node is not None:
                _expanded_size(node, path, {}, set())
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


MAX_EXTENDS = 8
# Never a recipe part, whatever the user names: system configuration, kernel and device trees, secrets.
_SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/root", "/run", "/var/run", "/var/lib")


def _check_extends_target(parent: Path, top: Path, where: str) -> None:
    """`extends` reaches recipes/ or the folder of the recipe file the user named (its opt-in), nothing else."""
    real = parent.resolve()
    roots = (RECIPES_DIR.resolve(), top.resolve().parent)
    system = any(real == Path(d) or real.is_relative_to(d) for d in _SYSTEM_DIRS)
    if system or not any(real.is_relative_to(root) for root in roots):
        raise RecipeError(
            f"{where}: extends reaches {real}, outside recipes/ and the folder of the recipe you named "
            f"({top.resolve().parent}); fix: extend a recipe in recipes/ by name, or copy the base next to your "
            "recipe file (naming a recipe file by path is the opt-in for its own folder)"
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
