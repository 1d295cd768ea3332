"""Invoke tasks `import` and `export` (community recipes <-> serve profiles) and the catalog behind `recipes --catalog`."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli import echo, task, user_errors, warn

DEFAULT_RECIPE = "vllm-qwen35-wheels"
RECIPE_HELP = f"sparkforge recipe whose pinned vLLM the profile is checked against (default {DEFAULT_RECIPE})"


def _pinned(recipe: str, offline: bool):
    from sparkforge.preflight.catalog import PinnedVllm
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.recipe.loader import load_recipe

    return PinnedVllm(load_recipe(recipe or DEFAULT_RECIPE), make_fetcher(offline=offline))


@task(
    name="import",
    iterable=["set", "allow"],
    help={
        "allow": "ENTRY=REASON: carry one flag (without dashes) or variable off the allow-list, having reviewed "
        "what it does; written into the profile with the reason (repeatable)",
        "set": "KEY=VALUE: override a `defaults` value before the command is filled (repeatable), as both tools allow",
        "source": "community recipe: a file or an https:// URL",
        "format": 'eugr (recipe_version "1"), sparkarena (recipe_version 2), nvidia-v3 or nvidia-v4 (NVIDIA\'s '
        "catalog, schema_version 3/4); default: from the file",
        "out": "profile file to write (default: profiles/<file name>.yaml)",
        "recipe": RECIPE_HELP,
        "extra": "the words the community runner takes after `--` (appended to the command, the last flag wins)",
        "force": "overwrite --out",
        "no_preflight": "do not read the pinned vLLM (short aliases from a built-in table; no flag check)",
        "offline": "read the pinned vLLM from the cache only",
    },
)
@user_errors
def import_(
    c: Context,
    source: str,
    format: str = "",
    out: str = "",
    recipe: str = "",
    extra: str = "",
    force: bool = False,
    no_preflight: bool = False,
    offline: bool = False,
    set: list[str] | None = None,
    allow: list[str] | None = None,
) -> None:
    """A community recipe becomes a serve profile; what it cannot carry as is, it names.

    Code loading and trust settings off the allow-list are left out, named, and the task exits 1 unless each is
    opted in with --allow."""
    from sparkforge.boundary import check_output
    from sparkforge.preflight.catalog import (
        ImportOptions,
        image_facts,
        import_with,
        preflight_notes,
        read_source,
        with_architecture,
    )
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.recipe.community.formats import FORMATS
    from sparkforge.recipe.community.toprofile import write_profile
    from sparkforge.recipe.profile import PROFILES_DIR

    if format and format not in FORMATS:
        raise Exit(f"sparkforge: --format {format!r}: use {', '.join(FORMATS)}", code=2)
    check_output(out, "--out")  # the boundary: before the source is read or fetched
    doc, where = read_source(source, make_fetcher(offline=offline, timeout=15, retries=1))
    pinned = None if no_preflight else _pinned(recipe, offline)
    name = Path(out).stem if out else None
    overrides = dict(item.split("=", 1) for item in set or [] if "=" in item)
    if len(overrides) != len(set or []):
        raise Exit("sparkforge: --set takes KEY=VALUE (e.g. --set max_model_len=32768)", code=2)
    pairs = [item.split("=", 1) for item in allow or [] if "=" in item and item.split("=", 1)[1].strip()]
    opt_ins = {
        key.strip().lstrip("-"): why.strip() for key, why in pairs
    }  # --tool-parser-plugin or tool-parser-plugin
    if len(opt_ins) != len(allow or []):
        raise Exit(
            "sparkforge: --allow takes ENTRY=REASON (e.g. --allow 'tool-parser-plugin=reviewed x.py')", code=2
        )
    options = ImportOptions(format or None, tuple(shlex.split(extra)), name, overrides, opt_ins)  # type: ignore[arg-type]
    imported = import_with(pinned, (doc, where), options)
    facts: list[str] = []
    if pinned:
        imported = replace(imported, attention=preflight_notes(imported, pinned))
        hub = None if offline else make_fetcher(timeout=5, retries=0)
        imported, found = with_architecture(imported, pinned, hub)
        facts = [found, *image_facts(imported, pinned)]
    notes = imported.attention
    serving = pinned.recipe.name if pinned else "R"
    target = Path(out) if out else PROFILES_DIR / f"{imported.name}.yaml"
    path = write_profile(imported, target, force=force, recipe=serving)
    carried = _carry_mods(imported, source, pinned)
    notes = [
        n
        for n in notes
        if not any(n.message.startswith(f"mod {v.mod!r} ") for v in carried.verdicts if v.kind != "missing")
    ]
    echo(f"wrote {path} (profile {imported.name}, {imported.document['nodes']} node(s), {where})")
    for fact in facts:
        echo(fact)
    _memory_plan(path, imported, pinned.recipe.model.device if pinned else "gpu")
    echo("vllm argv the source runs: " + shlex.join(imported.source_argv))
    for note in notes:
        warn(f"needs attention: {note}")
    for note in imported.refused:
        warn(f"refused: {note}")
    for note in imported.unmountable:
        warn(f"left out: {note}")
    ref = imported.name if path.resolve().parent == PROFILES_DIR.resolve() else str(path)
    echo(f"next: {imported.next_command(serving, ref)}")
    for verdict in carried.verdicts:
        if verdict.kind == "patch":
            echo(f"carried: {verdict}")
        elif verdict.kind != "missing":
            warn(f"refused: {verdict}")
    if carried.patches:
        echo(
            f"mods written as overlay patches: {', '.join(str(p) for p in carried.patches)}; next: {carried.next_step}"
        )
    if carried.refused:
        raise Exit(
            f"sparkforge: {where}: {len(carried.refused)} mod(s) refused (named above); {path} was written without "
            "them; fix: carry a mod's patch instead of its script, or leave the mod out (docs/overlays.md)",
            code=1,
        )
    if imported.unmountable:
        raise Exit(
            f"sparkforge: {where}: {len(imported.unmountable)} flag(s) name files the container would not have; "
            f"{path} was written without them; fix: put each file beside the profile and add it back under args "
            "(the lines above say how); serve then mounts it read-only and records its sha256",
            code=1,
        )
    if imported.refused:
        count = len(imported.refused)
        raise Exit(
            f"sparkforge: {where}: {count} entr{'y' if count == 1 else 'ies'} off the allow-list would load code or "
            f"change trust; {path} was written without them; fix: serve it as written, or review each entry and "
            "import again with --allow ENTRY=REASON (docs/community.md)",
            code=1,
        )
    if not notes:
        checked = "" if pinned else " (flags not checked against a vLLM: --no-preflight)"
        echo(f"imports cleanly: nothing needs attention{checked}")


def _carry_mods(imported, source: str, pinned):
    """The recipe's mods judged from their files: patches become an overlay series, scripts are refused."""
    from sparkforge.imagebuild.overlay.mods import carry_mods
    from sparkforge.recipe.loader import load_recipe

    base = pinned.recipe if pinned else load_recipe(DEFAULT_RECIPE)
    return carry_mods(imported.recipe, None if "://" in source else Path(source), base, imported.name)


def _memory_plan(path: Path, imported, device: str) -> None:
    """The imported profile's memory plan when a checkpoint config is reachable without the network."""
    from sparkforge.errors import SparkforgeError
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.memory.checkpoint import reachable_config
    from sparkforge.run.memory.guard import node_memory, plan_profile
    from sparkforge.run.memory.text import plan_lines

    revision = imported.document.get("args", {}).get("revision")
    found = reachable_config(str(imported.document["model"]), revision, imported.name)
    if found is None:
        echo(
            f"memory plan: no checkpoint config of {imported.document['model']} here (HF cache, profiles/checkpoints/); "
            f"save its config.json as profiles/checkpoints/{imported.name}.json and run invoke memory"
        )
        return
    config, source = found
    try:
        plan = plan_profile(load_profile(path), None, node_memory(device), config=config)
    except SparkforgeError as exc:
        warn(f"memory plan: not counted from {config} ({exc})")
        return
    echo(f"memory plan from {source} ({config}):")
    for line in plan_lines(plan):
        echo(line)


@task(
    help={
        "profile": "serve profile name in profiles/ or a path",
        "recipe": "sparkforge recipe whose image serves it (its candidate tag unless --image)",
        "format": 'sparkarena (recipe_version 2), eugr (recipe_version "1"), nvidia-v4 or nvidia-v3 (NVIDIA\'s catalog)',
        "image": "image reference to write (default: the recipe's candidate tag)",
        "realize": "pin the image by digest (registry, else the engine) and the model by its hub commit",
        "model_revision": "the model's hub commit (40 hex); needed for --realize where the hub is unreachable",
        "trust_remote_code": "write --trust-remote-code into the recipe (never from a profile)",
        "out": "file to write (default: print it)",
    }
)
@user_errors
def export(
    c: Context,
    profile: str,
    recipe: str,
    format: str = "sparkarena",
    image: str = "",
    realize: bool = False,
    model_revision: str = "",
    trust_remote_code: bool = False,
    out: str = "",
) -> None:
    """A serve profile becomes a community recipe; --realize pins image digest and model revision."""
    from sparkforge.boundary import check_output, write_output
    from sparkforge.recipe import plan
    from sparkforge.recipe.community.formats import FORMATS
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile
    from sparkforge.registry.realize import export_community

    if format not in FORMATS:
        raise Exit(f"sparkforge: --format {format!r}: use {', '.join(FORMATS)}", code=2)
    check_output(out, "--out")  # the boundary: before any registry or hub is asked
    loaded, prof = load_recipe(recipe), load_profile(profile)
    ref = (
        plan.check_reference("--image", image)
        if image
        else plan.candidate_tag(loaded, loaded.model.platforms[0])
    )
    text = export_community(
        prof,
        loaded,
        format,
        ref,
        realize=realize,
        model_revision=model_revision,
        trust_remote_code=trust_remote_code,
    )  # type: ignore[arg-type]
    if out:
        write_output(out, text, "--out")  # atomic; never through a planted link, never into a system folder
        echo(f"wrote {out} ({format}; validated by importing it back)")
    else:
        echo(text.rstrip())


def catalog(source: str, recipe: str, offline: bool, json_path: str) -> None:
    """`recipes --catalog DIR|URL`: per community recipe, imports cleanly / needs attention / model class."""
    import json

    from sparkforge.boundary import check_output, write_output
    from sparkforge.preflight.catalog import catalog_refs, run_catalog
    from sparkforge.preflight.fetch import make_fetcher

    check_output(json_path, "--json")  # before any fetch
    pinned = _pinned(recipe, offline)
    fetcher = make_fetcher(offline=offline, timeout=15, retries=1)
    hub = None if offline else make_fetcher(timeout=5, retries=0)
    rows, seconds = run_catalog(catalog_refs(source, fetcher), pinned, fetcher, hub, echo)
    statuses = ("imports cleanly", "needs attention", "refused", "does not import")
    counts = {s: sum(r.status == s for r in rows) for s in statuses}
    echo(
        f"{len(rows)} recipe(s) against {pinned.subject} in {seconds:.1f} s: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
    )
    if json_path:
        write_output(json_path, json.dumps([r.to_dict() for r in rows], indent=2) + "\n", "--json")
