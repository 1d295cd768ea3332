"""The house's figures (benchmarks/house.md): per module lines, long parameter lists, private names reached
across modules, `# fmt: skip`, and in how many modules an extension point's names are typed.

    python3 benchmarks/bench_house.py [ROOT]     # ROOT: a checkout (default: this one), e.g. a `git archive` of main

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


if __name__ == "__main__":
    print(json.dumps(figures(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1]).resolve()),
                     indent=2))  # fmt: skip
