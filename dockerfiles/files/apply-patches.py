"""In the image: apply an overlay's patch series to site-packages, all or nothing, and byte-compile what changed.

Usage: python3 apply-patches.py SITE PATCH... . The algorithm is sparkforge/imagebuild/overlay/unidiff.py, copied beside this
file into the build context (the host's preflight applied the same code to the same files); only the I/O is here.
"""

from __future__ import annotations

import py_compile
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import unidiff


def apply_to_tree(root: Path, patch_texts: list[str]) -> list[str]:
    """Apply each patch in order; every patch is checked before any file is written. Returns the changed paths."""
    current: dict[str, str | None] = {}
    for index, text in enumerate(patch_texts, 1):
        for change in unidiff.parse(text).changes:
            if change.binary or change.mode_change:
                raise unidiff.PatchError(
                    f"patch {index}: {change.path}: binary, mode or rename changes cannot be applied"
                )
            path = change.path
            if path not in current:
                target = root / path
                current[path] = target.read_text(encoding="utf-8") if target.is_file() else None
            try:
                current[path] = unidiff.apply_hunks(current[path], change)
            except unidiff.PatchError as exc:
                raise unidiff.PatchError(f"patch {index}: {exc}") from None
    for path, text in current.items():
        target = root / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    return list(current)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: apply-patches.py SITE PATCH...", file=sys.stderr)
        return 2
    root = Path(argv[0])
    try:
        changed = apply_to_tree(root, [Path(p).read_text(encoding="utf-8") for p in argv[1:]])
    except unidiff.PatchError as exc:
        print(f"sparkforge: overlay patch does not apply: {exc}", file=sys.stderr)
        return 1
    for path in changed:
        source = root / path
        if source.suffix == ".py" and source.is_file():
            # The stale bytecode goes; the new one is checked against the source's hash, never its time.
            for stale in (source.parent / "__pycache__").glob(source.stem + ".*.pyc"):
                stale.unlink()
            py_compile.compile(
                str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
            )
        print(f"sparkforge: patched {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
