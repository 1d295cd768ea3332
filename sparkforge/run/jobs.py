"""Short-lived containers on several nodes at once, under one deadline, always removed afterwards.

The doctor's stages are such jobs: one container per node (a rank), started detached, polled until all
exit or the deadline passes, then their JSON-lines output is read and every container removed, on every
node that still answers, whatever happened.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkforge.errors import RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.nodes import LABEL, ContainerSpec, NodeEngine

SANITY_SCRIPT = REPO_ROOT / "tests" / "image" / "cluster_sanity.py"
FACTS_SCRIPT = SANITY_SCRIPT.with_name("cluster_facts.py")  # the readers, imported by the helper
HOST_ROOT = (
    "/run/sparkforge-host"  # where the probe finds what it reads of the node (cluster_facts.HOST_ROOT)
)
# What the probe reads of the node, and nothing else: systemd's logind.conf(.d) (RemoveIPC) and the node's own
# libnccl (cluster_facts.NCCL_DIRS are all under /usr); each mounted read-only at HOST_ROOT + its path.
HOST_READS = ("/etc/systemd", "/usr")


def probe_mounts(paths: Sequence[str] = ()) -> tuple[str, ...]:
    """Read-only bind mounts (docker --mount) of exactly what the probe reads on the node, plus the --path
    entries the doctor checks. A source missing on the node is docker's refusal ('bind source path does not
    exist'), never a directory created there (as --volume would)."""
    return tuple(f"type=bind,source={p},target={HOST_ROOT}{p},readonly" for p in (*HOST_READS, *paths))


RDMA_DEVICES = ("/dev/infiniband",)  # uverbsN and rdma_cm: what ibverbs opens
# Runs the helper with its readers installed as the module `cluster_facts`, on any image with python3.
_BOOTSTRAP = """import sys, types
facts = types.ModuleType("cluster_facts")
exec(compile({facts!r}, "cluster_facts.py", "exec"), facts.__dict__)
sys.modules["cluster_facts"] = facts
exec(compile({sanity!r}, "cluster_sanity.py", "exec"), {{"__name__": "__main__"}})
"""


def sanity_script() -> str:
    """The in-image helper and its readers as one `python3 -c` program."""
    try:
        return _BOOTSTRAP.format(facts=FACTS_SCRIPT.read_text(), sanity=SANITY_SCRIPT.read_text())
    except OSError as exc:
        raise RunError(f"{exc.filename}: cannot read the doctor's in-image helper ({exc.strerror})") from None


@dataclass(frozen=True)
class Job:
    """One container of a stage: on which node, with which helper arguments and environment."""

    engine: NodeEngine
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    gpus: bool = False
    rdma: bool = False  # the node has RDMA devices: pass them in, with what NCCL needs to register memory
    mounts: tuple[str, ...] = ()


@dataclass
class Outcome:
    """What one job did: exit code (None: still running at the deadline), events, last lines, node loss."""

    job: Job
    name: str
    exit_code: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    node_lost: str | None = None

    @property
    def last_lines(self) -> str:
        return "\n".join(self.lines[-8:])

    def open_stage(self) -> str | None:
        """The stage this rank entered and never finished (None when it finished every stage it began)."""
        open_: str | None = None
        for event in self.events:
            if event.get("event") == "stage":
                open_ = str(event.get("stage"))
            elif event.get("event") in ("done", "skipped", "failed") and event.get("stage") == open_:
                open_ = None
        return open_


def container_spec(job: Job, image: str, name: str, stage: str, session: str) -> ContainerSpec:
    return ContainerSpec(
        name=name,
        image=image,
        entrypoint="python3",
        args=("-c", sanity_script(), *job.args),
        env={"PYTHONUNBUFFERED": "1", **job.env},
        labels={LABEL: "doctor", f"{LABEL}.session": session, f"{LABEL}.stage": stage},
        host_network=True,
        shm_size="1g",  # a private /dev/shm per rank: vLLM must see the ranks as different nodes
        gpus=job.gpus,
        # NCCL registers memory; without IPC_LOCK: "unhandled system error"
        cap_add=("IPC_LOCK",) if job.gpus or job.rdma else (),
        devices=RDMA_DEVICES if job.rdma else (),
        ulimits=("memlock=-1",) if job.rdma else (),
        mounts=job.mounts,
    )


def run_jobs(
    jobs: Sequence[Job],
    image: str,
    stage: str,
    deadline_s: float,
    *,
    until: Callable[[list[Outcome]], bool] | None = None,
    poll_s: float = 0.5,
    keep: bool = False,
) -> list[Outcome]:
    """Start every job, wait for all to exit (or `until(outcomes)` to hold) within `deadline_s`, then remove them.

    A node whose engine stops answering is recorded in its outcome (`node_lost`) and the others are still
    collected and removed. Containers still running at the deadline are killed (exit_code stays None).
    With `keep`, containers that are still running stay (the caller removes them with `remove_jobs`),
    unless something raised.
    """
    session = secrets.token_hex(4)
    outcomes: list[Outcome] = []
    done = False
    try:
        for i, job in enumerate(jobs):
            name = f"sparkforge-doctor-{stage}-{session}-{i}"
            outcome = Outcome(job, name)
            outcomes.append(outcome)
            try:
                job.engine.start(container_spec(job, image, name, stage, session))
            except RunError as exc:
                outcome.node_lost = str(exc)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pending = False
            for outcome in outcomes:
                if outcome.exit_code is not None or outcome.node_lost:
                    continue
                try:
                    state = outcome.job.engine.state(outcome.name, timeout=10)
                except RunError as exc:
                    outcome.node_lost = str(exc)
                    continue
                if state.status in ("exited", "dead"):
                    outcome.exit_code = state.exit_code
                elif state.status == "missing":
                    outcome.node_lost = f"{outcome.job.engine.node.label}: container {outcome.name} vanished"
                else:
                    pending = True
            if any(o.node_lost for o in outcomes):
                break
            if until is not None:
                _read_logs(outcomes)
                if until(outcomes):
                    break
            if not pending:
                break
            time.sleep(poll_s)
        _read_logs(outcomes)
        done = True
    finally:
        if not (keep and done):
            remove_jobs(outcomes)
    return outcomes


def remove_jobs(outcomes: Sequence[Outcome]) -> None:
    """Remove the jobs' containers on every node that still answers."""
    for outcome in outcomes:
        if not outcome.node_lost:
            outcome.job.engine.remove([outcome.name], timeout=30)


def _read_logs(outcomes: Sequence[Outcome]) -> None:
    for outcome in outcomes:
        if outcome.node_lost:
            continue
        try:
            text = outcome.job.engine.logs(outcome.name, timeout=10)
        except RunError:
            continue
        outcome.lines = text.rstrip().splitlines()
        outcome.events = []
        for line in outcome.lines:
            if line.startswith("{"):
                try:
                    outcome.events.append(json.loads(line))
                except ValueError:
                    continue


def first_event(outcome: Outcome, kind: str) -> dict[str, Any] | None:
    return next((e for e in outcome.events if e.get("event") == kind), None)


def leftover(engines: Sequence[NodeEngine]) -> dict[str, list[str]]:
    """Doctor containers still present on each answering node (should always be empty)."""
    found: dict[str, list[str]] = {}
    for engine in engines:
        try:
            names = engine.containers(f"{LABEL}=doctor", timeout=10)
        except RunError:
            continue
        if names:
            found[engine.node.label] = names
    return found
