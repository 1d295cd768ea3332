"""The doctor's sanity ranks held at a gate: what their containers are given, and the in-image gate itself.

The gate runs for real: the in-image helper's own module (loaded as the doctor's bootstrap loads it) waits for a
file that a separate process creates."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

from sparkforge.run.cluster.ranks import GATE, NO_DNS, sanity_jobs
from sparkforge.run.facts import Deadlines, DoctorOptions, NodeFacts
from sparkforge.run.jobs import FACTS_SCRIPT, SANITY_SCRIPT, container_spec
from sparkforge.run.nodes import NodeEngine, parse_nodes, run_argv


def _helper() -> types.ModuleType:
    """cluster_sanity.py with its readers installed as `cluster_facts`, as the doctor's bootstrap does."""
    facts = types.ModuleType("cluster_facts")
    exec(compile(FACTS_SCRIPT.read_text(), "cluster_facts.py", "exec"), facts.__dict__)
    sys.modules["cluster_facts"] = facts
    spec = importlib.util.spec_from_file_location("cluster_sanity", SANITY_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gate_holds_until_another_process_opens_it(tmp_path: Path) -> None:
    helper = _helper()
    gate = tmp_path / "gate"
    start = time.monotonic()
    assert helper.wait_gate(str(gate), 0.3) is None  # never opened: the rank gives up, it never dials
    assert time.monotonic() - start >= 0.3
    opener = subprocess.Popen(["sh", "-c", f"sleep 0.5; touch {gate}"])
    try:
        start = time.monotonic()
        waited = helper.wait_gate(str(gate), 10)
        elapsed = time.monotonic() - start
    finally:
        opener.wait(timeout=10)
    assert waited is not None and 0.45 <= waited <= elapsed + 0.001  # through only once the file existed
    assert helper.wait_gate(str(gate), 0) == 0.0  # already open: no wait


def _facts(rank: int, address: str) -> NodeFacts:
    return NodeFacts(
        rank=rank,
        label=f"node{rank}",
        auto_ip=address,
        ip_source="VLLM_HOST_IP",
        interfaces=[],
        infiniband={},
        versions={},
        address=address,
        interface="fabric0",
        env={"VLLM_HOST_IP": address, "GLOO_SOCKET_IFNAME": "fabric0"},
    )


def test_held_ranks_get_the_gate_the_library_report_and_no_name_server(tmp_path: Path) -> None:
    sockets = []
    for name in ("a", "b"):  # node addresses are checked when parsed: real socket files (nothing is called)
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / f"{name}.sock"))
        sockets.append(sock)
    try:
        engines = [NodeEngine(n) for n in parse_nodes(f"unix://{tmp_path}/a.sock,unix://{tmp_path}/b.sock")]
    finally:
        for sock in sockets:
            sock.close()
    facts = [_facts(0, "10.77.0.1"), _facts(1, "10.77.0.2")]
    options = DoctorOptions(image="img:1", deadlines=Deadlines(sanity=40))
    held = sanity_jobs(engines, facts, options, gated=True)
    plain = sanity_jobs(engines, facts, options, gated=False)
    for job, fact in zip(held, facts, strict=True):
        args = list(job.args)
        assert args[: args.index("--gate")] == list(plain[fact.rank].args)  # the same rank, plus the gate
        assert args[args.index("--gate") + 1] == GATE and "--library" in args
        assert args[args.index("--gate-timeout") + 1] == "110"  # reach's 30 s and twice the sanity's 40 s
        assert (
            args[args.index("--master") + 1] == "10.77.0.1:29501"
            and args[args.index("--timeout") + 1] == "35"
        )
        assert job.env == fact.env  # the launch env the addresses stage chose, from the start
    argv = run_argv(container_spec(held[1], "img:1", "rank1", "sanity", "s"))
    assert argv[argv.index("--dns") + 1] == NO_DNS[0] == "127.0.0.1"
    assert "--env" in argv and "VLLM_HOST_IP=10.77.0.2" in argv
    assert argv[-len(held[1].args) :] == list(held[1].args)  # the helper gets the gate and --library
