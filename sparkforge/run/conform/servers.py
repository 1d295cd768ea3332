"""The servers conform starts: one configuration after the other on one node, or the profile across nodes as
`cluster.up` brings it up; each start timed, a failed request's server log kept, everything it started stopped.
Before a server with speculative decoding stops, its draft and accepted token counts (vLLM's /metrics) go into
its entry of the report (`spec_decode`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkforge.boundary import linear_regex
from sparkforge.context import Session
from sparkforge.errors import InputError, RunError
from sparkforge.recipe.profile import Profile
from sparkforge.report import Report
from sparkforge.run.cluster.cluster import UpOptions, cluster_up
from sparkforge.run.conform.client import HeadExecClient, OpenAIClient
from sparkforge.run.conform.spec_decode import parse_spec_decode, uses_speculative
from sparkforge.run.facts import DoctorOptions
from sparkforge.run.launch import LaunchOptions, plan_launch
from sparkforge.run.nodes import NodeEngine
from sparkforge.run.postmortem import keep_logs
from sparkforge.run.serve.serve import ServeOptions, serve_down, serve_up
from sparkforge.run.serve.start import cluster_down, launch_plan

# How vLLM refuses a flag combination before it starts anything (config validation, argument parsing): only these
# make a variant that did not start `skipped`; any other start failure (a crash, OOM, no health) is `failed`.
REFUSALS = (
    r"validation errors? for \w*Config\s+Value error, ([^\n\[]+)",  # a config's own check (pydantic)
    r"error: (unrecognized arguments: [^\n]+|argument [^\n]+)",  # vllm serve's argument parser
    r"(?:ValueError|NotImplementedError): ([^\n]*(?:not supported|unsupported|is required|requires|must be|cannot "
    r"be used|only supported|incompatible|not compatible)[^\n]*)",  # an engine-args check
)


def refusal(message: str) -> str:
    """vLLM's own words where a failed start is vLLM refusing the configuration, else ''."""
    for pattern in REFUSALS:
        found = linear_regex(pattern).search(message)
        if found:
            return found.group(1).strip()[:400]
    return ""


@dataclass
class Servers:
    """What conform started (to stop it) and how long each start took."""

    session: Session
    launch: LaunchOptions | None
    doctor: DoctorOptions | None = None  # several nodes: cluster.up's doctor before the launch
    health_timeout_s: float = 1800
    started: list[dict[str, Any]] = field(default_factory=list)
    logs_kept_for: int = 0  # failed rows whose server log is kept
    client: OpenAIClient | None = None  # asks the server now up (its /metrics before it stops)
    # The server now up (the last started) drafts: its counters are read as it stops.
    speculative: bool = False

    def start(self, engine: NodeEngine, profile: Profile, what: str) -> None:
        """The first start goes through serve (model class looked up, weights fetched); a variant only relaunches."""
        assert self.launch is not None
        echo = self.session.echo
        echo(f"conform: starting {profile.name} ({what}) ...")
        start = time.monotonic()
        if not self.started:
            options = ServeOptions(self.launch, health_timeout_s=self.health_timeout_s, chat=False)
            serve_up(self.session, engine, profile, options)
        else:
            self.note_spec_decode()
            serve_down(engine, profile.name)
            plan = plan_launch(profile, ["127.0.0.1"], [{}], self.launch)
            launch_plan(self.session, [engine], plan, health_timeout_s=self.health_timeout_s, dry=False)
        self.started.append(
            {"config": what, "start_s": round(time.monotonic() - start, 1), "args": profile.serve_args()}
        )
        self.speculative = uses_speculative(profile)

    def start_cluster(self, engines: Sequence[NodeEngine], profile: Profile) -> OpenAIClient:
        """cluster.up's path (doctor, weights, workers then the head, health); the client asks from inside the
        head container."""
        assert self.launch is not None and self.doctor is not None
        echo = self.session.echo
        echo(f"conform: starting {profile.name} across {len(engines)} nodes ...")
        up = cluster_up(
            self.session, engines, profile, UpOptions(self.launch, self.doctor, self.health_timeout_s)
        )
        self.started.append(
            {
                "config": f"as profiled, {len(engines)} nodes",
                "start_s": round(up.seconds, 1),
                "args": profile.serve_args(),
            }
        )
        served = profile.model.served_model_name or profile.model.model
        self.client = HeadExecClient(engines[0], up.plan.head.container.name, self.launch.port, served)
        self.speculative = uses_speculative(profile)
        return self.client

    def note_spec_decode(self) -> None:
        """The server now up, when it drafts: vLLM's draft and accepted token counts into its report entry
        (`spec_decode`), read once, just before it stops; a server that does not answer leaves the reason."""
        if not (self.speculative and self.started and self.client):
            return
        self.speculative = False  # read once: the next server is another configuration
        entry, where = self.started[-1], f"{self.client.base}/metrics"
        try:
            entry["spec_decode"] = parse_spec_decode(self.client.metrics(timeout=60), where).as_report()
        except (RunError, InputError) as exc:  # never masks stopping the server
            entry["spec_decode_error"] = str(exc)[:600]
            self.session.echo(f"  (speculative decoding's counters could not be read: {exc})")

    def keep_failed_logs(
        self, engines: Sequence[NodeEngine], profile: Profile, report: Report, *, aborted: bool = False
    ) -> None:
        """Before conform removes a server that failed a request, its full log is kept (vLLM's traceback): a row's
        failed request, or (`aborted`) a request outside the rows (the warm-up, the reference pass) that ended
        the run."""
        echo = self.session.echo
        failed = [
            c for c in report.checks if c.status == "failed" and c.reason.startswith("a request failed")
        ]
        if not self.started or (len(failed) <= self.logs_kept_for and not aborted):
            return
        self.logs_kept_for = len(failed)
        names = [f"sparkforge-serve-{profile.name}-{rank}" for rank in range(len(engines))]
        try:
            where = keep_logs(engines, names)
        except (OSError, RunError) as exc:  # never masks the report being made
            echo(f"  (the server's log could not be kept: {exc})")
            return
        report.extra.setdefault("logs", []).append(str(where))
        echo(f"  a request failed: the server's log is kept in {where}")

    def stop(self, engines: Sequence[NodeEngine], profile: Profile) -> None:
        """What conform started, it stops (an attached deployment is left as it was)."""
        self.note_spec_decode()
        if self.started and len(engines) > 1:
            cluster_down(engines, profile.name)
        elif self.started:
            serve_down(engines[0], profile.name)
