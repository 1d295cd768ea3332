"""Registries for extension points: each stage declares its rows once (name, help, order, function, the profile
key that configures it), and everything a user reads about them is generated from that declaration: the
`--checks` parser and its error, help texts, the profile schema's allowed values and the docs tables.

A stage owns one `Registry` (conform rows, bench suites, verify checks, preflight checks, doctor stages). Adding
a row is the row's function in its module and one `Entry` line in the stage's registry; docs/contributing.md
says how. Docs tables sit between `<!-- registry:NAME -->` and `<!-- /registry:NAME -->` markers; a unit test
regenerates each and fails when the page is stale (`invoke docs.tables` rewrites them; cli/docs.py lists
the registries and their pages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One row of a stage: what users call it, what it does (one line), and the function that runs it."""

    name: str
    help: str
    run: F
    key: str | None = None  # the profile or recipe key that configures the row, where one does
    default: bool = True  # selected when the user names no rows


class Registry(Generic[F]):
    """The rows of one stage, in the order they run. Names are unique, lowercase words joined by '-', '.' or '_'."""

    def __init__(
        self,
        stage: str,
        option: str,
        entries: Sequence[Entry[F]],
        error: type[Exception],
        columns: tuple[str, str, str] = ("row", "what it checks", "profile key"),
    ) -> None:
        names = [e.name for e in entries]
        duplicate = sorted({n for n in names if names.count(n) > 1})
        if duplicate:
            raise ValueError(f"{stage}: rows declared twice: {', '.join(duplicate)}")
        bad = [
            n
            for n in names
            if not n or not all((c.isalnum() and c.islower()) or c.isdigit() or c in "-._" for c in n)
        ]
        if bad:
            raise ValueError(f"{stage}: row names must be lowercase words joined by '-', '.' or '_': {bad}")
        self.stage = stage
        self.option = option
        self.error = error
        self.columns = columns  # the docs table's headings: name, help, key
        self._entries = tuple(entries)
        self._by_name = {e.name: e for e in self._entries}

    def __iter__(self) -> Iterator[Entry[F]]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self._entries)

    def defaults(self) -> tuple[str, ...]:
        return tuple(e.name for e in self._entries if e.default)

    def get(self, name: str) -> Entry[F]:
        try:
            return self._by_name[name]
        except KeyError:
            raise self.error(self._unknown([name])) from None

    def parse(self, text: str) -> tuple[str, ...]:
        """A comma-separated selection as the user typed it, in the registry's order; an unknown name is an
        error naming the option and every known name, before anything runs."""
        asked = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in asked if n not in self._by_name]
        if unknown:
            raise self.error(self._unknown(unknown))
        return tuple(n for n in self.names() if n in asked)

    def _unknown(self, names: Sequence[str]) -> str:
        return (
            f"{self.option}: unknown {self.stage} row {', '.join(repr(n) for n in names)}; nothing was run; "
            f"fix: choose from {', '.join(self.names())}"
        )

    def help_text(self, lead: str = "") -> str:
        """The option's help: the lead sentence, then every row with its one line."""
        rows = "; ".join(f"{e.name}: {e.help}" for e in self._entries)
        return f"{lead} {rows}".strip() if lead else rows

    def markdown_table(self) -> str:
        keyed = any(e.key for e in self._entries)
        columns = self.columns if keyed else self.columns[:2]
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for e in self._entries:
            cells = [f"`{e.name}`", e.help.replace("|", "\\|")]
            if keyed:
                cells.append(f"`{e.key}`" if e.key else "")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def marker(self) -> tuple[str, str]:
        slug = self.stage.replace(" ", "-")
        return f"<!-- registry:{slug} -->", f"<!-- /registry:{slug} -->"

    def render_into(self, page: str) -> str:
        return render_between(page, self.marker(), self.markdown_table())


class Table(Protocol):
    """What a docs page shows between its markers: a Registry's rows, or a schema's keys (recipe/fields.py)."""

    def render_into(self, page: str) -> str: ...


def render_between(page: str, marker: tuple[str, str], table: str) -> str:
    """`page` with the text between the markers replaced by `table`; ValueError when the page has no markers
    (the docs must show the table where users look for it)."""
    start, end = marker
    head, found, rest = page.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found or not found_end:
        raise ValueError(f"no {start} ... {end} block in the page")
    return f"{head}{start}\n{table}\n{end}{tail}"


def stale_tables(pages: Iterable[tuple[Table, Path]], *, write: bool = False) -> list[Path]:
    """The docs pages whose registry table differs from the registry (rewritten in place with write=True)."""
    from sparkforge.boundary import read_text, write_output

    stale = []
    for registry, page in pages:
        text = read_text(page, "docs page", 1 << 20)
        fresh = registry.render_into(text)
        if fresh != text:
            stale.append(page)
            if write:
                write_output(page, fresh, "docs page")
    return stale
