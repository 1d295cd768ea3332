"""Invoke tasks that run images: `serve`, `serve.down` (thin: one LaunchPlan, sparkforge/run/launchplan.py, then
its executor, sparkforge/run/launchrun.py). The helpers below the tasks are cli/cluster.py's until cluster.up makes
its own LaunchPlan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from invoke import Collection, Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import DRY, NETWORK, Family, opt
from sparkforge.cli.launchflags import (
    FORCE,
    IMAGE,
    ITERABLE,
    LAUNCH_HELP,
    MOUNTS,
    NODE,
    SERVER,
    START,
    launch,
)
from sparkforge.context import Session

if TYPE_CHECKING:
    from sparkforge.run.launchplan import LaunchFlags


WATCHDOG_HELP = (
    "auto (default: on for a GB10 recipe with --gpus all), on or off: while serving, stop the server cleanly "
    "before the host runs out of memory (serve then stays in the foreground; Ctrl-C leaves the server running)"
)
FLOOR_HELP = (
    "the watchdog stops the server when the node's MemAvailable falls below this many GiB (default 4)"
)


def watchdog_options(mode: str, floor_gib: float) -> tuple[str, int]:
    """--watchdog and --watchdog-floor checked before anything is contacted: (mode, floor in bytes)."""
    from sparkforge.boundary import check_number
    from sparkforge.run.inputs import check_choice

    check_choice("--watchdog", mode, ("auto", "on", "off"))
    return mode, int(
        float(check_number("--watchdog-floor", floor_gib, low=0, high=1024, low_open=True)) * (1 << 30)
    )


@dataclass(frozen=True)
class ServeFlags:
    """`serve`'s own flags beyond the launch: the answer check and the memory watchdog (as given)."""

    no_chat: bool = opt(False, "skip the chat completion")
    down_on_fail: bool = opt(
        False, "remove the deployment when the answer check fails (default: keep the healthy deployment)"
    )
    watchdog: str = opt("auto", WATCHDOG_HELP)
    watchdog_floor: float = opt(4.0, FLOOR_HELP)


SERVE = Family.of(ServeFlags, "serving")
SERVE_LAUNCH = (IMAGE, NODE, MOUNTS, SERVER, START, FORCE)


@task(
    families=(NETWORK, DRY, launch(*SERVE_LAUNCH), SERVE),
    iterable=ITERABLE,
    help=dict(LAUNCH_HELP),
)
@user_errors
def serve(
    c: Context, session: Session, recipe: str, profile: str, flags: LaunchFlags, serving: ServeFlags
) -> None:
    """Serve a profile on one node: GPU, host IPC, caches mounted, health wait, one chat completion."""
    import os

    from sparkforge.run import launchrun
    from sparkforge.run.launchplan import plan_task

    mode, floor = watchdog_options(serving.watchdog, serving.watchdog_floor)
    plan = plan_task(recipe, profile, flags, os.environ, dry=session.runner.dry)  # every input checked
    launchrun.serve(session, plan, launchrun.Serving(not serving.no_chat, serving.down_on_fail, mode, floor))


@task(
    name="down",
    help={"node": "the engine (default: the local one)", "profile": "only this profile's container"},
)
@user_errors
def serve_down(c: Context, session: Session, node: str = "", profile: str = "") -> None:
    """Stop and remove what `serve` started on this node."""
    import os

    from sparkforge.run.launchplan import LaunchFlags, plan_nodes
    from sparkforge.run.nodes import NodeEngine
    from sparkforge.run.serve.serve import serve_down as down

    (parsed,), said = plan_nodes(LaunchFlags(node=node), os.environ)
    for line in said:
        session.warn(line)
    session.out(f"removed {down(NodeEngine(parsed), profile or None)} container(s)")


serve_ns = Collection("serve")
serve_ns.add_task(serve, "serve", default=True)
serve_ns.add_task(serve_down, "down")
