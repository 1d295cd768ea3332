"""The hostile-input fuzzer, generated from the task registry: every task, every option that takes a value
(read from the tasks' own definitions), every hostile class its kind must refuse (sparkforge/cli/options.py). The
rule: non-zero exit within seconds, the option named with a fix, no traceback, no engine, network or program
contact, nothing written outside a temporary folder (option_fuzz.Isolation). An option without a kind fails.

Cost, measured on the shared 2-core machine: 2,646 cases (the 259 value options of 45 of the 48 tasks; 3 take none) in 13-36 s run alone,
145 s inside the whole unit suite at -n 2 beside other sessions' work; it runs with the unit tests in every CI
run. Each case is refused in milliseconds (a parse-time check); the budget below is for a loaded machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from invoke import Collection, Context
from option_fuzz import (
    CASE_SECONDS,
    ISOLATED_ENV,
    ROOT,
    Option,
    alone,
    argv_for,
    baselines,
    classes_for,
    hostile_values,
    isolated,
    judge,
    options_of,
    run_cli,
)

import tasks
from sparkforge.cli import task
from sparkforge.cli.options import DOCS_MARKERS, render_docs, task_rows

FUZZ_BUDGET_S = 400  # the whole fuzz on a loaded 2-core machine (measured 13-36 s alone, 145 s in the suite)


def test_every_option_of_every_task_has_a_kind() -> None:
    untyped = [f"{o.task} {o.flag}" for o in options_of(tasks.ns) if o.kind is None]
    assert untyped == [], (
        "options without a boundary kind (add the option's name to sparkforge.cli.options.OPTION_KINDS, or "
        f"(task, name) to TASK_KINDS where the name means something else there): {untyped}"
    )


def test_every_task_specific_kind_names_a_task_that_exists() -> None:
    """A task moved to another module or renamed would leave its (task, option) kinds behind, and the option
    would silently fall back to the general kind of its name."""
    from sparkforge.cli.options import TASK_KINDS, task_key

    keys: set[str] = set()
    stack = [tasks.ns]
    while stack:
        collection = stack.pop()
        keys |= {task_key(t.body) for t in collection.tasks.values()}
        stack += collection.collections.values()
    assert sorted({task for task, _ in TASK_KINDS} - keys) == []


def test_the_docs_table_of_option_kinds_is_the_registrys() -> None:
    page = ROOT / "docs" / "inputs.md"
    text = page.read_text()
    assert DOCS_MARKERS[0] in text and render_docs(text, task_rows(tasks.ns)) == text, (
        "docs/inputs.md: the option kinds table is stale; fix: python -m sparkforge.cli.options"
    )


def test_every_required_option_has_a_baseline(tmp_path: Path) -> None:
    base = baselines(tmp_path)
    missing = sorted(
        {f"{o.task} {o.flag}" for o in options_of(tasks.ns) if o.required and o.name not in base}
    )
    assert missing == [], f"add a value for these required options to option_fuzz.baselines: {missing}"


def test_every_hostile_value_to_every_option_is_refused_before_anything_runs(tmp_path: Path) -> None:
    options = options_of(tasks.ns)
    values = hostile_values(tmp_path)
    base = baselines(tmp_path)
    by_task: dict[str, list[Option]] = {}
    for option in options:
        by_task.setdefault(option.task, []).append(option)
    spaces = {name: alone(tasks.ns, name) for name in by_task}
    failures, cases = [], 0
    start = time.monotonic()
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a relative path a task would write lands here, inside the allowed folder
    try:
        with isolated(tmp_path) as guard:
            for option in options:
                for hostile in classes_for(option):
                    cases += 1
                    argv = argv_for(option, values[hostile], base, by_task[option.task])
                    failure = judge(option, hostile, run_cli(spaces[option.task], argv, guard))
                    if failure:
                        failures.append(failure)
    finally:
        os.chdir(cwd)
    seconds = time.monotonic() - start
    assert failures == [], f"{len(failures)} of {cases} hostile inputs got through:\n" + "\n".join(failures)
    assert cases > 1000 and seconds < FUZZ_BUDGET_S, (cases, seconds)
    print(f"option fuzz: {cases} cases in {seconds:.1f} s")


# The fuzzer can fail: an option added without a kind is found, and a task that reaches the network, starts a
# program or writes outside is caught by the isolation.


@task
def planted(c: Context, recipe: str, frobnicate: str = "") -> None:
    """A task as a new one would be written: a new option without a kind, and a body that phones home."""
    socket.create_connection(("192.0.2.1", 9), timeout=1)


def test_a_new_untyped_option_is_found() -> None:
    ns = Collection(planted)
    untyped = [o.flag for o in options_of(ns) if o.kind is None]
    assert untyped == ["--frobnicate"]


def test_an_accepted_value_that_reaches_the_network_is_caught(tmp_path: Path) -> None:
    ns = Collection(planted)
    option = next(o for o in options_of(ns) if o.name == "frobnicate")
    with isolated(tmp_path) as guard:
        outcome = run_cli(ns, ["planted", "--recipe=vllm-qwen35", "--frobnicate=x"], guard)
    assert any("socket" in c for c in outcome.contacts), outcome
    assert "contacted" in judge(option, "word", outcome)


def test_a_write_outside_the_temporary_folder_is_caught(tmp_path: Path) -> None:
    outside = ROOT / "build" / "fuzz-should-not-exist.txt"
    with isolated(tmp_path) as guard:
        from option_fuzz import Isolation

        Isolation.armed = guard
        try:
            with pytest.raises(PermissionError):
                outside.write_text("x")
        finally:
            Isolation.armed = None
    assert not outside.exists() and guard.contacts == [f"write {str(outside)!r}"]


# The in-process runs stand for the command line: a sample of kinds through a real `invoke` process, with the
# engine and proxies closed, answers alike.
SAMPLE = [
    (
        "memory",
        ["--recipe=vllm-qwen35", "--profile=qwen35-35b-a3b-fp8", "--mem-available=٣"],
        "--mem-available",
    ),
    (
        "serve",
        ["--recipe=vllm-qwen35", "--profile=qwen35-35b-a3b-fp8", "--model-dir=/data:/etc:rw"],
        "--model-dir",
    ),
    ("bench.compare", ["--old=/dev/zero", "--new=x"], "--old"),
    (
        "import",
        [f"--source={ROOT / 'profiles' / 'qwen35-35b-a3b-fp8.yaml'}", "--extra=--flag 'unclosed"],
        "--extra",
    ),
    ("lock.update", ["--package=vllm; rm -rf /"], "--package"),
    ("conform", ["--recipe=vllm-qwen35", "--profile=qwen35-35b-a3b-fp8", "--golden=/dev/zero"], "--golden"),
]


@pytest.mark.parametrize(("task_name", "args", "flag"), SAMPLE, ids=[s[0] for s in SAMPLE])
def test_the_command_line_refuses_alike(tmp_path: Path, task_name: str, args: list[str], flag: str) -> None:
    env = {**os.environ, **ISOLATED_ENV, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "invoke", task_name, *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    seconds = time.monotonic() - start
    text = result.stdout + result.stderr
    assert result.returncode != 0 and flag in text and "fix:" in text and "Traceback" not in text, text
    assert seconds < 20 + CASE_SECONDS, (
        seconds
    )  # python + invoke start: ~0.5 s idle, a few s on a loaded machine


def test_the_target_choice_is_the_templates_stages() -> None:
    import re

    from sparkforge.cli.options import OPTION_KINDS

    template = (Path(__file__).resolve().parents[2] / "dockerfiles" / "vllm.Dockerfile.j2").read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)$", template, re.MULTILINE)
    for stage in stages:
        OPTION_KINDS["target"].check("--target", stage)  # each one taken
    with pytest.raises(Exception, match="--target"):
        OPTION_KINDS["target"].check("--target", "not-a-stage")
