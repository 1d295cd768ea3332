"""House round 4's walks, kept: one build's options and one launch's profile, followed through a real `--dry` task
run, pass through at most ten files and never climb back up (a call against the import arrows: a lower module
calling into one that imports it). The walk is traced, not spelled: every call in sparkforge/ or tasks.py that is
handed one of the task's option or plan objects is a stop; its file and its caller's file are the files walked."""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from invoke import Program

import tasks
from tests.unit.test_structure import ROOT, _graph, _module

MOST_FILES = 10  # the walk: one build's options, one serve profile, each through at most ten files
# Invoke calls every task's body through these decorators (the session, the families, user errors): the entry.
DISPATCH = ("sparkforge/cli/__init__.py", "sparkforge/cli/families.py")
# Per task where it differs, with the reason; may only shrink.
MOST_FILES_OF = {
    "cluster.up": 13,  # + the layout judge (parallel.py), the bring-up per node (cluster.py, weights.py)
}
TWIN = str(ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml")
MODEL = str(ROOT / "tests" / "fixtures" / "tiny-qwen35moe")
NODES = "ssh://u@spark1=10.0.12.1,ssh://u@spark2=10.0.12.2,ssh://u@spark3=10.0.13.3"


@dataclass(frozen=True)
class Stop:
    """One call handed a tracked object: where it went (file, function) and where it came from."""

    file: str
    function: str
    caller: str


def _rel(filename: str) -> str:
    path = Path(filename)
    if not path.is_absolute() or not path.is_relative_to(ROOT):
        return ""
    rel = path.relative_to(ROOT).as_posix()
    return rel if rel.startswith("sparkforge/") or rel == "tasks.py" else ""


def _handed(frame: FrameType, kinds: tuple[type, ...]) -> bool:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount + code.co_posonlyargcount
    values = frame.f_locals
    return any(isinstance(values.get(name), kinds) for name in code.co_varnames[:count])


@contextlib.contextmanager
def traced(kinds: tuple[type, ...]) -> Iterator[list[Stop]]:
    stops: list[Stop] = []
    where_of: dict[object, str] = {}  # code object -> its file in the walk ("" outside): asked once per code

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        where = where_of.get(code)
        if where is None:
            where = where_of[code] = _rel(code.co_filename)
        if where and _handed(frame, kinds):
            caller = _rel(frame.f_back.f_code.co_filename) if frame.f_back else ""
            stops.append(Stop(where, code.co_name, caller))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield stops
    finally:
        sys.setprofile(previous)


def run_task(argv: list[str]) -> tuple[str, str]:
    """A task run as `invoke` runs it, to the end: (stdout, stderr); a task that stops with an error fails the test
    (a walk cut short passes through fewer files), or skips it where no engine answers (`--dry` asks the local
    engine which images it holds)."""
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            Program(namespace=tasks.ns, binary="inv").run(["inv", *argv], exit=True)
        except SystemExit as stopped:
            code = stopped.code
    if code not in (0, None):
        if "cannot reach the Docker engine" in err.getvalue():
            pytest.skip("no container engine answers here: the --dry task cannot finish")
        pytest.fail(f"inv {' '.join(argv)} exited {code}: {err.getvalue()[-1500:]}")
    return out.getvalue(), err.getvalue()


def walk(argv: list[str], kinds: tuple[type, ...]) -> list[Stop]:
    with traced(kinds) as stops:
        out, err = run_task(argv)
    assert stops, f"the task handed none of {kinds} to anything: {err[-1500:]}"
    assert out.strip(), "the --dry task printed no plan"
    return stops


def files(stops: list[Stop]) -> list[str]:
    return sorted({s.file for s in stops} | {s.caller for s in stops if s.caller})


@functools.cache
def _reaches() -> dict[str, set[str]]:
    """Every module each module imports, directly or through others."""
    graph = _graph()
    closed: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for target in graph.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        closed[start] = seen
    return closed


def _name(rel: str) -> str:
    return "tasks" if rel == "tasks.py" else _module(ROOT / rel)


def climbs(stops: list[Stop]) -> list[str]:
    """Calls from a module into one that imports it and that it does not import: a call back up the floors. The
    task's own entry (Invoke calling the body through cli's decorators) is not one."""
    reaches = _reaches()
    found = []
    for stop in stops:
        if not stop.caller or stop.caller == stop.file or "tasks" in (_name(stop.caller), _name(stop.file)):
            continue
        if stop.caller in DISPATCH:
            continue
        caller, callee = _name(stop.caller), _name(stop.file)
        if caller in reaches.get(callee, set()) and callee not in reaches.get(caller, set()):
            found.append(f"{stop.caller} -> {stop.file}:{stop.function}")
    return found


def _build_kinds() -> tuple[type, ...]:
    from sparkforge.cli.build import BuildFlags
    from sparkforge.imagebuild.stage import BuildOptions, BuildPlan

    return (BuildFlags, BuildOptions, BuildPlan)


def _launch_kinds() -> tuple[type, ...]:
    from sparkforge.recipe.profile import Profile
    from sparkforge.run.launchplan import LaunchFlags, LaunchPlan

    return (Profile, LaunchFlags, LaunchPlan)


def _cluster_kinds() -> tuple[type, ...]:
    from sparkforge.run.cluster.clusterflags import ClusterFlags
    from sparkforge.run.cluster.clusterplan import ClusterPlan

    return (*_launch_kinds(), ClusterFlags, ClusterPlan)


WALKS = {
    "build": (
        ["build", "--recipe", str(ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"), "--dry"],
        _build_kinds,
    ),
    "serve": (
        [
            "serve",
            *("--recipe", TWIN, "--profile", str(ROOT / "tests/profiles/cpu-tiny-qwen35moe.yaml")),
            *("--model-dir", MODEL, "--gpus", "none", "--dry"),
        ],
        _launch_kinds,
    ),
    "conform": (
        [
            "conform",
            *("--recipe", TWIN, "--profile", str(ROOT / "tests/profiles/cpu-tiny-qwen35moe-conform.yaml")),
            *("--model-dir", MODEL, "--gpus", "none", "--dry"),
        ],
        _launch_kinds,
    ),
    "cluster.up": (
        [
            "cluster.up",
            *("--recipe", "vllm-qwen35", "--profile", "qwen35-122b-a10b-fp8-tp2", "--nodes", NODES),
            *("--tp", "1", "--pp", "3", "--layout", "mesh3", "--dry", "--no-preflight"),
            "--allow-unpinned-model",
        ],
        _cluster_kinds,
    ),
}


@pytest.mark.parametrize("task", sorted(WALKS))
def test_one_tasks_options_pass_through_at_most_ten_files_and_never_climb(task: str) -> None:
    argv, kinds = WALKS[task]
    stops = walk(argv, kinds())
    walked = files(stops)
    most = MOST_FILES_OF.get(task, MOST_FILES)
    assert len(walked) <= most, (
        f"{task}: its options pass through {len(walked)} files (most {most}): {walked}"
    )
    assert climbs(stops) == [], f"{task}: calls back up the import arrows: {climbs(stops)}"


def test_the_walk_sees_a_stop_a_file_and_a_climb() -> None:
    """The tracer finds a call handed a tracked object, names both files, and flags a call against the arrows."""

    @dataclass(frozen=True)
    class Tracked:
        n: int

    def take(value: Tracked) -> int:
        return value.n

    with traced((Tracked,)) as stops:
        take(Tracked(1))
    assert stops == []  # the test's own file is not the package's: not a stop
    made = [
        Stop("sparkforge/recipe/loader.py", "load_recipe", "sparkforge/cli/build.py"),  # down the arrows
        Stop("sparkforge/cli/build.py", "build", "sparkforge/recipe/loader.py"),  # back up
    ]
    assert files(made) == ["sparkforge/cli/build.py", "sparkforge/recipe/loader.py"]
    assert climbs(made) == ["sparkforge/recipe/loader.py -> sparkforge/cli/build.py:build"]
    entry = Stop("sparkforge/cli/build.py", "build", DISPATCH[0])  # Invoke's dispatch into the body
    assert climbs([entry]) == []
