"""Hostile cluster inputs: node URLs, --interface, ports and paths are checked before any engine is contacted,
and `cluster.up --dry` contacts none."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli import cluster as cli_cluster
from sparkforge.errors import RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run import inputs
from sparkforge.run.nodes import node_warnings, parse_node, parse_nodes


@pytest.fixture
def engine_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "engine.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    yield path
    sock.close()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a,,b", "node 1 is empty"),
        ("a,", "node 1 is empty"),
        (",a", "node 0 is empty"),
        ("   ", "--nodes is empty"),
        ("http://spark2:2375", "Docker does not take http://"),
        ("npipe:////./pipe/docker_engine", "Docker does not take npipe://"),
        ("fd://", "Docker does not take fd://"),
        ("unix://relative.sock", "not an absolute path"),
        ("unix:///etc/passwd", "is not a socket"),
        ("unix:///nonexistent/docker.sock", "cannot be read"),
        ("ssh://-oProxyCommand=touch@x", "ssh://-oProxyCommand"),
        ("ssh://-oProxyCommand@host", "not an ssh user name"),
        ("ssh://me@-oProxyCommand", "not a host name"),
        ("ssh://me@host:0", "port '0'"),
        ("ssh://me@host:65536", "port '65536'"),
        ("ssh://me@host:22x", "port '22x'"),
        ("ssh://me@host/path", "no path"),
        ("ssh://me@host?x", "no path or query"),
        ("tcp://user:pw@host:2376", "tcp:// takes no user"),
        ("tcp://host:-1", "port '-1'"),
        ("tcp://[::1", "is not [IPv6]:port"),
        ("tcp://[zz]:2376", "is not an IPv6 address"),
        ("tcp://a..b", "not a host name"),
        ("tcp://" + "a" * 64, "not a host name"),
        ("ssh://me@host\tx", "whitespace or a control character"),
        ("ssh://me@host\nx", "whitespace or a control character"),
        ("spark\x00two", "whitespace or a control character"),
        ("spark\x1b[2J", "whitespace or a control character"),
        ("ssh://me@host=", "nothing after '='"),
        ("ssh://me@host=10.0.0.1=2", "is not an IP address"),
        ("ssh://me@host=0.0.0.0", "is not an IP address (of one node"),
        ("ssh://me@host=224.0.0.1", "is not an IP address (of one node"),
        ("-context", "neither an engine URL nor a context name"),
        ("ssh://a@h,ssh://a@H:22", "twice"),
        ("tcp://h,tcp://h:2375", "twice"),
        ("spark2,spark2", "twice"),
        ("ssh://a@h1=10.0.0.1,ssh://a@h2=10.0.0.1", "link address 10.0.0.1 to ranks 0 and 1"),
        (",".join(f"n{i}" for i in range(65)), "more than a profile can use"),
    ],
)
def test_bad_node_lists_are_refused(text: str, needle: str) -> None:
    with pytest.raises(RunError) as info:
        parse_nodes(text)
    assert needle in str(info.value) and "fix:" in str(info.value), str(info.value)


def test_a_socket_named_twice_by_two_spellings_is_one_engine(engine_socket: Path) -> None:
    with pytest.raises(RunError, match="twice"):
        parse_nodes(f"unix://{engine_socket},unix://{engine_socket.parent}/./engine.sock")
    (node,) = parse_nodes(f"unix://{engine_socket}")
    assert node.kind == "unix" and node.engine_flags() == ("--host", f"unix://{engine_socket}")


def test_plain_tcp_is_warned_unless_tls() -> None:
    nodes = parse_nodes("tcp://10.0.0.2:2375,ssh://me@spark3")
    assert len(node_warnings(nodes, {})) == 1 and "without TLS" in node_warnings(nodes, {})[0]
    assert node_warnings(nodes, {"DOCKER_TLS_VERIFY": "1"}) == []


@pytest.mark.parametrize(
    "value", ["eth0;reboot", "../../etc", "a" * 16, "en p1", "-i", "x/y", ".", "..", "eth0\n", "$(id)"]
)
def test_interface_names(value: str) -> None:
    with pytest.raises(RunError, match="not a network interface name"):
        inputs.check_interface(value)


@pytest.mark.parametrize("good", ["enp1s0f1np1", "eth0", "bond0.100", "eth0:1", "wlP9s9", ""])
def test_interface_names_that_are_fine(good: str) -> None:
    assert inputs.check_interface(good) == good


@pytest.mark.parametrize("port", [0, -1, 65536, 10**12, True])
def test_ports(port: object) -> None:
    with pytest.raises(RunError, match="not a port"):
        inputs.check_port("--port", port)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--cache-dir", "/var/cache:/root/.ssh"), ("--cache-dir", "relative"), ("--model-dir", "/m,readonly=false"),
     ("--model-dir", "/models/../etc"), ("--cache-dir", "/with space")],
)  # fmt: skip
def test_mounted_paths_cannot_add_mounts(option: str, value: str) -> None:
    with pytest.raises(RunError, match=option):
        inputs.check_host_path(option, value)


# ---- properties ----------------------------------------------------------------------------------------------

_host = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z0-9]{1,8}){0,2}", fullmatch=True)
_user = st.from_regex(r"[a-z_][a-z0-9_.-]{0,10}", fullmatch=True)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=60))
def test_any_node_list_is_refused_or_well_formed(text: str) -> None:
    try:
        nodes = parse_nodes(text)
    except RunError as exc:
        assert "fix:" in str(exc)
        return
    assert nodes and len({n.key for n in nodes}) == len(nodes)
    for node in nodes:
        assert node.kind in ("unix", "tcp", "ssh", "context")
        assert not any(c.isspace() or ord(c) < 32 for c in node.target)
        assert not node.target.startswith("-") and "@-" not in node.target and "//-" not in node.target


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(user=_user, host=_host, port=st.integers(min_value=1, max_value=65535))
def test_valid_ssh_urls_pass_and_normalise(user: str, host: str, port: int) -> None:
    node = parse_node(f"ssh://{user}@{host}:{port}")
    assert node.key == f"ssh://{user}@{host}:{port}"
    assert parse_node(f"ssh://{user}@{host.upper()}:{port}").key == node.key  # host names are case-blind
    if port == 22:
        assert parse_node(f"ssh://{user}@{host}").key == node.key


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(host=_host, port=st.one_of(st.integers(), st.text(max_size=6)))
def test_tcp_ports_are_whole_numbers_in_range(host: str, port: object) -> None:
    text = f"tcp://{host}:{port}"
    digits = str(port).rstrip(" ")  # an entry's surrounding spaces are trimmed, as in "a, b"
    valid = digits.isascii() and digits.isdigit() and 1 <= int(digits) <= 65535
    if valid:
        assert parse_node(text).key == f"tcp://{host}:{int(digits)}"
    else:
        with pytest.raises(RunError):
            parse_node(text)


# ---- the command line: refused or dry, no engine is contacted -------------------------------------------------


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DOCKER_HOST": "tcp://192.0.2.1:9"},  # TEST-NET: contacting it would hang or fail
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nodes", "ssh://me@a,,ssh://me@b"], "node 1 is empty"),
        (["--nodes", "ssh://me@a=10.0.0.1,ssh://me@b=10.0.0.2", "--interface", "eth0;id"], "--interface"),
        (["--nodes", "ssh://me@a=10.0.0.1,ssh://me@b=10.0.0.2", "--port", "70000"], "--port 70000"),
        (["--nodes", "ssh://me@a=10.0.0.1,ssh://me@b=10.0.0.2", "--cache-dir", "/x:/root"], "--cache-dir"),
    ],
)
def test_cluster_up_refuses_before_any_engine(
    monkeypatch: pytest.MonkeyPatch, args: list[str], needle: str
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:9")
    options: dict[str, object] = {
        k.removeprefix("--").replace("-", "_"): v for k, v in zip(args[::2], args[1::2], strict=True)
    }
    if "port" in options:
        options["port"] = int(str(options["port"]))
    with pytest.raises(Exit) as info:
        cli_cluster.up(
            Context(), recipe="vllm-qwen35", profile="qwen35-122b-a10b-fp8-tp2", no_preflight=True,
            image="sparkforge-test/none:1", **options,
        )  # fmt: skip
    assert info.value.code != 0
    assert needle in str(info.value.message) and "fix:" in str(info.value.message), info.value.message


def test_cluster_up_refusal_through_the_command_line() -> None:
    result = _invoke(
        "cluster.up", "--recipe", "vllm-qwen35", "--profile", "qwen35-122b-a10b-fp8-tp2", "--no-preflight",
        "--image", "sparkforge-test/none:1", "--nodes", "ssh://me@a,,ssh://me@b",
    )  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stdout + result.stderr
    assert "node 1 is empty" in result.stderr and "fix:" in result.stderr, result.stderr


def test_cluster_up_dry_contacts_no_engine() -> None:
    # Both nodes are unroutable TEST-NET addresses: any contact would fail or hang, --dry must only print.
    start = time.monotonic()
    result = _invoke(
        "cluster.up", "--recipe", "vllm-qwen35", "--profile", "qwen35-122b-a10b-fp8-tp2", "--no-preflight",
        "--image", "sparkforge-test/none:1", "--nodes", "tcp://192.0.2.1:2376,tcp://192.0.2.2:2376=192.0.2.12",
        "--interface", "enp1s0f1np1", "--dry", "--allow-unpinned-model",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 60
    assert "<node0 (tcp://192.0.2.1:2376) link address>" in result.stdout  # no doctor: the address is unknown
    assert "192.0.2.12" in result.stdout and "--nnodes" in result.stdout
    assert "without TLS" in result.stderr
