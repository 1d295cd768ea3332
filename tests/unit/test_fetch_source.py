"""The in-build source fetcher: a tarball is accepted only when it records the pinned commit."""

from __future__ import annotations

import functools
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkforge.imagebuild.render import TEMPLATES_DIR

SCRIPT = TEMPLATES_DIR / "files" / "fetch-source.py"
COMMIT = "db9527a46873454610df6dbedf79a36d6bf1a7f6"


def _tarball(path: Path, top: str, files: dict[str, str], comment: str | None = None) -> None:
    pax = {"comment": comment} if comment else {}
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT, pax_headers=pax) as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}" if not name.startswith(("/", "..")) else name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _fetch(url: str, dest: Path, commit: str = COMMIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--repository",
            "https://github.com/vllm-project/vllm",
            "--commit",
            commit,
            "--version",
            "0.31.0",
            "--url",
            url,
            "--dest",
            str(dest / "src"),
            "--record",
            str(dest / "source.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_github_archive_commit_from_pax_header(served, tmp_path: Path) -> None:
    root, base = served
    _tarball(root / "a.tar.gz", f"vllm-{COMMIT}", {"CMakeLists.txt": "x"}, comment=COMMIT)
    proc = _fetch(f"{base}/a.tar.gz", tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "source.json").read_text())
    assert record["verified_by"] == "archive pax header" and record["commit"] == COMMIT
    assert (tmp_path / "src" / "CMakeLists.txt").read_text() == "x"


def test_sdist_commit_from_version_file(served, tmp_path: Path) -> None:
    root, base = served
    _tarball(
        root / "s.tar.gz", "vllm-0.31.0", {"vllm/_version.py": "__commit_id__ = commit_id = 'gdb9527a46'\n"}
    )
    proc = _fetch(f"{base}/s.tar.gz", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "source.json").read_text())["recorded"] == "db9527a46"


def test_other_commit_refused(served, tmp_path: Path) -> None:
    root, base = served
    _tarball(root / "s.tar.gz", "vllm-0.16.0", {"vllm/_version.py": "commit_id = 'g89a77b108'\n"})
    proc = _fetch(f"{base}/s.tar.gz", tmp_path)
    assert proc.returncode == 1
    assert f"is commit 89a77b108, the recipe pins {COMMIT}" in proc.stderr


def test_tarball_without_commit_refused(served, tmp_path: Path) -> None:
    root, base = served
    _tarball(root / "n.tar.gz", "something", {"README": "no commit here"})
    proc = _fetch(f"{base}/n.tar.gz", tmp_path)
    assert proc.returncode == 1 and "records no commit" in proc.stderr


def test_path_traversal_refused(served, tmp_path: Path) -> None:
    root, base = served
    _tarball(root / "t.tar.gz", f"vllm-{COMMIT}", {"ok": "1", "../../evil": "x"}, comment=COMMIT)
    proc = _fetch(f"{base}/t.tar.gz", tmp_path)
    assert proc.returncode == 1 and "unsafe archive member" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()
