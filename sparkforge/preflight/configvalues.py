"""What each value of the pinned vLLM's JSON-valued flags and variables is, read from its own source (pure AST).

vLLM turns a JSON-valued flag (`--compilation-config`, `-cc.x`, `--speculative-config`, `--structured-outputs-config`,
`--kv-transfer-config`, `--hf-overrides` ...) into one of its config dataclasses (vllm/config/*.py; `EngineArgs` in
vllm/engine/arg_utils.py names the class, or builds it with `Class(**self.field)`), and reads each variable of
vllm/envs.py through the lambda of its `environment_variables` entry. This module reads both into kinds the
value allow-list (sparkforge/recipe/values.py) judges by: `bool`, `int`, `float`, `enum:a|b`, `list:KIND`,
`class:Name` (a nested config), `str` (any text), `other` (a dict, a callable, a union); for variables `bool01`,
`truthy:a|b` and `set:a|b` besides. `render_values` writes the snapshot (sparkforge/recipe/vllmvalues.py) the
allow-list starts from, as `render_names` does for the flag names.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkforge.boundary import read_text, walk_tree
from sparkforge.errors import PreflightError
from sparkforge.preflight.fetch import Fetcher
from sparkforge.preflight.pypi import WHEEL_FILE_LIST, WheelTarget, resolve_file, wheel_members
from sparkforge.preflight.serveflags import env_table
from sparkforge.report import Check

if TYPE_CHECKING:
    from sparkforge.preflight.sources import UpstreamTree

ARG_UTILS = "vllm/engine/arg_utils.py"
ENVS = "vllm/envs.py"
CONFIG_DIR = "vllm/config/"
ARGS_CLASSES = ("EngineArgs", "AsyncEngineArgs", "BaseFrontendArgs", "FrontendArgs")
CLI_ARGS = (
    "vllm/entrypoints/launchers/cli_args.py",
    "vllm/entrypoints/common/cli_args.py",
    "vllm/entrypoints/openai/cli_args.py",
)  # as preflight's flag reader (serveflags.CLI_ARGS)


@dataclass(frozen=True)
class ValueSurface:
    """JSON-valued flags -> their config class (or `dict`); classes -> field -> kind; variables -> kind."""

    flags: dict[str, str] = field(default_factory=dict)
    classes: dict[str, dict[str, str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def _strip_optional(text: str) -> str:
    parts = [p.strip() for p in _split_union(text)]
    kept = [p for p in parts if p not in ("None", "'None'")]
    return " | ".join(kept) if kept else "None"


def _split_union(text: str) -> list[str]:
    out, depth, current = [], 0, ""
    for char in text:
        depth += 1 if char in "[(" else -1 if char in "])" else 0
        if char == "|" and depth == 0:
            out.append(current)
            current = ""
        else:
            current += char
    return [*out, current]


def _literal_values(node: ast.expr, known: dict[str, list[str]] | None = None) -> list[str] | None:
    """The values of `Literal[...]` (a nested alias of `known` expanded), or None."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Literal", "typing.Literal"):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        values: list[str] = []
        for item in items:
            if isinstance(item, ast.Constant):
                values.append(str(item.value))
            elif isinstance(item, ast.Name) and known and item.id in known:
                values += known[item.id]
            else:
                return None
        return values
    return None


def kind_of(annotation: str, enums: dict[str, list[str]], classes: Iterable[str]) -> str:
    """The kind of one annotation (as written) given the module's Literal aliases and enums and the config classes."""
    text = _strip_optional(annotation.strip().strip("'\""))
    if len(_split_union(text)) > 1:
        parts = sorted({kind_of(p, enums, classes) for p in _split_union(text)})
        if set(parts) <= {"int", "float"}:
            return "float"
        return "other"
    if text in ("bool", "int", "float", "str"):
        return text
    if text in enums:
        return "enum:" + "|".join(enums[text])
    if text in set(classes):
        return f"class:{text}"
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return "other"
    values = _literal_values(node)
    if values is not None:
        return "enum:" + "|".join(values)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("list", "tuple", "set", "List"):
        inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
        item = kind_of(ast.unparse(inner), enums, classes)
        return f"list:{item}" if not item.startswith(("list:", "class:")) else "other"
    return "other"


def _enums(tree: ast.Module) -> dict[str, list[str]]:
    """`X = Literal[...]` aliases and Enum classes (member names; an IntEnum's values too) of one module."""
    out: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            values = _literal_values(node.value, out) if node.value is not None else None
            for target in targets:
                if isinstance(target, ast.Name) and values is not None:
                    out[target.id] = values
        if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases):
            names: list[str] = []
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                    names.append(item.targets[0].id)
                    if isinstance(item.value, ast.Constant) and not isinstance(item.value.value, bool):
                        names.append(str(item.value.value))
            out[node.name] = names
    return out


def _fields(node: ast.ClassDef) -> dict[str, str]:
    """A dataclass's init fields: name -> annotation text (ClassVar, private and init=False fields left out)."""
    out = {}
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        text = ast.unparse(item.annotation)
        if item.target.id.startswith("_") or "ClassVar" in text:
            continue
        value = item.value
        if isinstance(value, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in value.keywords
        ):
            continue
        out[item.target.id] = text
    return out


def _env_kind(name: str, node: ast.expr, functions: dict[str, ast.FunctionDef] | None = None) -> str:
    """The kind of one vllm/envs.py entry from the expression that reads it (a module function: what it returns)."""
    body = node.body if isinstance(node, ast.Lambda) else node
    if isinstance(body, ast.Name) and functions and body.id in functions:
        returns = [
            n for n in ast.walk(functions[body.id]) if isinstance(n, ast.Return) and n.value is not None
        ]
        if len(returns) == 1:
            body = returns[0].value  # type: ignore[assignment]
    if isinstance(body, ast.IfExp):  # `int(os.getenv(X)) if X in os.environ else None`
        body = body.body
    text = ast.unparse(body)
    call = body.func if isinstance(body, ast.Call) else None
    head = ast.unparse(call) if call is not None else ""
    if text.startswith(("bool(int(", "maybe_convert_bool(")):
        return "bool01"
    if head in ("int", "maybe_convert_int"):
        return "int"
    if head == "float" or text.startswith("val if (val := float("):
        return "float"
    if head in ("env_with_choices", "env_set_with_choices") and isinstance(body, ast.Call):
        choices = next((k.value for k in body.keywords if k.arg == "choices"), None)
        if choices is None and len(body.args) >= 3:
            choices = body.args[2]
        if isinstance(choices, ast.List | ast.Tuple) and all(
            isinstance(e, ast.Constant) for e in choices.elts
        ):
            values = "|".join(str(e.value) for e in choices.elts)
            return ("enum:" if head == "env_with_choices" else "set:") + values
        return "str"
    if isinstance(body, ast.Compare) and len(body.ops) == 1 and isinstance(body.ops[0], ast.Eq | ast.NotEq):
        other = body.comparators[0]
        if isinstance(other, ast.Constant) and isinstance(other.value, str):
            return f"truthy:{other.value}"  # only compared with a constant: any word reads as true or false
    if isinstance(body, ast.Compare) and len(body.ops) == 1 and isinstance(body.ops[0], ast.In):
        options = body.comparators[0]
        if isinstance(options, ast.Tuple | ast.List) and all(
            isinstance(e, ast.Constant) for e in options.elts
        ):
            return "truthy:" + "|".join(str(e.value) for e in options.elts)
    return "str"


def read_values(read_text: Callable[[str], str | None], listing: Iterable[str]) -> ValueSurface:
    """The value surface of a vLLM tree (`read_text(rel)`; `listing`: every file path in the tree)."""
    modules = {}
    for rel in sorted(p for p in listing if p.startswith(CONFIG_DIR) and p.endswith(".py")):
        text = read_text(rel)
        if text:
            modules[rel] = ast.parse(text)
    enums: dict[str, list[str]] = {}
    raw: dict[str, dict[str, str]] = {}
    for tree in modules.values():
        enums.update(_enums(tree))
        for node in tree.body:
            if (
                isinstance(node, ast.ClassDef)
                and node.name.endswith(("Config", "Args"))
                and node.name not in enums
            ):
                raw[node.name] = _fields(node)
    classes = {
        name: {f: kind_of(a, enums, raw) for f, a in fields.items()} for name, fields in raw.items() if fields
    }
    flags: dict[str, str] = {}
    text = read_text(ARG_UTILS)
    if text is None:
        raise ValueError(f"{ARG_UTILS} is missing from the vLLM tree")
    tree = ast.parse(text)
    frontend = next((t for t in map(read_text, CLI_ARGS) if t), None)  # the serve entrypoint's FrontendArgs
    trees = [tree, ast.parse(frontend)] if frontend else [tree]
    built = {}  # `self.x = Class(**self.x)` / `Class(**self.x)`: the class vLLM builds from a dict field
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
            for kw in node.keywords:
                if (
                    kw.arg is None
                    and isinstance(kw.value, ast.Attribute)
                    and ast.unparse(kw.value.value) == "self"
                ):
                    built[kw.value.attr] = node.func.id
    for node in (n for t in trees for n in ast.walk(t)):
        if isinstance(node, ast.ClassDef) and node.name in ARGS_CLASSES:
            for name, annotation in _fields(node).items():
                kind = kind_of(annotation, enums, classes)
                flag = name.replace("_", "-")
                if name in built:
                    flags[flag] = built[name]
                elif kind.startswith("class:"):
                    flags[flag] = kind.removeprefix("class:")
                elif "dict" in annotation or annotation.strip("'\"") in ("HfOverrides",):
                    flags[flag] = "dict"
    env: dict[str, str] = {}
    envs = read_text(ENVS)
    module = ast.parse(envs) if envs else ast.Module(body=[], type_ignores=[])
    functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    table = env_table(module)
    for key, entry in zip(table.keys, table.values, strict=True) if table is not None else ():
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            env[key.value] = _env_kind(key.value, entry, functions)
    used = _reachable(flags, classes)
    return ValueSurface(
        dict(sorted(flags.items())), {k: classes[k] for k in sorted(used)}, dict(sorted(env.items()))
    )


def _reachable(flags: dict[str, str], classes: dict[str, dict[str, str]]) -> set[str]:
    todo = [c for c in flags.values() if c in classes]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [k.removeprefix("class:") for k in classes[name].values() if k.startswith("class:")]
    return seen


def render_values(surface: ValueSurface, version: str) -> str:
    """sparkforge/recipe/vllmvalues.py for `surface`: the kinds the value allow-list starts from."""
    import pprint

    def block(name: str, value: object) -> str:
        return f"{name} = {pprint.pformat(value, width=110, sort_dicts=True)}\n"

    return (
        '"""The pinned vLLM\'s own value kinds: the config class of each JSON-valued `vllm serve` flag, the kind of\n'
        "every field of those classes (vllm/config/*.py), and how vllm/envs.py reads each variable.\n\n"
        "Generated from the wheel by sparkforge.preflight.configvalues.render_values (`invoke preflight` checks it "
        "against the\nrecipe's pinned vLLM). Edit the value allow-list (sparkforge/recipe/values.py), not this file.\n"
        '"""\n\n'
        f"VERSION = {version!r}\n"
        + block("FLAGS", surface.flags)
        + block("CLASSES", surface.classes)
        + block("ENV", surface.env)
    )


def stale_values(surface: ValueSurface) -> list[str]:
    """Flags, fields and variables whose kind in the pinned vLLM differs from the snapshot's."""
    from sparkforge.recipe import vllmvalues

    out = [f"--{f}" for f, c in surface.flags.items() if vllmvalues.FLAGS.get(f) != c]
    for name, fields in surface.classes.items():
        known = vllmvalues.CLASSES.get(name, {})
        out += [f"{name}.{f}" for f, k in fields.items() if known.get(f) != k]
    out += [v for v, k in surface.env.items() if vllmvalues.ENV.get(v) != k]
    return sorted(out)


def wheel_values(fetcher: Fetcher, package: str, version: str, target: WheelTarget) -> ValueSurface:
    """The value surface of a PyPI wheel, reading only vllm/config/*.py, arg_utils, the serve entrypoint's
    arguments and envs.py (HTTP range requests)."""
    dist = resolve_file(fetcher, package, version, wheel=target)
    root = wheel_members(fetcher, dist, [ARG_UTILS])
    listing = read_text(root / WHEEL_FILE_LIST, "the wheel's file list", 16 << 20).split()
    wanted = [
        n
        for n in listing
        if n in (ARG_UTILS, ENVS, *CLI_ARGS) or (n.startswith(CONFIG_DIR) and n.endswith(".py"))
    ]
    members = wheel_members(fetcher, dist, wanted)

    def member(rel: str) -> str | None:
        path = members / rel
        return read_text(path, "a vLLM wheel member", 8 << 20) if path.is_file() else None

    return read_values(member, listing)


def check_value_kinds(check: Check, surface: Callable[[], ValueSurface], subject: str) -> None:
    """Fill `check`: the kinds the value allow-list judges by (the snapshot) against the pinned vLLM's own.

    A field the snapshot lacks is unknown (never passed without an opt-in); a field whose kind differs is judged
    by the snapshot's kind until render_values runs for this vLLM. Listed, not failed (as serve-flags lists the
    names the allow-list lacks)."""
    from sparkforge.recipe import vllmvalues

    try:
        found = surface()
    except (PreflightError, ValueError, SyntaxError) as exc:
        check.status, check.reason = "failed", f"cannot read the pinned vLLM's config classes: {exc}"
        return
    stale = stale_values(found)
    check.details = {
        "json_flags": len(found.flags),
        "config_classes": len(found.classes),
        "variables": len(found.env),
        "snapshot": vllmvalues.VERSION,
        "differs_from_snapshot": stale[:100],
    }
    check.reason = (
        f"the value allow-list's kinds (vLLM {vllmvalues.VERSION}) match {subject}'s config classes and envs.py"
        if not stale
        else f"{len(stale)} kinds of {subject} differ from the value allow-list's snapshot (vLLM "
        f"{vllmvalues.VERSION}): judged by the snapshot's (unknown fields are never passed); fix: regenerate "
        "sparkforge/recipe/vllmvalues.py with configvalues.render_values for this vLLM"
    )


def tree_values(tree: UpstreamTree, fetcher: Fetcher, package: str, target: WheelTarget) -> ValueSurface:
    """The value surface of the vLLM tree preflight resolved (a source tree, or the pinned wheel)."""
    if tree.kind == "wheel":
        return wheel_values(fetcher, package, tree.version or "", target)
    config = walk_tree(tree.root / CONFIG_DIR, "the vLLM source's config classes", max_entries=2000)
    listing = [str(p.relative_to(tree.root)) for p in config if p.suffix == ".py"]
    return read_values(tree.source_text, listing)
