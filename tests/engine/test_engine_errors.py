"""The engine seam turns the Docker SDK's errors into one clear EngineError (never a traceback)."""

from __future__ import annotations

import pytest

from sparkforge import engine
from sparkforge.errors import EngineError

pytestmark = pytest.mark.engine


def test_api_error_from_tag_is_an_engine_error(base_amd64: str) -> None:
    # Before: docker.errors.APIError (invalid reference format) reached the user as a traceback.
    with pytest.raises(EngineError, match=r"tag .* the Docker engine refused \(\d+: .*invalid"):
        engine.tag_image(base_amd64, "sparkforge-test/UPPER CASE:x")


def test_running_a_missing_image_is_an_engine_error(engine_ready: None) -> None:
    with pytest.raises(EngineError, match=r"run sparkforge-test/trust-no-such-image:1: .*fix:"):
        engine.run_container("sparkforge-test/trust-no-such-image:1", ["true"])
