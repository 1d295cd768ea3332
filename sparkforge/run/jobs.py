"""Short-lived containers on several nodes at once, under one deadline, always removed afterwards.

The doctor's stages are such jobs: one container per node (a rank), started detached, polled until all
exit or the deadline passes, then their JSON-lines output is read and every container removed, on every
node that still answers, whatever happened.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sparkforge.boundary import parse_json, read_text
from sparkforge.errors import InputError, RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.nodes import LABEL, ContainerSpec, NodeEngine

SANITY_SCRIPT = REPO_ROOT / "tests" / "image" / "cluster_sanity.py"
FACTS_SCRIPT = SANITY_SCRIPT.with_name("cluster_facts.py")  # the readers, imported by the helper
MAX_HELPER_BYTES = 1 << 20  # each of the two helper scripts (tens of KiB)
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


T = TypeVar("T")
R = TypeVar("R")


def each_node(call: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`call` on every item at once (one thread each: every call waits on a node's engine), results in order.

    An exception raised for one item is raised here after every call has ended, so no call is left running."""
    if len(items) <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="sparkforge-node") as pool:
        futures = [pool.submit(call, item) for item in items]
    return [future.result() for future in futures]


class Background:
    """One call run on a thread of its own while the caller goes on (e.g. a slow probe started early), with a
    `cancel` event the call is given: `stop()` sets it and waits, so nothing it started outlives the caller."""

    def __init__(self, call: Callable[[threading.Event], T]) -> None:
        self.cancel = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkforge-background")
        self._future = self._pool.submit(call, self.cancel)

    def result(self) -> Any:
        """The call's return value (its exception is raised here), waiting for it to end."""
        try:
            return self._future.result()
        finally:
            self._pool.shutdown(wait=True)

    def stop(self) -> None:
        """Ask the call to end (its cancel event), wait for it, and drop its result or error."""
        self.cancel.set()
        self._pool.shutdown(wait=True)


def sanity_script() -> str:
    """The in-image helper and its readers as one `python3 -c` program."""
    try:
        facts, sanity = (
            read_text(p, "", MAX_HELPER_BYTES, named=False) for p in (FACTS_SCRIPT, SANITY_SCRIPT)
        )
    except InputError as exc:
        raise RunError(f"the doctor's in-image helper: {exc}") from None
    return _BOOTSTRAP.format(facts=facts, sanity=sanity)


@dataclass(frozen=True)
class Job:
    """One container of a stage: on which node, with which helper arguments and environment."""

    engine: NodeEngine
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    gpus: bool = False
    rdma: bool = False  # the node has RDMA devices: pass them in, with what NCCL needs to register memory
    mounts: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()  # the container's name servers (docker --dns); () keeps the node's


@dataclass
class Outcome:
    """What one job did: exit code (None: still running at the deadline), events, last lines, node loss."""

    job: Job
    name: str
    exit_code: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    node_lost: str | None = None
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None  # from the start to its exit seen (per node: where a stage's time goes)

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
        dns=job.dns,
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
    cancel: threading.Event | None = None,
) -> list[Outcome]:
    """Start every job, wait for all to exit (or `until(outcomes)` to hold) within `deadline_s`, then remove them.

    Every engine call goes to all nodes at once (start, state, logs, remove), so a stage costs the slowest
    node's time, not the sum. A node whose engine stops answering is recorded in its outcome (`node_lost`) and
    the others are still collected and removed. Containers still running at the deadline (or when `cancel` is
    set) are killed (exit_code stays None). With `keep`, containers that are still running stay (the caller
    removes them with `remove_jobs`), unless something raised or the wait was cancelled.
    """
    outcomes: list[Outcome] = []
    done = False
    try:
        outcomes = start_jobs(jobs, image, stage)
        done = wait_jobs(outcomes, deadline_s, until=until, poll_s=poll_s, cancel=cancel)
    finally:
        if not (keep and done):
            remove_jobs(outcomes)
    return outcomes


def start_jobs(jobs: Sequence[Job], image: str, stage: str) -> list[Outcome]:
    """Start every job's container (all nodes at once); a node that refuses is recorded (`node_lost`). The
    caller waits (`wait_jobs`) and always removes them (`remove_jobs`)."""
    session = secrets.token_hex(4)
    outcomes = [Outcome(job, f"sparkforge-doctor-{stage}-{session}-{i}") for i, job in enumerate(jobs)]
    try:
        each_node(lambda o: _start(o, image, stage, session), outcomes)
    except BaseException:
        remove_jobs(outcomes)
        raise
    return outcomes


def wait_jobs(
    outcomes: list[Outcome],
    deadline_s: float,
    *,
    until: Callable[[list[Outcome]], bool] | None = None,
    poll_s: float = 0.5,
    cancel: threading.Event | None = None,
) -> bool:
    """Poll the started jobs until all exited, `until(outcomes)` holds, a node is lost, `deadline_s` passed or
    `cancel` is set; then read their output. False when the wait was cancelled."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not (cancel is not None and cancel.is_set()):
        # Every node's state and (when `until` reads them) its logs at once: over ssh:// each call is a session.
        calls: list[Callable[[], bool | None]] = [lambda o=o: _poll(o) for o in outcomes]
        if until is not None:
            calls += [lambda o=o: _read_log(o) for o in outcomes if not o.node_lost]
        pending = any(each_node(lambda call: call(), calls)[: len(outcomes)])
        if any(o.node_lost for o in outcomes):
            break
        if until is not None and until(outcomes):
            break
        if not pending:
            break
        if cancel is not None:
            cancel.wait(poll_s)
        else:
            time.sleep(poll_s)
    each_node(_read_log, [o for o in outcomes if not o.node_lost])
    return not (cancel is not None and cancel.is_set())


def open_gate(outcomes: Sequence[Outcome], path: str, timeout: float = 20) -> None:
    """Create `path` in every running job's container (`docker exec`, all nodes at once): the file its helper
    waits for before it dials anyone. A node whose engine does not answer within `timeout` is lost (named)."""

    def open_one(outcome: Outcome) -> None:
        if outcome.node_lost or outcome.exit_code is not None:
            return
        try:  # a container that ended meanwhile fails the exec: the wait that follows reads why it ended
            outcome.job.engine.exec(
                outcome.name, ("python3", "-c", f"open({path!r}, 'w').close()"), {}, timeout
            )
        except RunError as exc:
            outcome.node_lost = str(exc)

    each_node(open_one, outcomes)


def exec_jobs(jobs: Sequence[Job], running: Sequence[Outcome], deadline_s: float) -> list[Outcome]:
    """Run each job's helper inside its node's running container from `running` (e.g. the doctor's probe),
    all nodes at once: no container is started or removed. A job whose node has no running container there,
    or whose engine does not answer within the deadline, is lost (named)."""
    by_rank = {o.job.engine.node.rank: o for o in running if not o.node_lost and o.exit_code is None}

    def run(job: Job) -> Outcome:
        host = by_rank.get(job.engine.node.rank)
        outcome = Outcome(job, host.name if host else "")
        if host is None:
            outcome.node_lost = f"{job.engine.node.label}: no running probe container to run {job.args[0]} in"
            return outcome
        args = ("python3", "-c", sanity_script(), *job.args)
        env = {"PYTHONUNBUFFERED": "1", **job.env}
        try:
            outcome.exit_code, text = job.engine.exec(host.name, args, env, timeout=deadline_s)
            outcome.seconds = round(time.monotonic() - outcome.started, 2)
        except RunError as exc:
            outcome.node_lost = str(exc)
            return outcome
        _parse(outcome, text)
        return outcome

    return each_node(run, jobs)


def _start(outcome: Outcome, image: str, stage: str, session: str) -> None:
    try:
        outcome.job.engine.start(container_spec(outcome.job, image, outcome.name, stage, session))
    except RunError as exc:
        outcome.node_lost = str(exc)


def _poll(outcome: Outcome) -> bool:
    """Update one job's exit code or loss; True while its container still runs."""
    if outcome.exit_code is not None or outcome.node_lost:
        return False
    try:
        state = outcome.job.engine.state(outcome.name, timeout=10)
    except RunError as exc:
        outcome.node_lost = str(exc)
        return False
    if state.status in ("exited", "dead"):
        outcome.exit_code = state.exit_code
        outcome.seconds = round(time.monotonic() - outcome.started, 2)
        return False
    if state.status == "missing":
        outcome.node_lost = f"{outcome.job.engine.node.label}: container {outcome.name} vanished"
        return False
    return True


def remove_jobs(outcomes: Sequence[Outcome]) -> None:
    """Remove the jobs' containers on every node that still answers (all nodes at once)."""
    each_node(lambda o: o.job.engine.remove([o.name], timeout=30), [o for o in outcomes if not o.node_lost])


def _read_log(outcome: Outcome) -> None:
    try:
        text = outcome.job.engine.logs(outcome.name, timeout=10)
    except RunError:
        return
    _parse(outcome, text)


def _parse(outcome: Outcome, text: str) -> None:
    """The helper's output: every line kept, the JSON-lines ones also as events."""
    outcome.lines = text.rstrip().splitlines()
    outcome.events = []
    for line in outcome.lines:
        if line.startswith("{"):
            try:
                # NaN kept readable: a helper's figure it could not measure (the stage judges it).
                event = parse_json(line, f"{outcome.name}'s output", nonfinite=True)
            except InputError:
                continue
            if isinstance(event, dict):
                outcome.events.append(event)


def first_event(outcome: Outcome, kind: str) -> dict[str, Any] | None:
    return next((e for e in outcome.events if e.get("event") == kind), None)
