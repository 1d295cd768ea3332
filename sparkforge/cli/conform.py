"""Invoke task `conform` (thin: the work is in sparkforge.run.conform)."""

from __future__ import annotations

from pathlib import Path

from invoke import Context

from sparkforge.cli import LazyHelp, Whole, echo, finish_report, session, task, user_errors
from sparkforge.cli.memory import FORCE_HELP, memory_check
from sparkforge.cli.run import (
    COMMON_HELP,
    IFACE_HELP,
    NODES_HELP,
    NodeFlags,
    doctor_options,
    image_ref,
    launch_options,
    node_engine,
    node_engines,
)


def _dry_run(
    loaded, engines, launch, doctor, health_timeout: int, selected: tuple[str, ...], attach: str
) -> None:
    """conform --dry: what would start (the profile as profiled; each row starts its own variants after it) and
    which rows would run, in order; no engine is contacted."""
    from sparkforge.run.conform.session import settings_of

    rows = selected or tuple(settings_of(loaded).checks) or conform_rows().names()
    if attach:
        echo(f"conform --dry: would ask {attach}, the running deployment (no server started)")
    else:
        echo(f"conform --dry: would start {loaded.name} as profiled, then each row's server variants")
        if len(engines) > 1:
            from sparkforge.run.cluster.cluster import UpOptions, cluster_up

            cluster_up(session(), engines, loaded, UpOptions(launch, doctor, health_timeout, True))
        else:
            from sparkforge.run.serve.serve import ServeOptions, serve_up

            serve_up(session(), engines[0], loaded, ServeOptions(launch, chat=False, dry=True))
    registry = conform_rows()
    for index, name in enumerate(n for n in registry.names() if n in rows):
        echo(f"row {index + 1}/{len(rows)} {name}: {registry.get(name).help}")


def conform_rows():
    """The conform rows' registry, imported when asked (it imports the rows and their clients)."""
    from sparkforge.run.conform.rows import ROWS

    return ROWS


@task(
    iterable=["ulimit"],
    help={
        **{
            k: v
            for k, v in COMMON_HELP.items()
            if k not in ("no_preflight", "dry", "weights", "trust_remote_code")
        },
        "dry": "print the memory plan, the launch of the profile as profiled (docker argv per node) and the rows "
        "that would run; start nothing",
        "attach": "check a running server at this http(s) URL instead of starting one (equivalence across server configs is then skipped)",
        "checks": LazyHelp(
            lambda: conform_rows().help_text(
                "comma-separated rows to run (default: the profile's conform.checks, else all):"
            )
        ),
        "record": "store the greedy token ids of the prompt set as the golden file (with image digest, model revision, vLLM version)",
        "golden": "the golden file (default: golden/<profile>.json)",
        "json": "write the JSON report here",
        "junit": "write JUnit XML here",
        "node": "the engine to run on (default: the local one)",
        "nodes": NODES_HELP
        + "; conform brings a multi-node profile up as cluster.up does and asks from inside the head",
        "interface": IFACE_HELP,
        "master_port": "rendezvous port of a multi-node launch (--master-port)",
        "health_timeout": "seconds to wait for /health per server start",
        "force": FORCE_HELP,
    },
)
@user_errors
def conform(
    c: Context,
    recipe: str,
    profile: str,
    image: str = "",
    attach: str = "",
    checks: str = "",
    record: bool = False,
    golden: str = "",
    json: str = "",
    junit: str = "",
    port: int = Whole(8000),
    model_dir: str = "",
    hf_token_file: str = "",
    cache_dir: str = "/var/cache/sparkforge",
    gpus: str = "all",
    node: str = "",
    nodes: str = "",
    interface: str = "",
    master_port: int = Whole(29501),
    ulimit: list[str] | None = None,
    health_timeout: int = Whole(1800),
    hf_endpoint: str = "",
    allow_unpinned_model: bool = False,
    force: bool = False,
    allow_unverified: bool = False,
    dry: bool = False,
) -> None:
    """Correct answers: determinism, equivalence, long decode, prefix-cache hits, API, golden token ids."""
    from sparkforge.boundary import check_output
    from sparkforge.errors import RunError
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.conform.client import check_url
    from sparkforge.run.conform.session import ConformOptions, parse_checks, run_conform
    from sparkforge.run.inputs import check_positive

    selected = parse_checks(checks)  # every input checked before an engine or a server is contacted
    check_output(json, "--json")
    check_output(junit, "--junit")
    if record and golden:
        check_output(
            golden, "--golden"
        )  # --record writes it: no FIFO, folder or system path, before any start
    if node and nodes:
        raise RunError(
            "conform: --node and --nodes both given; fix: --node E for one engine, --nodes A,B for several"
        )
    if attach and nodes:
        raise RunError(
            "conform: --attach and --nodes both given; --attach asks a deployment that is already running (by its "
            "URL), --nodes starts one across the nodes; fix: give one of them"
        )
    engines = node_engines(nodes) if nodes else [node_engine(node)]
    if attach:
        check_url(attach)
    check_positive("--health-timeout", health_timeout)
    loaded = load_profile(profile)
    loaded_recipe = load_recipe(recipe)
    recipe_name = loaded_recipe.name
    launch = doctor = None
    if not attach:
        memory_check(recipe, loaded, model_dir, force)  # before any engine or server is contacted
        flags = NodeFlags.of(image_ref(recipe, image, allow_unverified, dry=dry), locals())
        launch = launch_options(flags)
        if nodes:
            doctor = doctor_options(flags)
    if dry:
        return _dry_run(loaded, engines, launch, doctor, health_timeout, selected, attach)
    options = ConformOptions(
        checks=selected,
        attach=attach or None,
        record=record,
        golden=Path(golden) if golden else None,
        explicit_golden=bool(golden),
        launch=launch,
        health_timeout_s=health_timeout,
        image_ref=image or None,
        doctor=doctor,
        gpu=loaded_recipe.model.gpu if loaded_recipe.model.device == "cuda" else None,
    )
    report = run_conform(session(), engines, loaded, options)
    report.recipe = recipe_name
    finish_report(report, json, junit, hint="each failed row names the first divergence or the garble found")
