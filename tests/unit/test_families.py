"""Option families (cli/families.py): a task body that declares `session` is shown to Invoke with GLOBAL's and
its families' options, gets one Session built from their values, and a global flag reaches every such task
from its one declaration. Run through Invoke's own parser and executor, as `invoke` runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
from invoke import Collection, Context, Program

import tasks
from sparkforge.cli import task, user_errors
from sparkforge.cli.families import DRY, GLOBAL, NETWORK, Family, Option, with_families
from sparkforge.context import Session

SEEN: list[Session] = []


@task(families=(NETWORK, DRY), help={"name": "who to greet"})
@user_errors
def greet(c: Context, session: Session, name: str = "you") -> None:
    """Greet, with a progress line and a result line."""
    SEEN.append(session)
    session.echo(f"progress: greeting {name}")
    session.out(f"hello {name}")


def run(argv: list[str]) -> None:
    Program(namespace=Collection(greet), binary="inv").run(["inv", *argv], exit=False)


def test_family_options_reach_the_session_and_quiet_silences_only_progress(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SPARKFORGE_CA_BUNDLE", raising=False)
    SEEN.clear()
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")  # --ca-bundle names an existing file
    run(["greet", "--name", "ann", "--offline", "--ca-bundle", str(tmp_path / "ca.pem"), "--dry"])
    loud = capsys.readouterr().out
    run(["greet", "--name", "bo", "--quiet"])
    quiet = capsys.readouterr().out
    assert "progress: greeting ann" in loud and "hello ann" in loud
    assert "progress" not in quiet and "hello bo" in quiet
    first, second = SEEN
    assert first.offline and first.ca_bundle == tmp_path / "ca.pem" and first.runner.dry and not first.quiet
    assert second.quiet and not second.offline and second.ca_bundle is None and not second.runner.dry


def test_the_ca_bundle_comes_from_the_environment_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKFORGE_CA_BUNDLE", "/etc/ssl/proxy.pem")
    SEEN.clear()
    run(["greet"])
    assert SEEN[0].ca_bundle == Path("/etc/ssl/proxy.pem")


def test_a_body_option_with_a_family_name_is_refused_at_declaration() -> None:
    def twice(c: Context, session: Session, quiet: bool = False) -> None:
        """Declares --quiet itself."""

    with pytest.raises(TypeError, match="quiet"):
        with_families(twice, (GLOBAL,), {})


def test_a_new_global_flag_is_one_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A global option added to GLOBAL appears on every task that takes a session, with its help."""
    extra = Option("verbose_probe", False, "a flag only this test declares")
    monkeypatch.setattr("sparkforge.cli.GLOBAL", Family("global", (*GLOBAL.options, extra)))

    @task
    def probe(c: Context, session: Session) -> None:
        """Takes only the session."""

    assert [a.name for a in probe.get_arguments()] == [o.name for o in GLOBAL.options] + ["verbose_probe"]


def test_every_project_task_that_takes_a_session_shows_quiet() -> None:
    with_session = [
        ctx.name
        for ctx in Collection.from_module(tasks).to_contexts()
        if any(arg.name == "quiet" for arg in ctx.args.values())
    ]
    assert {"recipes", "show", "render"} <= set(with_session)
