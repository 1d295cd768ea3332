"""Known-bad combinations: vLLM version range x model family x serve flags with a public report of silent wrong
output (sparkforge/preflight/known_bad.yaml). Pure: a profile and a vLLM version in, the matching entries out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from sparkforge.boundary import parse_json, read_text
from sparkforge.errors import InputError, PreflightError
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check

DATA = Path(__file__).with_name("known_bad.yaml")


class UpstreamReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, Field(pattern=r"^https://")]
    title: Annotated[str, Field(min_length=1)]


class Recheck(BaseModel):
    """When the entry was last held against upstream: the pinned vLLM versions it was checked for, the day, and
    what the upstream reports said then (an open issue, a fix in no release)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vllm: Annotated[list[Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+$")]], Field(min_length=1)]
    date: Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$")]
    upstream: Annotated[str, Field(min_length=1)]


class KnownBad(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    vllm: str
    architectures: list[str]
    speculative_methods: list[str] = Field(default_factory=list)
    prefix_caching: bool | None = None
    action: Literal["refuse", "warn"]
    what: str
    fix: str
    reports: Annotated[list[UpstreamReport], Field(min_length=1)]
    checked: Recheck

    def rechecked_for(self, vllm: str) -> bool:
        """Whether the entry was re-checked against this vLLM release (a local build suffix ignored)."""
        return vllm.split("+")[0] in self.checked.vllm

    def describe(self) -> str:
        cited = "; ".join(f"{r.url} ({r.title})" for r in self.reports)
        return (
            f"{self.what} (vLLM {self.vllm}; reported in {cited}; re-checked {self.checked.date} for vLLM "
            f"{', '.join(self.checked.vllm)}: {self.checked.upstream}); fix: {self.fix}"
        )


@dataclass(frozen=True)
class Match:
    entry: KnownBad
    profile: str
    vllm: str

    def message(self) -> str:
        return (
            f"profile {self.profile} on vLLM {self.vllm} is a known-bad combination: {self.entry.describe()}"
        )


def load_known_bad(path: Path = DATA) -> list[KnownBad]:
    try:
        entries = TypeAdapter(list[KnownBad]).validate_python(yaml.safe_load(read_text(path, "", 1 << 20)))
        for entry in entries:
            SpecifierSet(entry.vllm)
    except (InputError, yaml.YAMLError, ValidationError, InvalidSpecifier) as exc:
        raise PreflightError(
            f"{path}: the known-bad list is unreadable ({str(exc)[:300]}); fix: correct the file"
        ) from None
    return entries


def _speculative_method(args: dict) -> str | None:
    config = args.get("speculative-config")
    if config is None:
        return None
    try:
        parsed = parse_json(config, "speculative-config") if isinstance(config, str) else config
    except InputError:
        return None
    return str(parsed.get("method")) if isinstance(parsed, dict) and parsed.get("method") else None


def matches(profile: Profile, vllm: str, entries: list[KnownBad] | None = None) -> list[Match]:
    """The entries this profile hits on this vLLM version (its architecture, speculative method, prefix caching)."""
    args = {k.replace("_", "-"): v for k, v in profile.model.args.items()}
    try:
        version = Version(vllm.split("+")[0])
    except InvalidVersion:
        return []
    found = []
    for entry in load_known_bad() if entries is None else entries:
        if version not in SpecifierSet(entry.vllm, prereleases=True):
            continue
        if profile.model.architecture not in entry.architectures:
            continue
        if entry.speculative_methods and _speculative_method(args) not in entry.speculative_methods:
            continue
        if (
            entry.prefix_caching is not None
            and (args.get("enable-prefix-caching", True) is not False) != entry.prefix_caching
        ):
            continue
        found.append(Match(entry, profile.name, vllm))
    return found


def refusals(profile: Profile, vllm: str) -> list[Match]:
    return [m for m in matches(profile, vllm) if m.entry.action == "refuse"]


def known_bad_check(profile: Profile, vllm: str) -> Check:
    """Preflight's `known-bad:<profile>` row: failed on a refusing entry, passed with a warning otherwise."""
    found = matches(profile, vllm)
    details = {
        "entries": [m.entry.id for m in found],
        "reports": [r.url for m in found for r in m.entry.reports],
    }
    refused = [m for m in found if m.entry.action == "refuse"]
    if refused:
        return Check(f"known-bad:{profile.name}", "failed", refused[0].message(), details)
    if found:
        return Check(f"known-bad:{profile.name}", "passed", "warning: " + found[0].message(), details)
    return Check(f"known-bad:{profile.name}", "passed", f"no known-bad combination for vLLM {vllm}", details)


def guard(profile: Profile, vllm: str, warn) -> None:
    """serve / cluster.up: refuse a refusing entry before anything starts; print the warning ones."""
    for match in matches(profile, vllm):
        if match.entry.action == "refuse":
            raise PreflightError(match.message() + "; nothing was started")
        warn(f"warning: {match.message()}")
