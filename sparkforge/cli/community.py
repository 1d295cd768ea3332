"""Invoke tasks `import` and `export` (community recipes <-> serve profiles) and the catalog behind `recipes --catalog`."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import NETWORK, Family, Outputs, opt
from sparkforge.context import Session

DEFAULT_RECIPE = "vllm-qwen35-wheels"
RECIPE_HELP = f"sparkforge recipe whose pinned vLLM the profile is checked against (default {DEFAULT_RECIPE})"


def _pinned(session: Session, recipe: str):
    from sparkforge.preflight.catalog import PinnedVllm
    from sparkforge.recipe.loader import load_recipe

    return PinnedVllm(load_recipe(recipe or DEFAULT_RECIPE), _fetcher(session, 30, 3))


def _fetcher(session: Session, timeout: float, retries: int):
    """A fetcher of this session's: offline or not, through its CA bundle."""
    from sparkforge.preflight.fetch import make_fetcher

    return make_fetcher(
        offline=session.offline, timeout=timeout, retries=retries, ca_bundle=session.ca_bundle
    )


def _hub(session: Session):
    """The hub's fetcher (short timeouts, no retries), none offline."""
    return None if session.offline else _fetcher(session, 5, 0)


@dataclass(frozen=True)
class Reading:
    """How import reads a community recipe: its format, the runner's extra words, --set overrides, --allow
    opt-ins, and whether the pinned vLLM is read (preflight). Parsed and checked when the task is called."""

    format: str = opt(
        "",
        'eugr (recipe_version "1"), sparkarena (recipe_version 2), nvidia-v3 or nvidia-v4 (NVIDIA\'s catalog, '
        "schema_version 3/4); default: from the file",
    )
    extra: str = opt(
        "", "the words the community runner takes after `--` (appended to the command, the last flag wins)"
    )
    set: tuple[str, ...] | list[str] | None = opt(
        None,
        "KEY=VALUE: override a `defaults` value before the command is filled (repeatable), as both tools allow",
    )
    allow: tuple[str, ...] | list[str] | None = opt(
        None,
        "ENTRY=REASON: carry one flag (without dashes) or variable off the allow-list, having reviewed what it does; written into the profile with the reason (repeatable)",
    )
    no_preflight: bool = opt(
        False, "do not read the pinned vLLM (short aliases from a built-in table; no flag check)"
    )

    def options(self, name: str | None):  # -> preflight.catalog.ImportOptions
        from sparkforge.preflight.catalog import ImportOptions
        from sparkforge.recipe.community.formats import FORMATS

        if self.format and self.format not in FORMATS:
            raise Exit(f"sparkforge: --format {self.format!r}: use {', '.join(FORMATS)}", code=2)
        given = list(self.set or [])
        overrides = dict(item.split("=", 1) for item in given if "=" in item)
        if len(overrides) != len(given):
            raise Exit("sparkforge: --set takes KEY=VALUE (e.g. --set max_model_len=32768)", code=2)
        allow = list(self.allow or [])
        pairs = [item.split("=", 1) for item in allow if "=" in item and item.split("=", 1)[1].strip()]
        opt_ins = {key.strip().lstrip("-"): why.strip() for key, why in pairs}  # --x or x
        if len(opt_ins) != len(allow):
            raise Exit(
                "sparkforge: --allow takes ENTRY=REASON (e.g. --allow 'tool-parser-plugin=reviewed x.py')",
                code=2,
            )
        extra = tuple(shlex.split(self.extra))
        return ImportOptions(self.format or None, extra, name, overrides, opt_ins)  # type: ignore[arg-type]


READING = Family.of(Reading, "reading")


@task(
    name="import",
    families=(NETWORK, READING),
    iterable=["set", "allow"],
    help={
        "source": "community recipe: a file or an https:// URL",
        "out": "profile file to write (default: profiles/<file name>.yaml)",
        "recipe": RECIPE_HELP,
        "force": "overwrite --out",
        "offline": "read the pinned vLLM from the cache only",
    },
)
@user_errors
def import_(
    c: Context,
    session: Session,
    reading: Reading,
    source: str,
    out: str = "",
    recipe: str = "",
    force: bool = False,
) -> None:
    """A community recipe becomes a serve profile; what it cannot carry as is, it names.

    Code loading and trust settings off the allow-list are left out, named, and the task exits 1 unless each is
    opted in with --allow."""
    from sparkforge.boundary import check_output
    from sparkforge.preflight.catalog import (
        image_facts,
        import_with,
        preflight_notes,
        read_source,
        with_architecture,
    )
    from sparkforge.recipe.community.toprofile import write_profile
    from sparkforge.recipe.profile import PROFILES_DIR

    echo, warn = session.out, session.warn
    options = reading.options(Path(out).stem if out else None)  # --format, --set, --allow: before any read
    check_output(out, "--out")  # the boundary: before the source is read or fetched
    doc, where = read_source(source, _fetcher(session, 15, 1))
    pinned = None if reading.no_preflight else _pinned(session, recipe)
    imported = import_with(pinned, (doc, where), options)
    facts: list[str] = []
    if pinned:
        imported = replace(imported, attention=preflight_notes(imported, pinned))
        imported, found = with_architecture(imported, pinned, _hub(session))
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
    _memory_plan(session, path, imported, pinned.recipe.model.device if pinned else "gpu")
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


def _memory_plan(session: Session, path: Path, imported, device: str) -> None:
    """The imported profile's memory plan when a checkpoint config is reachable without the network."""
    from sparkforge.errors import SparkforgeError
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.memory.checkpoint import reachable_config
    from sparkforge.run.memory.guard import node_memory, plan_profile
    from sparkforge.run.memory.text import plan_lines

    echo = session.out
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
        session.warn(f"memory plan: not counted from {config} ({exc})")
        return
    echo(f"memory plan from {source} ({config}):")
    for line in plan_lines(plan):
        echo(line)


@dataclass(frozen=True)
class Pinning:
    """What an exported recipe pins: the image (default: the recipe's candidate tag), with --realize its digest
    and the model's hub commit, and whether it writes --trust-remote-code."""

    image: str = opt("", "image reference to write (default: the recipe's candidate tag)")
    realize: bool = opt(
        False, "pin the image by digest (registry, else the engine) and the model by its hub commit"
    )
    model_revision: str = opt(
        "", "the model's hub commit (40 hex); needed for --realize where the hub is unreachable"
    )
    trust_remote_code: bool = opt(False, "write --trust-remote-code into the recipe (never from a profile)")


PINNING = Family.of(Pinning, "pinning")


@task(
    families=(PINNING,),
    help={
        "profile": "serve profile name in profiles/ or a path",
        "recipe": "sparkforge recipe whose image serves it (its candidate tag unless --image)",
        "format": 'sparkarena (recipe_version 2), eugr (recipe_version "1"), nvidia-v4 or nvidia-v3 (NVIDIA\'s catalog)',
        "out": "file to write (default: print it)",
    },
)
@user_errors
def export(
    c: Context,
    session: Session,
    pinning: Pinning,
    profile: str,
    recipe: str,
    format: str = "sparkarena",
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
    image = pinning.image
    ref = (
        plan.check_reference("--image", image)
        if image
        else plan.candidate_tag(loaded, loaded.model.platforms[0])
    )
    text = export_community(
        prof,
        loaded,
        format,  # type: ignore[arg-type]
        ref,
        realize=pinning.realize,
        model_revision=pinning.model_revision,
        trust_remote_code=pinning.trust_remote_code,
    )
    if out:
        write_output(out, text, "--out")  # atomic; never through a planted link, never into a system folder
        session.out(f"wrote {out} ({format}; validated by importing it back)")
    else:
        session.out(text.rstrip())


def catalog(session: Session, source: str, recipe: str, outputs: Outputs) -> None:
    """`recipes --catalog DIR|URL`: per community recipe, imports cleanly / needs attention / model class."""
    from sparkforge.preflight.catalog import catalog_refs, run_catalog

    pinned = _pinned(session, recipe)
    fetcher = _fetcher(session, 15, 1)
    rows, seconds = run_catalog(catalog_refs(source, fetcher), pinned, fetcher, _hub(session), session.echo)
    statuses = ("imports cleanly", "needs attention", "refused", "does not import")
    counts = {s: sum(r.status == s for r in rows) for s in statuses}
    session.out(
        f"{len(rows)} recipe(s) against {pinned.subject} in {seconds:.1f} s: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
    )
    outputs.write(session, [r.to_dict() for r in rows])
