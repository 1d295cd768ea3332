"""What a failed launch leaves behind: every container's logs kept in a directory before the containers are
removed, and the stage vLLM's head had reached (so a timeout says where it stopped)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from sparkforge.boundary import linear_regex, write_output
from sparkforge.run.nodes import NodeEngine

LOG_DIR_ENV = "SPARKFORGE_LOG_DIR"  # default: ./logs/run
# vLLM's own log lines, in the order a start goes through them: the last one seen names the stage.
STAGES = (
    (r"Starting to load model|Loading weights|Loading safetensors|load_weights", "loading the weights"),
    (r"Model loading took|Loading weights took", "weights loaded, profiling memory"),
    (r"torch\.compile|Compiling a graph|Dynamo bytecode", "compiling (torch.compile)"),
    (r"KV cache|GPU KV cache size|num_gpu_blocks", "allocating the KV cache"),
    (r"Capturing CUDA graph|CUDA graph|cudagraph", "capturing CUDA graphs"),
    (r"Starting vLLM API server|Uvicorn running|Application startup", "starting the API server"),
)


def stage_of(lines: Sequence[str]) -> str:
    """The last start-up stage the lines show ('starting, before weight loading' when none)."""
    reached = "starting, before weight loading"
    for line in lines:
        for pattern, name in STAGES:
            if linear_regex(pattern).search(line):
                reached = name
    return reached


def keep_logs(engines: Sequence[NodeEngine], names: Sequence[str], root: Path | None = None) -> Path:
    """Write each container's full log (engines[i] holds names[i]) under a fresh directory; returns it."""
    base = root or Path(os.environ.get(LOG_DIR_ENV) or Path.cwd() / "logs" / "run")
    where = base / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    where.mkdir(parents=True, exist_ok=True)
    for engine, name in zip(engines, names, strict=True):
        text = engine.logs(name, timeout=60)
        write_output(where / f"node{engine.node.rank}-{name}.log", text, "a node's log")
    return where
