"""Preflight: facts about upstream (source at a commit, model registry, declared requirements, patch
applicability, CMake arch plan, base images) checked before any build starts."""

from __future__ import annotations

from sparkforge.preflight.lock import LockEntry, LockResult, lock_recipe
from sparkforge.preflight.run import run_preflight

__all__ = ["LockEntry", "LockResult", "lock_recipe", "run_preflight"]
