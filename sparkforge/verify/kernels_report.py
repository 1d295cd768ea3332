"""The kernel report of one image: audit verdicts per library, the JIT toolchain checks, and the vLLM backends
that can run on the recipe's GPU, as JSON (a sparkforge report) and Markdown (a release page).

The backend rule is deliberately simple and stated in every report (`RULE`): a backend needs some compiled
libraries (matched by path) and/or a serve-time compiler (one of the in-image JIT checks). A library counts
by its audit verdict (its best way to run on the target); a compiler counts as "jit" when its check passed.
A backend's verdict is the worst of its needs; it is usable when that is native, family or jit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkforge.audit.coverage import glob_matches
from sparkforge.console import md_cell, md_code
from sparkforge.report import Check, Report

ORDER = ("native", "family", "jit", "none", "missing", "unchecked")  # best first
USABLE = ("native", "family", "jit")
JIT_CHECKS = ("jit.toolchain", "jit.triton", "jit.flashinfer")
RULE = (
    "A backend needs the listed libraries (glob over the image's paths) and serve-time compilers (in-image JIT "
    "checks). A library counts by its audit verdict for the target (native: a cubin for it or an older minor "
    "of its major; family: an 'f' cubin; jit: PTX only; none; missing: not in the image). A compiler counts as "
    "'jit' when its check passed, 'none' when it failed or was skipped, 'unchecked' when no verify report was "
    "given. A backend's verdict is the worst of its needs; native, family and jit are usable. Library verdicts "
    "are per library: a library with native units may still hold other kernels built only for other GPUs."
)


@dataclass(frozen=True)
class Backend:
    """One vLLM backend and what it needs in the image."""

    name: str
    kind: str  # attention, moe, fp8
    libraries: tuple[str, ...] = ()  # globs, each must match a library with device code
    compilers: tuple[str, ...] = ()  # in-image JIT checks that must pass

    def needs(self) -> tuple[str, ...]:
        return (*self.libraries, *self.compilers)


# vLLM's names (VLLM_ATTENTION_BACKEND, the MoE and FP8 kernel paths) and where their kernels live.
BACKENDS: tuple[Backend, ...] = (
    Backend("FLASH_ATTN (FA2)", "attention", ("vllm/vllm_flash_attn/_vllm_fa2_C*.so",)),
    Backend("FLASH_ATTN (FA3)", "attention", ("vllm/vllm_flash_attn/_vllm_fa3_C*.so",)),
    Backend("FLASHINFER", "attention", (), ("jit.toolchain", "jit.flashinfer")),
    Backend("TRITON_ATTN", "attention", (), ("jit.triton",)),
    Backend("FLASHMLA", "attention", ("vllm/_flashmla_C*.so",)),
    Backend("fused_moe (Triton)", "moe", ("vllm/_moe_C*.so",), ("jit.triton",)),
    Backend("marlin / CUTLASS MoE (vLLM _moe_C, _C)", "moe", ("vllm/_moe_C*.so", "vllm/_C*.so")),
    Backend("FlashInfer CUTLASS MoE", "moe", (), ("jit.toolchain", "jit.flashinfer")),
    Backend("CUTLASS scaled_mm (vLLM _C)", "fp8", ("vllm/_C*.so",)),
    Backend("Triton block FP8", "fp8", (), ("jit.triton",)),
    Backend("torch._scaled_mm (cuBLASLt)", "fp8", ("torch/lib/libtorch_cuda.so",)),
)


def worst(verdicts: Sequence[str]) -> str:
    return max(verdicts, key=ORDER.index) if verdicts else "missing"


def _library_verdict(pattern: str, libraries: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]]:
    found = [lib for lib in libraries if glob_matches(pattern, str(lib["path"]))]
    if not found:
        return "missing", []
    best = min((str(lib["verdict"]) for lib in found), key=ORDER.index)
    return best, [str(lib["path"]) for lib in found]


def _compiler_verdict(name: str, jit: Mapping[str, Mapping[str, Any]] | None) -> str:
    if jit is None:
        return "unchecked"
    check = jit.get(name)
    return "jit" if check and check.get("status") == "passed" else "none"


def backend_verdicts(
    libraries: Sequence[Mapping[str, Any]], jit: Mapping[str, Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """Each backend of BACKENDS with the verdict of each need and its own (the worst)."""
    out = []
    for backend in BACKENDS:
        needs = []
        for pattern in backend.libraries:
            verdict, paths = _library_verdict(pattern, libraries)
            needs.append({"need": pattern, "verdict": verdict, "paths": paths})
        for name in backend.compilers:
            needs.append({"need": name, "verdict": _compiler_verdict(name, jit), "paths": []})
        verdict = worst([n["verdict"] for n in needs])
        out.append(
            {
                "name": backend.name,
                "kind": backend.kind,
                "verdict": verdict,
                "usable": verdict in USABLE,
                "needs": needs,
            }
        )
    return out


def jit_results(checks: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """The JIT toolchain checks of a verify report's checks (None: no verify report to read them from)."""
    if checks is None:
        return None
    return {
        str(c["name"]): {"status": c.get("status"), "reason": c.get("reason", "")}
        for c in checks
        if c.get("name") in JIT_CHECKS
    }


def kernel_report(
    audit: Report,
    *,
    recipe: str | None = None,
    verify_checks: Sequence[Mapping[str, Any]] | None = None,
    facts: Mapping[str, Any] | None = None,
) -> Report:
    """The kernel report of one image from its audit and (optionally) its verify report's checks.

    `facts` (versions from labels and lock, the image digest) is copied into the report as it is.
    """
    audit_data = audit.to_dict()
    libraries = list(audit_data.get("libraries") or [])
    jit = jit_results(verify_checks)
    backends = backend_verdicts(libraries, jit)
    report = Report(command="kernels", subject=audit.subject, recipe=recipe)
    for check in audit_data.get("checks") or []:
        report.add(Check.from_dict({**check, "name": f"audit.{check['name']}"}))
    for name, result in (jit or {}).items():
        status = str(result["status"]) if result["status"] in ("passed", "failed") else "skipped"
        report.add(Check(name, status, str(result["reason"])))
    usable = [b["name"] for b in backends if b["usable"]]
    report.add(
        Check(
            "backends",
            "passed",
            f"{len(usable)} of {len(backends)} vLLM backends usable on {audit_data.get('target')}",
            {"usable": usable},
        )
    )
    report.extra.update(
        {
            "target": audit_data.get("target"),
            "libraries": libraries,
            "summary": audit_data.get("summary"),
            "jit": jit,
            "backends": backends,
            "rule": RULE,
            "facts": dict(facts or {}),
        }
    )
    return report


def coverage_summary(data: Mapping[str, Any]) -> dict[str, Any]:
    """The short form kept in history entries and shown by pull: verdict counts and usable backends."""
    summary = data.get("summary") or {}
    return {
        "target": data.get("target"),
        "by_verdict": dict(summary.get("by_verdict") or {}),
        "native": sorted(
            str(lib["path"]) for lib in data.get("libraries") or [] if lib["verdict"] == "native"
        ),
        "usable_backends": [b["name"] for b in data.get("backends") or [] if b.get("usable")],
    }


def to_markdown(data: Mapping[str, Any]) -> str:
    """The report (its JSON form) as Markdown for a release page."""
    target = data.get("target")
    facts = data.get("facts") or {}
    lines = [f"# Kernel report: {md_cell(data.get('subject'))}", ""]  # untrusted text: md_cell escapes it
    lines.append(
        f"Recipe {md_code(data.get('recipe'))}, GPU {md_code(target)}, status **{data.get('status')}**."
    )
    if facts:
        lines += ["", "| fact | value |", "|---|---|"]
        lines += [f"| {md_cell(k)} | {md_code(v)} |" for k, v in sorted(facts.items())]
    by = (data.get("summary") or {}).get("by_verdict") or {}
    lines += ["", f"## Libraries ({', '.join(f'{k} {v}' for k, v in by.items())})", ""]
    lines += ["| library | verdict | units native/family/jit/none |", "|---|---|---|"]
    for lib in data.get("libraries") or []:
        units = lib.get("units") or {}
        counts = "/".join(str(units.get(v, 0)) for v in ("native", "family", "jit", "none"))
        lines.append(f"| {md_code(lib['path'])} | {lib['verdict']} | {counts} |")
    lines += ["", "## JIT toolchain", ""]
    jit = data.get("jit")
    if jit is None:
        lines.append("Not checked (no verify report given).")
    else:
        lines += ["| check | status | reason |", "|---|---|---|"]
        lines += [
            f"| {md_cell(k)} | {md_cell(v['status'])} | {md_cell(v['reason'])} |"
            for k, v in sorted(jit.items())
        ]
    lines += ["", f"## vLLM backends on {target}", ""]
    lines += ["| backend | kind | verdict | usable | needs |", "|---|---|---|---|---|"]
    for b in data.get("backends") or []:
        needs = ", ".join(f"`{n['need']}`: {n['verdict']}" for n in b["needs"])
        lines.append(
            f"| {b['name']} | {b['kind']} | {b['verdict']} | {'yes' if b['usable'] else 'no'} | {needs} |"
        )
    lines += ["", f"Rule: {data.get('rule')}", ""]
    return "\n".join(lines)


def versions(labels: Mapping[str, str]) -> dict[str, str]:
    """component -> pin from the image's `dev.sparkforge.pin.<component>` labels (vLLM commit, torch, CUDA...)."""
    prefix = "dev.sparkforge.pin."
    return {k.removeprefix(prefix): v for k, v in sorted(labels.items()) if k.startswith(prefix)}


def for_target(
    target: str,
    gpu: str,
    require: Sequence[str],
    *,
    recipe: str | None = None,
    verify_checks: Sequence[Mapping[str, Any]] | None = None,
) -> Report:
    """The kernel report of an image (audited, never run) or of a wheel or directory (`invoke audit`'s inputs).

    For an image without `verify_checks`, this machine's latest verify record of the same image ID supplies
    the JIT checks when there is one; a wheel or directory has none (its compilers are 'unchecked').
    """
    from pathlib import Path

    from sparkforge import engine
    from sparkforge.verify import verified
    from sparkforge.verify.suite import audit_subject

    if Path(target).expanduser().exists():
        audit = audit_subject(target, gpu, require)
        return kernel_report(
            audit, recipe=recipe, verify_checks=verify_checks, facts={"file": Path(target).name}
        )
    attrs = engine.inspect_image(target)
    labels = dict((attrs.get("Config") or {}).get("Labels") or {})
    if verify_checks is None:
        record = verified.read_record(str(attrs["Id"]), verified.VERIFIED_DIR)
        verify_checks = (record or {}).get("checks")
    facts = {
        "image_id": str(attrs["Id"]),
        "repo_digests": ", ".join(attrs.get("RepoDigests") or []),
        "recipe_hash": labels.get("dev.sparkforge.recipe-hash", ""),
        **{f"pin.{k}": v for k, v in versions(labels).items()},
    }
    audit = audit_subject(target, gpu, require)
    return kernel_report(
        audit, recipe=recipe or labels.get("dev.sparkforge.recipe"), verify_checks=verify_checks, facts=facts
    )
