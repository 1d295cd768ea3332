"""The doctor's order: stages run one after another into the report, and the first that fails makes the rest
skip, naming it (a later stage's answer would only restate the cause, or hang on it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkforge.errors import RunError
from sparkforge.report import Check, Report

EXPENSIVE = ("nccl-library", "sanity", "transport")  # a torch import per node, then the ranks themselves


@dataclass(frozen=True)
class Stage:
    """One doctor stage: its report name and what it checks (it fills in the Check it is given)."""

    name: str
    run: Callable[[Check], None]


def run_stages(
    report: Report,
    steps: Sequence[Stage],
    echo: Callable[[str], None],
    *,
    after: dict[str, Callable[[], None]] | None = None,
    left_out: tuple[Sequence[str], str] | None = None,
) -> str | None:
    """Run `steps` in order into `report`; the first that fails makes the rest skip, naming it. Returns that
    stage's name (None when all passed). `after[name]` runs once that stage ended; `left_out` (names, why) adds
    stages that were not asked for as skipped, after the rest."""
    blocked: str | None = None
    for index, stage in enumerate(steps, 1):
        if blocked:
            report.add(Check(stage.name, "skipped", f"not run: stage '{blocked}' failed"))
            continue
        echo(f"doctor: {index}/{len(steps)} {stage.name} ...")  # the stage count: how far the wait has come
        with report.timed(stage.name) as check:
            try:
                stage.run(check)
            except RunError as exc:  # a node that stops answering mid-stage fails the stage, named
                check.status, check.reason = "failed", str(exc)
        echo(f"doctor: {stage.name} {check.status} ({check.duration_s:.1f}s) {check.reason}")
        if after and stage.name in after:
            after[stage.name]()
        if check.status == "failed":
            blocked = stage.name
    names, why = left_out or ((), "")
    for name in names:
        report.add(
            Check(name, "skipped", f"not run: stage '{blocked}' failed" if blocked else f"not run: {why}")
        )
    return blocked
