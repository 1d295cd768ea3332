"""Value families (cli/families.py: a family with `into`): their options reach the body as one typed value,
checked before the body runs, with the check's error said as a user error; run through Invoke's own parser
and executor, as `invoke` runs them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from invoke import Collection, Context, Program

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import (
    JSON,
    PULL,
    SIGNING,
    Family,
    Outputs,
    PullChoice,
    Signing,
    opt,
    with_families,
)
from sparkforge.context import Session

SEEN: list[tuple[Session, PullChoice, Outputs]] = []


@task(families=(PULL, JSON), help={"name": "what to fetch"})
@user_errors
def fetch(c: Context, session: Session, pulling: PullChoice, outputs: Outputs, name: str = "x") -> None:
    """Record what the families built, write the JSON asked for."""
    SEEN.append((session, pulling, outputs))
    outputs.write(session, {"name": name, "platform": pulling.platform})


def run(argv: list[str]) -> int:
    try:
        Program(namespace=Collection(fetch), binary="inv").run(["inv", *argv], exit=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_the_family_options_become_one_value_and_the_json_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    SEEN.clear()
    out = tmp_path / "r.json"
    code = run(["fetch", "--platform", "linux/arm64", "--allow-drift", "--json", str(out), "--quiet"])
    assert code == 0
    session, pulling, outputs = SEEN[0]
    assert pulling == PullChoice("linux/arm64", allow_drift=True) and outputs.json == str(out)
    assert session.quiet and out.read_text() == '{\n  "name": "x",\n  "platform": "linux/arm64"\n}\n'
    assert f"wrote {out}" in capsys.readouterr().out  # a result line: printed under --quiet too


def test_a_bad_value_is_a_user_error_before_the_body(capsys: pytest.CaptureFixture[str]) -> None:
    SEEN.clear()
    assert run(["fetch", "--platform", "linux/riscv64"]) == 1
    assert SEEN == []
    err = capsys.readouterr().err
    assert "--platform 'linux/riscv64' is not a platform sparkforge builds" in err and "Traceback" not in err


def test_an_output_into_a_system_folder_is_refused_before_the_body(
    capsys: pytest.CaptureFixture[str],
) -> None:
    SEEN.clear()
    assert run(["fetch", "--json", "/etc/sparkforge-report.json"]) == 1
    assert SEEN == [] and "--json" in capsys.readouterr().err


def test_a_value_family_needs_its_parameter_in_the_body() -> None:
    def unsigned(c: Context, session: Session, recipe: str = "") -> None:
        """Declares SIGNING without taking the Signing value."""

    with pytest.raises(TypeError, match="signing"):
        with_families(unsigned, (SIGNING,), {})


def test_a_task_with_only_value_families_gets_them_without_a_session() -> None:
    got: list[Signing] = []

    @task(families=(SIGNING,))
    def sign_only(c: Context, signing: Signing) -> None:
        """Takes only the key."""
        got.append(signing)

    assert sorted(a.name for a in sign_only.get_arguments()) == ["key", "quiet"]
    sign_only(Context(), key="k.pem")
    assert got == [Signing("k.pem")]


def test_a_checking_task_finishes_through_its_report_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkforge.cli.families import REPORT
    from sparkforge.report import Check, Report

    @task(families=(REPORT,))
    @user_errors
    def check(c: Context, session: Session, outputs: Outputs) -> None:
        """One passed and one failed check."""
        report = Report(command="check", subject="here")
        report.add(Check("first", "passed", "fine"))
        report.add(Check("second", "failed", "broken"))
        outputs.finish(session, report, hint="see second")

    argv = ["check", "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"), "--quiet"]
    with pytest.raises(SystemExit) as raised:
        Program(namespace=Collection(check), binary="inv").run(["inv", *argv], exit=True)
    assert raised.value.code == 1
    captured = capsys.readouterr()
    assert "check failed (second); see second" in captured.err and "second" in captured.out
    assert (tmp_path / "r.json").is_file() and "<testsuite" in (tmp_path / "r.xml").read_text()


@dataclass(frozen=True)
class Asked:
    """A value family's dataclass: two options declared on their fields, one field that is no option."""

    depth: str = opt("3", "how deep")
    kept: str = ""
    name: str = opt("x", "who asks")


def test_a_value_family_takes_its_options_from_the_fields_that_have_a_help() -> None:
    asked = Family.of(Asked, "asked")
    assert [(o.name, o.default, o.help) for o in asked.options] == [
        ("depth", "3", "how deep"),
        ("name", "x", "who asks"),
    ]

    @task(families=(asked,))
    def ask(c: Context, asked: Asked) -> None:
        """Takes the family's value."""

    shown = {a.name: a.help for a in ask.get_arguments()}
    assert shown["depth"] == "how deep" and shown["name"] == "who asks" and "kept" not in shown
    reworded = Family.of(Asked, "asked", name="whom", kept="now an option, in this family's words")
    assert [(o.name, o.help) for o in reworded.options] == [
        ("depth", "how deep"),
        ("kept", "now an option, in this family's words"),
        ("name", "whom"),
    ]
