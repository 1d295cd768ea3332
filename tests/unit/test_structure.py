"""The shape of the house: packages by pipeline stage, imports that only point down, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkforge"
# Lowest first: a package may import its own modules, the ground floor (root modules) and lower packages.
FLOORS = ["recipe", "audit", "preflight", "probe", "verify", "registry", "imagebuild", "run", "cli"]
MAX_ROOT_MODULES = (
    10  # the ground floor and the seams: the boundary holds its parsers, context the download cache
)
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


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reaches(path: Path, root: Path = ROOT) -> list[str]:
    """`from X import _name` and `X._name` in `path`, where X is another sparkforge module (or a name it holds)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    tree = ast.parse(path.read_text())
    bound: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "sparkforge":
                continue
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private(alias.name) and base != name:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: from {base} import {alias.name}")
        elif isinstance(node, ast.Import):
            bound.update(
                a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "sparkforge"
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base_name = node.value
            while isinstance(base_name, ast.Attribute):
                base_name = base_name.value
            if isinstance(base_name, ast.Name) and base_name.id in bound:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reaches_another_modules_private_names() -> None:
    # What a module offers is its public names: a `_name` is free to change without a reader of another module
    # noticing. Tests may reach in; the package and tasks.py may not (within one module `_name` is fine).
    found = [hit for p in [*sorted(PACKAGE.rglob("*.py")), ROOT / "tasks.py"] for hit in _private_reaches(p)]
    assert found == []


def test_the_private_name_check_sees_both_spellings(tmp_path: Path) -> None:
    module = tmp_path / "sparkforge" / "cli" / "run.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from sparkforge.registry.publish import _hidden, __version__\n"
        "from . import run as again\n"
        "from .run import _mine\n"
        "from sparkforge.registry import publish as pub\n"
        "import sparkforge.engine\n"
        "import os\n"
        "pub._other(again._third, sparkforge.engine._fourth, pub.public, pub.__doc__, os._exit, _mine)\n"
    )
    assert [hit.split(": ", 1)[1] for hit in _private_reaches(module, tmp_path)] == [
        "from sparkforge.registry.publish import _hidden",
        "pub._other",
        "again._third",
        "sparkforge.engine._fourth",
    ]


TABLE = (ast.List, ast.Tuple, ast.Dict, ast.Set)
HOLDS_A_VALUE = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)


def _fmt_skips_off_tables(path: Path) -> list[int]:
    """Lines of `path` whose `# fmt: skip` is not on a table: an assignment or return of a list, tuple, dict or
    set display (rows a reader scans by column). Everything else is laid out by the formatter."""
    text = path.read_text()
    marked = [i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# fmt: skip")]
    if not marked:
        return []
    statements = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt)]
    found = []
    for line in marked:
        around = [n for n in statements if n.lineno <= line <= (n.end_lineno or n.lineno)]
        node = min(around, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if around else None
        if not (isinstance(node, HOLDS_A_VALUE) and isinstance(getattr(node, "value", None), TABLE)):
            found.append(line)
    return found


def test_fmt_skip_only_for_tables() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in [*sorted(PACKAGE.rglob("*.py")), ROOT / "tasks.py"]
        for line in _fmt_skips_off_tables(p)
    ]
    assert found == [], f"`# fmt: skip` off a table (let the formatter lay it out): {found}"


def test_the_fmt_skip_check_tells_a_table_from_a_call(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "ROWS = [\n    (1, 'a'),\n    (22, 'bb'),\n]  # fmt: skip\n"
        "def f(a, b):\n    return g(a,  b)  # fmt: skip\n"
        "def h(a):\n    return [a,  a]  # fmt: skip\n"
    )
    assert _fmt_skips_off_tables(probe) == [6]
