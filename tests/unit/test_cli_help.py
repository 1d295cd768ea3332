"""Every task's help, as `invoke --help TASK` prints it: a placeholder on every option that takes a value, short
flags that mean one thing in every task (never -h, which is --help), no `%%`, and --list lines that are whole
sentences; Invoke's own usage errors come out in the project's words with the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection

import tasks
from sparkforge.cli.parsing import SHORT_FLAGS

ROOT = Path(__file__).resolve().parents[2]


def contexts():
    return Collection.from_module(tasks).to_contexts()


def test_every_value_option_shows_a_placeholder_and_no_percent_escape() -> None:
    problems = []
    for context in contexts():
        for arg in context.args.values():
            flag = ("-" if len(arg.names[0]) == 1 else "--") + arg.names[0]
            spec, text = context.help_for(flag)
            shown = [part.replace("=", " ").split(" ", 1)[1:] for part in spec.split(", ")]
            if arg.takes_value and not all(value and value[0].isupper() for value in shown):
                problems.append(f"{context.name} {flag}: {spec!r} shows no placeholder")
            if "%%" in text:
                problems.append(f"{context.name} {flag}: help prints '%%'")
            if not text.strip():
                problems.append(f"{context.name} {flag}: no help text")
    assert not problems, "\n".join(problems)


def test_short_flags_mean_one_option_everywhere() -> None:
    meaning: dict[str, set[str]] = {}
    for context in contexts():
        for arg in context.args.values():
            long_name = arg.names[0]
            for short in arg.names[1:]:
                meaning.setdefault(short, set()).add(long_name)
    assert "h" not in meaning, f"-h is --help, yet it names {meaning.get('h')}"
    clashes = {short: longs for short, longs in meaning.items() if len(longs) > 1}
    assert not clashes, f"short flags with more than one meaning: {clashes}"
    for short, longs in meaning.items():
        assert {SHORT_FLAGS.get(n.replace("-", "_")) for n in longs} == {short}, (short, longs)


def test_list_lines_are_whole_sentences() -> None:
    ns = Collection.from_module(tasks)
    cut = [
        f"{name}: {ns[name].__doc__.strip().splitlines()[0]!r}"
        for name in ns.task_names
        if not ns[name].__doc__.strip().splitlines()[0].rstrip().endswith((".", ")"))
    ]
    assert not cut, (
        "--list shows these cut mid-sentence (end the docstring's first line with the sentence):\n"
        + "\n".join(cut)
    )


def invoke(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["build"], "`invoke build` needs --recipe RECIPE"),
        (["build", "--recipee", "vllm-qwen35"], "has no option --recipee; fix: did you mean --recipe?"),
        (
            ["memory", "--recipe", "vllm-qwen35-wheels", "--profile", "qwen35-35b-a3b-fp8", "--dry"],
            "`invoke memory` has no option --dry",
        ),
        (["diff", "a"], "`invoke diff` needs B"),
        (["serve", "--recipe", "vllm-qwen35-wheels"], "`invoke serve` needs --profile PROFILE"),
    ],
)
def test_invoke_usage_errors_are_said_with_the_fix(argv: list[str], said: str) -> None:
    result = invoke(*argv)
    assert result.returncode == 1, result.stdout + result.stderr
    assert said in result.stderr, result.stderr
    assert "fix:" in result.stderr and "sparkforge:" in result.stderr
    assert "positional" not in result.stderr and "No idea" not in result.stderr


def test_help_output_shows_placeholders_for_whole_numbers_and_repeatables() -> None:
    result = invoke("--help", "serve")
    assert result.returncode == 0, result.stderr
    assert "--port=PORT" in result.stdout and "--ulimit=ULIMIT" in result.stdout


def test_reading_a_tasks_options_twice_keeps_every_help_line() -> None:
    """Invoke pops each option's help as it builds the arguments; help, the fuzzer and the parser all read them."""
    for context_task in (tasks.ns.tasks["conform"], tasks.ns.tasks["build"]):
        first = {a.name: str(a.help) for a in context_task.get_arguments()}
        second = {a.name: str(a.help) for a in context_task.get_arguments()}
        assert first == second and all(second.values()), second
