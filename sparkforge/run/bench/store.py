"""The result store: every `invoke bench` result kept under a local directory by image digest.

Layout: `<store>/<algo>-<hex>/<UTC date-time>-<suite>.json`, where the key is the image's registry digest
when it has one (what a release is known by) and its local image ID otherwise. The store is
`$SPARKFORGE_BENCH_STORE`, else `~/.cache/sparkforge/bench`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.boundary import output_dir, walk_tree, write_output
from sparkforge.errors import RunError
from sparkforge.run.bench.results import load_result

MAX_ENTRIES = 200_000  # files and folders in a store: years of nightly benches on many images
_DIGEST = re.compile(r"(sha256):([0-9a-f]{64})")


def store_root(root: str | Path | None = None) -> Path:
    if root:
        return Path(root)
    env = os.environ.get("SPARKFORGE_BENCH_STORE")
    return Path(env) if env else Path.home() / ".cache" / "sparkforge" / "bench"


def image_key(image: dict[str, Any]) -> str:
    """The store's folder for an image: its first registry digest, else its image ID."""
    for candidate in [*(image.get("digests") or []), image.get("id") or ""]:
        match = _DIGEST.search(str(candidate))
        if match:
            return f"{match.group(1)}-{match.group(2)}"
    raise RunError(
        f"bench: the served image has no digest or image ID ({image}); fix: serve an image the engine knows"
    )


def save(doc: dict[str, Any], text: str, root: str | Path | None = None) -> Path:
    """Write a result's JSON text into the store; the path written. Through the boundary: a link planted in
    the store (the image's folder, or the file's name) is never followed, a file or pipe there is refused."""
    folder = output_dir(store_root(root) / image_key(doc["identity"]["image"]), "--store")
    stamp = doc["identity"]["date"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = folder / f"{stamp}-{doc['suite']['name']}.json"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{stamp}-{doc['suite']['name']}-{n}.json"
    return write_output(path, text, "--store")


@dataclass(frozen=True)
class Stored:
    path: Path
    doc: dict[str, Any]

    @property
    def date(self) -> str:
        return str(self.doc["identity"].get("date"))


def entries(root: str | Path | None = None) -> tuple[list[Stored], list[str]]:
    """Every result in the store, oldest first, and one line per file that is not a readable result."""
    base = store_root(root)
    found, unreadable = [], []
    if not base.is_dir():
        return [], []
    # The store's own layout (<key>/<file>.json) without following a link: a link planted in the store (to
    # another folder or to a file elsewhere) is not a result of this store.
    top = base.resolve()
    results = [
        p for p in walk_tree(top, "--store", max_depth=2, max_entries=MAX_ENTRIES) if p.suffix == ".json"
    ]
    for path in sorted(p for p in results if len(p.relative_to(top).parts) == 2):
        try:
            found.append(Stored(path, load_result(path)))
        except RunError as exc:
            unreadable.append(str(exc).split("; fix:")[0])
    return sorted(found, key=lambda s: (s.date, str(s.path))), unreadable


def history(
    recipe: str, recipe_hash: str | None, root: str | Path | None = None
) -> tuple[list[Stored], list[str]]:
    """The stored results of one recipe (by name, or by the hash of the recipe file given), oldest first."""
    found, unreadable = entries(root)
    mine = [
        s
        for s in found
        if s.doc["identity"].get("recipe") == recipe
        or (recipe_hash and s.doc["identity"].get("recipe_hash") == recipe_hash)
    ]
    return mine, unreadable


def _keys(image: dict[str, Any]) -> set[str]:
    return {
        m.group(2)
        for i in [image.get("id") or "", *(image.get("digests") or [])]
        for m in [_DIGEST.search(str(i))]
        if m
    }


def of_image(image_ids: set[str], root: str | Path | None = None) -> list[Stored]:
    """The stored results of an image known by any of these IDs/digests, oldest first."""
    wanted = {m.group(2) for i in image_ids for m in [_DIGEST.search(i)] if m}
    found, _ = entries(root)
    return [s for s in found if _keys(s.doc["identity"]["image"]) & wanted]


def latest_pair(
    ids_a: set[str], ids_b: set[str], root: str | Path | None = None
) -> tuple[Stored, Stored] | None:
    """The newest results of image A and of image B that measured the same model with the same suite (the
    suite of B's newest such result); None when the two images share no such result."""
    a, b = of_image(ids_a, root), of_image(ids_b, root)
    for newer in reversed(b):
        kind = (newer.doc["model"], newer.doc["suite"]["name"])
        older = [s for s in a if (s.doc["model"], s.doc["suite"]["name"]) == kind and s.path != newer.path]
        if older:
            return older[-1], newer
    return None


def stored_pair(a: str, b: str, root: str | Path | None = None) -> list[Path]:
    """For `invoke diff A B` without --bench: the newest stored results of the two local images that measured
    the same model with the same suite (latest_pair), or [] when there are none."""
    from sparkforge import engine
    from sparkforge.errors import EngineError

    ids = []
    for ref in (a, b):
        try:
            attrs = engine.inspect_image(ref)
        except EngineError:  # not a local image (a recipe, a registry reference): no stored result
            return []
        ids.append({str(attrs.get("Id") or ""), *(attrs.get("RepoDigests") or [])})
    pair = latest_pair(ids[0], ids[1], root)
    return [pair[0].path, pair[1].path] if pair else []
