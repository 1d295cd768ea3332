"""The house's figures (benchmarks/house.md): per module lines, long parameter lists, private names reached
across modules, `# fmt: skip`, and in how many modules an extension point's names are typed; per module, the
session rules of issue 54 (parameters named echo/runner/engine/eng, `Runner(` constructions, `**options: Any`).

    python3 benchmarks/bench_house.py [ROOT]              # JSON figures; ROOT: a checkout (default: this one)
    python3 benchmarks/bench_house.py --modules [ROOT]    # the per-module table (markdown), with the totals
    python3 benchmarks/bench_house.py --modules [ROOT] --only sparkforge/registry/,sparkforge/cli/publish.py
    python3 benchmarks/bench_house.py --budget [ROOT]     # exit 1 when the package is over LINE_BUDGET

Pure AST and text over ROOT/sparkforge and ROOT/tasks.py; nothing is imported from ROOT.
"""

from __future__ import annotations

import ast
import json
import statistics
import sys
from pathlib import Path

# A name of each extension point, as a user types it: the modules of the package that spell it out.
NAMES = {
    "conform row": "long-decode",
    "bench suite": "spark-arena-v2",
    "in-image verify check": "jit.triton",
    "preflight check": "arch-plan",
}
INIMAGE = "sparkforge/verify/inimage/"  # runs inside images: counted apart (it cannot import the package)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(root: Path, path: Path) -> list[str]:
    """`from sparkforge.X import _name` where X is not this module (the rule tests/unit/test_structure.py keeps)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkforge"):
            found += [f"{path.relative_to(root)}:{node.lineno}" for a in node.names
                      if _private(a.name) and node.module != name]  # fmt: skip
    return found


def figures(root: Path) -> dict[str, object]:
    modules = sorted((root / "sparkforge").rglob("*.py"))
    host = [p for p in modules if not str(p.relative_to(root)).startswith(INIMAGE)]
    lines = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in host}
    many_params = []
    threaded: dict[str, int] = {
        "echo": 0,
        "runner": 0,
        "offline": 0,
        "ca_bundle": 0,
        "session": 0,
    }  # values a session carries, and the session itself
    for path in [*host, root / "tasks.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                count -= bool(a.args and a.args[0].arg in ("self", "cls"))
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if arg.arg in threaded:
                        threaded[arg.arg] += 1
                if count >= 8:
                    many_params.append(f"{path.relative_to(root)}:{node.name}({count})")
    # the in-image suite where it lived before (tests/image) and where it lives now (sparkforge/verify/inimage)
    texts = {
        str(p.relative_to(root)): p.read_text() for p in [*modules, *sorted(root.glob("tests/image/*.py"))]
    }
    spelled = {
        point: sorted(p for p, t in texts.items() if f'"{name}"' in t or f"'{name}'" in t)
        for point, name in NAMES.items()
    }
    values = sorted(lines.values())
    return {
        "modules": len(values),
        "lines_median": statistics.median(values),
        "lines_max": max(values),
        "largest": max(lines, key=lines.__getitem__),
        "band_350_400": sorted(p for p, n in lines.items() if 350 <= n <= 400),
        "band_300_350": len([n for n in values if 300 <= n < 350]),
        "params_8_or_more": len(many_params),
        "params_8_or_more_list": many_params,
        "private_cross_module_imports": [
            hit for p in [*host, root / "tasks.py"] for hit in private_reaches(root, p)
        ],
        "functions_taking": threaded,
        "fmt_skip": sum(
            t.count("# fmt: skip")
            for p, t in texts.items()
            if p.startswith("sparkforge/") and not p.startswith(INIMAGE)
        ),
        "name_spelled_in": spelled,
        "root_modules": sorted(p.name for p in (root / "sparkforge").glob("*.py") if p.name != "__init__.py"),
    }


# The package's line budget (sparkforge/ and tasks.py; house.md says how it was set). A ceiling with room for a
# registry row or two (the extension drill adds ~20 lines): tests/unit/test_house_round4.py fails past it.
LINE_BUDGET = 48_000
# Parameters that the Session carries (issue 54: a library entry point takes `session` instead).
THREADED = ("echo", "runner", "engine", "eng")
# Where constructing a Runner is the design: the seam itself, the Session's own, and the CLI that builds one.
RUNNER_HOMES = ("sparkforge/commands.py", "sparkforge/context.py", "sparkforge/cli/", "tasks.py")


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, list[str]]:
    a = node.args
    names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    count = len(names) + bool(a.vararg) + bool(a.kwarg) - bool(names and names[0] in ("self", "cls"))
    return count, names


def module_row(root: Path, path: Path) -> dict[str, object]:
    """One module's figures: lines, functions with 8+ parameters, functions taking echo/runner/engine,
    `Runner(` constructions (outside RUNNER_HOMES: library code), `**options: Any` shims."""
    text = path.read_text()
    name = str(path.relative_to(root))
    many, threaded, shims, runners = [], [], [], 0
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            count, names = _params(node)
            if count >= 8:
                many.append(f"{node.name}({count})")
            taken = [n for n in names if n in THREADED]
            if taken:
                threaded.append(f"{node.name}({','.join(taken)})")
            kwarg = node.args.kwarg  # a keyword form forwarding options (not a decorator's **kwargs)
            if (
                kwarg
                and kwarg.arg == "options"
                and kwarg.annotation is not None
                and ast.unparse(kwarg.annotation) == "Any"
            ):
                shims.append(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Runner":
            runners += 1
    library = not name.startswith(RUNNER_HOMES)
    return {
        "module": name,
        "lines": len(text.splitlines()),
        "params_8": many,
        "threaded": threaded,
        "runner_calls": runners if library else 0,
        "options_any": shims,
    }


def module_rows(root: Path, only: tuple[str, ...] = ()) -> list[dict[str, object]]:
    modules = sorted((root / "sparkforge").rglob("*.py"))
    paths = [p for p in modules if not str(p.relative_to(root)).startswith(INIMAGE)] + [root / "tasks.py"]
    rows = [module_row(root, p) for p in paths]
    return [r for r in rows if not only or str(r["module"]).startswith(only)]


def markdown(rows: list[dict[str, object]]) -> str:
    """The per-module table and its totals line (what house.md's budget is checked against)."""
    lines = [
        "<!-- generated: python3 benchmarks/bench_house.py --modules > benchmarks/house-modules.md -->",
        "",
        "| module | lines | 8+ parameters | echo/runner/engine parameters | `Runner(` (library) | `**options: Any` |",
        "|---|---:|---|---|---:|---|",
    ]
    for r in rows:
        cells = [f"`{r['module']}`", str(r["lines"])]
        cells += [", ".join(r[k]) for k in ("params_8", "threaded")]  # type: ignore[arg-type]
        cells += [str(r["runner_calls"] or ""), ", ".join(r["options_any"])]  # type: ignore[arg-type]
        lines.append("| " + " | ".join(cells) + " |")
    total = {
        "modules": len(rows),
        "lines": sum(r["lines"] for r in rows),  # type: ignore[misc]
        "params_8": sum(len(r["params_8"]) for r in rows),  # type: ignore[arg-type]
        "threaded": sum(len(r["threaded"]) for r in rows),  # type: ignore[arg-type]
        "runner_calls": sum(r["runner_calls"] for r in rows),  # type: ignore[misc]
        "options_any": sum(len(r["options_any"]) for r in rows),  # type: ignore[arg-type]
    }
    lines.append(
        f"\ntotals: {total['modules']} modules, {total['lines']} lines; {total['params_8']} functions with 8+ "
        f"parameters; {total['threaded']} functions taking echo/runner/engine; {total['runner_calls']} `Runner(` "
        f"in library code; {total['options_any']} `**options: Any`"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    args = list(argv)
    only: tuple[str, ...] = ()
    if "--only" in args:
        at = args.index("--only")
        only = tuple(p for p in args[at + 1].split(",") if p)
        del args[at : at + 2]
    modules, budget = "--modules" in args, "--budget" in args
    args = [a for a in args if a not in ("--modules", "--budget")]
    root = Path(args[0] if args else Path(__file__).parents[1]).resolve()
    if budget:
        lines = sum(int(r["lines"]) for r in module_rows(root))  # type: ignore[call-overload]
        print(f"{lines} lines in sparkforge/ and tasks.py; budget {LINE_BUDGET}")
        raise SystemExit(0 if lines <= LINE_BUDGET else 1)
    if modules:
        print(markdown(module_rows(root, only)))
    else:
        print(json.dumps(figures(root), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
