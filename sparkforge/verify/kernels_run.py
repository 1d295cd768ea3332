"""`invoke kernels` end to end: audit the target, ask the image's vLLM what it selects, read the serve log.

An image's audit is cached by its ID; a wheel's by the digest of its zip directory (every member's name, CRC-32 and size: the same
bytes give the same digest, and reading it takes milliseconds), so a second report on a 333 MB wheel skips
the 8 s of inflating; vLLM's answer is cached by selection.run_selection.

vLLM's selection runs first: the audit then opens only the libraries the report's verdicts depend on (the
recipe's required ones and those of the kernels vLLM named), not every library of the target; `all_libraries`
opens every one (the full table of a release page).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge.boundary import read_json
from sparkforge.context import cache_path, write_atomic
from sparkforge.report import Check, Report
from sparkforge.verify import selection as sel
from sparkforge.verify.kernel_origin import report_scope
from sparkforge.verify.kernels_report import kernel_report, versions
from sparkforge.verify.started import started_backends


@dataclass(frozen=True)
class SelectionInput:
    """What vLLM's selection is asked about: the checkpoint's config.json, the profile's args, a runner image."""

    config: dict[str, Any]
    args: dict[str, Any] = field(default_factory=dict)
    runner: str | None = None  # image to run a wheel's or directory's selection in (an image runs its own)


def zip_digest(path: Path) -> str:
    """sha256 over a zip's directory (name, CRC-32, size of every member)."""
    with zipfile.ZipFile(path) as archive:
        entries = sorted((i.filename, i.CRC, i.file_size) for i in archive.infolist())
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def _audit_path(path: Path, gpu: str, require: Sequence[str], only: Sequence[str] | None = None) -> Report:
    from sparkforge.audit.scan import audit_target

    if not zipfile.is_zipfile(path):
        return audit_target(path, gpu=gpu, require=require, only=only)
    return _cached_audit(
        _identity(zip_digest(path), gpu, require, only),
        str(path),
        lambda: audit_target(path, gpu=gpu, require=require, only=only),
    )


def _identity(subject: str, gpu: str, require: Sequence[str], only: Sequence[str] | None) -> str:
    scope = None if only is None else sorted(set(only))
    return json.dumps([subject, gpu, sorted(require)] + ([] if scope is None else [scope]))


def _cached_audit(identity: str, subject: str, audit: Callable[[], Report]) -> Report:
    """The audit of an immutable subject (a wheel's content, an image ID), from the cache when it was done."""
    cached = cache_path("kernels", "audit", hashlib.sha256(identity.encode()).hexdigest()[:32] + ".json")
    if cached.is_file():
        data = read_json(cached, "a cached kernel audit")
        report = Report(command=data["command"], subject=subject, recipe=data.get("recipe"))
        for check in data.get("checks") or []:
            report.add(Check.from_dict(check))
        report.extra.update({k: data[k] for k in ("target", "libraries", "summary") if k in data})
        return report
    report = audit()
    write_atomic(cached, json.dumps(report.to_dict(), sort_keys=True).encode())
    return report


def _wheel_selection(path: Path, gpu: str, ask: SelectionInput) -> dict[str, Any]:
    if not ask.runner:
        raise sel.SelectionError(
            f"{path.name}: a wheel holds vLLM's code but no environment to run it in; its selection runs in an "
            "image holding the same vLLM; fix: pass --runner-image (e.g. the CI image built from "
            "tests/recipes/ci-wheels-amd64.yaml), or drop --profile/--model-config for an audit-only report"
        )
    answer = sel.run_selection(ask.runner, gpu, ask.config, ask.args, digests=True)
    digests = answer.get("python_digests") or {}
    ours = sel.wheel_python_digests(path)  # the RECORD read once, for the comparison and the count
    differ = sel.wheel_matches_runner(path, digests, ours)
    if differ:
        raise sel.SelectionError(
            f"{path.name}: {len(differ)} of its vLLM Python files differ from those in {ask.runner} (e.g. "
            f"{', '.join(differ[:4])}), so the runner's answer would not be this wheel's; fix: pass a "
            "--runner-image holding the same vLLM release as the wheel"
        )
    count = len(ours)
    return {
        **answer,
        "ran_in": ask.runner,
        "sources": f"The wheel's {count} vLLM Python files are byte-identical to the runner's (RECORD sha256).",
    }


@dataclass(frozen=True)
class KernelsQuery:
    """What a kernel report is asked besides its target (`invoke kernels`' options)."""

    recipe: str | None = None  # the recipe named in the report (an image's label otherwise)
    verify_checks: Sequence[Mapping[str, Any]] | None = None  # a verify report's checks (JIT compilers)
    ask: SelectionInput | None = None  # vLLM's selection, asked for a checkpoint
    serve_log: str | None = None  # a start's log: what vLLM really selected
    all_libraries: bool = False  # open every library, not only those the verdicts depend on


def for_target(target: str, gpu: str, require: Sequence[str], query: KernelsQuery | None = None) -> Report:
    """The kernel report of an image (audited, vLLM's selection run in it) or of a wheel or directory.

    For an image without `verify_checks`, this machine's latest verify record of the same image ID supplies
    the JIT checks when there is one; a wheel or directory has none (its compilers are 'unchecked').
    Only the libraries the verdicts depend on are opened unless `all_libraries`.
    """
    query = query or KernelsQuery()
    recipe, verify_checks, ask = query.recipe, query.verify_checks, query.ask
    serve_log, all_libraries = query.serve_log, query.all_libraries
    from sparkforge import engine
    from sparkforge.verify import verified
    from sparkforge.verify.suite import audit_subject

    sel.capability(gpu)
    started = started_backends(serve_log) if serve_log is not None else None
    path = Path(target).expanduser()
    if path.exists():
        answer = _wheel_selection(path, gpu, ask) if ask else None
        only = None if all_libraries else report_scope(require, answer)
        audit = _audit_path(path, gpu, require, only)
        return kernel_report(
            audit,
            recipe=recipe,
            verify_checks=verify_checks,
            facts={"file": path.name},
            selection=answer,
            started=started,
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
    answer = None
    if ask is not None:
        answer = {**sel.run_selection(target, gpu, ask.config, ask.args), "ran_in": target}
    only = None if all_libraries else report_scope(require, answer)
    audit = _cached_audit(
        _identity(str(attrs["Id"]), gpu, require, only),
        target,
        lambda: audit_subject(target, gpu, require, only),
    )
    return kernel_report(
        audit,
        recipe=recipe or labels.get("dev.sparkforge.recipe"),
        verify_checks=verify_checks,
        facts=facts,
        selection=answer,
        started=started,
    )


def selection_input(profile: str, model_config: str, runner_image: str) -> SelectionInput | None:
    """The selection request of `invoke kernels`: none without --profile or --model-config."""
    from sparkforge.recipe.profile import PROFILES_DIR, load_profile

    if not profile and not model_config:
        return None
    args: dict[str, Any] = {}
    config_path = Path(model_config) if model_config else None
    if profile:
        loaded = load_profile(profile)
        args = {k: v for k, v in loaded.model.args.items() if k in ("dtype", "quantization", "max-model-len")}
        if config_path is None:
            from sparkforge.errors import RunError
            from sparkforge.recipe.checkpoints import checkpoint_path, pinned_revision

            try:  # the memory plan's rule: the config of the profile's model and revision, not of its file name
                config_path = checkpoint_path(
                    loaded.model.model, pinned_revision(loaded.model.args), PROFILES_DIR, None
                )
            except RunError as exc:
                raise sel.SelectionError(
                    f"profile {loaded.name}: {exc} (vLLM's selection needs it too; or pass --model-config)"
                ) from None
    config = sel.read_model_config(config_path) if config_path is not None else {}
    return SelectionInput(config=config, args=args, runner=runner_image or None)
