"""Runs `invoke ARGS...` with the Dockerfile template read from TEMPLATES_DIR instead of dockerfiles/.

Usage: python tests/engine/planted_invoke.py TEMPLATES_DIR ARGS...
test_rebuild.py plants a non-deterministic step in a copy of the real template; the build and `rebuild --check`
then run the real command line on it (the rendered context is what BuildKit sees; nothing else changes).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from invoke.main import program  # noqa: E402

from sparkforge.imagebuild import render  # noqa: E402

if __name__ == "__main__":
    render.TEMPLATES_DIR = Path(sys.argv[1])
    sys.argv = ["invoke", "--search-root", str(REPO), *sys.argv[2:]]
    program.run()
