"""The recipe pins the NCCL the image carries (runtime.nccl: version, sha256, variant); the in-image check compares
the library torch loads with it (here: real files standing in for the library torch maps)."""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.schema import Runtime

INIMAGE = REPO_ROOT / "sparkforge" / "verify" / "inimage"


@pytest.fixture
def checks():
    sys.path.insert(0, str(INIMAGE))
    try:
        yield importlib.import_module("checks_fabric")
    finally:
        sys.path.remove(str(INIMAGE))
        for name in ("checks_fabric", "checklist"):  # the in-image modules: other tests load their own
            sys.modules.pop(name, None)


def _library(tmp_path: Path, data: bytes) -> tuple[str, str]:
    path = tmp_path / "libnccl.so.2.30.7"
    path.write_bytes(data)
    return str(path), hashlib.sha256(data).hexdigest()


def test_the_pin_is_strict() -> None:
    pin = Runtime.model_validate(
        {"nccl": {"version": "2.30.7", "sha256": "a" * 64, "variant": "switchless"}}
    ).nccl
    assert pin is not None and pin.variant == "switchless"
    with pytest.raises(ValidationError):
        Runtime.model_validate({"nccl": {"version": "2.30", "sha256": "a" * 64}})  # not an exact version
    with pytest.raises(ValidationError):
        Runtime.model_validate({"nccl": {"version": "2.30.7", "sha256": "a" * 64, "variant": "patched"}})
    assert "nccl" not in Runtime().model_dump(mode="json", exclude_none=False) or Runtime().nccl is None


def test_library_against_pin(checks, tmp_path: Path) -> None:
    path, digest = _library(tmp_path, b"\x7fELF nccl 2.30.7 bytes")
    status, reason, details = checks.nccl_against_pin(path, "2.30.7", {"version": "2.30.7", "sha256": digest})
    assert status == "passed" and details["sha256"] == digest
    status, reason, _ = checks.nccl_against_pin(path, "2.30.7", {"version": "2.30.7", "sha256": "0" * 64})
    assert status == "failed" and f"has sha256 {digest[:16]}, the recipe pins 0000000000000000" in reason
    status, reason, _ = checks.nccl_against_pin(path, "2.28.9", {"version": "2.30.7", "sha256": digest})
    assert status == "failed" and "is NCCL 2.28.9, the recipe pins 2.30.7" in reason
    assert checks.nccl_against_pin(None, None, {"version": "2.30.7"})[0] == "failed"
    assert checks.check_nccl({"runtime": {}})[0] == "skipped"
    assert checks._nccl_version(path) in ("2.30.7", None) or checks._nccl_version(path)
