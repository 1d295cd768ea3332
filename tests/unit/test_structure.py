"""The shape of the house: packages by pipeline stage, imports that only point down, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkforge"
# Lowest first: a package may import its own modules, the ground floor (root modules) and lower packages.
FLOORS = ["recipe", "audit", "preflight", "probe", "verify", "registry", "imagebuild", "run", "cli"]
MAX_ROOT_MODULES = 10
MAX_LINES = (
    800  # split where the job splits, not where a counter says (a module over 800 lines holds two jobs)
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(path: Path, known: set[str]) -> set[str]:
    """sparkforge modules `path` imports (function-level and TYPE_CHECKING imports included)."""
    name = _module(path)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            found = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in found:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _targets(path, set(paths)) for name, path in paths.items()}


def _floor(module: str) -> int:
    parts = module.split(".")
    if len(parts) <= 2 and parts[-1] not in FLOORS:
        return -1  # the ground floor: sparkforge/__init__ and the root modules
    return FLOORS.index(parts[1])


def test_no_import_circles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert circles == []


def test_arrows_only_point_down_the_floors() -> None:
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if _floor(b) > _floor(a) and not (a == "sparkforge" or b == "sparkforge")
    )
    assert upward == []


def test_the_root_holds_only_the_ground_floor() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= MAX_ROOT_MODULES, modules
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(FLOORS)


def test_each_package_says_what_it_owns() -> None:
    for init in PACKAGE.glob("*/__init__.py"):
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), init
        assert all(isinstance(n, ast.Expr) for n in tree.body) or init.parent.name == "cli", (
            f"{init}: a package's __init__ holds its docstring only (import the module that defines a name)"
        )


def test_no_module_over_800_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for folder in ("sparkforge", "tests")
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_one_module_name_means_one_thing() -> None:
    # 'run.py' once meant four things (preflight's, the probe's, the CLI's and a package). Outside cli/ (whose
    # modules are named after the library part they face) a basename names one module.
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py" and path.relative_to(PACKAGE).parts[0] != "cli":
            seen.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
