"""Every repository a profile reaches besides the model, pinned by the profile itself.

A tokenizer (`--tokenizer`), a drafter (`--speculative-config`'s `model`, `--spec-model`), LoRA adapters
(`--lora-modules`) and a config repository (`--hf-config-path`) are other Hugging Face repositories: each is
listed under the profile's `repositories:` with a full 40-hex commit (a branch, a tag or `refs/pr/N` is refused:
its owner can change what it names). vLLM never resolves these names itself: the download phase fetches each
at its pin into the Hugging Face cache and serve passes the folder of that snapshot (`snapshot_value`), so what
runs is what was pinned whether or not vLLM has a revision flag for it (LoRA and `--hf-config-path` have none).
The model's own pin stays `args.revision`; `--code-revision` and `--tokenizer-revision` are derived from it.

Code that `hf-overrides`' `auto_map` names in another repository (`org/repo--module.Class`) cannot be pinned
(transformers fetches it at the model's one `--code-revision`): it is refused with no opt-in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sparkforge.boundary import parse_json
from sparkforge.errors import InputError

HEX40 = re.compile(r"[0-9a-f]{40}")
# A Hugging Face repository id as the hub accepts it: `name` or `owner/name`, no `..`, no scheme, no path.
HUB_ID = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?")
# Flags whose whole value is one repository.
WHOLE = {
    "tokenizer": "the tokenizer (and processor)",
    "hf-config-path": "the model's config",
    "spec-model": "the drafter",
}
PIN_FIX = (
    "write its full 40-hex commit under repositories: in the profile (`git ls-remote https://huggingface.co/{repo}` "
    "or the repository's history on the hub shows it)"
)


@dataclass(frozen=True)
class Reach:
    """One repository a profile's args reach: the arg (or field) that names it, and the repository id."""

    entry: str  # `tokenizer`, `speculative-config.model`, `lora-modules.NAME`
    repo: str
    what: str

    @property
    def flag(self) -> str:
        """The flag that names it (`lora-modules` for each adapter)."""
        return self.entry.split(".", 1)[0] if self.entry.startswith("lora-modules.") else self.entry


def is_hub_id(text: object) -> bool:
    """Whether a value is a Hugging Face repository id (not a path, not a URI)."""
    return isinstance(text, str) and HUB_ID.fullmatch(text) is not None


def _json(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return parse_json(value, "a JSON value")
    except InputError:
        return value


def lora_items(value: object) -> Iterator[tuple[str, str]]:
    """(name, path) of each `--lora-modules` item: `name=path` or vLLM's JSON form."""
    for word in value if isinstance(value, list) else [value]:
        parsed = _json(word) if isinstance(word, str) and word.lstrip().startswith("{") else word
        if isinstance(parsed, dict):
            yield str(parsed.get("name", "")), str(parsed.get("path", ""))
        elif isinstance(word, str) and "=" in word:
            name, _, path = word.partition("=")
            yield name, path
        else:
            yield str(word), str(word)


def reached(args: Mapping[str, object], model: str = "") -> list[Reach]:
    """The Hub repositories other than `model` that the args reach (paths and URIs are the allow-list's)."""
    out: list[Reach] = []
    for key, value in args.items():
        flag = key.replace("_", "-")
        if flag in WHOLE and is_hub_id(value):
            out.append(Reach(flag, str(value), WHOLE[flag]))
        elif flag == "lora-modules":
            out += [
                Reach(f"lora-modules.{n}", p, f"the LoRA adapter {n}")
                for n, p in lora_items(value)
                if is_hub_id(p)
            ]
        elif flag in ("speculative-config", "speculative-config.model"):
            parsed = _json(value) if flag == "speculative-config" else value
            drafter = parsed.get("model") if isinstance(parsed, dict) else parsed if "." in flag else None
            if is_hub_id(drafter):
                out.append(Reach("speculative-config.model", str(drafter), "the drafter"))
    return [r for r in out if r.repo != model]


def auto_map_repos(args: Mapping[str, object]) -> list[str]:
    """Repositories named by `hf-overrides`' auto_map (`org/repo--module.Class`): code no pin can hold."""
    found = []
    for key, value in args.items():
        flag = key.replace("_", "-")
        if not flag.startswith("hf-overrides"):
            continue
        parsed = _json(value)
        tree = {flag.split(".", 1)[1]: parsed} if "." in flag else parsed
        stack = [tree]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack += list(item.values())
            elif isinstance(item, list):
                stack += item
            elif isinstance(item, str) and "--" in item:
                found.append(item.split("--", 1)[0])
    return found


def pin_problems(args: Mapping[str, object], model: str, repositories: Mapping[str, str | None]) -> list[str]:
    """Why the args and `repositories:` disagree: a reached repository not listed, a listed one nothing reaches,
    auto_map code in another repository. (An entry listed without a commit loads; every launch refuses it.)"""
    problems = []
    reach = reached(args, model)
    for r in reach:
        if r.repo not in repositories:
            problems.append(
                f"args.{r.entry}: reaches {r.repo} ({r.what}), which repositories: does not list; fix: "
                + PIN_FIX.format(repo=r.repo)
            )
    stale = sorted(set(repositories) - {r.repo for r in reach})
    if stale:
        problems.append(
            f"repositories: {', '.join(stale)}: no arg reaches it; fix: remove the entry (or the arg that needed it)"
        )
    for repo in auto_map_repos(args):
        problems.append(
            f"args.hf-overrides.auto_map: loads code from {repo[:80]}, which no pin can hold (transformers fetches "
            "it at the model's one --code-revision); fix: remove it (no opt-in)"
        )
    return problems


def unpinned(repositories: Mapping[str, str | None]) -> list[str]:
    """The listed repositories still waiting for their commit."""
    return sorted(repo for repo, commit in repositories.items() if commit is None)


def snapshot_folder(hub_cache: str, repo: str, commit: str) -> str:
    """The folder Hugging Face's cache keeps `repo` at `commit` in (what the download phase fills)."""
    return f"{hub_cache.rstrip('/')}/models--{repo.replace('/', '--')}/snapshots/{commit}"


def snapshot_value(
    key: str, value: object, model: str, repositories: Mapping[str, str | None], hub_cache: str
) -> object:
    """An arg's value with every pinned repository it reaches replaced by its snapshot folder (pure); the
    drafter's revision fields are dropped: the folder is the pin."""
    flag = key.replace("_", "-")

    def folder(repo: object) -> object:
        commit = repositories.get(str(repo)) if is_hub_id(repo) and repo != model else None
        return snapshot_folder(hub_cache, str(repo), commit) if commit else repo

    if flag in WHOLE or flag == "speculative-config.model":
        return folder(value)
    if flag == "lora-modules":
        words = value if isinstance(value, list) else [value]
        out = []
        for word in words:
            parsed = _json(word) if isinstance(word, str) and word.lstrip().startswith("{") else None
            if isinstance(parsed, dict):
                out.append(json.dumps({**parsed, "path": folder(parsed.get("path"))}))
            elif isinstance(word, str) and "=" in word:
                name, _, path = word.partition("=")
                out.append(f"{name}={folder(path)}")
            else:
                out.append(word)
        return out if isinstance(value, list) else out[0]
    if flag == "speculative-config":
        parsed = _json(value)
        if isinstance(parsed, dict) and folder(parsed.get("model")) != parsed.get("model"):
            kept = {k: v for k, v in parsed.items() if k not in ("revision", "code_revision")}
            return json.dumps({**kept, "model": folder(parsed.get("model"))})
    return value
