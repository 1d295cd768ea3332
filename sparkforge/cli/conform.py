"""Invoke task `conform` (thin: one LaunchPlan, sparkforge/run/launchplan.py; the rows in sparkforge.run.conform)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Context

from sparkforge.cli import LazyHelp, Whole, task, user_errors
from sparkforge.cli.families import DRY, REPORT, Family, Outputs, opt
from sparkforge.cli.launchflags import (
    FORCE,
    IMAGE,
    ITERABLE,
    LAUNCH_HELP,
    MOUNTS,
    NODE,
    NODES,
    SERVER,
    launch,
)
from sparkforge.context import Session

if TYPE_CHECKING:
    from sparkforge.run.launchplan import LaunchFlags, LaunchPlan


def conform_rows():
    """The conform rows' registry, imported when asked (it imports the rows and their clients)."""
    from sparkforge.run.conform.rows import ROWS

    return ROWS


@dataclass(frozen=True)
class ConformFlags:
    """conform's own flags beyond the launch (as given)."""

    attach: str = opt(
        "",
        "check a running server at this http(s) URL instead of starting one (equivalence across server configs is then skipped)",
    )
    checks: str = opt(
        "",
        LazyHelp(
            lambda: conform_rows().help_text(
                "comma-separated rows to run (default: the profile's conform.checks, else all):"
            )
        ),
    )
    record: bool = opt(
        False,
        "store the greedy token ids of the prompt set as the golden file (with image digest, model revision, vLLM version)",
    )
    golden: str = opt("", "the golden file (default: golden/<profile>.json)")
    health_timeout: int = opt(Whole(1800), "seconds to wait for /health per server start")
    reference_model_dir: str = opt(
        "",
        "the folder the reference row's transformers reads (the same path on the head node; "
        "default: --model-dir): e.g. the unquantized checkpoint of a quantized served model",
    )


CONFORM = Family.of(ConformFlags, "conforming")
CONFORM_LAUNCH = (IMAGE, NODE, NODES, MOUNTS, SERVER, FORCE)


@task(
    families=(DRY, launch(*CONFORM_LAUNCH), CONFORM, REPORT),
    iterable=ITERABLE,
    help={
        **LAUNCH_HELP,
        "nodes": NODES.options[0].help
        + "; conform brings a multi-node profile up as cluster.up does and asks from inside the head",
        "dry": "print the memory plan, the launch of the profile as profiled (docker argv per node) and the rows "
        "that would run; start nothing",
    },
)
@user_errors
def conform(
    c: Context,
    session: Session,
    recipe: str,
    profile: str,
    flags: LaunchFlags,
    conforming: ConformFlags,
    outputs: Outputs,
) -> None:
    """Correct answers: determinism, equivalence, long decode, prefix-cache hits, API, golden token ids."""
    import os

    from sparkforge.run.conform.session import run_conform
    from sparkforge.run.launchplan import plan_task
    from sparkforge.run.launchrun import check_launch, opt_ins

    options = conform_options(conforming, flags)  # every input checked before an engine or a server
    plan = plan_task(recipe, profile, flags, os.environ, dry=session.runner.dry, starts=not conforming.attach)
    check_launch(session, plan)
    opt_ins(session, plan)
    if session.runner.dry:
        return _dry_run(session, plan, conforming, options.checks)
    options = plan_options(options, plan)
    from sparkforge.run.nodes import NodeEngine

    report = run_conform(session, [NodeEngine(n) for n in plan.nodes], plan.profile, options)
    report.recipe = plan.recipe.name
    outputs.finish(session, report, hint="each failed row names the first divergence or the garble found")


def conform_options(conforming: ConformFlags, flags: LaunchFlags):
    """conform's own flags checked (rows, outputs, the attach URL, the health timeout) and the flag pairs that
    exclude each other refused, before anything is loaded or contacted."""
    from sparkforge.boundary import check_output
    from sparkforge.errors import RunError
    from sparkforge.run.conform.client import check_url
    from sparkforge.run.conform.session import ConformOptions, parse_checks
    from sparkforge.run.inputs import check_host_path, check_positive

    selected = parse_checks(conforming.checks)
    if conforming.record and conforming.golden:
        check_output(conforming.golden, "--golden")  # --record writes it: no FIFO, folder or system path
    if flags.node and flags.nodes:
        raise RunError(
            "conform: --node and --nodes both given; fix: --node E for one engine, --nodes A,B for several"
        )
    if conforming.attach and flags.nodes:
        raise RunError(
            "conform: --attach and --nodes both given; --attach asks a deployment that is already running (by its "
            "URL), --nodes starts one across the nodes; fix: give one of them"
        )
    if conforming.attach:
        check_url(conforming.attach)
    check_positive("--health-timeout", conforming.health_timeout)
    reference = Path(conforming.reference_model_dir).resolve() if conforming.reference_model_dir else None
    check_host_path("--reference-model-dir", str(reference or ""))
    return ConformOptions(
        checks=selected,
        attach=conforming.attach or None,
        record=conforming.record,
        golden=Path(conforming.golden) if conforming.golden else None,
        explicit_golden=bool(conforming.golden),
        health_timeout_s=conforming.health_timeout,
        image_ref=flags.image or None,
        reference_model_dir=reference,
    )


def plan_options(options, plan: LaunchPlan):
    """The launch plan's part of conform's options: the launch and (several nodes) the doctor, the GPU."""
    from dataclasses import replace

    starts = options.attach is None
    return replace(
        options,
        launch=plan.launch if starts else None,
        doctor=plan.doctor if starts and len(plan.nodes) > 1 else None,
        gpu=plan.recipe.model.gpu if plan.device == "cuda" else None,
    )


def _dry_run(session: Session, plan: LaunchPlan, conforming: ConformFlags, selected: tuple[str, ...]) -> None:
    """conform --dry: what would start (the profile as profiled; each row starts its own variants after it) and
    which rows would run, in order; no engine is contacted."""
    from sparkforge.run.conform.session import profile_checks
    from sparkforge.run.launchplan import plan_lines

    registry = conform_rows()
    profiled = profile_checks(plan.profile)  # judged by the registry, --checks given or not
    rows = selected or profiled
    if conforming.attach:
        session.echo(
            f"conform --dry: would ask {conforming.attach}, the running deployment (no server started)"
        )
    else:
        session.echo(
            f"conform --dry: would start {plan.profile.name} as profiled, then each row's server variants"
        )
        if len(plan.nodes) > 1:
            from sparkforge.run.cluster.cluster import UpOptions, cluster_up
            from sparkforge.run.nodes import NodeEngine

            up = UpOptions(plan.launch, plan.doctor, conforming.health_timeout, True)
            cluster_up(session, [NodeEngine(n) for n in plan.nodes], plan.profile, up)
        else:
            for line in plan_lines(plan):
                session.echo(line)
    for index, name in enumerate(n for n in registry.names() if n in rows):
        session.echo(f"row {index + 1}/{len(rows)} {name}: {registry.get(name).help}")
