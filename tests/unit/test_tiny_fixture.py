"""The committed tiny model (tests/fixtures/tiny-qwen35moe, tests/engine/tiny_fixture.py): current, whole, and
refused when it is not."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
import tiny_fixture


def test_the_committed_model_is_current_and_whole() -> None:
    # A change to the trainer, the probes, the twin recipe or the steps fails here, with the command that remakes it.
    assert tiny_fixture.problems() == []
    facts = json.loads((tiny_fixture.FIXTURE / "accuracy.json").read_text())
    assert facts["known_answers_bf16"]["right"] == 120 and facts["steps"] == tiny_fixture.TRAIN_STEPS


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "tiny"
    shutil.copytree(tiny_fixture.FIXTURE, target)
    return target


def test_a_changed_missing_or_extra_file_is_named(copy: Path) -> None:
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    (copy / "generation_config.json").unlink()
    (copy / "planted.py").write_text("print('hi')\n")
    found = "\n".join(tiny_fixture.problems(copy))
    assert "model.safetensors: sha256 differs" in found
    assert "generation_config.json: listed in SHA256SUMS but missing" in found
    assert "planted.py: not listed in SHA256SUMS" in found


def test_a_model_made_by_another_trainer_is_refused_with_the_fix(copy: Path) -> None:
    made = json.loads((copy / "MADE.json").read_text())
    (copy / "MADE.json").write_text(json.dumps({**made, "key": "0" * 24}))
    found = tiny_fixture.problems(copy)
    assert len(found) == 1 and "made with key 000000000000000000000000" in found[0]
    assert "test_tiny_model_real.py" in found[0] and "--write" in found[0]
