"""Check reports: the stable JSON every checking command writes, JUnit XML, and a human table."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import FrozenInstanceError, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from sparkforge import __version__
from sparkforge.boundary import read_json, write_output
from sparkforge.console import cell, say
from sparkforge.errors import InputError

Status = Literal["passed", "failed", "skipped"]


class _Sealable:
    """Mutable while filled in; once sealed (a report was written) every assignment is an error."""

    _sealed = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._sealed:
            raise FrozenInstanceError(f"cannot set {name!r}: this report was written and is now immutable")
        super().__setattr__(name, value)

    def _seal(self) -> None:
        object.__setattr__(self, "_sealed", True)


@dataclass
class Check(_Sealable):
    """One named check with its verdict, the reason for it and the evidence."""

    name: str
    status: Status
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "details": dict(self.details),
            "duration_s": round(self.duration_s, 3),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        return cls(
            name=str(data["name"]),
            status=data["status"],
            reason=str(data.get("reason", "")),
            details=dict(data.get("details", {})),
            duration_s=float(data.get("duration_s", 0.0)),
        )


@dataclass
class Report(_Sealable):
    """A checking command's result; `extra` holds command-specific top-level keys (e.g. audit's).

    Writing it (`write_json`, `write_junit`) seals it: what was written is what the report says from then on.
    """

    command: str
    subject: str
    recipe: str | None = None
    checks: list[Check] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> Literal["passed", "failed"]:
        return "failed" if any(c.status == "failed" for c in self.checks) else "passed"

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "failed"]

    def add(self, check: Check) -> Check:
        self._open()
        self.checks.append(check)
        return check

    def _open(self) -> None:
        if self._sealed:
            raise FrozenInstanceError(
                f"{self.command} {self.subject}: the report was written; it takes no checks"
            )

    def seal(self) -> None:
        """Make the report and its checks immutable (checks a tuple, extra and details read-only)."""
        if self._sealed:
            return
        for check in self.checks:
            object.__setattr__(check, "details", MappingProxyType(check.details))
            check._seal()
        object.__setattr__(self, "checks", tuple(self.checks))
        object.__setattr__(self, "extra", MappingProxyType(self.extra))
        self._seal()

    @contextmanager
    def timed(self, name: str) -> Iterator[Check]:
        """Yield a passed check to fill in; its duration is measured around the block."""
        self._open()
        check = Check(name=name, status="passed")
        start = time.monotonic()
        try:
            yield check
        finally:
            check.duration_s = time.monotonic() - start
            self.checks.append(check)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "tool": "sparkforge",
            "version": __version__,
            "command": self.command,
            "recipe": self.recipe,
            "subject": self.subject,
            "status": self.status,
            "checks": [c.to_dict() for c in self.checks],
        }
        data.update(self.extra)
        return data

    def write_json(self, path: Path, option: str = "--json") -> None:
        """Seal, then write through the boundary: atomic, never through a symlink out of the project."""
        self.seal()
        write_output(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n", option)

    def write_junit(self, path: Path, option: str = "--junit") -> None:
        self.seal()
        suite = ET.Element(
            "testsuite",
            name=f"sparkforge.{self.command}",
            tests=str(len(self.checks)),
            failures=str(len(self.failed)),
            skipped=str(sum(c.status == "skipped" for c in self.checks)),
            time=f"{sum(c.duration_s for c in self.checks):.3f}",
        )
        for check in self.checks:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"{self.command}.{self.subject}",
                name=check.name,
                time=f"{check.duration_s:.3f}",
            )
            if check.status == "failed":
                ET.SubElement(case, "failure", message=check.reason).text = json.dumps(dict(check.details))
            elif check.status == "skipped":
                ET.SubElement(case, "skipped", message=check.reason)
        write_output(path, ET.tostring(suite, encoding="utf-8", xml_declaration=True), option)

    def table_rows(self) -> list[tuple[str, str, str, str]]:
        """Each check as a table row; names and reasons escaped (a line break would forge a row)."""
        return [(cell(c.name), c.status.upper(), f"{c.duration_s:.1f}s", cell(c.reason)) for c in self.checks]


def print_report(report: Report, echo: Callable[[str], None] = say) -> None:
    """Print a summary table: rich on a TTY, plain aligned text otherwise (logs, CI, pipes)."""
    import sys

    if sys.stdout.isatty():
        _print_rich(report)
        return
    rows = report.table_rows()
    width = max([len(r[0]) for r in rows] + [5])
    echo(f"{cell(report.command)} {cell(report.subject)}: {report.status.upper()}")
    for name, status, duration, reason in rows:
        echo(f"  {name:<{width}}  {status:<7}  {duration:>7}  {reason}")


def _print_rich(report: Report) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    colours = {"PASSED": "green", "FAILED": "bold red", "SKIPPED": "yellow"}
    title = escape(f"{cell(report.command)} {cell(report.subject)}: {report.status.upper()}")
    table = Table(title=title, title_justify="left")
    for column in ("check", "status", "time", "reason"):
        table.add_column(column, overflow="fold")
    for name, status, duration, reason in report.table_rows():  # '[...]' in a name is text, not markup
        table.add_row(escape(name), f"[{colours[status]}]{status}[/]", duration, escape(reason))
    Console().print(table)


def load_report(path: Path) -> Report:
    """Read a report written by `Report.write_json` (through the boundary: a regular file of bounded JSON)."""
    data = read_json(path, "report")
    checks = data.get("checks", [])
    good = isinstance(data.get("command"), str) and isinstance(data.get("subject"), str)
    good = good and isinstance(data.get("recipe"), str | None) and isinstance(checks, list)
    for c in checks if good else ():
        good = good and isinstance(c, dict) and isinstance(c.get("name"), str)
        good = good and c.get("status") in ("passed", "failed", "skipped")
        good = good and isinstance(c.get("reason", ""), str) and isinstance(c.get("details", {}), dict)
        good = good and isinstance(c.get("duration_s", 0.0), int | float)
    if not good:
        raise InputError(
            f"report {path}: not a sparkforge report (string 'command' and 'subject', 'checks' of objects with a "
            "'name' and a status of passed, failed or skipped); fix: name the file a task's --json wrote"
        )
    known = {"tool", "version", "command", "recipe", "subject", "status", "checks"}
    return Report(
        command=data["command"],
        subject=data["subject"],
        recipe=data.get("recipe"),
        checks=[Check.from_dict(c) for c in data.get("checks", [])],
        extra={k: v for k, v in data.items() if k not in known},
    )
