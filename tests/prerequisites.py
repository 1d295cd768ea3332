"""What a test needs from the machine: a missing prerequisite skips the test here, and fails it in CI.

CI sets SPARKFORGE_REQUIRE_ENGINE=1 (.ci/run): there a missing engine, registry, QEMU, cosign or nvcc is a
broken machine, and a suite that passed by skipping would hide it.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE = "SPARKFORGE_REQUIRE_ENGINE"


def fail_if_required(reason: str) -> None:
    """Fail for `reason` under SPARKFORGE_REQUIRE_ENGINE=1; otherwise return (the caller skips)."""
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but {reason}", pytrace=False)


def skip_or_fail(reason: str) -> NoReturn:
    """Skip for `reason`, or fail under SPARKFORGE_REQUIRE_ENGINE=1: CI must not pass by skipping."""
    fail_if_required(reason)
    pytest.skip(reason)
