"""The Invoke layer (nothing below it imports Invoke). Shared glue: user errors become a one-paragraph message and a non-zero exit."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.exceptions import Exit

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


# One default output for the whole tool (sparkforge/console.py): progress and results on stdout, warnings on stderr.
echo = say
__all__ = ["echo", "user_errors", "warn"]
