"""Reading one recipe or profile YAML file: bounded (size, depth, aliases), duplicate keys refused, key lines kept.

A YAML file is read before anything can check what it says, so the reading itself is bounded: a regular file of at
most MAX_YAML_BYTES, nesting at most MAX_YAML_DEPTH, at most MAX_YAML_ALIASES aliases expanding to at most
MAX_YAML_NODES values, no recursive alias.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sparkforge.boundary import read_text
from sparkforge.errors import InputError, RecipeError


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
    """A regular file's UTF-8 text, at most MAX_YAML_BYTES: the boundary's one reader (a FIFO or /dev/zero would
    otherwise hang or fill memory)."""
    try:
        return read_text(path, "", MAX_YAML_BYTES)
    except InputError as exc:
        raise RecipeError(str(exc)) from None


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
