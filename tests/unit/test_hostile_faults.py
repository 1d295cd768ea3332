"""A stopped engine is named by the address the docker CLI was really talking to (pure parts; the real kill of a
throwaway engine mid-build is tests/engine/test_engine_fault.py)."""

from __future__ import annotations

import pytest

from sparkforge.commands import (
    Command,
    engine_address,
    engine_lost,
    engine_stopped_message,
    stopped_engine_in,
)


@pytest.mark.parametrize(
    ("argv", "env", "address"),
    [
        (("docker", "--host", "ssh://me@spark2", "ps"), {}, "ssh://me@spark2"),
        (("docker", "-l", "debug", "-H", "tcp://10.0.0.2:2376", "ps"), {}, "tcp://10.0.0.2:2376"),
        (("docker", "--context", "spark2", "ps"), {}, "context spark2"),
        (
            ("docker", "run", "img", "sh", "-c", "echo"),
            {"DOCKER_HOST": "unix:///run/x.sock"},
            "unix:///run/x.sock",
        ),
        (
            ("docker", "run", "img", "sh", "-c", "echo"),
            {"DOCKER_HOST": "", "DOCKER_CONTEXT": ""},
            "unix:///var/run/docker.sock",
        ),
    ],
)
def test_the_engine_named_is_the_one_the_cli_talked_to(
    monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...], env: dict[str, str], address: str
) -> None:
    for key in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(key, raising=False)
    assert engine_address(Command(argv, env)) == address


def test_the_message_names_the_engine_and_the_fix_and_round_trips() -> None:
    for address in ("unix:///run/sf/docker.sock", "ssh://me@spark2:2222", "context spark2"):
        message = engine_stopped_message(address, "step 3/9 (RUN pip install)")
        assert message.startswith(f"the engine at {address} stopped answering during step 3/9")
        assert "invoke engine.up" in message and "the same command again" in message
        assert stopped_engine_in(f"build: {message}. Full log: x") == address


def test_only_docker_commands_are_probed() -> None:
    assert engine_lost(Command.of("git", "status"), "unexpected EOF") is None
