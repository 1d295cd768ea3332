"""`invoke conform` refuses bad input in one paragraph before any engine or server is contacted: an unknown check,
a prompt set that is not a list of strings, an --attach URL that is not http(s) or does not answer, a golden
file of another model or tokenizer. DOCKER_HOST points at TEST-NET: an engine contact would fail differently."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli.conform import conform
from sparkforge.errors import ProfileError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile

TWIN = str(REPO_ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml")
TINY = REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform.yaml"


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:9")


def _refused(fn: Callable[..., object] = conform, **options: object) -> str:
    with pytest.raises(Exit) as info:
        fn(Context(), **options)
    assert info.value.code != 0
    message = str(info.value.message)
    assert "Traceback" not in message and "fix:" in message
    return message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unknown_check_is_named_with_the_choices() -> None:
    from sparkforge.run.conform.rows import ROWS

    message = _refused(recipe=TWIN, profile=str(TINY), checks=f"{ROWS.names()[0]},bogus")
    assert "unknown conform row 'bogus'" in message and "nothing was run" in message
    assert all(name in message for name in ROWS.names())  # the choices: every row


@pytest.mark.parametrize("prompts", ['"0 1"', "[1, 2]", "[]", '["ok", {"a": 1}]'])
def test_a_prompt_set_that_is_not_a_list_of_strings_is_a_profile_error(tmp_path: Path, prompts: str) -> None:
    text = TINY.read_text().replace(
        'prompts: ["0 1", "17 18", "40 42", "93 96", "50 49", "7 8 9 10 11"]', f"prompts: {prompts}"
    )
    path = tmp_path / "bad-prompts.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert f"{path}:" in str(info.value) and "conform.prompts" in str(info.value)
    message = _refused(recipe=TWIN, profile=str(path), attach="http://127.0.0.1:9")
    assert "conform.prompts" in message


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:8000", "127.0.0.1:8000", "file:///etc/passwd", "http://"])
def test_an_attach_url_that_is_not_http_is_refused(url: str) -> None:
    message = _refused(recipe=TWIN, profile=str(TINY), attach=url)
    assert "is not an http(s) URL" in message and "nothing was started or stopped" in message


def test_an_attach_url_that_does_not_answer_is_refused() -> None:
    port = _closed_port()
    message = _refused(recipe=TWIN, profile=str(TINY), attach=f"http://127.0.0.1:{port}")
    assert f"--attach http://127.0.0.1:{port}" in message and "does not answer" in message
    assert "nothing was started or stopped" in message


def _golden(tmp_path: Path, model: dict) -> Path:
    path = tmp_path / "golden.json"
    path.write_text(
        json.dumps({"format": "sparkforge-golden/1", "model": model, "prompts": [], "token_ids": []})
    )
    return path


def test_a_golden_of_another_model_is_refused(tmp_path: Path) -> None:
    golden = _golden(tmp_path, {"model": "Qwen/Qwen3.5-35B-A3B-FP8", "revision": "x"})
    message = _refused(
        recipe=TWIN, profile=str(TINY), attach=f"http://127.0.0.1:{_closed_port()}", golden=str(golden)
    )
    assert "recorded for model 'Qwen/Qwen3.5-35B-A3B-FP8'" in message and "'tiny-qwen35moe'" in message
    assert "nothing was started or stopped" in message


def test_a_golden_of_another_tokenizer_is_refused(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    golden = _golden(tmp_path, {"model": "tiny-qwen35moe", "revision": "x", "tokenizer_sha256": "0" * 64})
    message = _refused(
        recipe=TWIN, profile=str(TINY), model_dir=str(model_dir), golden=str(golden), image="x:y"
    )
    assert "recorded with another tokenizer" in message and "nothing was started or stopped" in message


def test_a_missing_or_broken_golden_is_refused(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    message = _refused(recipe=TWIN, profile=str(TINY), attach=url, golden=str(tmp_path / "none.json"))
    assert "does not exist" in message and "--record" in message
    (tmp_path / "broken.json").write_text("{")
    message = _refused(recipe=TWIN, profile=str(TINY), attach=url, golden=str(tmp_path / "broken.json"))
    assert "cannot read it as JSON" in message and "nothing was started or stopped" in message


PP2 = REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform-pp2.yaml"


def test_a_profile_and_a_node_count_that_disagree_are_refused(tmp_path: Path) -> None:
    launch = {
        "recipe": TWIN,
        "image": "x:y",
        "gpus": "none",
        "model_dir": str(tmp_path),
        "cache_dir": str(tmp_path),
    }
    message = _refused(profile=str(PP2), **launch)
    assert "runs on 2 node(s), conform was given one node" in message and "--nodes" in message
    assert "nothing was started or stopped" in message
    nodes = "tcp://192.0.2.1:2376,tcp://192.0.2.2:2376"
    message = _refused(profile=str(TINY), nodes=nodes, **launch)
    assert "runs on 1 node(s), conform was given 2 nodes (--nodes)" in message
    message = _refused(profile=str(PP2), nodes=nodes, node="tcp://192.0.2.1:2376", **launch)
    assert "--node and --nodes both given" in message
    message = _refused(profile=str(PP2), nodes=nodes, attach="http://127.0.0.1:9", **launch)
    assert "--attach and --nodes both given" in message
