"""Invoke tasks for releases over time: diff (what changed), history (what a tag named), kernels (the kernel
report of an image, optionally attested). Thin: parse, call sparkforge.registry, print."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from pathlib import Path

from invoke import Context

from sparkforge.boundary import write_output
from sparkforge.cli import task, user_errors
from sparkforge.cli.families import JSON, RECIPE_HELP, SIGNING, Family, Outputs, Signing, opt
from sparkforge.context import Session

SERVE_LOG_MAX_BYTES = 64 << 20  # a start-up log of a large model: warnings included, well under this
MAX_WHEEL_BYTES = 8 << 30  # a vLLM or torch wheel (torch's aarch64 CUDA wheel is ~3 GiB)


def _side(option: str, side: str, recipes: list[str]) -> None:
    """A diff side checked before any engine or registry: a recipe is loaded in full (a `.yaml` link to
    /etc/passwd is refused by the reader); anything else must be an image reference, and a bare name that is no
    recipe (a misspelt one) is refused rather than asked of the engine as `NAME:latest`."""
    import difflib

    from sparkforge.errors import InputError
    from sparkforge.oci import check_reference
    from sparkforge.recipe.loader import load_recipe

    if side.endswith((".yaml", ".yml")) or side in recipes:
        load_recipe(side)
        return
    check_reference(option, side)
    if not any(c in side for c in "/:@"):
        near = difflib.get_close_matches(side, recipes, n=1)
        hint = f"did you mean the recipe {near[0]!r}? " if near else ""
        raise InputError(
            f"{option} {side!r} is neither a recipe in recipes/ nor an image reference with a tag or digest; "
            f"{hint}fix: name a recipe ('invoke recipes' lists them) or an image as NAME:TAG or NAME@sha256:..."
        )


def _write(session: Session, path: str, text: str, option: str = "--json") -> None:
    if path:
        write_output(path, text, option)  # the boundary: atomic, never through a symlink out of the project
        session.out(f"wrote {path}")


@task(
    families=(JSON,),
    iterable=["bench"],
    help={
        "a": "the older image (local, or REGISTRY/REPO:TAG or @sha256:...), or a recipe name/path",
        "b": "the newer image or recipe",
        "json": "write the diff report (JSON) here",
        "bench": "benchmark results JSON of A, then of B ('invoke bench --json'; give twice)",
    },
)
@user_errors
def diff(
    c: Context, session: Session, outputs: Outputs, a: str, b: str, bench: list[str] | None = None
) -> None:
    """What changed from A to B: versions, kernels, labels, lock, size, JIT, verify, benchmarks."""
    from sparkforge.errors import InputError, SparkforgeError
    from sparkforge.recipe.loader import list_recipe_names
    from sparkforge.registry.diff import diff as run_diff
    from sparkforge.registry.diff import format_table
    from sparkforge.run.bench.results import load_result
    from sparkforge.run.bench.store import stored_pair

    recipes = list_recipe_names()
    for option, side in (("A", a), ("B", b)):  # the boundary, before any engine or registry is contacted
        _side(option, side, recipes)
    if len(bench or []) not in (0, 2):
        raise InputError(f"--bench given {len(bench or [])} times; fix: give it twice, A's result then B's")
    for path in bench or []:
        load_result(Path(path), "--bench")  # the bench reader: shape and finite figures, not only JSON
    # without --bench: the newest result of each image in the bench result store (invoke bench writes there)
    paths = [Path(p) for p in bench or []] or stored_pair(a, b)
    report = run_diff(session, a, b, paths)
    session.out(format_table(report))
    if outputs.json:
        report.write_json(Path(outputs.json))
        session.out(f"report: {outputs.json}")
    if report.status != "passed":  # exit status follows the report
        raise SparkforgeError(
            f"diff failed ({', '.join(c.name for c in report.failed)}); see the table above"
        )


@task(
    families=(JSON,),
    help={
        "recipe": RECIPE_HELP,
        "tag": "moving tag whose history to list (default: each of the recipe's moving tags)",
        "json": "write the history (JSON) here",
        "no_attestations": "do not read each index's signed verify and kernel attestations (faster)",
    },
)
@user_errors
def history(
    c: Context, session: Session, outputs: Outputs, recipe: str, tag: str = "", no_attestations: bool = False
) -> None:
    """The digests a moving tag has named, newest first, with dates, verify verdicts and kernel coverage."""
    import datetime as dt

    from sparkforge.errors import InputError, PublishError
    from sparkforge.oci import check_tag
    from sparkforge.recipe import plan
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry.publish import session_tools
    from sparkforge.registry.releases import history_view, verdict_counts

    if tag:
        check_tag("--tag", tag)  # before the registry is contacted

    loaded = load_recipe(recipe)
    moving = [t.rsplit(":", 1)[1] for t in plan.final_tags(loaded, dt.date.today()).moving]
    if (
        tag and tag not in moving
    ):  # an immutable (dated, versioned) tag has no history: refused before the registry
        raise InputError(
            f"--tag {tag!r} is not one of {loaded.name}'s moving tags ({', '.join(moving) or 'none'}): only a "
            "moving tag names several digests over time; fix: pass one of those, or leave --tag out"
        )
    tools = session_tools(session, loaded, "history")
    tags = [tag] if tag else moving
    views, missing = [], []
    for t in tags:  # without --tag, the moving tags that have a history
        try:
            views.append(history_view(loaded, tools, t, attestations=not no_attestations))
        except PublishError as exc:
            if tag or "has no history" not in str(exc):
                raise
            missing.append(exc)
    if not views:
        raise missing[0]
    for view in views:
        session.out(f"{view['repository']}:{view['tag']} (record {view['record']})")
        for e in view["entries"]:
            mark = "*" if e["current"] else " "
            session.out(
                f" {mark} {e['date']}  {e['digest']}  {e['action']:8}  {e['recipe']} {e['recipe_hash'][:12]}"
            )
            for platform, p in e["platforms"].items():
                rec = p.get("recorded") or {}
                gpu = (
                    "GPU-verified"
                    if rec.get("gpu_verified")
                    else f"not GPU-verified ({rec.get('reason', '?')})"
                )
                signed = p.get("verify") or {}
                claim = f"signed verify {signed.get('status')}" + (
                    " on GPU" if signed.get("gpu_used") else ""
                )
                kernels = p.get("kernels") or {}
                cover = verdict_counts(kernels)
                session.out(
                    f"      {platform}: {gpu}; {claim if signed else 'no signed verify claim'}; "
                    f"kernels: {cover or 'no signed kernel report'}"
                )
    outputs.write(session, views if not tag else views[0])


@dataclass(frozen=True)
class KernelsFlags:
    """kernels' own flags: what vLLM's selection is asked about, the evidence beside it, where the report goes."""

    profile: str = opt(
        "",
        "serve profile whose checkpoint vLLM's selection is asked about (its config.json: "
        "profiles/checkpoints/<org>/<name>/<revision>.json, keyed by its model, unless --model-config)",
    )
    model_config: str = opt("", "the checkpoint's config.json (overrides the profile's)")
    runner_image: str = opt(
        "", "for a wheel or directory: an image holding the same vLLM to run its selection in"
    )
    serve_log: str = opt(
        "", "vLLM's log of a start of this profile: what it selected, set beside the prediction"
    )
    verify_report: str = opt(
        "",
        "a verify report of this image ('invoke verify --report'): its JIT checks (default: this "
        "machine's latest verify record of the image)",
    )
    gpu: str = opt("", "GPU target (default: the recipe's)")
    all_libraries: bool = opt(
        False,
        "open every library of the target (default: only those the verdicts depend on: the recipe's "
        "required ones and those of the kernels vLLM names)",
    )
    json: str = opt("", "write the kernel report (JSON) here")
    markdown: str = opt("", "write the kernel report (Markdown, for a release page) here")
    attest: bool = opt(
        False, "attach the report to IMAGE (repository@sha256:...) as a signed attestation (--key signs)"
    )


ASKING = Family.of(KernelsFlags, "asking")


@task(
    families=(ASKING, SIGNING),
    help={
        "recipe": RECIPE_HELP,
        "image": "image, wheel or directory to report on (default: the recipe's candidate for its first platform)",
    },
)
@user_errors
def kernels(
    c: Context, session: Session, asking: KernelsFlags, signing: Signing, recipe: str, image: str = ""
) -> None:
    """Per layer type, what vLLM selects on the recipe's GPU, where that code comes from and if it can run."""
    from sparkforge.boundary import check_input, check_output, read_json, read_text
    from sparkforge.errors import SparkforgeError
    from sparkforge.oci import check_reference
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.verify.kernels_report import to_markdown
    from sparkforge.verify.kernels_run import KernelsQuery, for_target, selection_input

    if image and (Path(image).exists() or Path(image).is_symlink()):
        if not Path(image).is_dir():  # a wheel: a regular file (a FIFO would hang, /dev/zero fill memory)
            check_input(image, "--image", MAX_WHEEL_BYTES)
    elif image:
        check_reference("--image", image)
    check_output(asking.json, "--json")
    check_output(asking.markdown, "--markdown")
    loaded = load_recipe(recipe)
    if not image:
        from sparkforge.registry.pulled import resolve

        found = resolve(loaded)  # the local build, else the digest pull verified
        session.echo(f"sparkforge: image {found.image}: {found.why}")
    ref = image or found.image
    checks = None
    if asking.verify_report:
        from sparkforge.registry.signinputs import parse_verify_report

        data = parse_verify_report(
            read_json(asking.verify_report, "--verify-report"), f"--verify-report {asking.verify_report}"
        )
        checks = list(data["checks"])
    log = None
    if asking.serve_log:
        log = read_text(asking.serve_log, "--serve-log", SERVE_LOG_MAX_BYTES)
    ask = selection_input(asking.profile, asking.model_config, asking.runner_image)
    query = KernelsQuery(loaded.name, checks, ask, log, asking.all_libraries)
    report = for_target(ref, asking.gpu or loaded.model.gpu, loaded.model.audit.require, query)
    data = report.to_dict()
    text = to_markdown(data)
    session.out(text)
    _write(session, asking.json, _json.dumps(data, indent=2, sort_keys=True) + "\n")
    _write(session, asking.markdown, text, "--markdown")
    if asking.attest:
        from sparkforge.registry.attest import attest_kernels

        cosign, signer = signing.tools(session)
        signed = attest_kernels(loaded, ref, data, cosign, signer)
        session.echo(f"sparkforge: attested {signed.reference} ({signed.what}) with {signer.describe()}")
    if report.status != "passed":  # exit status follows the report (attested or not)
        raise SparkforgeError(
            f"kernels failed ({', '.join(c.name for c in report.failed)}); see the report above"
        )
