"""One rule in one place: the seams' small shared pieces (daemons, build metadata, reports, output streams)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from sparkforge import cli, console
from sparkforge.cli.families import session_from
from sparkforge.commands import Command, Runner
from sparkforge.errors import EngineError
from sparkforge.registry.pushed import read_build_metadata
from sparkforge.report import Check, Report, load_report, print_report


def test_runner_start_detaches_a_daemon_and_appends_its_output(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    log.write_text("earlier\n")
    Runner().start(Command.of("sh", "-c", 'echo "up $WHO"', env={"WHO": "dockerd"}), log)
    deadline = time.monotonic() + 10
    while "up dockerd" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text() == "earlier\nup dockerd\n"


def test_runner_start_dry_prints_the_detached_line(tmp_path: Path) -> None:
    lines: list[str] = []
    log = tmp_path / "d.log"
    Runner(dry=True, echo=lines.append).start(Command.of("dockerd", "--host", "x y", env={"PATH": "/b"}), log)
    assert lines == [f"PATH=/b setsid dockerd --host 'x y' >{log} 2>&1 &"]
    assert not log.exists()


def test_one_reader_for_buildkits_metadata_file(tmp_path: Path) -> None:
    meta = tmp_path / "meta.json"
    digest, config = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    meta.write_text(
        json.dumps({"containerimage.digest": digest, "containerimage.config.digest": config, "x": 1})
    )
    read = read_build_metadata(meta)
    assert (read.digest, read.config_digest) == (digest, config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.digest = config  # type: ignore[misc]
    for text in ("{}", "not json", "[]", json.dumps({"containerimage.digest": digest})):
        meta.write_text(text)
        with pytest.raises(
            EngineError, match=r"containerimage\.config\.digest.*fix: pass the --metadata-file"
        ):
            read_build_metadata(meta)
    with pytest.raises(EngineError, match="fix:"):
        read_build_metadata(tmp_path / "missing.json")


def test_a_written_report_cannot_change(tmp_path: Path) -> None:
    report = Report(command="verify", subject="img", recipe="r")
    report.add(Check("labels", "passed", details={"n": 1}))
    with report.timed("smoke") as check:
        check.reason = "ran"
    report.extra["image_id"] = "sha256:x"
    report.subject = "candidate"  # still open: filled in until written
    report.write_json(tmp_path / "r.json")
    written = (tmp_path / "r.json").read_text()
    for change in (
        lambda: setattr(report, "subject", "other"),
        lambda: report.add(Check("late", "failed")),
        lambda: report.timed("late").__enter__(),
        lambda: setattr(report.checks[0], "status", "failed"),
        lambda: report.checks.append(Check("late", "failed")),  # type: ignore[attr-defined]
        lambda: report.extra.__setitem__("image_id", "sha256:y"),
        lambda: report.checks[0].details.__setitem__("n", 2),
    ):
        with pytest.raises((FrozenInstanceError, AttributeError, TypeError)):
            change()
    report.write_junit(tmp_path / "r.xml")  # writing again (another format) is fine
    report.write_json(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == written
    loaded = load_report(tmp_path / "r.json")
    assert loaded.to_dict() == report.to_dict()
    loaded.add(Check("more", "passed"))  # a report read back is a new, open one


def test_one_default_output_stream_for_progress(capfd: pytest.CaptureFixture[str]) -> None:
    # Runner streams a program's lines and build/publish/pull/probe/lint say their progress to the same place.
    Runner().run(Command.of("sh", "-c", "echo from-the-program"), "step")
    Runner(dry=True).run(Command.of("true", "dry"), "step")
    out, err = capfd.readouterr()
    assert (out, err) == ("from-the-program\ntrue dry\n", "")
    defaults = {fn.__qualname__: inspect.signature(fn).parameters["echo"].default for fn in (print_report,)}
    assert set(defaults.values()) == {console.say}, defaults
    built = session_from({})  # what every task's session says through (the registry's steps take it)
    assert built.echo is console.say and built.out is console.say and built.warn is console.warn
    assert cli.echo is console.say and cli.warn is console.warn
    console.warn("careful")
    assert capfd.readouterr() == ("", "careful\n")


def test_finish_report_prints_writes_and_fails_once_for_every_checking_task(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from invoke.exceptions import Exit

    report = Report(command="cluster.doctor", subject="2 nodes")
    report.add(Check("engines", "passed", "2 engines answer"))
    report.add(Check("image", "failed", "not on node1"))
    with pytest.raises(Exit) as raised:
        cli.finish_report(
            report, str(tmp_path / "r.json"), str(tmp_path / "r.xml"), hint="the table says why"
        )
    assert raised.value.message == "sparkforge: cluster.doctor failed (image); the table says why"
    assert load_report(tmp_path / "r.json").to_dict() == report.to_dict()
    assert (tmp_path / "r.xml").is_file()
    out = capfd.readouterr().out
    assert "cluster.doctor 2 nodes: FAILED" in out and out.endswith(f"report: {tmp_path / 'r.json'}\n")
    passed = Report(command="preflight", subject="recipe r")
    passed.add(Check("lock", "passed"))
    cli.finish_report(passed)  # no files asked for, nothing raised
