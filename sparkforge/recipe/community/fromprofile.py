"""A sparkforge serve profile -> a community recipe (Spark Arena's version 2 or the community runner's "1").

The values sparkrun reads from its config chain (tensor_parallel, max_model_len, gpu_memory_utilization,
served_model_name, port, host) go to `defaults` and reach the command as placeholders, as its validator asks;
every other flag is written literally, shell-quoted (and, for the runner's str.format, braces doubled). JSON
values become `defaults` placeholders in Spark Arena recipes, so no template engine reads their braces. What a
realized export pins (image digest, model revision, sparkforge's recipe hash) is passed in, never looked up here.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from sparkforge.boundary import write_output
from sparkforge.errors import RecipeError
from sparkforge.recipe.community.formats import Format, read_community
from sparkforge.recipe.community.toprofile import import_recipe
from sparkforge.recipe.community.vllmargv import FALLBACK_ALIASES, comment_line, shell_line
from sparkforge.recipe.profile import Profile
from sparkforge.recipe.yamlfile import read_yaml

_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")  # what sparkrun's template fills
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


def _slot(key: str, taken: dict[str, object]) -> str:
    """A fresh `defaults` key (an identifier) for a profile flag's value."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", key)
    base = base if re.match(r"[A-Za-z_]", base) else f"v_{base}"
    slot, n = base, 2
    while slot in taken or slot == "model":
        slot, n = f"{base}_{n}", n + 1
    return slot


def pinned_args(
    args: dict[str, object], revision: str | None, repositories: Mapping[str, str | None] | None = None
) -> dict[str, object]:
    """The args with the model pinned: --revision, and the tokenizer and code at the same commit (what import
    writes from a recipe's model_revision: --revision alone leaves them at main, GHSA-3ww4-5jv9-j5gm). With
    `repositories`, a tokenizer of its own at its own pin (what import reads back as that tokenizer's pin)."""
    if revision:
        args["revision"] = revision
    pin = args.get("revision")
    for flag in ("tokenizer-revision", "code-revision"):
        if isinstance(pin, str) and flag not in args:
            args[flag] = pin
    own = (repositories or {}).get(str(args.get("tokenizer")))
    if own and "tokenizer-revision" in args:
        args["tokenizer-revision"] = own
    return args


def _command(
    profile: Profile, fmt: Format, pins: Pins, trust_remote_code: bool
) -> tuple[list[str], dict[str, object]]:
    """The command's words (already quoted) and the defaults they use."""
    model = profile.model
    defaults: dict[str, object] = {"port": 8000, "host": "0.0.0.0"}
    words = ["vllm", "serve", "{model}" if fmt == "sparkarena" else _word(model.model, fmt)]
    args = pinned_args(dict(model.args), pins.model_revision, model.repositories)
    for key, value in args.items():
        if value is True:
            words.append(f"--{key}")
            continue
        if value is False:
            words.append(f"--no-{key}")
            continue
        words.append(f"--{key}")
        slot = DEFAULT_KEYS.get(key) if shlex.quote(str(value)) == str(value) else None
        slot = None if slot in defaults else slot
        if (
            slot is None
            and fmt == "sparkarena"
            and isinstance(value, str)
            and "{" in value
            and "'" not in value
        ):
            slot = _slot(
                key, defaults
            )  # JSON: a placeholder in quotes, so no template engine reads its braces
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


def _refuse_unrepresentable(profile: Profile, fmt: Format) -> None:
    """What the format's own tool would change on the way: refused, not exported wrong."""
    tool = "the community runner" if fmt == "eugr" else "sparkrun"
    problems = []
    if profile.model.gpus_per_node != 1:
        problems.append(
            f"gpus_per_node {profile.model.gpus_per_node}: {tool} places one GPU per node (a Spark)"
        )
    for key, value in profile.model.args.items():
        if "." in key and isinstance(value, bool | list):
            problems.append(
                f"args.{key}: vLLM reads the word after a dotted option as its value; give it one value"
            )
        texts = [str(v) for v in (value if isinstance(value, list) else [value])]
        if fmt == "sparkarena" and any(_PLACEHOLDER.search(t) for t in texts):
            problems.append(f"args.{key}: {{name}} in the value would be filled from defaults by {tool}")
    expands = "$" if fmt == "sparkarena" else '$`"\\'  # sparkrun: ${VAR}; the runner: export K="..." in bash
    for key, value in profile.model.env.items():
        found = sorted(set(expands) & set(value))
        if found:
            problems.append(f"env.{key}: {tool} would expand {' '.join(found)} in the value")
    if problems:
        raise RecipeError(
            f"profile {profile.name} cannot be written as a {fmt} recipe: {'; '.join(problems)}; nothing was "
            "written; fix: change those values in the profile (or export the other format)"
        )


def export_document(
    profile: Profile, fmt: Format, pins: Pins, *, trust_remote_code: bool = False
) -> dict[str, object]:
    """The recipe document of `fmt` that serves `profile` with the image (and pins) given."""
    if fmt in ("nvidia-v3", "nvidia-v4"):
        return _nvidia(profile, fmt, pins, trust_remote_code)
    _refuse_unrepresentable(profile, fmt)
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


def _nvidia(profile: Profile, fmt: Format, pins: Pins, trust_remote_code: bool) -> dict[str, object]:
    """NVIDIA's catalog document (recipe/community/nvidia.py): the pinned args as its serve.command."""
    import datetime

    from sparkforge.recipe.community.nvidia import ServeSpec, nvidia_document

    model = profile.model
    if model.gpus_per_node != 1:
        raise RecipeError(
            f"profile {profile.name}: gpus_per_node {model.gpus_per_node}: a DGX Spark has one GPU"
        )
    args = pinned_args(dict(model.args), pins.model_revision, model.repositories)
    args |= {"served-model-name": model.served_model_name} if model.served_model_name else {}
    args |= {"trust-remote-code": True} if trust_remote_code else {}
    description = model.description
    if pins.recipe_hash:
        description = f"{description} (sparkforge {pins.recipe} {pins.recipe_hash[:12]})".strip()
    spec = ServeSpec(
        model.model, args, dict(model.env), model.nodes, pins.image, description, model.served_model_name
    )
    return nvidia_document(fmt, spec, datetime.datetime.now(datetime.UTC).date())  # type: ignore[arg-type]


class _Literal(str):
    """A multi-line string written as a YAML block (`|`), as the formats' own recipes write commands."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def _blocks(value: object) -> object:
    """Multi-line strings inside mappings and lists (NVIDIA's serve.command) as YAML blocks too."""
    if isinstance(value, dict):
        return {k: _blocks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blocks(v) for v in value]
    return _Literal(value) if isinstance(value, str) and "\n" in value else value


def export_text(document: dict[str, object], header: list[str]) -> str:
    body = {
        k: _Literal(v) if k == "command" and isinstance(v, str) else _blocks(v) for k, v in document.items()
    }
    text = yaml.dump(body, Dumper=_Dumper, sort_keys=False, allow_unicode=False, width=4096)
    return "".join(f"# {comment_line(line)}\n" for line in header) + text


def arg_tokens(args: dict[str, object]) -> list[str]:
    """The argv words of profile args as vLLM reads them (a flag's name before its first dot: `_` is `-`)."""
    words: list[str] = []
    for key, value in args.items():
        head, dot, tail = key.partition(".")
        flag = head.replace("_", "-") + dot + tail
        if isinstance(value, bool):
            words.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            words += [f"--{flag}", *(str(v) for v in (value if isinstance(value, list) else [value]))]
    return words


def check_export(text: str, fmt: Format, profile: Profile, pins: Pins) -> None:
    """Read the exported text back as `fmt` and import it: it must be valid and give the same profile."""
    with tempfile.TemporaryDirectory(prefix="sparkforge-export-") as tmp:
        path = Path(tmp) / f"{profile.name}.yaml"
        write_output(path, text, "export's check")
        back = import_recipe(
            read_community(read_yaml(path), str(path), fmt),
            aliases=FALLBACK_ALIASES,
            allow=profile.model.allow,
        )
    args = pinned_args(dict(profile.model.args), pins.model_revision)
    model = profile.model
    want = (model.model, model.nodes, arg_tokens(args), dict(model.env), model.served_model_name)
    doc = back.document
    got = (
        doc["model"],
        doc["nodes"],
        arg_tokens(doc["args"]),
        doc.get("env", {}),
        doc.get("served_model_name"),
    )  # type: ignore[arg-type]
    if got != want:
        raise RecipeError(
            f"profile {profile.name}: the {fmt} export does not import back to the same profile ({got} != {want}); "
            "nothing was written; fix: report this as a sparkforge bug"
        )
