"""One exception family; every message says what failed, where, and how to fix it."""

from __future__ import annotations


class SparkforgeError(Exception):
    """A user-facing failure. Tasks print the message and exit non-zero, never a traceback."""

    exit_code = 1


class RecipeError(SparkforgeError):
    """A recipe file is missing, malformed or inconsistent."""


class RenderError(SparkforgeError):
    """The build context could not be rendered."""


class CommandError(SparkforgeError):
    """An external program failed or could not be started."""


class EngineError(SparkforgeError):
    """The container engine is missing, stopped or refused an operation."""


class AuditError(SparkforgeError):
    """A binary could not be read or a kernel-coverage requirement is unmet."""


class PreflightError(SparkforgeError):
    """Upstream facts could not be obtained or contradict the recipe."""


class VerifyError(SparkforgeError):
    """An image failed verification."""


class PublishError(SparkforgeError):
    """A push, manifest merge or pull was refused."""


class RunError(SparkforgeError):
    """A serve profile, a node or a launch is wrong or failed."""


class ProfileError(RunError):
    """A serve profile file is missing, malformed or asks for something the pinned vLLM lacks."""


class InputError(SparkforgeError):
    """A file or option handed to sparkforge is refused at the input boundary (sparkforge/boundary.py)."""
