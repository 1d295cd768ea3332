"""What every conform row reads: one `ConformRun` per run (the served client, the profile and its settings, the
reference pass, the options, the servers started) and the report the rows add to. A row is a function
`row(run: ConformRun) -> None` declared in sparkforge/run/conform/rows.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge.console import Echo
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.recipe.conformspec import ConformSettings
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check, Report
from sparkforge.run.conform.client import Completion, OpenAIClient
from sparkforge.run.conform.servers import Servers
from sparkforge.run.facts import DoctorOptions
from sparkforge.run.launch import LaunchOptions
from sparkforge.run.nodes import NodeEngine


@dataclass(frozen=True)
class ConformOptions:
    checks: tuple[str, ...] = ()  # empty: the profile's (default: all)
    attach: str | None = None
    record: bool = False
    golden: Path | None = None  # default: golden/<profile>.json
    explicit_golden: bool = False
    launch: LaunchOptions | None = None
    health_timeout_s: float = 1800
    image_ref: str | None = None
    doctor: DoctorOptions | None = None  # several nodes: cluster.up's doctor before the launch
    gpu: str | None = None  # the recipe's GPU (sm_121): `invoke kernels`' prediction beside what vLLM logged
    reference_model_dir: Path | None = None  # the reference row's weights (default: the launch's --model-dir)


@dataclass
class ConformRun:
    """One conform run as the rows see it; `reference` is the greedy pass of the prompt set every comparison
    starts from, `inputs` what a row checked before anything started (e.g. the golden file)."""

    report: Report
    client: OpenAIClient
    engines: Sequence[NodeEngine]
    profile: Profile
    settings: ConformSettings
    options: ConformOptions
    servers: Servers
    session: Session  # the command's echo and runner
    prompts: list[str]
    reference: list[Completion]
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def echo(self) -> Echo:
        """The command's progress lines (the session's)."""
        return self.session.echo

    def timed(self, name: str, make: Callable[[], Check]) -> Check:
        """Run one check, time it and add it; a failed request is this row's finding, the others still run."""
        start = time.monotonic()
        try:
            check = make()
        except RunError as exc:
            check = Check(name, "failed", f"a request failed: {str(exc)[:500]}")
        check.duration_s = time.monotonic() - start
        self.report.add(check)
        self.echo(f"  {check.name}: {check.status} ({check.duration_s:.1f} s) {check.reason[:300]}")
        return check
