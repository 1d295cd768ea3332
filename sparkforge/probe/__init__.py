"""The compile probe: vLLM's real CMake configure and chosen kernels compiled, measured and audited."""

from __future__ import annotations

from sparkforge.probe.run import ProbeOptions, ProbeResult, run_probe
from sparkforge.probe.units import ProbeError

__all__ = ["ProbeError", "ProbeOptions", "ProbeResult", "run_probe"]
