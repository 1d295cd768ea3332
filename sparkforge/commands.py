"""The one seam for external programs: argv lists, dry runs, a log and a replayable script per step."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparkforge.boundary import open_log, write_output
from sparkforge.console import say
from sparkforge.errors import CommandError


@dataclass(frozen=True)
class Command:
    """An external program call: argv (never a shell string), extra environment and working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise TypeError(f"argv must be a non-empty sequence of str, got {self.argv!r}")

    @classmethod
    def of(cls, *argv: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Command:
        return cls(tuple(argv), dict(env or {}), cwd)

    def shell_line(self) -> str:
        """The command as one copy-pasteable POSIX shell line."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        line = shlex.join(self.argv)
        return f"{env} {line}" if env else line

    def script(self) -> str:
        """A replayable bash script for this command."""
        lines = [
            "#!/usr/bin/env bash",
            "# Written by sparkforge: replays this step exactly.",
            "set -euo pipefail",
        ]
        if self.cwd is not None:
            lines.append(f"cd {shlex.quote(str(self.cwd))}")
        lines.append(self.shell_line())
        return "\n".join(lines) + "\n"


# An engine that stops mid-command: the docker CLI's own words for losing its daemon. BuildKit's bare
# "unexpected EOF" is no sign by itself (a RUN step or a registry can say it): there the probe decides.
_ENGINE_GONE = re.compile(
    r"Cannot connect to the Docker daemon|error during connect|error reading from server: EOF", re.MULTILINE
)
ENGINE_STOPPED = "the engine at {address} stopped answering"
ENGINE_STOPPED_FIX = (
    "fix: start it ('invoke engine.up', or 'sudo systemctl start docker'), then run the same command again "
    "(BuildKit's cache keeps the steps that finished)"
)
_DEFAULT_ENGINE = "unix:///var/run/docker.sock"


_GLOBAL_WITH_VALUE = {
    "--host",
    "-H",
    "--context",
    "-c",
    "--config",
    "--log-level",
    "-l",
    "--tlscacert",
    "--tlscert",
    "--tlskey",
}


def _engine_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """The docker CLI's global --host/--context before the subcommand (a `sh -c` later is the container's)."""
    index = 1
    while index < len(argv) and argv[index].startswith("-"):
        if argv[index] in _GLOBAL_WITH_VALUE and index + 1 < len(argv):
            if argv[index] in ("--host", "-H", "--context", "-c"):
                return (argv[index], argv[index + 1])
            index += 2
        else:
            index += 1
    return ()


def engine_address(command: Command) -> str:
    """The engine a docker CLI command talks to: its --host/--context, else DOCKER_HOST/DOCKER_CONTEXT, else the
    CLI's default socket."""
    flags = _engine_flags(command.argv)
    if flags:
        return flags[1] if flags[0] in ("--host", "-H") else f"context {flags[1]}"
    env = {**os.environ, **command.env}
    if env.get("DOCKER_HOST"):
        return env["DOCKER_HOST"]
    return f"context {env['DOCKER_CONTEXT']}" if env.get("DOCKER_CONTEXT") else _DEFAULT_ENGINE


def engine_lost(command: Command, output: str, timeout: float = 15) -> str | None:
    """For a failed docker CLI command: the engine's address when the engine went away under it, else None.

    Gone: it does not answer `docker version` now, or the output carries the CLI's own words for a lost engine.
    """
    if Path(command.argv[0]).name != "docker" or len(command.argv) < 2:
        return None
    probe = [command.argv[0], *_engine_flags(command.argv), "version", "--format", "{{.Server.Version}}"]
    try:
        answers = (
            subprocess.run(
                probe, env={**os.environ, **command.env}, capture_output=True, timeout=timeout, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        answers = False
    if answers and not _ENGINE_GONE.search(output):
        return None
    return engine_address(command)


def engine_stopped_message(address: str, during: str) -> str:
    """One paragraph: which engine stopped, during what, what was left undone, the fix."""
    return f"{ENGINE_STOPPED.format(address=address)} during {during}; {ENGINE_STOPPED_FIX}"


def stopped_engine_in(text: str) -> str | None:
    """The address named by an engine_stopped_message in `text` (a CommandError's message), else None."""
    match = re.search(re.escape(ENGINE_STOPPED).replace(r"\{address\}", r"(\S+(?: \S+)?)"), text)
    return match.group(1) if match else None


@dataclass(frozen=True)
class Result:
    command: Command
    returncode: int
    output: str
    log: Path | None


class Runner:
    """Runs commands (or only prints them with `dry`); with `log_dir`, saves NN-step.sh and NN-step.log."""

    def __init__(
        self,
        *,
        dry: bool = False,
        log_dir: Path | None = None,
        echo: Callable[[str], None] | None = None,
        stream: bool = True,
    ) -> None:
        self.dry = dry
        self.log_dir = log_dir
        self.echo = echo or say
        self.stream = stream
        self._step = 0

    def _paths(self, step: str) -> tuple[Path | None, Path | None]:
        if self.log_dir is None:
            return None, None
        self._step += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{self._step:02d}-{step}"
        return self.log_dir / f"{stem}.sh", self.log_dir / f"{stem}.log"

    def run(
        self,
        command: Command,
        step: str,
        *,
        check: bool = True,
        quiet: bool = False,
        on_line: Callable[[str], None] | None = None,
    ) -> Result:
        """Run `command` as step `step`; raise CommandError on a non-zero exit when `check`."""
        script, log = self._paths(step)
        if script is not None:
            write_output(script, command.script(), "replay script", mode=0o755)
        if self.dry:
            self.echo(command.shell_line())
            return Result(command, 0, "", None)
        env = {**os.environ, **command.env}
        lines: list[str] = []
        try:
            proc = subprocess.Popen(
                list(command.argv),
                cwd=command.cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except FileNotFoundError as exc:
            raise CommandError(
                f"{step}: cannot start {command.argv[0]!r} (not installed or not on PATH). "
                f"Install it, or see README.md 'Quick start'."
            ) from exc
        logf = open_log(log, "step log") if log is not None else None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if logf:
                    logf.write(line.encode("utf-8", errors="replace"))
                if on_line:
                    on_line(line.rstrip("\n"))
                elif self.stream and not quiet:
                    self.echo(line.rstrip("\n"))
            proc.wait()
        finally:
            if logf:
                logf.close()
        output = "".join(lines)
        if check and proc.returncode != 0:
            tail = "".join(lines[-15:]).rstrip()
            where = f" Full log: {log}." if log else ""
            lost = engine_lost(command, output)
            if lost:
                raise CommandError(f"{step}: {engine_stopped_message(lost, f'step {step!r}')}.{where}")
            raise CommandError(
                f"{step} failed (exit {proc.returncode}): {command.shell_line()}\n"
                f"--- last lines ---\n{tail}\n---{where}"
            )
        return Result(command, proc.returncode, output, log)

    def start(self, command: Command, log: Path) -> None:
        """Start a long-running daemon detached from this process, its output appended to `log`."""
        if self.dry:
            self.echo(f"{Command(('setsid', *command.argv), command.env).shell_line()} >{log} 2>&1 &")
            return
        with open_log(log, "daemon log", append=True) as out:
            try:
                subprocess.Popen(
                    list(command.argv),
                    cwd=command.cwd,
                    env={**os.environ, **command.env},
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                raise CommandError(
                    f"cannot start {command.argv[0]!r} (not installed or not on PATH)."
                ) from exc

    def capture(
        self, command: Command, step: str, *, check: bool = True, timeout: float | None = None
    ) -> Result:
        """Run a short query command without streaming; its output is returned (also when dry).

        With `timeout`, a command still running after that many seconds is killed and CommandError raised.
        """
        try:
            proc = subprocess.run(
                list(command.argv),
                cwd=command.cwd,
                env={**os.environ, **command.env},
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
            )
        except FileNotFoundError as exc:
            raise CommandError(
                f"{step}: cannot start {command.argv[0]!r} (not installed or not on PATH)."
            ) from exc
        except subprocess.TimeoutExpired:
            raise CommandError(
                f"{step}: no answer within {timeout:g} s from {command.shell_line()}"
            ) from None
        if check and proc.returncode != 0:
            lost = engine_lost(command, proc.stdout + proc.stderr)
            if lost:
                raise CommandError(f"{step}: {engine_stopped_message(lost, f'step {step!r}')}")
            raise CommandError(
                f"{step} failed (exit {proc.returncode}): {command.shell_line()}\n{proc.stderr.strip()[-2000:]}"
            )
        return Result(command, proc.returncode, proc.stdout + proc.stderr, None)


def argv_of(parts: Sequence[str | None]) -> tuple[str, ...]:
    """Drop None parts: lets callers build argv lists with optional flags inline."""
    return tuple(p for p in parts if p is not None)


def run_pipeline(source: Command, sinks: Sequence[Command], step: str, *, chunk: int = 1 << 22) -> int:
    """Stream `source`'s stdout into the stdin of every command in `sinks` (one read, many writers).

    Used to copy an image to several engines at once (`docker save` into each `docker load`) without a
    temporary file. Returns the bytes streamed; raises CommandError naming the command that failed.
    """
    writers = [
        subprocess.Popen(
            list(sink.argv),
            env={**os.environ, **sink.env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for sink in sinks
    ]
    reader = subprocess.Popen(
        list(source.argv), env={**os.environ, **source.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    total = 0
    try:
        assert reader.stdout is not None
        for block in iter(lambda: reader.stdout.read(chunk), b""):  # type: ignore[union-attr]
            total += len(block)
            for writer in writers:
                if writer.stdin is not None and not writer.stdin.closed:
                    try:
                        writer.stdin.write(block)
                    except BrokenPipeError:
                        writer.stdin.close()
    finally:
        for writer in writers:
            if writer.stdin is not None and not writer.stdin.closed:
                writer.stdin.close()
        reader_err = reader.stderr.read().decode(errors="replace") if reader.stderr else ""
        reader.wait()
        outputs = [(w.stdout.read() if w.stdout else b"").decode(errors="replace") for w in writers]
        for writer in writers:
            writer.wait()
    if reader.returncode != 0:
        raise CommandError(
            f"{step}: {source.shell_line()} failed (exit {reader.returncode}): {reader_err.strip()[-800:]}"
        )
    for sink, writer, output in zip(sinks, writers, outputs, strict=True):
        if writer.returncode != 0:
            raise CommandError(
                f"{step}: {sink.shell_line()} failed (exit {writer.returncode}): {output.strip()[-800:]}"
            )
    return total
