"""Turn scanned fatbins into the audit report: per-library verdicts, `--require` checks and a human table.

Choice: a required library that runs only through PTX JIT passes (with "JIT only" in the reason). The
kernels do run correctly on the target; the cost is a slow first start while the driver compiles them
(cached afterwards). Failing here would reject working images; the table and JSON still flag it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sparkforge.audit.compat import (
    VERDICTS,
    GpuTarget,
    Verdict,
    best_verdict,
    stranded_units,
    unit_counts,
    verdict_of,
)
from sparkforge.audit.fatbin import Entry, FatbinFile
from sparkforge.console import cell
from sparkforge.report import Check, Report

_KIND_ORDER = {"sass": 0, "ptx": 1, "lto": 2}
_VARIANT_ORDER = {"": 0, "a": 1, "f": 2}
MAX_LISTED = 8  # names listed in a reason before "and N more"


@dataclass(frozen=True, slots=True)
class ScannedFile:
    """A file found to carry device code, or one that looked like ELF but could not be read."""

    path: str
    fatbin: FatbinFile | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class LibraryAudit:
    """One library's entry counts and verdicts for a target."""

    path: str
    entries: dict[str, int]
    verdict: Verdict
    required: bool
    units: dict[str, int]
    stranded: int = 0  # units built for the target's generation that cannot run on it

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "entries": self.entries,
            "verdict": self.verdict,
            "required": self.required,
            "units": self.units,
            "stranded_units": self.stranded,
        }


def _entry_order(key: tuple[str, int, str]) -> tuple[int, str, int, int]:
    kind, arch, variant = key
    return (_KIND_ORDER.get(kind, 9), kind, arch, _VARIANT_ORDER.get(variant, 9))


def entry_counts(entries: Sequence[Entry]) -> dict[str, int]:
    """Entries counted by target, ordered SASS, PTX, LTO then by arch: {"sass_120": 50, "ptx_80": 19}."""
    counts = Counter((e.kind, e.arch, e.variant) for e in entries)
    return {f"{k}_{a}{v}": counts[(k, a, v)] for k, a, v in sorted(counts, key=_entry_order)}


def audit_library(path: str, fatbin: FatbinFile, target: GpuTarget, required: bool) -> LibraryAudit:
    """A library's verdict is the best of its entries; `units` counts its containers by their own best."""
    entries = list(fatbin.entries)
    return LibraryAudit(
        path=path,
        entries=entry_counts(entries),
        verdict=best_verdict(verdict_of(e, target) for e in entries),
        required=required,
        units=unit_counts(fatbin.containers, target),
        stranded=stranded_units(fatbin.containers, target),
    )


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A path glob (`*` within a directory, `**` across) matching whole paths or a suffix at a `/` boundary.

    `vllm/_C*.so` matches `vllm/_C.abi3.so` in a wheel and `usr/lib/python3/dist-packages/vllm/_C.abi3.so`
    in an image; a leading `/` anchors the glob at the target's root.
    """
    anchored = pattern.startswith("/")
    body = pattern.lstrip("/")
    out: list[str] = []
    i = 0
    while i < len(body):
        if body.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif body[i] == "*":
            out.append("[^/]*")
            i += 1
        elif body[i] == "?":
            out.append("[^/]")
            i += 1
        elif body[i] == "[" and (close := body.find("]", i + 2)) > 0:
            inner = body[i + 1 : close]
            negate = inner.startswith("!")
            inner = re.escape(inner[1:] if negate else inner).replace("\\-", "-")
            out.append(f"[^/{inner}]" if negate else f"[{inner}]")  # never let a class match the `/`
            i = close + 1
        else:
            out.append(re.escape(body[i]))
            i += 1
    return re.compile(("" if anchored else "(?:.*/)?") + "".join(out))


def glob_matches(pattern: str, path: str) -> bool:
    return glob_regex(pattern).fullmatch(path) is not None


def scope_filter(only: Sequence[str] | None) -> Callable[[str], bool] | None:
    """A path test matching any of the `only` globs (one regex for all); None when every file is in scope."""
    if only is None:
        return None
    if not only:
        return lambda path: False
    combined = re.compile("|".join(f"(?:{glob_regex(g).pattern})" for g in sorted(set(only))))
    return lambda path: combined.fullmatch(path) is not None


def name_filter(only: Sequence[str] | None) -> Callable[[str], bool] | None:
    """A test of a file's base name that every path `scope_filter(only)` accepts passes (the globs' last parts);
    None when a glob's last part may cross directories (`**`) or every file is in scope."""
    if only is None or any("**" in g.rsplit("/", 1)[-1] for g in only):
        return None
    if not only:
        return lambda name: False
    combined = re.compile(
        "|".join(f"(?:{glob_regex(g.rsplit('/', 1)[-1]).pattern})" for g in sorted(set(only)))
    )
    return lambda name: combined.fullmatch(name) is not None


def _listing(items: Sequence[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    return shown + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")


def require_check(
    pattern: str,
    libraries: Sequence[LibraryAudit],
    unreadable: Sequence[ScannedFile],
    target: GpuTarget,
    scoped: bool = False,
) -> Check:
    """Failed when no library matches `pattern`, or a matched one has nothing that runs on `target`."""
    matched = [lib for lib in libraries if glob_matches(pattern, lib.path)]
    broken = [f for f in unreadable if glob_matches(pattern, f.path)]
    details: dict[str, Any] = {
        "glob": pattern,
        "matched": [{"path": lib.path, "verdict": lib.verdict} for lib in matched],
        "unreadable": [{"path": f.path, "error": f.error} for f in broken],
    }
    check = Check(name=f"require:{pattern}", status="passed", details=details)
    none = [f"{lib.path} ({' '.join(lib.entries)})" for lib in matched if lib.verdict == "none"]
    stranded = [f"{lib.path} ({lib.stranded} units)" for lib in matched if lib.stranded]
    jit = [lib.path for lib in matched if lib.verdict == "jit"]
    if broken:
        check.status = "failed"
        check.reason = f"unreadable: {_listing([f.path for f in broken])}; " + broken[0].error
    elif not matched:
        check.status = "failed"
        check.reason = (
            f"no library with device code matches {pattern!r} "
            f"({'every file it matches was opened' if scoped else f'{len(libraries)} scanned'}); "
            f"check the glob or whether the build produced it"
        )
    elif none:
        check.status = "failed"
        check.reason = f"no kernel runs on {target.name} in {_listing(none)}"
    elif stranded:
        check.status = "failed"
        check.reason = (
            f"kernels built for sm_{target.major}x cannot run on {target.name} in {_listing(stranded)} "
            f"(e.g. sm_{target.major}0a cubins); rebuild with TORCH_CUDA_ARCH_LIST covering {target.name}"
        )
    elif jit:
        check.reason = f"JIT only: slow first start: {_listing(jit)} run on {target.name} only through PTX"
    else:
        check.reason = ", ".join(f"{lib.path}: {lib.verdict}" for lib in matched[:MAX_LISTED])
    return check


def coverage_check(
    libraries: Sequence[LibraryAudit], unreadable: Sequence[ScannedFile], target: GpuTarget
) -> Check:
    """The check when nothing is required: passes and reports the counts; fails when nothing was audited."""
    if not libraries:
        where = (
            f"; {len(unreadable)} unreadable: {_listing([f.path for f in unreadable])}" if unreadable else ""
        )
        return Check(
            name="coverage",
            status="failed",
            reason=(
                f"nothing was audited: no CUDA device code (no fatbinary in any ELF library, object or wheel) on "
                f"{target.name}{where}; fix: point the audit at the folder, wheel or image holding the CUDA "
                "libraries (e.g. site-packages/vllm)"
            ),
            details={"unreadable": [{"path": f.path, "error": f.error} for f in unreadable]},
        )
    counts = Counter(lib.verdict for lib in libraries)
    entries = sum(sum(lib.entries.values()) for lib in libraries)
    reason = (
        f"{len(libraries)} libraries with device code ({entries} entries) on {target.name}: "
        + ", ".join(f"{v} {counts.get(v, 0)}" for v in VERDICTS)
    )
    if unreadable:
        reason += f"; {len(unreadable)} unreadable: {_listing([f.path for f in unreadable])}"
    return Check(
        name="coverage",
        status="passed",
        reason=reason,
        details={"unreadable": [{"path": f.path, "error": f.error} for f in unreadable]},
    )


@dataclass(frozen=True, slots=True)
class ScanResult:
    """Files with device code (or unreadable ones) and how many files were looked at."""

    files: tuple[ScannedFile, ...]
    files_scanned: int
    not_opened: int = 0  # files outside the scope (libraries the verdict does not need): never opened


def build_report(
    subject: str,
    target: GpuTarget,
    scan: ScanResult,
    require: Sequence[str],
    duration_s: float,
    *,
    only: Sequence[str] | None = None,
) -> Report:
    """The audit report in the shape of every check report (sparkforge/report.py: JSON, JUnit XML, table).

    `only`: the globs the scan was limited to (None: every file); the summary says so, since the libraries and
    counts then cover only those (the required checks' answers are the same either way)."""
    scanned, files_scanned, not_opened = scan.files, scan.files_scanned, scan.not_opened
    good = sorted((f for f in scanned if f.fatbin is not None), key=lambda f: f.path)
    unreadable = sorted((f for f in scanned if f.fatbin is None), key=lambda f: f.path)
    libraries = [
        audit_library(f.path, f.fatbin, target, any(glob_matches(g, f.path) for g in require))
        for f in good
        if f.fatbin is not None
    ]
    if require:
        checks = [require_check(g, libraries, unreadable, target, only is not None) for g in require]
    else:
        checks = [coverage_check(libraries, unreadable, target)]
    checks[0].duration_s = duration_s  # the scan is the whole cost; the checks themselves are instant
    by_verdict = Counter(lib.verdict for lib in libraries)
    summary = {
        "entries": sum(sum(lib.entries.values()) for lib in libraries),
        "libraries": len(libraries),
        "by_verdict": {v: by_verdict.get(v, 0) for v in VERDICTS},
        "files_scanned": files_scanned,
        "unreadable": len(unreadable),
    }
    if only is not None:
        summary["scope"] = sorted(set(only))
        summary["not_opened"] = not_opened
    return Report(
        command="audit",
        subject=subject,
        checks=checks,
        extra={"target": target.name, "libraries": [lib.to_dict() for lib in libraries], "summary": summary},
    )


def compact_entries(entries: dict[str, int]) -> str:
    """`sass 80:71 90a:27 120:50 120f:35 | ptx 80:19`: one group per kind, arch:count in order."""
    groups: dict[str, list[str]] = {}
    for key, count in entries.items():
        kind, _, arch = key.partition("_")
        groups.setdefault(kind, []).append(f"{arch}:{count}")
    return " | ".join(f"{kind} {' '.join(items)}" for kind, items in groups.items())


def scope_note(summary: dict[str, Any]) -> str:
    """One line saying that only some libraries were opened, and how to see every one."""
    return (
        f"only the libraries the verdict needs were opened ({', '.join(summary['scope']) or 'none'}); "
        f"{summary.get('not_opened', 0)} other files were not (`invoke audit TARGET` lists every library)"
    )


def format_audit_table(report: Report) -> str:
    """The human table: library, entries, verdict, units (native/family/jit/none), then a summary line."""
    libraries = report.extra.get("libraries", [])
    target = report.extra.get("target", "?")
    rows = [("library", "entries", "verdict", "units n/f/j/x")]
    for lib in libraries:
        units = lib.get("units", {})
        rows.append(
            (
                cell(lib["path"]) + (" *" if lib.get("required") else ""),  # a member name: escaped
                compact_entries(lib["entries"]),
                lib["verdict"],
                "/".join(str(units.get(v, 0)) for v in VERDICTS),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]
    summary = report.extra.get("summary", {})
    by_verdict = summary.get("by_verdict", {})
    failed = [c.name for c in report.failed]
    lines.append(
        f"{target}: {summary.get('libraries', 0)} libraries, {summary.get('entries', 0)} entries; "
        + ", ".join(f"{v} {by_verdict.get(v, 0)}" for v in VERDICTS)
        + f"; {report.status.upper()}"
        + (f" ({', '.join(failed)})" if failed else "")
        + (" (* = required)" if any(lib.get("required") for lib in libraries) else "")
    )
    if "scope" in summary:
        lines.append(scope_note(summary))
    return "\n".join(lines)
