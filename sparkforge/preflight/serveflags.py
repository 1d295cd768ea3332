"""Serve flags, reasoning parsers and tool parsers of a profile, checked against the pinned vLLM's own source.

`vllm serve --help` needs a GPU platform (RuntimeError: Failed to infer device type), so the flags are read
from the source instead: every option string in the `add_argument(...)` calls of vllm/engine/arg_utils.py and
of the serve entrypoint (vllm/entrypoints/launchers/cli_args.py from 0.32, common/ before; plus the fields of
its FrontendArgs dataclasses, which become `--field-name`), and every parser name registered in vllm/reasoning/
and vllm/tool_parsers/.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkforge.boundary import read_source, walk_tree
from sparkforge.errors import PreflightError
from sparkforge.preflight.fetch import Fetcher
from sparkforge.preflight.pypi import WHEEL_FILE_LIST, WheelTarget, resolve_file, wheel_members
from sparkforge.preflight.sources import MAX_TREE_MEMBERS
from sparkforge.report import Check, Report

if TYPE_CHECKING:
    from sparkforge.preflight.sources import UpstreamTree
    from sparkforge.recipe.loader import Recipe
    from sparkforge.recipe.profile import Profile

ARG_UTILS = "vllm/engine/arg_utils.py"
ENVS = "vllm/envs.py"  # the `environment_variables` dict: every variable vLLM reads
CLI_ARGS = (
    "vllm/entrypoints/launchers/cli_args.py",  # 0.32 on (the OpenAI server's FrontendArgs moved here)
    "vllm/entrypoints/common/cli_args.py",  # 0.2x-0.31
    "vllm/entrypoints/openai/cli_args.py",  # older releases
)
PARSER_DIRS = {
    "reasoning": "vllm/reasoning/",
    "tool": ("vllm/tool_parsers/", "vllm/entrypoints/openai/tool_parsers/"),
}
FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")
PARSER_FLAGS = {"reasoning-parser": "reasoning", "tool-call-parser": "tool"}


@dataclass(frozen=True)
class ServeSurface:
    """What the pinned vLLM's `serve` accepts: flag names (without dashes), boolean flags, parser names."""

    flags: frozenset[str]
    negatable: frozenset[str]  # flags that also take --no-<flag> (BooleanOptionalAction or config-typed)
    parsers: dict[str, frozenset[str]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    aliases: dict[str, str] = field(
        default_factory=dict
    )  # every option name -> its first long name (tp -> ...)
    env: frozenset[str] = frozenset()  # the variables vllm/envs.py reads


def _option_strings(tree: ast.AST) -> tuple[set[str], set[str]]:
    flags: set[str] = set()
    negatable: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        names = [
            a.value.lstrip("-")
            for a in node.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
        ]
        flags.update(names)
        boolean = any(
            kw.arg == "action" and "BooleanOptionalAction" in ast.unparse(kw.value) for kw in node.keywords
        )
        spread = any(kw.arg is None for kw in node.keywords)  # **kwargs from a config field: may be boolean
        if boolean or spread:
            negatable.update(n for n in names if len(n) > 2)
    return flags, negatable


def option_aliases(tree: ast.AST) -> dict[str, str]:
    """Each short option name of `add_argument(...)` calls -> the long one it stands for (tp -> tensor-parallel-size)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            written = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            long = next((w[2:] for w in written if w.startswith("--")), None)
            out.update(
                {
                    w.lstrip("-"): long
                    for w in written
                    if long and w.startswith("-") and not w.startswith("--")
                }
            )
    return out


def _dataclass_fields(tree: ast.AST, classes: Iterable[str]) -> tuple[set[str], set[str]]:
    flags: set[str] = set()
    negatable: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id.replace("_", "-")
                    flags.add(name)
                    if "bool" in ast.unparse(item.annotation):
                        negatable.add(name)
    return flags, negatable


def _registered_names(text: str) -> set[str]:
    """Parser names: keys of the module's `_..._TO_REGISTER` dict, `register_module("x")` / name="x" calls."""
    names: set[str] = set()
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("_TO_REGISTER") for t in targets):
                names.update(
                    k.value
                    for k in node.value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                )
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("register_module", "register_lazy_module")
        ):
            for arg in node.args[:1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
                elif isinstance(arg, ast.List | ast.Tuple):
                    names.update(
                        e.value for e in arg.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    )
            for kw in node.keywords:
                if (
                    kw.arg == "name"
                    and isinstance(kw.value, ast.Constant)
                    and isinstance(kw.value.value, str)
                ):
                    names.add(kw.value.value)
    return names


def env_table(module: ast.Module) -> ast.Dict | None:
    """vllm/envs.py's `environment_variables` dict (every variable vLLM reads, by its own list), as parsed."""
    for node in module.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(value, ast.Dict)
        ):
            return value
    return None


def env_names(text: str) -> set[str]:
    """The keys of vllm/envs.py's `environment_variables` dict."""
    table = env_table(ast.parse(text))
    keys = table.keys if table is not None else []
    return {k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def read_surface(read_text: Callable[[str], str | None], listing: Iterable[str]) -> ServeSurface:
    """The serve surface from a vLLM tree (`read_text(rel)`; `listing`: every file path in the tree)."""
    flags: set[str] = set()
    negatable: set[str] = set()
    sources = []
    text = read_text(ARG_UTILS)
    if text is None:
        raise ValueError(f"{ARG_UTILS} is missing from the vLLM tree")
    tree = ast.parse(text)
    aliases = option_aliases(tree)
    for found, neg in (_option_strings(tree),):
        flags |= found
        negatable |= neg
    sources.append(ARG_UTILS)
    for rel in CLI_ARGS:
        cli = read_text(rel)
        if cli is None:
            continue
        cli_tree = ast.parse(cli)
        aliases.update(option_aliases(cli_tree))
        for found, neg in (_option_strings(cli_tree), _dataclass_fields(cli_tree, FRONTEND_CLASSES)):
            flags |= found
            negatable |= neg
        sources.append(rel)
        break
    files = sorted(listing)
    parsers: dict[str, frozenset[str]] = {}
    for kind, dirs in PARSER_DIRS.items():
        prefixes = (dirs,) if isinstance(dirs, str) else dirs
        names: set[str] = set()
        for rel in (f for f in files if f.startswith(prefixes) and f.endswith(".py")):
            body = read_text(rel)
            if body and ("register" in body):
                names |= _registered_names(body)
        parsers[kind] = frozenset(names)
    envs = read_text(ENVS)
    env = frozenset(env_names(envs)) if envs else frozenset()
    return ServeSurface(frozenset(flags), frozenset(negatable), parsers, tuple(sources), aliases, env)


def wheel_surface(fetcher: Fetcher, package: str, version: str, target: WheelTarget) -> ServeSurface:
    """The serve surface of a PyPI wheel, reading only the needed members (HTTP range requests)."""
    dist = resolve_file(fetcher, package, version, wheel=target)
    root = wheel_members(fetcher, dist, [ARG_UTILS])
    listing = (read_source(root / WHEEL_FILE_LIST, root) or "").split()
    wanted = [
        n
        for n in listing
        if n in (ARG_UTILS, ENVS)
        or n in CLI_ARGS
        or (
            n.endswith(".py")
            and n.startswith(
                ("vllm/reasoning/", "vllm/tool_parsers/", "vllm/entrypoints/openai/tool_parsers/")
            )
        )
    ]
    members = wheel_members(fetcher, dist, wanted)

    def read_text(rel: str) -> str | None:
        return read_source(members / rel, members)

    return read_surface(read_text, listing)


def unknown_flags(args: Iterable[str], surface: ServeSurface) -> list[str]:
    """Profile arg keys the pinned vLLM's serve does not accept (dotted keys: the part before the first dot)."""
    bad = []
    for key in args:
        name = key.split(".", 1)[0].replace("_", "-")
        if name in surface.flags:
            continue
        if name.startswith("no-") and name[3:] in surface.negatable:
            continue
        bad.append(key)
    return bad


def check_profile(
    check: Check,
    profile_name: str,
    args: dict[str, object],
    surface: ServeSurface,
    where: Callable[[str], str],
    subject: str,
) -> None:
    """Fill `check`: every flag known, every reasoning/tool parser registered, each problem with file:line."""
    problems = []
    for key in unknown_flags(args, surface):
        near = difflib.get_close_matches(key.replace("_", "-"), sorted(surface.flags), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join('--' + n for n in near)}?)" if near else ""
        problems.append(
            f"{where(key)}: --{key} is not a `vllm serve` flag of {subject}{hint}; fix: remove or rename it"
        )
    for flag, kind in PARSER_FLAGS.items():
        value = args.get(flag)
        if value is None or not surface.parsers.get(kind):
            continue
        if str(value) not in surface.parsers[kind]:
            known = ", ".join(sorted(surface.parsers[kind]))
            problems.append(
                f"{where(flag)}: {kind} parser {value!r} is not registered in {subject}; fix: use one of: {known}"
            )
    check.details = {
        "profile": profile_name,
        "flags": sorted(args),
        "known_flags": len(surface.flags),
        "reasoning_parsers": len(surface.parsers.get("reasoning", ())),
        "tool_parsers": len(surface.parsers.get("tool", ())),
        "sources": list(surface.sources),
        # Names of this vLLM the allow-list's snapshot lacks: refused as unknown (safe) until render_names runs.
        "not_on_allow_list": stale_names(surface)[:100],
    }
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    else:
        check.reason = f"{len(args)} serve flags and their parsers are known to {subject}"


def tree_surface(tree: UpstreamTree, fetcher: Fetcher, package: str, target: WheelTarget) -> ServeSurface:
    """The serve surface of the vLLM tree preflight resolved (a source tree, or the pinned wheel)."""
    if tree.kind == "wheel":
        return wheel_surface(fetcher, package, tree.version or "", target)
    files = walk_tree(tree.root, "the vLLM source", max_depth=32, max_entries=MAX_TREE_MEMBERS)
    listing = [str(p.relative_to(tree.root)) for p in files if p.suffix == ".py"]
    return read_surface(tree.source_text, listing)


def check_serve_profiles(
    report: Report, recipe: Recipe, profiles: Sequence[Profile], surface: Callable[[], ServeSurface]
) -> None:
    """One `serve-flags` check per profile; the surface is read once, lazily."""
    subject = f"vLLM {recipe.model.components.vllm.version}"
    for profile in profiles:
        with report.timed(f"serve-flags:{profile.name}") as check:
            try:
                found = surface()
            except (PreflightError, ValueError, SyntaxError) as exc:
                check.status, check.reason = "failed", f"cannot read the pinned vLLM's serve flags: {exc}"
                continue

            def where(key: str, profile: Profile = profile) -> str:
                return f"{profile.path}:{profile.line_of('args', key)}: args.{key}"

            check_profile(check, profile.name, dict(profile.model.args), found, where, subject)


def recipe_surface(recipe: Recipe, fetcher: Fetcher, tree: UpstreamTree | None = None) -> ServeSurface:
    """The serve surface of a recipe's pinned vLLM: its wheel (cheap: range requests) or its source tree."""
    component = recipe.model.components.vllm
    target = WheelTarget.of(recipe.model.platforms[0], recipe.model.python)
    if tree is None and component.source == "wheel":
        return wheel_surface(fetcher, component.package or "vllm", component.version, target)
    if tree is None:
        from sparkforge.preflight.sources import GITHUB, fetch_upstream

        tree = fetch_upstream(recipe, source=None, github_base=GITHUB, fetcher=fetcher)
    return tree_surface(tree, fetcher, component.package or "vllm", target)


def render_names(surface: ServeSurface, version: str) -> str:
    """sparkforge/recipe/vllmnames.py for `surface`: the pinned vLLM's serve flags, aliases and variables, the
    names the allow-list (sparkforge/recipe/allowlist.py) starts from."""
    import textwrap

    def words(names: Iterable[str]) -> str:
        text = textwrap.fill(" ".join(sorted(names)), 100, break_on_hyphens=False, break_long_words=False)
        return f'_words(\n    """\n{text}\n"""\n)'

    aliases = {k: v for k, v in sorted(surface.aliases.items()) if k != v}
    return (
        '"""The pinned vLLM\'s own names: `vllm serve` flags (argparse) and variables (vllm/envs.py).\n\n'
        "Generated from the wheel by sparkforge.preflight.serveflags.render_names (preflight's reader); `invoke "
        "preflight`\nchecks it against the recipe's pinned vLLM. Edit the allow-list, not this file.\n"
        '"""\n\n\n'
        "def _words(text: str) -> frozenset[str]:\n    return frozenset(text.split())\n\n\n"
        f"VERSION = {version!r}\n"
        f"FLAGS = {words(surface.flags)}\n"
        f"ALIASES = {aliases!r}\n"
        f"ENV = {words(surface.env)}\n"
    )


def stale_names(surface: ServeSurface) -> list[str]:
    """Flags and variables of the pinned vLLM that the allow-list's names (vllmnames) do not hold."""
    from sparkforge.recipe import vllmnames

    return sorted({f"--{f}" for f in surface.flags - vllmnames.FLAGS} | set(surface.env - vllmnames.ENV))
