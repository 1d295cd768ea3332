"""Where the TUF metadata of a repository lives in the registry, and the fetcher python-tuf reads it through.

Layout (docs/trust.md): each metadata file is a one-layer OCI artifact in the image's own repository, under a
tag derived from its TUF file name; versioned files never move, `timestamp.json` is the one moving tag.

    {N}.root.json      -> REPOSITORY:tuf-root-{N}
    {V}.snapshot.json  -> REPOSITORY:tuf-snapshot-{V}       (consistent snapshots)
    {V}.targets.json   -> REPOSITORY:tuf-targets-{V}
    timestamp.json     -> REPOSITORY:tuf-timestamp
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from tuf.api.exceptions import DownloadHTTPError
from tuf.ngclient import FetcherInterface

from sparkforge.errors import PublishError
from sparkforge.registry.ocidist import Registry

ARTIFACT_TYPE = "application/vnd.sparkforge.tuf.metadata.v1+json"
LAYER_TYPE = "application/vnd.tuf.metadata+json"
MAX_BYTES = 2 << 20  # a targets file of thousands of tags; more is refused before it is read
URL_SCHEME = "oci-tuf://"
_FILE = re.compile(r"(?:(\d{1,12})\.)?(root|snapshot|targets|timestamp)\.json")


def tag_for(filename: str) -> str:
    """The registry tag holding the TUF metadata file `filename` (e.g. 3.root.json -> tuf-root-3)."""
    found = _FILE.fullmatch(filename)
    if found is None or (found.group(2) == "timestamp") != (found.group(1) is None):
        raise PublishError(f"{filename!r} is not a TUF metadata file name of this layout")
    version, role = found.groups()
    return f"tuf-{role}" if version is None else f"tuf-{role}-{int(version)}"


def base_url(repository: str) -> str:
    return f"{URL_SCHEME}{repository}/"


class RegistryFetcher(FetcherInterface):
    """python-tuf's fetcher over the registry: a URL names a metadata file; absent tags answer 404.

    It remembers the bytes served per file name (`served`), so the client can compare what the registry
    served with what it already trusts (a fork at equal version).
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.served: dict[str, bytes] = {}

    def _fetch(self, url: str) -> Iterator[bytes]:
        prefix = base_url(self.registry.repository)
        if not url.startswith(prefix):
            raise DownloadHTTPError(f"{url} is not in {self.registry.repository}", 404)
        name = url.removeprefix(prefix)
        data = self.registry.artifact(tag_for(name), MAX_BYTES)
        if data is None:
            raise DownloadHTTPError(f"{self.registry.repository}:{tag_for(name)} is not in the registry", 404)
        self.served[name] = data
        return iter([data])


def upload(registry: Registry, filename: str, data: bytes) -> str:
    """Write one metadata file to its tag; the artifact's manifest digest."""
    return registry.put_artifact(tag_for(filename), ARTIFACT_TYPE, LAYER_TYPE, data)
