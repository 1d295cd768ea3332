"""Running built images: serve profiles, one node (`serve`) and several (`cluster`), and the cluster doctor."""

from __future__ import annotations

from sparkforge.errors import SparkforgeError


class RunError(SparkforgeError):
    """A serve profile, a node or a launch is wrong or failed."""


class ProfileError(RunError):
    """A serve profile file is missing, malformed or asks for something the pinned vLLM lacks."""
