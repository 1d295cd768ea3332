"""A boundary nothing bypasses: the package's AST holds no file read or write, JSON parse, HTTP call, regex made
from data or tree walk outside the boundary's modules (boundary.py, urlfetch.py), except what this
allow-list names with its reason. The list may only shrink: an entry no longer needed fails too, so it goes."""

from __future__ import annotations

from boundary_scan import BOUNDARY, KINDS, ROOT, findings

# Reasons by kind of exception, so each entry says why in words a reviewer can check.
OWN = "reads the project's own files (templates, shipped tables, patches/), never a path a user or file names"
BUILD = "writes a file of its own into a fresh mkdtemp folder or build/<recipe>/ staging it created itself"
CACHE = "the sparkforge cache it keyed itself (sha256 names, atomic rename), never a path a user names"
ENGINE = (
    "parses the JSON a local program (docker, cosign, git) printed to it: that program is the trusted tool"
)
CONTAINER = "parses what a container of the image under test printed: bounded by the command seam's capture"
TREE = "reads a file inside an upstream tree sparkforge extracted itself (its cache, sha256-checked archive)"
STATE = "this machine's own state files under ~/.cache/sparkforge or logs/ (written by sparkforge)"
SCRATCH = "writes a file into a temporary folder of its own for a container or tool to read"

ALLOWED: dict[str, tuple[set[str], str]] = {
    "sparkforge/audit/fatbin.py": (
        {"path-io"},
        "reads an ELF the audit opened by member index (archives: "
        "audit/members.py bounds each member); a binary read by offsets, not text",
    ),
    "sparkforge/audit/members.py": ({"path-io"}, "opens an archive for the capped member reader (rule 5)"),
    "sparkforge/audit/scan.py": ({"path-io"}, "opens wheels/trees for the capped member reader (rule 5)"),
    "sparkforge/context.py": ({"open"}, "the download cache's own atomic writer (mkstemp + fdopen + rename)"),
    "sparkforge/commands.py": (
        {"path-io"},
        "the command seam writes its replay script and step log under logs/",
    ),
    "sparkforge/imagebuild/hostsetup.py": (
        {"path-io"},
        "host engine set-up: its own apt sources, daemon.json "
        "and stamps under its build folder; reads its own daemon logs",
    ),
    "sparkforge/imagebuild/probe.py": ({"json", "path-io"}, f"{CONTAINER}; {BUILD}"),
    "sparkforge/imagebuild/render.py": (
        {"path-io", "walk"},
        f"{BUILD}; walks the project's own in-image scripts",
    ),
    "sparkforge/imagebuild/execute.py": (
        {"path-io"},
        "the BuildKit log its own build wrote under logs/ (last 40,000 characters)",
    ),
    "sparkforge/preflight/archplan.py": ({"path-io"}, f"{SCRATCH} (CMake scripts for the arch plan)"),
    "sparkforge/preflight/catalog.py": (
        {"json", "path-io", "walk"},
        "issue 42 owns the catalog logic; its "
        "fetches go through urlfetch (capped); a catalog folder is walked there",
    ),
    "sparkforge/preflight/checks.py": ({"path-io"}, TREE),
    "sparkforge/preflight/fetch.py": (
        {"open", "path-io"},
        "writes downloads into the cache by sha256 (the session and every request are urlfetch's)",
    ),
    "sparkforge/preflight/lock.py": (
        {"path-io"},
        "lock --write edits the recipe file in place, after _check_writable refused links out of the project",
    ),
    "sparkforge/preflight/serveflags.py": ({"path-io", "walk"}, f"issue 42 owns it; {TREE}"),
    "sparkforge/preflight/sources.py": ({"path-io"}, f"{TREE}; archives capped before extraction"),
    "sparkforge/recipe/community/fromprofile.py": (
        {"path-io"},
        "issue 42 owns recipe/community/* (export's validation copy in a temporary folder)",
    ),
    "sparkforge/recipe/community/toprofile.py": (
        {"path-io"},
        "issue 42 owns recipe/community/*: the trial copy "
        "in a temporary folder, the profile after check_output",
    ),
    "sparkforge/registry/earlier.py": (
        {"path-io", "walk"},
        "the project's own recipes at an earlier commit, from `git archive` into a temporary folder",
    ),
    "sparkforge/verify/imagefs.py": (
        {"json", "path-io"},
        f"{CACHE} (layer listings and image audits by digest)",
    ),
    "sparkforge/run/bench/runner.py": (
        {"json", "path-io"},
        f"{CONTAINER} (the bench clients' JSON); hashes a wheel the user named for the identity",
    ),
    "sparkforge/run/jobs.py": ({"json", "path-io"}, f"{OWN} (tests/image helpers); {CONTAINER}"),
    "sparkforge/verify/selection.py": (
        {"json", "path-io"},
        f"{OWN} (the selection script); {CACHE}; {CONTAINER}",
    ),
    "sparkforge/verify/size.py": ({"path-io"}, "reads files of an image filesystem it exported itself"),
    "sparkforge/verify/suite.py": ({"json", "path-io"}, f"{CONTAINER}; writes its own logs and script"),
}


def test_no_read_write_fetch_or_walk_outside_the_boundary() -> None:
    found = findings()
    unlisted = {f: sorted(k - ALLOWED.get(f, (set(), ""))[0]) for f, k in found.items()}
    unlisted = {f: k for f, k in unlisted.items() if k}
    assert unlisted == {}, (
        "these modules read, write, fetch, parse or walk outside sparkforge's boundary; route them through it "
        f"({'; '.join(f'{k}: {v}' for k, v in KINDS.items())}) or add an entry with its reason: {unlisted}"
    )


def test_the_allow_list_only_shrinks() -> None:
    # What remains is printed with its reason (pytest -rP shows it): a reviewer reads why each one stays.
    for module, (kinds, reason) in sorted(ALLOWED.items()):
        print(f"{module}: {', '.join(sorted(kinds))}: {reason}")
    found = findings()
    stale = {f: sorted(k - found.get(f, set())) for f, (k, _) in ALLOWED.items()}
    assert {f: k for f, k in stale.items() if k} == {}, "remove what the module no longer does from ALLOWED"
    assert all(len(reason) > 20 for _, reason in ALLOWED.values())
    # issue 59: the registry client (every method through urlfetch.request_url), the engine's error types, the
    # docker-save manifest, the weight progress lines, patches/ reads and hashes, node logs, workflows, csrc/'s
    # walk, a wheel's file list, cosign's envelopes and predicate, its apt sources and the suite's digest left
    # the list; no entry speaks HTTP any more.
    assert len(ALLOWED) <= 25
    assert not any("http" in kinds for kinds, _ in ALLOWED.values())


def test_the_boundary_modules_exist_and_the_scanner_sees_a_bypass(tmp_path) -> None:
    assert all((ROOT / m).is_file() for m in BOUNDARY)
    import ast

    from boundary_scan import _kinds

    planted = "import json, os, re, requests\nopen('x')\njson.loads(s)\nos.walk('/')\nre.search(p, t)\nP.read_text()"
    kinds = set().union(*(_kinds(n) for n in ast.walk(ast.parse(planted))))
    assert kinds == set(KINDS)
