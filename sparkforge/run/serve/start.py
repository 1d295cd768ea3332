"""Start a launch plan on its nodes, watch it come up, stop it completely (`serve` on one node, `cluster.up` on
several): workers, then the head; the health wait with the head's loading progress; any failure gives the last
log lines of every node and a one-paragraph cause, keeps the logs and removes everything, so nothing is left
running.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from sparkforge.boundary import linear_regex
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.run.launch import ContainerPlan, NodeLaunch, describe_plan
from sparkforge.run.nodes import LABEL, NodeEngine
from sparkforge.run.postmortem import keep_logs, stage_of

# vLLM's last words -> the cause in one sentence and the fix.
CAUSES = (
    (
        r"Failed to infer device type",
        "vLLM found no GPU in the container",
        "run on a node with the NVIDIA Container Toolkit and --gpus all (the default)",
    ),
    (
        r"CUDA out of memory|OutOfMemoryError",
        "the GPU ran out of memory",
        "lower gpu-memory-utilization or max-model-len in the profile",
    ),
    (
        r"unrecognized arguments: (.*)",
        "vLLM rejected arguments",
        "remove them from the profile (preflight checks flags against the pinned vLLM)",
    ),
    (
        r"(Repository Not Found|401 Client Error|GatedRepoError)",
        "the model could not be downloaded",
        "check the model name and pass --hf-token-file for gated models",
    ),
    (
        r"(No such file or directory: '/models|does not appear to have a file named)",
        "the model directory is incomplete",
        "point --model-dir at a directory holding the model's config and weights",
    ),
    (
        r"(NCCL error|ncclCommInitRank|unhandled system error)",
        "NCCL could not set up the link",
        "run 'invoke cluster.doctor' and check NCCL_IB_HCA / the CX-7 link",
    ),
)


def serve_label(profile: str | None = None) -> str:
    return f"{LABEL}.profile={profile}" if profile else f"{LABEL}=serve"


def launch_plan(
    session: Session,
    engines: Sequence[NodeEngine],
    plan: ContainerPlan,
    *,
    health_timeout_s: float,
    dry: bool,
) -> None:
    """Print the plan (docker argv and env per node); unless `dry`, start it and wait for health."""
    for line in describe_plan(plan, [e.node.label for e in engines]):
        session.echo(line)
    if not dry:
        start_plan(session, engines, plan, health_timeout_s=health_timeout_s)


def start_plan(
    session: Session, engines: Sequence[NodeEngine], plan: ContainerPlan, *, health_timeout_s: float
) -> None:
    """Start workers then the head, wait for health; on failure: cause, last lines, everything removed."""
    echo = session.echo
    by_rank = {e.node.rank: e for e in engines}
    try:
        for launch in plan.start_order():
            engine = by_rank[launch.rank]
            engine.remove(
                [launch.container.name]
            )  # a stopped leftover of an earlier run would block the name
            engine.start(launch.container)
            echo(f"started {launch.container.name} on {engine.node.label}")
            if launch.exec_argv:
                _ray_exec(session, engine, launch, len(engines))
        wait_healthy(session, engines, plan, timeout_s=health_timeout_s)
    except BaseException:
        kept = _keep(engines, plan)
        removed = cluster_down(engines, plan.profile)
        echo(f"removed {sum(removed.values())} container(s) after the failure{kept}")
        raise


def _keep(engines: Sequence[NodeEngine], plan: ContainerPlan) -> str:
    """Every launch container's full log, kept before removal (never masking the failure being raised)."""
    by_rank = {e.node.rank: e for e in engines}
    try:
        where = keep_logs([by_rank[n.rank] for n in plan.nodes], [n.container.name for n in plan.nodes])
    except Exception as exc:  # the launch's own failure is the one to report
        return f"; logs not kept ({exc})"
    return f"; their logs are kept in {where}"


def _ray_exec(session: Session, engine: NodeEngine, launch: NodeLaunch, count: int) -> None:
    for _ in range(30):  # Ray's own readiness: every node joined (as eugr's launcher waits, 30 x 2 s)
        status = engine.runner.capture(
            engine.command("exec", launch.container.name, "ray", "status"),
            "ray-status",
            check=False,
            timeout=30,
        )
        if status.returncode == 0 and status.output.count("node_") >= count:
            break
        time.sleep(2)
    else:
        raise RunError(
            f"{engine.node.label}: Ray did not see {count} nodes within 60 s; fix: run 'invoke cluster.doctor'"
        )
    engine.call("exec", "exec", "--detach", launch.container.name, *launch.exec_argv)
    session.echo(f"vllm serve started inside {launch.container.name} (Ray backend)")


def wait_healthy(
    session: Session, engines: Sequence[NodeEngine], plan: ContainerPlan, *, timeout_s: float
) -> None:
    """Poll every container and the head's /health (from inside the head container); explain any exit."""
    echo = session.echo
    by_rank = {e.node.rank: e for e in engines}
    head = by_rank[0]
    end = time.monotonic() + timeout_s
    seen = 0
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{plan.port}/health', timeout=3)"
    while time.monotonic() < end:
        for launch in plan.nodes:
            state = by_rank[launch.rank].state(launch.container.name)
            if state.status != "running":
                raise RunError(explain_exit(engines, plan, launch.rank, state.exit_code))
        lines = head.logs(plan.head.container.name).splitlines()
        for line in lines[seen:]:
            if re.search(r"Loading|loaded|weights|Starting|KV cache|graph|Uvicorn|ERROR", line):
                echo(f"  head: {line[-200:]}")
        seen = len(lines)
        health = head.runner.capture(
            head.command("exec", plan.head.container.name, "python3", "-c", probe),
            "health",
            check=False,
            timeout=20,
        )
        if health.returncode == 0:
            echo(f"healthy: http://{plan.head_address}:{plan.port}/v1 (profile {plan.profile})")
            return
        time.sleep(3)
    raise RunError(
        f"stage health: vLLM did not become healthy within {timeout_s:g} s after the weights were on disk (the "
        f"head was {stage_of(lines)}); the containers are removed, their logs kept. Last lines of the head:\n"
        + "\n".join(head.logs(plan.head.container.name, tail=15).splitlines()[-15:])
    )


def explain_exit(engines: Sequence[NodeEngine], plan: ContainerPlan, rank: int, code: int | None) -> str:
    """One paragraph: which node's vLLM exited, the likely cause and fix, then the last lines of every node."""
    by_rank = {e.node.rank: e for e in engines}
    tails = {launch.rank: by_rank[launch.rank].logs(launch.container.name, tail=12) for launch in plan.nodes}
    cause, fix = "vLLM exited", "read the log lines below ('invoke cluster.logs' shows more)"
    for pattern, what, how in CAUSES:
        match = linear_regex(pattern).search(tails[rank])
        if match:
            cause, fix = f"{what} ({match.group(0)[:160]})", how
            break
    paragraph = (
        f"vLLM on {by_rank[rank].node.label} (rank {rank}) exited with code {code}: {cause}; fix: {fix}. "
        "Every container of this launch was removed."
    )
    for launch_rank, tail in sorted(tails.items()):
        lines = "\n    ".join(tail.strip().splitlines()[-8:])
        paragraph += f"\n  last lines on {by_rank[launch_rank].node.label}:\n    {lines}"
    return paragraph


def cluster_down(engines: Sequence[NodeEngine], profile: str | None = None) -> dict[str, int]:
    """Remove every serve container sparkforge started (of one profile, or all) on every answering node."""
    removed: dict[str, int] = {}
    for engine in engines:
        try:
            names = engine.containers(serve_label(profile), timeout=20)
        except RunError:
            removed[engine.node.label] = 0
            continue
        engine.remove(names)
        removed[engine.node.label] = len(names)
    return removed
