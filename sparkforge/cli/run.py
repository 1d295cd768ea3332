"""Invoke tasks that run images: `serve`, `serve.down` (thin: one LaunchPlan, sparkforge/run/launchplan.py, then
its executor, sparkforge/run/launchrun.py). The helpers below the tasks are cli/cluster.py's until cluster.up makes
its own LaunchPlan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from invoke import Collection, Context

from sparkforge.cli import echo, task, user_errors, warn
from sparkforge.cli.families import DRY, NETWORK, Family
from sparkforge.cli.launchflags import (
    FORCE,
    IFACE_HELP,
    IMAGE,
    ITERABLE,
    MOUNTS,
    NODE,
    NODES_HELP,
    PROFILE_HELP,
    RECIPE_HELP,
    SERVER,
    START,
    flag_help,
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

    no_chat: bool = False
    down_on_fail: bool = False
    watchdog: str = "auto"
    watchdog_floor: float = 4.0


SERVE = Family.of(
    ServeFlags,
    "serving",
    no_chat="skip the chat completion",
    down_on_fail="remove the deployment when the answer check fails (default: keep the healthy deployment)",
    watchdog=WATCHDOG_HELP,
    watchdog_floor=FLOOR_HELP,
)
SERVE_LAUNCH = (IMAGE, NODE, MOUNTS, SERVER, START, FORCE)


@task(
    families=(NETWORK, DRY, launch(*SERVE_LAUNCH), SERVE),
    iterable=ITERABLE,
    help={"recipe": RECIPE_HELP, "profile": PROFILE_HELP},
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


# cli/cluster.py's helpers (doctor, fabric, up) until cluster.up makes its own LaunchPlan: adapters over
# sparkforge/run/launchplan.py, whose functions check each flag once.

__all__ = ["COMMON_HELP", "IFACE_HELP", "NODES_HELP", "RECIPE_HELP", "NodeFlags", "doctor_options", "image_ref",
           "known_bad_guard", "launch_options", "node_engines", "preflight_profile", "serve", "serve_ns"]  # fmt: skip
COMMON_HELP = {
    "recipe": RECIPE_HELP,
    "profile": PROFILE_HELP,
    **flag_help(IMAGE, MOUNTS, SERVER, START),
    "dry": "print the exact plan (docker argv and env per node), start nothing",
}


def image_ref(recipe: str, image: str, allow_unverified: bool = False, dry: bool = False) -> str:
    """The image a node task runs, through the one resolver (registry/pulled.py), said with the reason."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.run.launchplan import LaunchFlags, resolve_image

    if image:
        from sparkforge.recipe import plan

        plan.check_reference("--image", image)  # the boundary: before the recipe or the engine
        if not recipe:  # cluster.doctor/fabric without a recipe: the image as named (run with --pull never)
            return image
    flags = LaunchFlags(image=image, allow_unverified=allow_unverified)
    found, why, said = resolve_image(load_recipe(recipe), flags, dry=dry)
    for line in said:
        warn(line)
    echo(f"sparkforge: image {found}: {why}")
    return found


def preflight_profile(recipe: str, profile, skip: bool) -> None:
    """The (loaded) profile's flags and parsers against the recipe's pinned vLLM: fails in seconds, not at launch."""
    if not skip:
        from sparkforge.cli.families import session_from
        from sparkforge.recipe.loader import load_recipe
        from sparkforge.run.launchrun import preflight_profile as check

        check(session_from({}), load_recipe(recipe), profile)


def known_bad_guard(recipe: str, profile) -> None:
    """A profile on a vLLM with a public report of silent wrong output: refused (or warned) before anything starts."""
    from sparkforge.preflight.knownbad import guard
    from sparkforge.recipe.loader import load_recipe

    guard(profile, load_recipe(recipe).model.components.vllm.version, warn)


def node_engines(nodes: str) -> list:
    """Every node checked (and plain tcp:// warned) before any engine is contacted."""
    import os

    from sparkforge.run.launchplan import LaunchFlags, plan_nodes
    from sparkforge.run.nodes import NodeEngine

    parsed, said = plan_nodes(LaunchFlags(nodes=nodes), os.environ)
    for line in said:
        warn(line)
    return [NodeEngine(n) for n in parsed]


@dataclass(frozen=True)
class NodeFlags:
    """cli/cluster.py's flags by name (`NodeFlags.of(image, locals())`) until cluster.up makes a LaunchPlan: the
    image and the LaunchFlags its parameters name; a flag the task does not have keeps LaunchFlags' default."""

    image: str
    flags: LaunchFlags

    @classmethod
    def of(cls, image: str, options: Mapping[str, Any]) -> NodeFlags:
        from sparkforge.run.launchplan import LaunchFlags

        given = {
            f.name: options[f.name] for f in fields(LaunchFlags) if f.name != "image" and f.name in options
        }
        if "ulimit" in given:
            given["ulimit"] = tuple(given["ulimit"] or ())
        return cls(image, LaunchFlags(**given))


def doctor_options(flags: NodeFlags, sanity: bool = True):
    """The doctor's options from the flags, each checked (interface, port, --gpus, paths made absolute)."""
    from sparkforge.run import launchplan

    return launchplan.doctor_options(flags.image, flags.flags, sanity)


def launch_options(flags: NodeFlags):
    """The launch options from the flags, each checked before any engine or download; opt-ins warned."""
    import os

    from sparkforge.run import launchplan

    options = launchplan.launch_options(flags.image, flags.flags, os.environ)
    for line in launchplan.flag_warnings(flags.flags):
        warn(line)
    return options
