"""How Invoke reads and shows sparkforge's options: the same short flags everywhere, a placeholder on every
option that takes a value, and Invoke's own usage errors (an unknown flag, a missing option) said in the
project's words with the fix.

Invoke builds its parser from each task's `get_arguments()`; the project's Task (cli.ShortFlagTask) returns
TaskArguments and, the first time, calls `route_through_project`. Nothing happens at import time.
"""

from __future__ import annotations

import difflib
import functools

import invoke
from invoke.exceptions import ParseError
from invoke.parser import ParserContext
from invoke.parser.parser import ParseMachine

# The only short flags: one meaning in every task that has the option (never -h: that is --help).
SHORT_FLAGS = {"recipe": "r", "profile": "p", "image": "i", "json": "j"}
# Where a missing required value is found, said with the error.
REQUIRED_HINTS = {
    "recipe": "`invoke recipes` lists the recipe names",
    "profile": "the files in profiles/ name the profiles; a path to a profile file works too",
}
# Invoke's core flags that mean something inside a task context; any other (--dry, --echo ...) given after a
# task that lacks it would change how Invoke runs commands, not what the task does: refused.
CORE_FLAGS_IN_TASKS = frozenset({"--help", "-h"})


def placeholder(arg: invoke.Argument) -> str:
    """The value's name in help and errors, as argparse names it: the option's name in capitals."""
    return (arg.attr_name or arg.name or "value").upper().replace("-", "_")


def flag_names(name: str) -> list[str]:
    """An option's flags: its dashed name and, for the few in SHORT_FLAGS, its one short flag."""
    dashed = name.replace("_", "-")
    return [dashed, SHORT_FLAGS[name]] if name in SHORT_FLAGS else [dashed]


class TaskArgument(invoke.Argument):
    """An option of a sparkforge task: what marks a parser context as ours (Invoke's core flags are not). Each
    value given is typed by the boundary (sparkforge/cli/options.py) as Invoke parses it, before the task runs."""

    task_name = ""  # the task function's name, set by ShortFlagTask.get_arguments

    def set_value(self, value: object, cast: bool = True) -> None:
        if cast and isinstance(value, str):
            from sparkforge.cli.options import type_option
            from sparkforge.errors import InputError

            try:
                type_option(
                    self.task_name, (self.name or "").replace("-", "_"), value, empty_ok=self.default == ""
                )
            except InputError as exc:
                raise ParseError(f"sparkforge: {exc}") from None
        super().set_value(value, cast=cast)


def ours(context: ParserContext | None) -> bool:
    """Whether a parser context is a sparkforge task's (its options are TaskArguments)."""
    return context is not None and any(isinstance(a, TaskArgument) for a in context.args.values())


def task_help_for(context: ParserContext, flag: str) -> tuple[str, str]:
    """A sparkforge option's help line: a placeholder on every option that takes a value (Invoke shows one only
    for `str` and `int`, so whole-number and repeatable options showed none)."""
    arg = context.flags[flag]
    value = placeholder(arg)
    specs = []
    for name in context.names_for(flag):
        short = len(name.strip("-")) == 1
        spec = f" [{value}]" if short and arg.optional else f" {value}" if short else f"={value}"
        specs.append(name + (f"[{spec}]" if arg.optional and not short else spec))
    help_text = str(arg.help or "")  # a LazyHelp becomes its text here
    if arg.kind is list and "repeatable" not in help_text:
        help_text += " (repeatable)"
    return ", ".join(sorted(specs, key=len)), help_text


def usage_error(context: ParserContext | None, invoke_message: str, token: str = "") -> str:
    """Invoke's parse error for a task, rewritten: what was wrong, with the fix (Invoke's own text otherwise)."""
    if context is None or not ours(context):
        return invoke_message
    task = min((context.name, *context.aliases), key=len)  # what the user typed: serve, not serve.serve
    if token:
        known = sorted(n for n in context.flags if n.startswith("--")) + sorted(context.inverse_flags)
        near = difflib.get_close_matches(token, known, n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        if token.startswith("-"):
            return (
                f"sparkforge: `invoke {task}` has no option {token}; fix: {hint}"
                f"`invoke --help {task}` lists its options"
            )
        return (
            f"sparkforge: `invoke {task}` got {token!r}, which is neither an option nor a task; fix: "
            f"{hint}give values as --option VALUE (`invoke --help {task}` lists them)"
        )
    missing = context.missing_positional_args
    if not missing:
        return invoke_message
    parts: list[str] = []
    specs: list[str] = []
    for arg in missing:
        name = arg.name or ""
        # A one-letter option (diff's a and b) reads best by position; any other by its flag, always valid.
        spec = placeholder(arg) if len(name) == 1 else f"--{flag_names(name)[0]} {placeholder(arg)}"
        hint = REQUIRED_HINTS.get(name)
        parts.append(spec + (f" ({hint})" if hint else ""))
        specs.append(spec)
    return (
        f"sparkforge: `invoke {task}` needs {' and '.join(parts)}; fix: `invoke {task} {' '.join(specs)} ...` "
        f"(`invoke --help {task}` explains every option)"
    )


@functools.cache
def route_through_project() -> None:
    """Once per process, when Invoke first asks a sparkforge task for its options: help lines of sparkforge
    options show placeholders, and the parse machine reports unknown tokens and missing options of sparkforge
    tasks through usage_error. Invoke offers no hook for either (its loader copies the root collection into a
    plain Collection), so its two classes get these wrappers; contexts that are not ours behave as before."""
    handle = ParseMachine.handle
    complete_context = ParseMachine.complete_context
    help_for = ParserContext.help_for

    def checked_help_for(self: ParserContext, flag: str) -> tuple[str, str]:
        arg = self.flags.get(flag)
        if not isinstance(arg, TaskArgument):
            return help_for(self, flag)
        if arg.takes_value:
            return task_help_for(self, flag)
        return help_for(self, flag)[0], str(arg.help or "")  # a LazyHelp becomes its text here

    def checked_handle(self: ParseMachine, token: str) -> None:
        context = self.context
        if (
            ours(context)
            and self.current_state != "unknown"
            and token not in context.flags
            and token not in context.inverse_flags
            and not self.waiting_for_flag_value
            and (token.startswith("-") or not context.missing_positional_args)
            and token not in self.contexts
            and token not in CORE_FLAGS_IN_TASKS
        ):
            raise ParseError(usage_error(context, "", token), context)
        handle(self, token)

    def checked_complete(self: ParseMachine) -> None:
        context = self.context
        if ours(context) and context.missing_positional_args:
            raise ParseError(usage_error(context, ""), context)
        complete_context(self)

    ParserContext.help_for = checked_help_for  # type: ignore[method-assign]
    ParseMachine.handle = checked_handle  # type: ignore[method-assign]
    ParseMachine.complete_context = checked_complete  # type: ignore[method-assign]
