"""Invoke task `bench.baseline`: a bench result against NVIDIA's published performance file for the same recipe.
Thin: parse, call sparkforge.run.bench.nvperf, print."""

from __future__ import annotations

from pathlib import Path

from invoke import Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import JSON, Outputs
from sparkforge.context import Session


@task(
    families=(JSON,),
    help={
        "result": "a bench result ('invoke bench --json', or one from the result store)",
        "performance": "NVIDIA's performance file of the recipe (docs/formats.md)",
        "threshold": "percent worse than the published figure that fails (default 10)",
        "allow_different": "compare although harness or token lengths differ (listed in the report)",
        "json": "write the comparison report (JSON) here",
    },
)
@user_errors
def baseline(
    c: Context,
    session: Session,
    outputs: Outputs,
    result: str,
    performance: str,
    threshold: str = "10",
    allow_different: bool = False,
) -> None:
    """This run against a published performance file: per concurrency, ours vs theirs (harness and dataset first)."""
    from sparkforge.run.bench.compare import check_threshold
    from sparkforge.run.bench.nvperf import compare_with_baseline, read_performance
    from sparkforge.run.bench.results import load_result

    report = compare_with_baseline(
        load_result(Path(result), "RESULT"),
        read_performance(Path(performance)),
        threshold_pct=check_threshold(threshold),
        allow_different=allow_different,
    )
    outputs.finish(session, report)
