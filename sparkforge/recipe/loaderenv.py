"""The variables a sparkforge build recipe may not bake into an image's ENV (they change how every process in the
image finds and loads code).

Only the project's own build recipes (reviewed in this repository) use this list. What a serve profile or a
community recipe may set is decided by the allow-list, sparkforge/recipe/allowlist.py, never by a deny-list.
"""

from __future__ import annotations

from collections.abc import Iterable

# Variables that change how every process in the image finds and loads code: never set from a recipe.
LOADER_ENV = frozenset(
    {
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONSAFEPATH",
        "PYTHONNOUSERSITE",
        "PYTHONEXECUTABLE",
        "VIRTUAL_ENV",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_CONSTRAINT",
        "PIP_REQUIRE_VIRTUALENV",
        "BASH_ENV",
        "ENV",
        "SHELL",
        "IFS",
        "HOME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CUDA_HOME",
    }
)


def loader_env_names(names: Iterable[str]) -> list[str]:
    """The names among `names` that LOADER_ENV refuses (the one deny list for recipes and serve profiles)."""
    return sorted(n for n in names if n.upper() in LOADER_ENV or n.upper().startswith(("LD_", "DYLD_")))
