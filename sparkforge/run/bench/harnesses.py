"""Load harnesses: which client sends a suite's load (`bench --harness`). One row each; `--harness`, its help and
the table in docs/run.md are generated from it.

A row's function (None: the suite's own client, runner.suite_client) runs every level of the suite x (warm-up + repeats) in interleaved rounds and returns
(measured, corpus, stopping) as runner.run_bench reads them. The harness and its version are recorded in every
result (`suite.client`, `suite.params.client_version`, `suite.harness`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry

# (session, engine, the head container's inspect, ctx {port, model, tokenizer}, runner.BenchOptions) ->
# (measured, corpus, stopping). Not imported here: runner dispatches to these rows (no import circle).
Harness = Callable[[Any, Any, dict[str, Any], dict[str, str], Any], tuple]


def _aiperf(*args: Any) -> tuple:
    """aiperf.aiperf_levels (imported when the row runs)."""
    from sparkforge.run.bench.aiperf import aiperf_levels

    return aiperf_levels(*args)


HARNESSES: Registry[Harness | None] = Registry(
    "bench harness",
    "--harness",
    [
        Entry(
            "suite",
            "the suite's own client, in the head's serve container: vllm bench serve (default, quick) or "
            "llama-benchy (spark-arena-v2)",
            None,  # runner.suite_client
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
