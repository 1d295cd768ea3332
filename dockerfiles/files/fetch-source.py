#!/usr/bin/env python3
"""Fetch a component's source at a pinned commit and prove it is that commit (runs inside the build).

Without --url: git fetch of exactly the commit, then HEAD must equal it. With --url: a tarball that is either
a GitHub archive (its pax header records the commit) or a release sdist (vllm/_version.py records the
abbreviated commit); either record must match the pinned commit, or the build stops.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path


def fail(message: str) -> None:
    print(f"fetch-source: {message}", file=sys.stderr)
    sys.exit(1)


def run(*argv: str, cwd: Path) -> str:
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def fetch_git(repository: str, commit: str, dest: Path) -> dict[str, str]:
    dest.mkdir(parents=True, exist_ok=True)
    run("git", "init", "-q", cwd=dest)
    run("git", "fetch", "-q", "--depth", "1", repository, commit, cwd=dest)
    run("git", "checkout", "-q", "--detach", "FETCH_HEAD", cwd=dest)
    head = run("git", "rev-parse", "HEAD", cwd=dest)
    if head != commit:
        fail(f"HEAD is {head}, the recipe pins {commit}")
    return {"method": "git", "commit": head, "verified_by": "git rev-parse HEAD"}


def download(url: str, target: Path) -> None:
    cafile = os.environ.get("SSL_CERT_FILE")
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    with urllib.request.urlopen(url, context=context, timeout=600) as response, target.open("wb") as out:
        shutil.copyfileobj(response, out)


def tar_commit(archive: tarfile.TarFile) -> str | None:
    comment = archive.pax_headers.get("comment", "")
    return comment if re.fullmatch(r"[0-9a-f]{40}", comment) else None


def sdist_commit(root: Path) -> str | None:
    for version_file in root.glob("*/_version.py"):
        match = re.search(r"commit_id\s*=\s*['\"]g?([0-9a-f]{7,40})['\"]", version_file.read_text())
        if match:
            return match.group(1)
    return None


def _inside(root: Path, path: Path) -> bool:
    """True when `path` (resolved) is `root` or below it: a path-component test, not a string prefix."""
    return path == root or root in path.parents


def check_members(archive: tarfile.TarFile, dest: Path) -> None:
    """Refuse absolute paths, '..', devices, and links (symbolic or hard) whose target leaves `dest`."""
    root = dest.resolve()
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        if Path(member.name).is_absolute() or not _inside(root, target):
            fail(f"unsafe archive member {member.name!r} (outside the tree)")
        if member.isdev() or member.isfifo():
            fail(f"unsafe archive member {member.name!r} (device or fifo)")
        if member.issym():
            link = (target.parent / member.linkname).resolve()
            if Path(member.linkname).is_absolute() or not _inside(root, link):
                fail(f"archive link {member.name!r} -> {member.linkname!r} points outside the tree")
        if member.islnk():  # hard-link targets are archive paths, relative to the archive root
            link = (root / member.linkname).resolve()
            if Path(member.linkname).is_absolute() or not _inside(root, link):
                fail(f"archive hard link {member.name!r} -> {member.linkname!r} points outside the tree")


def safe_extract(archive: tarfile.TarFile, dest: Path) -> None:
    """Extract refusing anything that would land outside `dest` (tarfile's data filter where it exists)."""
    dest.mkdir(parents=True, exist_ok=True)
    check_members(archive, dest)
    if hasattr(tarfile, "data_filter"):
        try:
            archive.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            fail(f"unsafe archive member: {exc}")
        return
    archive.extractall(dest)


def fetch_tarball(url: str, commit: str, dest: Path) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        archive_path = Path(tmp) / "source.tar.gz"
        download(url, archive_path)
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(archive_path) as archive:
            recorded = tar_commit(archive)
            safe_extract(archive, unpacked)
        tops = [p for p in unpacked.iterdir() if p.is_dir()]
        if len(tops) != 1:
            fail(f"{url}: expected one top-level directory, found {len(tops)}")
        root = tops[0]
        how = "archive pax header"
        if recorded is None:
            recorded, how = sdist_commit(root), "sdist _version.py commit_id"
        if recorded is None:
            fail(
                f"{url}: records no commit (neither a GitHub archive nor a release sdist); cannot verify the pin"
            )
        if not commit.startswith(recorded) and recorded != commit:
            fail(f"{url} is commit {recorded}, the recipe pins {commit}")
        dest.mkdir(parents=True, exist_ok=True)
        for child in root.iterdir():
            shutil.move(str(child), dest / child.name)
    return {"method": "tarball", "url": url, "commit": commit, "recorded": recorded, "verified_by": how}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--url", default="")
    parser.add_argument("--dest", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    if args.url:
        record = fetch_tarball(args.url, args.commit, args.dest)
    else:
        record = fetch_git(args.repository, args.commit, args.dest)
    record["version"] = args.version
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(record, indent=2) + "\n")
    print(f"fetch-source: {record['commit']} verified by {record['verified_by']}")


if __name__ == "__main__":
    main()
