"""A sparkforge serve profile -> a community recipe (Spark Arena's version 2 or the community runner's "1").

The values sparkrun reads from its config chain (tensor_parallel, max_model_len, gpu_memory_utilization,
served_model_name, port, host) go to `defaults` and reach the command as placeholders, as its validator asks;
every other flag is written literally, shell-quoted (and, for the runner's str.format, braces doubled). JSON
values become `defaults` placeholders in Spark Arena recipes, so no template engine reads their braces. What a
realized export pins (image digest, model revision, sparkforge's recipe hash) is passed in, never looked up here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import yaml

from sparkforge.recipe.community.formats import Format
from sparkforge.recipe.community.vllmargv import shell_line
from sparkforge.recipe.profile import Profile

# Profile flag -> the defaults key sparkrun reads (sparkrun/core/validation.py: SPARKRUN_READ_CONFIG_KEYS).
DEFAULT_KEYS = {
    "tensor-parallel-size": "tensor_parallel",
    "pipeline-parallel-size": "pipeline_parallel",
    "max-model-len": "max_model_len",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "kv-cache-dtype": "kv_cache_dtype",
}


@dataclass(frozen=True)
class Pins:
    """What --realize found (or what the user passed): all optional."""

    image: str
    model_revision: str | None = None
    recipe: str | None = None
    recipe_hash: str | None = None


def _word(value: object, fmt: Format) -> str:
    text = shlex.quote(str(value))
    return text.replace("{", "{{").replace("}", "}}") if fmt == "eugr" else text


def _command(
    profile: Profile, fmt: Format, pins: Pins, trust_remote_code: bool
) -> tuple[list[str], dict[str, object]]:
    """The command's words (already quoted) and the defaults they use."""
    model = profile.model
    defaults: dict[str, object] = {"port": 8000, "host": "0.0.0.0"}
    words = ["vllm", "serve", "{model}" if fmt == "sparkarena" else _word(model.model, fmt)]
    args = dict(model.args)
    if pins.model_revision:
        args["revision"] = pins.model_revision
    for key, value in args.items():
        if value is True:
            words.append(f"--{key}")
            continue
        if value is False:
            words.append(f"--no-{key}")
            continue
        words.append(f"--{key}")
        slot = DEFAULT_KEYS.get(key)
        if (
            slot is None
            and fmt == "sparkarena"
            and isinstance(value, str)
            and "{" in value
            and "'" not in value
        ):
            slot = key.replace("-", "_").replace(".", "_")
        if slot and not isinstance(value, list):
            defaults[slot] = value
            words.append(f"'{{{slot}}}'" if isinstance(value, str) and "{" in value else f"{{{slot}}}")
        else:
            words += [_word(v, fmt) for v in (value if isinstance(value, list) else [value])]
    if model.served_model_name:
        defaults["served_model_name"] = model.served_model_name
        words += ["--served-model-name", "{served_model_name}"]
    if trust_remote_code:
        words.append("--trust-remote-code")
    if fmt == "eugr" and model.nodes > 1:
        # The runner's cluster launch starts Ray; --no-ray (torch distributed) strips this flag, as solo does.
        words += ["--distributed-executor-backend", "ray"]
    words += ["--host", "{host}", "--port", "{port}"]
    return words, defaults


def export_document(
    profile: Profile, fmt: Format, pins: Pins, *, trust_remote_code: bool = False
) -> dict[str, object]:
    """The recipe document of `fmt` that serves `profile` with the image (and pins) given."""
    model = profile.model
    words, defaults = _command(profile, fmt, pins, trust_remote_code)
    env = dict(model.env)
    if fmt == "eugr":
        doc: dict[str, object] = {"recipe_version": "1", "name": profile.name}
        if pins.recipe_hash:
            doc["name"] = f"{profile.name} (sparkforge {pins.recipe} {pins.recipe_hash[:12]})"
        doc.update({"description": model.description, "model": model.model, "container": pins.image})
        if model.nodes > 1:
            doc["cluster_only"] = True
        doc.update({"defaults": defaults, **({"env": env} if env else {}), "command": shell_line(words)})
        return doc
    doc = {"recipe_version": 2, "model": model.model}
    if pins.model_revision:
        doc["model_revision"] = pins.model_revision
    doc["runtime"] = "vllm"
    if model.nodes > 1:
        doc["min_nodes"] = model.nodes
    doc["container"] = pins.image
    metadata: dict[str, object] = {"description": model.description, "sparkforge_profile": profile.name}
    if pins.recipe_hash:
        metadata.update({"sparkforge_recipe": pins.recipe, "sparkforge_recipe_hash": pins.recipe_hash})
    doc.update({"metadata": metadata, "defaults": defaults, **({"env": env} if env else {})})
    doc["command"] = shell_line(words)
    return doc


class _Literal(str):
    """A multi-line string written as a YAML block (`|`), as the formats' own recipes write commands."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def export_text(document: dict[str, object], header: list[str]) -> str:
    body = {k: _Literal(v) if k == "command" and isinstance(v, str) else v for k, v in document.items()}
    text = yaml.dump(body, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096)
    return "".join(f"# {line}\n" for line in header) + text


def check_export(text: str, fmt: Format, profile: Profile, pins: Pins) -> None:
    """Read the exported text back as `fmt` and import it: it must be valid and give the same profile."""
    import tempfile
    from pathlib import Path

    from sparkforge.errors import RecipeError
    from sparkforge.recipe.community.formats import read_community
    from sparkforge.recipe.community.toprofile import import_recipe
    from sparkforge.recipe.community.vllmargv import FALLBACK_ALIASES
    from sparkforge.recipe.yamlfile import read_yaml

    with tempfile.TemporaryDirectory(prefix="sparkforge-export-") as tmp:
        path = Path(tmp) / f"{profile.name}.yaml"
        path.write_text(text)
        back = import_recipe(read_community(read_yaml(path), str(path), fmt), aliases=FALLBACK_ALIASES)
    want = profile.model.model_dump(
        include={"model", "nodes", "args", "env", "served_model_name"}, exclude_defaults=True
    )
    if pins.model_revision:
        want["args"] = {**want.get("args", {}), "revision": pins.model_revision}
    got = {k: v for k, v in back.document.items() if k in want}
    if got != want:
        raise RecipeError(
            f"profile {profile.name}: the {fmt} export does not import back to the same profile ({got} != {want}); "
            "nothing was written; fix: report this as a sparkforge bug"
        )
