"""Where a profile's checkpoint config.json is found: by the MODEL the profile serves (its Hugging Face id and
pinned revision) or `--model-dir`, never by the profile's file name, so a copied or renamed profile reads the
same config. One rule for the memory plan (run/memory) and vLLM's kernel selection (`invoke kernels`)."""

from __future__ import annotations

import re
from pathlib import Path

from sparkforge.errors import RunError

CHECKPOINTS_DIR = "checkpoints"  # profiles/checkpoints/<org>/<name>/<revision>.json, keyed by the model
UNPINNED = "unpinned"  # the file name of a config read from the hub's current files (no pinned revision)
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
REVISION = re.compile(r"[0-9a-f]{40}")


def pinned_revision(args: dict[str, object]) -> str | None:
    """The profile's pinned model commit (`args.revision`, 40 hex), None when unpinned."""
    value = args.get("revision")
    return value if isinstance(value, str) and REVISION.fullmatch(value) else None


def shipped_config(model: str, revision: str | None, profiles_dir: Path) -> Path | None:
    """Where the repository keeps the config.json of `model` at `revision`: profiles/checkpoints/<org>/<name>/
    <revision>.json (`unpinned.json`: the hub's current files, for a profile without a pinned revision). None for
    a model that is not a hub id (a local path: only --model-dir can say what it is)."""
    if not HUB_ID.fullmatch(model) or ".." in model:
        return None
    return profiles_dir / CHECKPOINTS_DIR / model / f"{revision or UNPINNED}.json"


def checkpoint_path(model: str, revision: str | None, profiles_dir: Path, model_dir: Path | None) -> Path:
    """The config.json the plan reads for the profile's MODEL (never its file name): `--model-dir`'s, else the
    one shipped for the model id and revision; RunError naming where to put it when neither exists."""
    if model_dir is not None:
        if (model_dir / "config.json").is_file():
            return model_dir / "config.json"
        raise RunError(
            f"--model-dir {model_dir} holds no config.json: the memory plan reads the checkpoint's dimensions from "
            "it; fix: pass the folder that holds the checkpoint's config.json"
        )
    path = shipped_config(model, revision, profiles_dir)
    if path is None:
        raise RunError(
            f"model {model!r} is not a Hugging Face id, so no checkpoint config is shipped for it: the memory plan "
            "needs its config.json; fix: pass --model-dir with the folder holding it, or --force to start without a "
            "plan"
        )
    if not path.is_file():
        at = f"revision {revision}" if revision else "no pinned revision (the hub's current files)"
        known = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
        raise RunError(
            f"no checkpoint config for {model} at {at} (looked for {path}"
            + (f"; shipped for revisions: {', '.join(known)}" if known else "")
            + "): the memory plan needs the config.json of the model the profile serves; fix: save that revision's "
            f"config.json as {path}, pass --model-dir holding it, or --force to start without a plan"
        )
    return path
