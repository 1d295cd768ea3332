"""`cluster.up` and `cluster.logs`: a profile brought up across nodes.

Up: (distribute the image where its ID differs) -> doctor -> plan -> weights -> the start of the plan
(run/serve/start.py: workers, then the head, health wait; any failure explained and everything removed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.engine import docker_cli
from sparkforge.errors import RunError
from sparkforge.recipe.profile import Profile
from sparkforge.run.cluster.doctor import DoctorPlan, DoctorResult, network_env, run_doctor
from sparkforge.run.facts import DoctorOptions
from sparkforge.run.launch import (
    ContainerPlan,
    LaunchOptions,
    check_model_pin,
    plan_launch,
)
from sparkforge.run.nodes import NodeEngine, distribute_image, local_image_id
from sparkforge.run.serve.start import launch_plan, serve_label
from sparkforge.run.weights.weights import fetch_weights


@dataclass(frozen=True)
class UpResult:
    plan: ContainerPlan
    doctor: DoctorResult | None
    seconds: float


def ensure_image(
    session: Session, engines: Sequence[NodeEngine], image: str, *, distribute: bool = False, docker: str = ""
) -> dict[str, str]:
    """Prove the same image ID on every node; with `distribute`, stream this machine's image (its `docker`
    client, default the engine seam's) to the nodes that differ."""
    ids = {e.node.label: e.image_id(image) for e in engines}
    if distribute:
        echo = session.echo
        source = Command((docker or docker_cli(),))
        local = local_image_id(source, image, session.runner)
        differ = [e for e in engines if ids[e.node.label] != local]
        if differ:
            echo(
                f"distributing {image} ({local[:19]}) to {', '.join(e.node.label for e in differ)} (streamed docker save/load)"
            )
            start = time.monotonic()
            size = distribute_image(source, image, differ, session.runner)
            echo(f"distributed {size / 1e9:.2f} GB in {time.monotonic() - start:.0f} s")
            ids = {e.node.label: e.image_id(image) for e in engines}
            wrong = [label for label, found in ids.items() if found != local]
            if wrong:
                raise RunError(
                    f"after distribution {', '.join(wrong)} still hold another {image}; fix: check those engines"
                )
    return {k: v or "" for k, v in ids.items()}


@dataclass(frozen=True)
class UpOptions:
    """How `cluster_up` starts a profile across nodes: the launch, the doctor that runs first, the health wait."""

    launch: LaunchOptions
    doctor: DoctorOptions
    health_timeout_s: float = 1800
    dry: bool = False  # print the plan (the =ADDRESS given, else placeholders), contact no engine


def cluster_up(
    session: Session, engines: Sequence[NodeEngine], profile: Profile, options: UpOptions
) -> UpResult:
    """Doctor, plan, start, wait for health on `engines` (head first); on any failure everything is removed and
    RunError explains."""
    start = time.monotonic()
    echo, launch, doctor = session.echo, options.launch, options.doctor
    health_timeout_s, dry = options.health_timeout_s, options.dry
    for line in check_model_pin(profile, launch):
        echo(line)
    if dry:  # no engine is contacted: the link addresses are the =ADDRESS given, else named placeholders
        addresses = [e.node.address or f"<{e.node.label} link address>" for e in engines]
        envs = [network_env(doctor.interface, a) for a in addresses]
        plan = plan_launch(profile, addresses, envs, launch)
        fetch_weights(session, engines, profile, launch, dry=True)  # its containers, printed
        launch_plan(session, engines, plan, health_timeout_s=health_timeout_s, dry=True)
        return UpResult(plan, None, time.monotonic() - start)
    result = run_doctor(session, DoctorPlan(tuple(engines), doctor))
    if result.report.status != "passed":
        failed = "; ".join(f"{c.name}: {c.reason}" for c in result.report.failed)
        raise RunError(f"cluster.doctor failed, nothing was launched. {failed}")
    by_rank = {f.rank: f for f in result.facts}
    if launch.backend == "ray" and not all(f.versions.get("ray") for f in result.facts):
        raise RunError(
            f"--backend ray, but {launch.image} has no Ray (vLLM does not install it by default); fix: use the "
            "default --backend mp (vLLM's own multi-node backend) or build an image with ray installed"
        )
    plan = plan_launch(
        profile,
        [by_rank[e.node.rank].address for e in engines],
        [by_rank[e.node.rank].env for e in engines],
        launch,
        [by_rank[e.node.rank].rdma for e in engines],
        [by_rank[e.node.rank].mounts for e in engines],
    )
    fetch_weights(session, engines, profile, launch, dry=dry, address=by_rank[0].address)
    launch_plan(session, engines, plan, health_timeout_s=health_timeout_s, dry=dry)
    return UpResult(plan, result, time.monotonic() - start)


def cluster_logs(engines: Sequence[NodeEngine], tail: int = 100) -> dict[str, str]:
    """The last lines of every serve container on every node."""
    out: dict[str, str] = {}
    for engine in engines:
        for name in engine.containers(serve_label(), timeout=20):
            out[f"{engine.node.label} {name}"] = engine.logs(name, tail=tail)
    return out
