"""The executors of a cluster plan (clusterplan.py), as launchrun.py is serve's: what `cluster.doctor` and
`cluster.up` say and check before they contact a node (the layout, the image, the warnings, the memory plan, the
profile's flags against the pinned vLLM), then the doctor, or the launch (cluster.py: doctor, weights, workers
then the head, health) and one answer. `--dry` (the session's dry runner) prints the plan and contacts no node.
"""

from __future__ import annotations

from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.run.cluster.cluster import UpOptions, UpResult, cluster_up, ensure_image
from sparkforge.run.cluster.clusterflags import Bringing
from sparkforge.run.cluster.clusterplan import ClusterPlan, plan_lines
from sparkforge.run.cluster.doctor import DoctorPlan, DoctorResult, run_doctor
from sparkforge.run.launchplan import LaunchPlan
from sparkforge.run.launchrun import check_launch, check_profile, preflight_profile
from sparkforge.run.nodes import NodeEngine


def _said(session: Session, plan: ClusterPlan) -> LaunchPlan | None:
    """The plan's own lines: the nodes' and image's warnings, the layout and its warnings, then (with a profile)
    the launch's checks before any node: the image, the warnings, the memory plan (refused unless it fits)."""
    for line in plan.warnings:
        session.warn(line)
    for line in plan.notes:
        session.echo(line)
    for line in plan_lines(plan):
        session.echo(line)
    for line in plan.layout.warnings if plan.layout else ():
        session.warn(f"warning: {line}")
    if plan.launch:
        check_launch(session, plan.launch)
    return plan.launch


def doctor(session: Session, plan: ClusterPlan) -> DoctorResult:
    """`invoke cluster.doctor`: with a profile, its layout, memory plan (reported, never refused) and flags
    against the pinned vLLM (unless --no-preflight) first; then every doctor stage on the nodes."""
    launch = _said(session, plan)
    if launch and not launch.flags.no_preflight:
        preflight_profile(session, launch.recipe, launch.profile)
    return run_doctor(session, DoctorPlan(tuple(NodeEngine(n) for n in plan.nodes), plan.doctor))


def up(session: Session, plan: ClusterPlan, bringing: Bringing) -> UpResult:
    """`invoke cluster.up`: the plan's checks, the image on every node, then the doctor, the launch, health and
    one answer (dry: the plan printed, no node contacted). A failed answer keeps the healthy deployment unless
    --down-on-fail; anything else removes it."""
    from sparkforge.run.inputs import check_positive
    from sparkforge.run.serve.serve import ask, keep_or_remove
    from sparkforge.run.serve.start import cluster_down

    check_positive("--health-timeout", bringing.health_timeout)
    launch = _said(session, plan)
    if launch is None:
        raise RunError("cluster.up needs a profile; fix: --profile P")
    check_profile(session, launch)
    engines = [NodeEngine(n) for n in plan.nodes]
    dry = session.runner.dry
    if not dry:  # --dry contacts no engine: no image check, no doctor probe
        ensure_image(session, engines, launch.image, distribute=bringing.distribute)
    options = UpOptions(launch.launch, plan.doctor, bringing.health_timeout, dry)
    result = cluster_up(session, engines, launch.profile, options)
    if dry:
        return result
    try:
        ask(session, engines[0], result.plan.head.container.name, launch.launch.port, launch.profile)
    except RunError:
        keep_or_remove(session, engines, launch.profile.name, bringing.down_on_fail)
        raise
    except BaseException:
        cluster_down(engines, launch.profile.name)
        raise
    return result
