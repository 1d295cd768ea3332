"""The Invoke layer (nothing below it imports Invoke). Shared glue: user errors become a one-paragraph message and a non-zero exit."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import invoke
from invoke.exceptions import Exit, ParseError

from sparkforge.cli.families import GLOBAL, Family, finish_report, takes_session, with_families
from sparkforge.console import say, warn
from sparkforge.errors import SparkforgeError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn SparkforgeError into `Exit(message)`: a clear message, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SparkforgeError as exc:
            raise Exit(f"sparkforge: {exc}", code=exc.exit_code) from None
        except KeyboardInterrupt:
            raise Exit("sparkforge: interrupted; nothing was tagged", code=130) from None

    return wrapper  # type: ignore[return-value]


class LazyHelp:
    """An option's help computed when help is shown: a registry's rows (conform rows, bench suites, preflight
    checks) would otherwise be imported, with everything they import, by every command, `invoke --list` too."""

    def __init__(self, make: Callable[[], str]) -> None:
        self.make = make

    def __str__(self) -> str:
        return self.make()


class ShortFlagTask(invoke.Task):
    """Invoke's Task with the project's short flags: only those in `parsing.SHORT_FLAGS` (one meaning in every
    task), never one Invoke picks from the name's first free letter (which gave `-h` to --push-by-digest on
    build and `-t` to different options on different tasks)."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        from sparkforge.cli.parsing import flag_names

        opts = super().arg_opts(name, default, taken_names)
        dashed, *short = flag_names(name)
        opts["names"] = [dashed, *(s for s in short if s not in taken_names)]
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[invoke.Argument]:
        from sparkforge.cli.options import task_key
        from sparkforge.cli.parsing import TaskArgument, route_through_project

        route_through_project()
        helps = dict(
            self.help
        )  # Invoke pops each option's help as it reads it: a second reading would have none
        try:
            args = super().get_arguments(ignore_unknown_help=ignore_unknown_help)
        finally:
            self.help.update(helps)
        for arg in args:
            arg.__class__ = TaskArgument  # the same object, marked as a sparkforge option
            arg.task_name = task_key(self.body)  # the boundary types its values (sparkforge.cli.options)
        return args


def task(*args: Any, families: tuple[Family, ...] = (), **kwargs: Any) -> Any:
    """Invoke's `@task` (bare or with options), building a ShortFlagTask: every task of the CLI uses this one.
    A body that declares `session` gets the one Session of its call, built from GLOBAL's options and those of
    `families` (cli/families.py), which Invoke shows in its place."""
    kwargs.setdefault("klass", ShortFlagTask)

    def make(fn: Callable[..., Any]) -> Any:
        if takes_session(fn) or families:  # a family's value is checked before the body: its errors too
            fn = user_errors(with_families(fn, (GLOBAL, *families), kwargs.setdefault("help", {})))
        return invoke.task(fn, **kwargs)

    if len(args) == 1 and callable(args[0]) and not kwargs.get("help") and not families:
        return make(args[0])
    return make


class Whole(int):
    """The kind of every whole-number option (`port: int = Whole(8000)`): Invoke converts a value with its
    default's type, and `int()` reads '1_8' as 18 and '٣' as 3; this takes ASCII digits only (a sign allowed),
    at most 40, and refuses anything else as a usage error naming the value, before the task runs."""

    def __new__(cls, value: object = 0) -> Whole:
        if isinstance(value, str):
            from sparkforge.boundary import ascii_number

            parsed = ascii_number(value.strip(), integer=True)
            if parsed is None:
                raise ParseError(
                    f"sparkforge: {value[:60]!r} given to a whole-number option is not a whole number in ASCII "
                    "digits ('1_0', '٣', '²', '0x10' and '1e3' are refused); fix: write it as digits, e.g. 8000"
                )
            value = parsed
        return super().__new__(cls, value)  # type: ignore[arg-type]


# One default output for the whole tool (sparkforge/console.py): progress and results on stdout, warnings on stderr.
echo = say


__all__ = ["Whole", "echo", "finish_report", "user_errors", "warn"]
