#!/usr/bin/env python3
"""Fetch what build_ops.py compiles, from PyPI, and pack it for a GPU machine that has no network.

    python3 tests/gpu/fp8_ops/fetch_sources.py --out build/fp8dev/ship/fp8src.tar.gz [--cache DIR] [--vllm V] [--flashinfer V]

vLLM's sdist (csrc/ and the two Python files build_ops.py reads) and CUTLASS's headers as the compile probe gets
them: from the flashinfer-python wheel the recipe pins (flashinfer/data/cutlass). Each file is checked against
the sha256 PyPI's Simple API lists. The tarball holds `vllm-<version>/` and `cutlass/`, about 6 MB.
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

SIMPLE = "https://pypi.org/simple/{name}/"
# The pins of recipes/vllm-qwen35.yaml (tests/unit/test_fp8_ops_build.py keeps them equal).
VLLM_VERSION = "0.31.0"
FLASHINFER_VERSION = "0.7.0.post1"
VLLM_MEMBERS = ("csrc/", "vllm/_custom_ops.py", "vllm/_version.py")
CUTLASS_MEMBERS = ("include/", "tools/util/include/")


def pypi_file(name: str, filename: str) -> tuple[str, str]:
    """(url, sha256) of one file of a PyPI project, from the Simple API (PEP 691 JSON)."""
    request = urllib.request.Request(
        SIMPLE.format(name=name), headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        index = json.load(response)
    for entry in index["files"]:
        if entry["filename"] == filename:
            return entry["url"], entry["hashes"]["sha256"]
    raise SystemExit(f"PyPI lists no {filename} for {name}")


def download(name: str, filename: str, cache: Path) -> bytes:
    path = cache / filename
    url, sha256 = pypi_file(name, filename)
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        with urllib.request.urlopen(url, timeout=600) as response:
            path.write_bytes(response.read())
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"{filename}: sha256 differs from PyPI's {sha256}")
    return data


def pack(vllm_sdist: bytes, flashinfer_wheel: bytes, version: str, out: Path) -> int:
    """Write the tarball; returns the number of files in it."""
    count = 0
    with tarfile.open(out, "w:gz") as dst:
        with tarfile.open(fileobj=io.BytesIO(vllm_sdist), mode="r:gz") as src:
            top = f"vllm-{version}/"
            for member in src:
                rel = member.name.removeprefix(top)
                if member.isfile() and rel.startswith(VLLM_MEMBERS):
                    dst.addfile(member, src.extractfile(member))
                    count += 1
        with zipfile.ZipFile(io.BytesIO(flashinfer_wheel)) as wheel:
            for name in wheel.namelist():
                rel = name.removeprefix("flashinfer/data/cutlass/")
                if rel != name and rel.startswith(CUTLASS_MEMBERS) and not name.endswith("/"):
                    data = wheel.read(name)
                    info = tarfile.TarInfo(f"cutlass/{rel}")
                    info.size = len(data)
                    dst.addfile(info, io.BytesIO(data))
                    count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vllm", default=VLLM_VERSION)
    parser.add_argument("--flashinfer", default=FLASHINFER_VERSION)
    parser.add_argument("--cache", type=Path, help="where the downloads are kept (default: beside --out)")
    args = parser.parse_args()
    cache = args.cache or args.out.parent
    cache.mkdir(parents=True, exist_ok=True)
    sdist = download("vllm", f"vllm-{args.vllm}.tar.gz", cache)
    wheel = download("flashinfer-python", f"flashinfer_python-{args.flashinfer}-py3-none-any.whl", cache)
    count = pack(sdist, wheel, args.vllm, args.out)
    print(f"{args.out}: {count} files, {args.out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
