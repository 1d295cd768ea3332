"""An engine that stops in the middle of a build is named as the cause, nothing is left half-done, and the fix
(start it again, run the same command) works from the cache.

The engine killed here is a throwaway dockerd of this test's own (its own socket, data root, exec root, pidfile,
no bridge, no iptables, vfs storage): the machine's engines are never touched. The build is real BuildKit
through sparkforge's own argv (build_command) and command seam; the step that is running when the engine is
killed is a static `pause` program built here with the C compiler.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.commands import Command, Runner, engine_lost
from sparkforge.errors import CommandError, RunError
from sparkforge.imagebuild.buildkit import BuildRequest, build_command
from sparkforge.imagebuild.execute import failure_paragraph
from sparkforge.run.nodes import NodeEngine, parse_node
from tests.prerequisites import skip_or_fail

pytestmark = pytest.mark.engine

PAUSE_C = r"""
#include <stdlib.h>
#include <unistd.h>
int main(void) { const char *s = getenv("PAUSE"); sleep(s ? atoi(s) : 60); return 0; }
"""
DOCKERFILE = """\
FROM scratch AS fault
COPY pause /pause
COPY marker /marker
ARG PAUSE=60
RUN ["/pause"]
"""
TAG = "sparkforge-candidate/fault-test:{}"


@dataclass
class Throwaway:
    """A dockerd of this test's own; `kill` is SIGKILL, as a crash or an OOM kill would be."""

    name: str
    host: str
    data: Path
    run: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.host}

    def start(self, wait_s: float = 60) -> None:
        self.run.mkdir(parents=True, exist_ok=True)
        # Its own network namespace: a dockerd in the machine's namespace (even with --bridge none) takes the
        # machine engine's docker0 bridge down with it, and every other build's RUN steps lose their network.
        if not Path(f"/run/netns/{self.name}").exists():  # a restart reuses it
            subprocess.run(["ip", "netns", "add", self.name], capture_output=True, check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], capture_output=True, check=True)
        argv = [
            "nsenter", f"--net=/run/netns/{self.name}",
            shutil.which("dockerd") or "dockerd",
            "--host", self.host,
            "--data-root", str(self.data),
            "--exec-root", str(self.run / "exec"),
            "--pidfile", str(self.run / "dockerd.pid"),
            "--bridge", "none",
            "--iptables=false",
            "--ip-masq=false",
            "--storage-driver", "vfs",  # no overlay mounts to leave behind when it is killed
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while not self.answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"throwaway dockerd did not start: {self.log.read_text()[-1500:]}")
            time.sleep(0.5)

    def answers(self) -> bool:
        probe = ["docker", "--host", self.host, "version", "--format", "{{.Server.Version}}"]
        return subprocess.run(probe, capture_output=True, timeout=20, check=False).returncode == 0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def own_processes(self) -> list[int]:
        """Processes this engine left (its containerd, a build step's runc): found by this engine's own paths."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(self.run) in cmdline or str(self.data) in cmdline:
                pids.append(int(entry.name))
        return pids

    def kill_leftovers(self) -> None:
        """The killed dockerd's containerd (it holds its state lock; a new dockerd would wait on it)."""
        for pid in self.own_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while self.own_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        # A killed containerd may linger as a zombie a while: its pid file would make the next dockerd wait on it.
        (self.run / "exec" / "containerd" / "containerd.pid").unlink(missing_ok=True)

    def clean(self) -> None:
        self.kill()
        self.kill_leftovers()
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted(
            (m for m in mounts if m.startswith((str(self.data), str(self.run)))), reverse=True
        ):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.data, ignore_errors=True)
        shutil.rmtree(self.run, ignore_errors=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


@pytest.fixture
def throwaway(tmp_path: Path) -> Iterator[Throwaway]:
    if os.geteuid() != 0 or not shutil.which("dockerd") or not shutil.which("docker"):
        skip_or_fail("a throwaway dockerd needs root, dockerd and the docker CLI")
    name = f"sf-fault-{os.getpid()}"
    daemon = Throwaway(
        name,
        f"unix:///run/{name}/docker.sock",
        Path(f"/var/lib/{name}"),
        Path(f"/run/{name}"),
        tmp_path / "dockerd.log",
    )
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.clean()


@pytest.fixture
def context(tmp_path: Path) -> Path:
    if not shutil.which("cc"):
        skip_or_fail("no C compiler for the static pause program")
    folder = tmp_path / "context"
    folder.mkdir()
    source = tmp_path / "pause.c"
    source.write_text(PAUSE_C)
    subprocess.run(["cc", "-static", "-O2", "-o", str(folder / "pause"), str(source)], check=True)
    (folder / "marker").write_text(f"{time.time_ns()}\n")  # a fresh cache key for the steps after it
    (folder / "Dockerfile").write_text(DOCKERFILE)
    return folder


def _build(daemon: Throwaway, context: Path, log_dir: Path, pause: int, on_line=None) -> str:
    """One real BuildKit build through sparkforge's argv and command seam, against the throwaway engine."""
    eng = engine.detect_engine(Runner(stream=False))  # DOCKER_HOST names the throwaway engine (see the test)
    request = BuildRequest(
        context=context,
        platform="linux/amd64",
        target="fault",
        tags=(TAG.format(daemon.name),),
        build_args={"PAUSE": str(pause)},
        network="none",
    )
    command = build_command(eng, request)
    command = type(command)(command.argv, {**command.env, **daemon.env}, command.cwd)
    runner = Runner(log_dir=log_dir, stream=False)
    return runner.run(command, "build", on_line=on_line).output


def test_engine_killed_mid_build_is_named_and_nothing_is_tagged(
    throwaway: Throwaway, context: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "DOCKER_HOST", throwaway.host
    )  # every docker CLI this test starts talks to the throwaway
    started = threading.Event()

    def watch(line: str) -> None:
        if 'RUN ["/pause"]' in line and not started.is_set():
            started.set()
            threading.Timer(2.0, throwaway.kill).start()  # two seconds into the step, the engine dies

    logs = tmp_path / "logs"
    began = time.monotonic()
    with pytest.raises(CommandError) as info:
        _build(throwaway, context, logs, pause=120, on_line=watch)
    assert started.is_set(), "the build never reached the RUN step"
    assert time.monotonic() - began < 100, "the failure took as long as the step: the engine loss went unseen"
    message = str(info.value)
    assert f"the engine at {throwaway.host} stopped answering" in message, message
    assert "invoke engine.up" in message and "the same command again" in message

    # The paragraph the build prints (build/stage.py): the engine, the step it was on, nothing tagged, the fix.
    paragraph = failure_paragraph(sorted(logs.glob("*-build.log"))[-1], message)
    assert f"the engine at {throwaway.host} stopped answering during step 3/3 (" in paragraph, paragraph
    assert 'RUN ["/pause"]' in paragraph, paragraph
    assert "Nothing was tagged and no record was written" in paragraph and "invoke engine.up" in paragraph
    assert "unexpected EOF" not in paragraph and "\n" not in paragraph

    # A node on that engine (a cluster launch) is told the same, naming the node.
    with pytest.raises(
        RunError, match=rf"node0 \({throwaway.host}\): the engine at {throwaway.host} stopped"
    ):
        NodeEngine(parse_node(throwaway.host)).call("ps", "ps", timeout=30)

    # Nothing half-done: with the engine back, no candidate tag; the same command again finishes from the cache.
    throwaway.kill_leftovers()
    throwaway.start()
    tag = TAG.format(throwaway.name)
    inspect = ["docker", "--host", throwaway.host, "image", "inspect", tag]
    assert subprocess.run(inspect, capture_output=True, check=False).returncode != 0, (
        "a candidate tag was left"
    )
    output = _build(throwaway, context, tmp_path / "again", pause=0)
    assert "CACHED" in output, output[-2000:]  # the COPY steps that finished before the kill
    assert subprocess.run(inspect, capture_output=True, check=False).returncode == 0


def test_a_failure_on_a_live_engine_is_not_blamed_on_the_engine(engine_ready: None, tmp_path: Path) -> None:
    # A real failed command on the machine's engine (which answers): its own error, not "stopped answering".
    docker = engine.docker_cli()
    with pytest.raises(CommandError) as info:
        Runner(log_dir=tmp_path, stream=False).run(
            Command.of(docker, "image", "inspect", "sparkforge-test/fault-no-such-image:1"), "inspect"
        )
    assert "stopped answering" not in str(info.value) and "No such image" in str(info.value)


def test_an_engine_that_is_not_there_is_named(tmp_path: Path) -> None:
    host = f"unix://{tmp_path}/gone.sock"
    command = Command.of(engine.docker_cli(), "--host", host, "ps")
    with pytest.raises(
        CommandError, match=rf"ps: the engine at {host} stopped answering during step 'ps'; fix: "
    ):
        Runner(stream=False).capture(command, "ps")
    assert engine_lost(command, "") == host
