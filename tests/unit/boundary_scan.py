"""What test_boundary_ast.py looks for: the calls that read, write, fetch, parse or scan outside the boundary."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkforge"
# The boundary's own modules: the one place these calls belong.
BOUNDARY = {"sparkforge/boundary.py", "sparkforge/urlfetch.py"}
KINDS = {
    "open": "open() / os.open() / os.fdopen(): a file opened by hand (boundary.read_bytes, write_output)",
    "path-io": "Path.read_text/read_bytes/write_text/write_bytes/open: boundary.read_text, write_output",
    "json": "json.load(s): boundary.read_json / parse_json (no NaN, no key twice, depth and size caps)",
    "http": "requests / urllib / http.client: urlfetch.fetch_url (redirect policy, deadline, byte caps)",
    "regex-scan": "re.search/match/findall/... with a pattern made from data: boundary.linear_regex (RE2)",
    "walk": "os.walk / Path.rglob: boundary.walk_tree (depth and count, no symlink followed)",
}
_MODULES = {"tarfile", "zipfile", "gzip", "io", "os", "webbrowser", "codecs", "bz2", "lzma"}
_PATH_IO = {"read_text", "read_bytes", "write_text", "write_bytes"}
_SCANS = {"search", "match", "findall", "finditer", "sub", "subn", "split"}
_HTTP = ("requests", "urllib.request", "urllib.error", "http.client", "urllib3")


def _literal(node: ast.AST) -> bool:
    """A pattern written in the source (a string, an f-string of escaped parts, re.escape(...))."""
    if isinstance(node, ast.Constant | ast.JoinedStr):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("escape", "replace")
    )


def _kinds(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        return {"http"} if any(n == h or n.startswith(h + ".") for n in names for h in _HTTP) else set()
    if not isinstance(node, ast.Call):
        return set()
    func = node.func
    if isinstance(func, ast.Name):
        return {"open"} if func.id == "open" else set()
    if not isinstance(func, ast.Attribute):
        return set()
    owner = func.value.id if isinstance(func.value, ast.Name) else ""
    name = func.attr
    if (owner == "os" and name in ("open", "fdopen")) or (owner == "io" and name == "open"):
        return {"open"}
    if (owner == "os" and name == "walk") or name == "rglob":
        return {"walk"}
    if owner == "json" and name in ("load", "loads"):
        return {"json"}
    if owner in ("requests", "urllib", "urllib3"):
        return {"http"}
    if owner == "re" and name in _SCANS and node.args and not _literal(node.args[0]):
        return {"regex-scan"}  # a pattern made from data: what it costs over a long text is not known here
    if name in _PATH_IO or (
        name == "open" and owner not in _MODULES and not isinstance(func.value, ast.Call)
    ):
        return {"path-io"}
    return set()


# The in-image suite runs inside images with only the image's Python (it cannot import the boundary); what it
# reads is the image's own lock and files, and the host trusts nothing it prints before verify's checks of it.
INIMAGE = "sparkforge/verify/inimage/"


def findings() -> dict[str, set[str]]:
    """{module path: kinds found}, for every module of the package outside the boundary."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in BOUNDARY or rel.startswith(INIMAGE):
            continue
        kinds = set().union(*(_kinds(n) for n in ast.walk(ast.parse(path.read_text()))))
        if kinds:
            out[rel] = kinds
    return out
