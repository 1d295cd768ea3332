"""The executor of a launch plan (sparkforge/run/launchplan.py): what every launch says and checks before it
contacts an engine (the image, the warnings, the memory plan, the profile's flags against the pinned vLLM, the
known-bad list), then `serve` on one node. `--dry` (the session's dry runner) prints the plan and starts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkforge.context import Session
from sparkforge.errors import PreflightError
from sparkforge.run.launchplan import LaunchPlan, plan_lines
from sparkforge.run.memory.guard import judge_memory
from sparkforge.run.nodes import NodeEngine

if TYPE_CHECKING:
    from sparkforge.recipe.loader import Recipe
    from sparkforge.recipe.profile import Profile


def check_launch(session: Session, plan: LaunchPlan) -> None:
    """Before any engine, download or container: the warnings and, for a plan that starts a server, the image
    and why, the memory plan (refused unless it fits or --force) and the profile's opt-ins."""
    if plan.starts:
        session.echo(f"sparkforge: image {plan.image}: {plan.image_why}")
    for line in plan.warnings:
        session.warn(line)
    if plan.starts:
        judge_memory(session, plan.memory, plan.profile.name, plan.flags.force, plan.memory_refusal)


def opt_ins(session: Session, plan: LaunchPlan) -> None:
    """The profile's opt-ins past the allow-list, said; then a model that is not pinned refused (or the token
    that would reach the recipe's code), before any container starts."""
    from sparkforge.errors import RunError

    for line in plan.notes:
        session.echo(line)
    if plan.pin_refusal:
        raise RunError(plan.pin_refusal)


def check_profile(session: Session, plan: LaunchPlan) -> None:
    """What serve and cluster.up check of the profile itself before a start: its flags against the pinned vLLM
    (unless --no-preflight), then the known-bad list (refused, or warned)."""
    from sparkforge.preflight.knownbad import guard

    if not plan.flags.no_preflight:
        preflight_profile(session, plan.recipe, plan.profile)
    guard(plan.profile, plan.vllm, session.warn)


def preflight_profile(session: Session, recipe: Recipe, profile: Profile) -> None:
    """The profile's flags and parsers against the recipe's pinned vLLM: fails in seconds, not at launch."""
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.preflight.serveflags import check_serve_profiles, recipe_surface
    from sparkforge.report import Report, print_report

    report = Report(command="preflight", subject=f"profile {profile.name}", recipe=recipe.name)
    fetcher = make_fetcher(offline=session.offline, ca_bundle=session.ca_bundle)
    check_serve_profiles(report, recipe, [profile], lambda: recipe_surface(recipe, fetcher))
    if report.status != "passed":
        print_report(report, session.echo)
        raise PreflightError(f"serve flags failed preflight: {report.failed[0].reason}")


@dataclass(frozen=True)
class Serving:
    """`serve`'s own choices beyond the launch: the answer check and the memory watchdog."""

    chat: bool = True
    down_on_fail: bool = False
    watchdog: str = "auto"  # auto (a GB10 recipe with GPUs), on, off
    watchdog_floor: int = 4 << 30  # bytes of MemAvailable below which the watchdog stops the server


def serve(session: Session, plan: LaunchPlan, serving: Serving) -> None:
    """`invoke serve`: the checks, then (unless dry: the plan printed) the profile on its node, health, one
    answer, and the memory watchdog in the foreground."""
    from sparkforge.run.serve.serve import ServeOptions, serve_up

    check_launch(session, plan)
    check_profile(session, plan)
    opt_ins(session, plan)
    if session.runner.dry:
        for line in plan_lines(plan):
            session.echo(line)
        return
    engine = NodeEngine(plan.nodes[0])
    options = ServeOptions(
        plan.launch, chat=serving.chat, down_on_fail=serving.down_on_fail, containers=plan.containers
    )
    containers, _ = serve_up(session, engine, plan.profile, options)
    if watches(plan, serving):
        watch(session, engine, containers.head.container.name, serving.watchdog_floor)


def watches(plan: LaunchPlan, serving: Serving) -> bool:
    """--watchdog auto: on for a GB10 recipe served with GPUs."""
    if serving.watchdog == "auto":
        return plan.flags.gpus != "none" and plan.device != "cpu"
    return serving.watchdog == "on"


def watch(session: Session, engine: NodeEngine, container: str, floor: int) -> None:
    """After a healthy serve: watch the node's memory in the foreground; a stop is a failure naming why."""
    from sparkforge.errors import RunError
    from sparkforge.run.memory.serving import watch_container

    try:
        stopped = watch_container(session, engine, container, floor=floor)
    except KeyboardInterrupt:
        session.echo(f"watchdog: no longer watching; {container} keeps running unguarded")
        return
    if stopped is None:
        raise RunError(
            f"the server {container} exited on its own; fix: 'invoke cluster.logs' or 'docker logs {container}'"
        )
    raise RunError(f"{stopped.message}\nlast lines of {container}:\n{stopped.last_lines.rstrip()}")
