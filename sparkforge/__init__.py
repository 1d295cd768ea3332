"""sparkforge: reproducible, verified vLLM images for DGX Spark (GB10, sm_121)."""

from __future__ import annotations

__version__ = "0.1.0"
