"""The library without Invoke (pypa/build's split): a Session built by hand drives an entry point, and nothing
below cli/ loads Invoke; on the Invoke side, a node task's flags become the library's options by name."""

from __future__ import annotations

import json
import subprocess
import sys

from sparkforge.recipe.loader import REPO_ROOT

SCRIPT = r"""
import importlib, json, pathlib, sys
import sparkforge
from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.run import launchrun
from sparkforge.run.launchplan import LaunchFlags, plan_task

lines = []
session = Session(echo=lines.append, runner=Runner(stream=False, dry=True), warn=lines.append)
flags = LaunchFlags("sparkforge-example/vllm:1", port=18499, gpus="none", allow_unpinned_model=True, no_preflight=True)
plan = plan_task("vllm-qwen35", "qwen35-35b-a3b-fp8", flags, {})
reply = launchrun.serve(session, plan, launchrun.Serving())
root = pathlib.Path(sparkforge.__file__).parent
for path in sorted(root.rglob("*.py")):  # a file walk: pkgutil's walk would import cli/ to look inside it
    parts = path.relative_to(root.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if not name.startswith(("sparkforge.cli", "sparkforge.verify.inimage")):
        importlib.import_module(name)
print(json.dumps({"lines": lines, "container": plan.containers.head.container.name, "reply": reply,
                  "invoke": sorted(m for m in sys.modules if m == "invoke" or m.startswith("invoke."))}))
"""


def test_a_hand_built_session_runs_serve_dry_and_no_library_module_loads_invoke() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["invoke"] == []  # every library module imported, and Invoke never came with one
    assert out["reply"] is None and out["container"] == "sparkforge-serve-qwen35-35b-a3b-fp8-0"
    # the plan went to the session's echo: the exact docker argv (the image, no GPU request with gpus off)
    (run,) = [line for line in out["lines"] if line.startswith("docker run ")]
    assert " sparkforge-example/vllm:1 " in run and "--gpus" not in run and "--ipc host" in run, run
    assert "download: skipped (--gpus none: vLLM stops before loading)" in out["lines"]


def test_a_tasks_launch_flags_keep_their_defaults_where_the_task_has_none() -> None:
    """A task takes only some launch groups (cli/launchflags.py); the flags it lacks keep LaunchFlags' defaults."""
    from invoke import Context

    from sparkforge.cli import task
    from sparkforge.cli.launchflags import SERVER, launch
    from sparkforge.run.launchplan import LaunchFlags, launch_options

    seen: list[LaunchFlags] = []

    @task(families=(launch(SERVER),), iterable=["ulimit"])
    def serve_like(c: Context, flags: LaunchFlags) -> None:
        """Takes the server group only."""
        seen.append(flags)

    assert "master_port" not in {a.name for a in serve_like.get_arguments()}  # not an option of the task
    serve_like(Context(), port=18000, gpus="none", ulimit=["nofile=4096"])
    (flags,) = seen
    assert flags == LaunchFlags(port=18000, gpus="none", ulimit=("nofile=4096",))
    options = launch_options("example.invalid/vllm:2", flags, {})
    assert (options.image, options.port, options.gpus, options.ulimits, options.master_port) == (
        "example.invalid/vllm:2", 18000, False, ("nofile=4096",), LaunchFlags().master_port
    )  # fmt: skip
