"""Load harnesses: which client sends a suite's load (`bench --harness`). One row each; `--harness`, its help and
the table in docs/run.md are generated from it.

A row's function runs every level of the suite x (warm-up + repeats) in interleaved rounds and returns
(measured, corpus, stopping) as runner.run_bench reads them. The harness and its version are recorded in every
result (`suite.client`, `suite.params.client_version`, `suite.harness`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry

if TYPE_CHECKING:
    from sparkforge.context import Session
    from sparkforge.run.bench.runner import BenchOptions
    from sparkforge.run.nodes import NodeEngine

Harness = Callable[["Session", "NodeEngine", dict[str, Any], dict[str, str], "BenchOptions"], tuple]


def _suite_client(
    session: Session, engine: NodeEngine, info: dict[str, Any], ctx: dict[str, str], options: BenchOptions
) -> tuple:
    from sparkforge.run.bench.runner import suite_client

    return suite_client(session, engine, info, ctx, options)


def _aiperf(
    session: Session, engine: NodeEngine, info: dict[str, Any], ctx: dict[str, str], options: BenchOptions
) -> tuple:
    from sparkforge.run.bench.aiperf import aiperf_levels

    return aiperf_levels(session, engine, info, ctx, options)


HARNESSES: Registry[Harness] = Registry(
    "bench harness",
    "--harness",
    [
        Entry(
            "suite",
            "the suite's own client, in the head's serve container: vllm bench serve (default, quick) or "
            "llama-benchy (spark-arena-v2)",
            _suite_client,
        ),
        Entry(
            "aiperf",
            "NVIDIA's AIPerf 0.13.0 (the harness of NVIDIA's performance files), installed once into the cache from "
            "a sha256-pinned lock and run on this host against the served port, at the suite's sizes",
            _aiperf,
        ),
    ],
    RunError,
    columns=("harness", "what runs the load", "key"),
)
