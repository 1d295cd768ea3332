"""Records of pushed platform images (`build/digests/`): what `push` writes and `publish` merges."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkforge import oci
from sparkforge.boundary import read_json, write_output
from sparkforge.errors import EngineError, InputError, PublishError
from sparkforge.recipe.loader import REPO_ROOT, Recipe

DIGESTS_DIR = REPO_ROOT / "build" / "digests"


@dataclass(frozen=True)
class PushedImage:
    """One platform's image in the registry, addressed by digest: what `publish` merges."""

    recipe: str
    recipe_hash: str
    platform: str
    repository: str
    digest: str

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.recipe}-{oci.arch(self.platform)}.json"
        return write_output(path, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n", "digest record")


def load_digests(recipe: Recipe, directory: Path) -> dict[str, str]:
    """platform -> digest from the records `push` wrote for this recipe; a stale record is an error."""
    out: dict[str, str] = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = read_json(path, "digest record", max_bytes=1 << 20)
            record = PushedImage(**{k: data[k] for k in PushedImage.__dataclass_fields__})
        except (InputError, ValueError, KeyError, TypeError):
            raise PublishError(f"{path}: not a digest record written by 'invoke push'; remove it") from None
        if record.recipe != recipe.name:
            continue
        if record.recipe_hash != recipe.hash or record.repository != recipe.model.publish.repository:
            raise PublishError(
                f"{path}: written for recipe hash {record.recipe_hash[:12]} / {record.repository}, but recipe "
                f"{recipe.name} is now {recipe.hash[:12]} / {recipe.model.publish.repository}; fix: build and "
                f"push {record.platform} again from this recipe, or remove the stale record"
            )
        out[record.platform] = record.digest
    return out


@dataclass(frozen=True)
class BuildMetadata:
    """What BuildKit's --metadata-file says of a pushed image: its manifest digest and its config (image ID)."""

    digest: str
    config_digest: str


def read_build_metadata(path: Path) -> BuildMetadata:
    """Read BuildKit's metadata file (`containerimage.digest`, `containerimage.config.digest`)."""
    from sparkforge.boundary import read_json
    from sparkforge.errors import InputError

    try:
        # The boundary: a FIFO or /dev/zero never hangs or fills memory.
        meta = read_json(path, "--metadata-file")
        return BuildMetadata(str(meta["containerimage.digest"]), str(meta["containerimage.config.digest"]))
    except (OSError, ValueError, KeyError, TypeError, InputError):
        raise EngineError(
            f"{path}: no 'containerimage.digest' / 'containerimage.config.digest', so the pushed image cannot be "
            "matched to the verified one; fix: pass the --metadata-file written by 'invoke build --push-by-digest' "
            "(buildx)"
        ) from None
