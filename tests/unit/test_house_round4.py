"""House round 4's rules, kept: every task gets its one Session from its option families; library code takes
no `echo=` / `runner=` / `engine=` (the session carries them) and builds no `Runner` of its own, except where
named below with the reason; at most ten functions take eight or more parameters; one build's and one launch's
recipe and profile are each loaded once per task. The lists below may only shrink: an entry that no longer
applies fails too, so the rules tighten as the code does."""

from __future__ import annotations

import ast
import collections
from collections.abc import Iterator
from pathlib import Path

import pytest
from invoke import Collection

import tasks

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkforge"
SEAM = "the command seam itself"
BELOW = (
    "engine.py sits below the session (context.py imports the seam; engine.py importing it back is a circle)"
)

# (module, function, parameter): why it is not the session's. `engine` annotated NodeEngine is a subject (which
# node), not the session's engine, and is not listed.
PARAMETERS_ALLOWED = {
    ("commands.py", "__init__", "echo"): f"{SEAM}: where a Runner prints the commands it runs",
    ("console.py", "__init__", "echo"): "the progress display's sink (Stages)",
    ("context.py", "with_runner", "runner"): "the session's own copy-with-another-runner",
    ("engine.py", "daemon_ready", "runner"): BELOW,
    ("engine.py", "cli_has_image", "runner"): BELOW,
    ("engine.py", "detect_engine", "runner"): BELOW,
    ("engine.py", "buildx_driver", "runner"): BELOW,
    ("engine.py", "buildx_driver", "engine"): BELOW,
    ("engine.py", "run_cli", "runner"): BELOW,
    ("engine.py", "run_cli", "engine"): BELOW,
    ("imagebuild/buildkit.py", "build_command", "engine"): "a pure argv builder: the engine is its subject",
    ("imagebuild/buildkit.py", "load_command", "engine"): "a pure argv builder: the engine is its subject",
    ("imagebuild/render.py", "line", "engine"): "build.sh's replay line for an engine kind (pure text)",
    ("preflight/catalog.py", "run_catalog", "echo"): "the catalog's per-row progress line (one sink)",
    ("registry/cosign.py", "detect", "runner"): "which cosign the runner finds (a probe of the tool itself)",
    ("report.py", "print_report", "echo"): "a report printed to a given sink (stdout or a test's list)",
    ("run/nodes.py", "__init__", "runner"): "a node's engine handle owns the runner its commands go through",
    ("run/nodes.py", "distribute_image", "runner"): "streams an image between engines (two node handles)",
    ("run/nodes.py", "local_image_id", "runner"): "asks one node's engine (a node handle's helper)",
}
# module: why it constructs a Runner (the session's runner is used everywhere else).
RUNNERS_ALLOWED = {
    "context.py": "Session.logged (a step's own log folder) and quiet_session (a library call given none)",
    "engine.py": BELOW,
    "imagebuild/execute.py": "the build executor's one logging runner (the plan's log folder)",
    "run/nodes.py": "a node handle made without a session (tests, tools) gets a quiet runner",
}
MOST_WITH_EIGHT_PARAMETERS = 10  # functions (Invoke tasks included) with 8+ parameters, self/cls not counted


def library_modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("cli/") or rel.startswith("verify/inimage/"):  # the task layer; the in-image suite
            continue
        yield rel, ast.parse(path.read_text(encoding="utf-8"))


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def all_tasks(collection: Collection, prefix: str = "") -> Iterator[tuple[str, object]]:
    for name, task in collection.tasks.items():
        yield prefix + name, task
    for name, sub in collection.collections.items():
        yield from all_tasks(sub, f"{prefix}{name}.")


def test_every_task_gets_its_session_from_its_option_families() -> None:
    without = [name for name, task in all_tasks(tasks.ns) if not hasattr(task.body, "families")]
    assert without == [], f"these tasks build no session from option families (cli/families.py): {without}"


def test_library_code_takes_the_session_not_echo_runner_or_engine() -> None:
    found = set()
    for rel, tree in library_modules():
        for fn in functions(tree):
            arguments = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            for arg in arguments:
                note = ast.unparse(arg.annotation) if arg.annotation else ""
                if arg.arg in ("echo", "runner") or (arg.arg == "engine" and "NodeEngine" not in note):
                    found.add((rel, fn.name, arg.arg))
    new = sorted(found - set(PARAMETERS_ALLOWED))
    assert new == [], f"take `session` (sparkforge/context.py) instead of these parameters: {new}"
    stale = sorted(set(PARAMETERS_ALLOWED) - found)
    assert stale == [], f"remove these from PARAMETERS_ALLOWED (the code no longer has them): {stale}"


def test_library_code_builds_no_runner_of_its_own() -> None:
    found = {
        rel
        for rel, tree in library_modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Runner"
    }
    assert sorted(found - set(RUNNERS_ALLOWED)) == [], "use session.runner (or session.logged(dir))"
    assert sorted(set(RUNNERS_ALLOWED) - found) == [], "remove these from RUNNERS_ALLOWED"


def test_at_most_ten_functions_take_eight_or_more_parameters() -> None:
    trees = [*(tree for _, tree in library_modules())]
    trees += [ast.parse(p.read_text(encoding="utf-8")) for p in sorted((PACKAGE / "cli").glob("*.py"))]
    trees.append(ast.parse((ROOT / "tasks.py").read_text(encoding="utf-8")))
    wide = []
    for tree in trees:
        for fn in functions(tree):
            names = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
            names = [n for n in names if n not in ("self", "cls")]
            if len(names) >= 8:
                wide.append(f"{fn.name}({len(names)})")
    assert len(wide) <= MOST_WITH_EIGHT_PARAMETERS, (
        f"{len(wide)} functions take 8+ parameters (at most {MOST_WITH_EIGHT_PARAMETERS}): {sorted(wide)}; "
        "group options into a frozen dataclass (a task: a value family, cli/families.py Family.of)"
    )


def test_the_rules_see_a_new_echo_parameter_and_a_new_runner(tmp_path: Path) -> None:
    """The checks above read what they should: a function taking `echo` and a call of Runner are found."""
    tree = ast.parse("def f(session, echo=print):\n    return Runner(stream=False)\n")
    (fn,) = functions(tree)
    assert [a.arg for a in fn.args.args] == ["session", "echo"]
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Runner" for n in ast.walk(tree))


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts of recipe and profile loads while a task runs (the loaders are imported where used)."""
    import sparkforge.recipe.loader as loader
    import sparkforge.recipe.profile as profile

    counts: collections.Counter[str] = collections.Counter()
    recipe, served = loader.load_recipe, profile.load_profile

    def load_recipe(*args: object, **kwargs: object):
        counts["recipe"] += 1
        return recipe(*args, **kwargs)

    def load_profile(*args: object, **kwargs: object):
        counts["profile"] += 1
        return served(*args, **kwargs)

    monkeypatch.setattr(loader, "load_recipe", load_recipe)
    monkeypatch.setattr(profile, "load_profile", load_profile)
    return counts


TWIN = str(ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml")
MODEL = str(ROOT / "tests" / "fixtures" / "tiny-qwen35moe")
NODES = "ssh://u@spark1=10.0.12.1,ssh://u@spark2=10.0.12.2,ssh://u@spark3=10.0.13.3"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["build", "--recipe", str(ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"), "--dry"],
            {"recipe": 1},
        ),
        (
            [
                "serve",
                "--recipe",
                TWIN,
                "--profile",
                str(ROOT / "tests/profiles/cpu-tiny-qwen35moe.yaml"),
                "--model-dir",
                MODEL,
                "--gpus",
                "none",
                "--dry",
            ],
            {"recipe": 1, "profile": 1},
        ),
        (
            [
                "conform",
                "--recipe",
                TWIN,
                "--profile",
                str(ROOT / "tests/profiles/cpu-tiny-qwen35moe-conform.yaml"),
                "--model-dir",
                MODEL,
                "--gpus",
                "none",
                "--dry",
            ],
            {"recipe": 1, "profile": 1},
        ),
        (
            [
                "cluster.up",
                *("--recipe", "vllm-qwen35", "--profile", "qwen35-122b-a10b-fp8-tp2", "--nodes", NODES),
                *("--tp", "1", "--pp", "3", "--layout", "mesh3", "--dry", "--no-preflight"),
                "--allow-unpinned-model",
            ],
            {"recipe": 1, "profile": 1},
        ),
        (
            [
                "bench",
                *(
                    "--recipe",
                    "vllm-qwen35-wheels",
                    "--profile",
                    "qwen35-35b-a3b-fp8",
                    "--concurrency",
                    "1,8",
                ),
                *("--node", "ssh://me@spark9.invalid", "--dry"),
            ],
            {"recipe": 1, "profile": 1},
        ),
    ],
    ids=["build", "serve", "conform", "cluster.up", "bench"],
)
def test_one_task_loads_its_recipe_and_profile_once(
    argv: list[str], expected: dict[str, int], loads: collections.Counter[str]
) -> None:
    from tests.unit.test_house_walks import run_task  # the task run to its end (a failed one fails here)

    out, _ = run_task(argv)
    assert dict(loads) == expected, out[-2000:]


def test_the_package_stays_inside_its_line_budget() -> None:
    """sparkforge/ and tasks.py (the in-image suite apart) within LINE_BUDGET, counted as
    benchmarks/house.md reports it per module: a change that grows the package cuts elsewhere, or moves the
    budget in a reviewed line with its reason."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_house", ROOT / "benchmarks" / "bench_house.py")
    assert spec and spec.loader
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    rows = house.module_rows(ROOT)
    lines = sum(int(r["lines"]) for r in rows)
    largest = sorted(rows, key=lambda r: -int(r["lines"]))[:5]
    assert lines <= house.LINE_BUDGET, (
        f"{lines} lines in sparkforge/ and tasks.py, over the budget of {house.LINE_BUDGET} "
        f"(benchmarks/bench_house.py); the largest modules: {[(r['module'], r['lines']) for r in largest]}"
    )
