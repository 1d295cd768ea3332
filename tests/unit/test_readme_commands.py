"""Every `invoke` command the README shows passes as written, in its --dry form: a newcomer's first hour must
not start with an error.

Each command is taken from the README's ```bash blocks (chains split at && and ;, comments dropped) and run
through the real CLI:
- a task with a --dry option runs with --dry (serve, cluster.up, conform, bench, build, engine.up): it must exit 0;
- a task that only reads and prints (memory, recipes, show, render, import to a temporary --out) runs as is;
- any other (pull, verify, the doctor, the downs: they need a registry, an image or a running
  server) is parsed by Invoke with the project's parser: every option must exist and every required one be given.
A profile that the README imports is written to a temporary folder and later commands name that file."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection
from invoke.exceptions import ParseError
from invoke.parser import Parser

import tasks
from sparkforge.recipe.loader import REPO_ROOT

README = REPO_ROOT / "README.md"
# Tasks that change nothing and need no engine, registry or server: run as the README writes them.
READ_ONLY = {"memory", "recipes", "show", "render", "import"}


def readme_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    commands = []
    for block in blocks:
        for line in block.splitlines():
            for part in re.split(r"&&|;", line):
                words = shlex.split(part, comments=True)
                if words[:1] == ["invoke"]:
                    commands.append(words[1:])
    return commands


COMMANDS = readme_commands()
NAMESPACE = Collection.from_module(tasks)


def takes(name: str, option: str) -> bool:
    return any(arg.name == option for arg in NAMESPACE[name].get_arguments())


def test_the_readme_shows_the_first_hour_and_the_lines_ci_depends_on() -> None:
    text = README.read_text()
    assert (
        "bash .ci/install && . .venv/bin/activate && invoke engine.up && invoke build --recipe vllm-qwen35"
        in text
    )
    assert "## Tests\n```bash\nbash .ci/run\n```" in text
    names = [c[0] for c in COMMANDS]
    for step in (
        "pull",
        "memory",
        "serve",
        "conform",
        "bench",
        "cluster.doctor",
        "cluster.up",
        "build",
        "import",
    ):
        assert step in names, f"the README's first hour lacks invoke {step}"
    assert len(text.split()) < 1500, f"the README has {len(text.split())} words; move detail to docs/"


def test_every_file_the_readme_names_is_shipped() -> None:
    text = README.read_text()
    named = set(re.findall(r"\]\(([^)#]+)", text))  # links
    named |= {w for c in COMMANDS for w in c if re.fullmatch(r"[\w./-]+\.(ya?ml|json|md)", w) and "/" in w}
    named -= {
        w for c in COMMANDS for i, w in enumerate(c) if i and c[i - 1] == "--out"
    }  # written by the command
    missing = sorted(n for n in named if not (REPO_ROOT / n).exists())
    assert not missing, f"the README names files the repository does not ship: {missing}"


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c)[:90] for c in COMMANDS])
def test_readme_command_passes_in_its_dry_form(
    argv: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    name = argv[0]
    profiles = tmp_path_factory.getbasetemp() / "readme-profiles"
    profiles.mkdir(exist_ok=True)
    argv = list(argv)
    for i, word in enumerate(argv[:-1]):
        if word == "--out":  # the README's import writes a profile: here into a temporary folder
            argv[i + 1] = str(profiles / Path(argv[i + 1]).name)
        if word in ("--profile", "-p") and (profiles / f"{argv[i + 1]}.yaml").is_file():
            argv[i + 1] = str(profiles / f"{argv[i + 1]}.yaml")
    if takes(name, "dry") or name in READ_ONLY:
        if takes(name, "dry") and "--dry" not in argv:
            argv.append("--dry")
        if name == "import" and "--force" not in argv:
            argv.append("--force")
        done = subprocess.run(
            [sys.executable, "-m", "invoke", *argv],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"invoke {shlex.join(argv)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
        return
    parser = Parser(contexts=NAMESPACE.to_contexts())
    try:
        parsed = parser.parse_argv(argv)
    except ParseError as exc:
        pytest.fail(f"invoke {shlex.join(argv)}: {exc}")
    assert parsed[0].name in (name, f"{name}.{name}") or name in parsed[0].aliases
