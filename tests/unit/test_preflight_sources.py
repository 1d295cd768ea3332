"""Where preflight gets vLLM from: GitHub-layout archives over HTTP, PyPI sdists and wheels, local trees."""

from __future__ import annotations

import io
import multiprocessing
import subprocess
import tarfile
from pathlib import Path

import pytest
from preflight_fixtures import (  # noqa: F401 (pytest fixtures)
    COMMITS,
    OFFLINE,
    SESSION,
    fixture_fresh_cache,
    fixture_github_archive_0310,
    fixture_sdist_0160,
    fixture_sdist_0310,
    fixture_server,
    vllm_pin,
    write_recipe,
)

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import PreflightError
from sparkforge.preflight.checks import PreflightOptions, run_preflight
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.sources import (
    extract_archive,
    github_archive_url,
    read_version_py,
    resolve_upstream,
    same_commit,
)
from sparkforge.recipe.loader import load_recipe


def _resolve(recipe, source, *, base="https://github.com", offline=False):
    return resolve_upstream(
        Session(echo=print, runner=Runner(stream=False)),
        recipe,
        source=source,
        github_base=base,
        fetcher=make_fetcher(offline=offline),
    )


def test_github_archive_is_fetched_over_http_once_then_cached(github_archive_0310, server):
    # The mirror's port is new each run, so its URL was never fetched; the extracted tree may be cached.
    commit = COMMITS["0.31.0"]
    server.add_file(f"/vllm-project/vllm/archive/{commit}.tar.gz", github_archive_0310)
    recipe = load_recipe("vllm-qwen35")
    tree = _resolve(recipe, "github", base=server.base)
    assert (tree.root / "CMakeLists.txt").is_file()
    assert tree.root.name != f"vllm-{commit}"  # GitHub's top directory is stripped
    assert tree.commit_id == "db9527a46"  # the mirror served the sdist's tree: _version.py agrees
    assert tree.origin == f"{server.base}/vllm-project/vllm/archive/{commit}.tar.gz"
    assert server.seen == [f"/vllm-project/vllm/archive/{commit}.tar.gz"]
    again = _resolve(recipe, "github", base=server.base, offline=True)
    assert again.root == tree.root and len(server.seen) == 1


def test_default_source_falls_back_to_pypi_when_the_mirror_lacks_the_commit(sdist_0310, server):
    report = run_preflight(SESSION, load_recipe("vllm-qwen35"), PreflightOptions(github_base=server.base))
    source = report.checks[0]
    assert source.status == "passed"
    assert "PyPI sdist vllm-0.31.0.tar.gz" in source.reason
    assert source.details["commit_id"] == "db9527a46"


def test_mirror_404_names_the_url(server, fresh_cache):
    with pytest.raises(PreflightError, match=r"HTTP 404.*fix:"):
        _resolve(load_recipe("vllm-qwen35"), "github", base=server.base)


def test_sdist_commit_must_match_the_pin(sdist_0160, tmp_path):
    recipe = write_recipe(tmp_path, vllm_pin("0.16.0", COMMITS["0.31.0"], patches=[]))
    with pytest.raises(PreflightError) as err:
        _resolve(recipe, "pypi")
    assert "89a77b108" in str(err.value) and COMMITS["0.31.0"] in str(err.value)


def test_local_sdist_archive_and_directory(sdist_0310):
    recipe = load_recipe("vllm-qwen35")
    from_archive = _resolve(recipe, str(sdist_0310.archive))
    assert from_archive.commit_id == "db9527a46" and from_archive.version == "0.31.0"
    from_dir = _resolve(recipe, str(sdist_0310.tree()))
    assert from_dir.root == sdist_0310.tree() and from_dir.commit_id == "db9527a46"


def test_git_checkout_at_another_commit_is_refused(tmp_path):
    repo = tmp_path / "vllm"
    repo.mkdir()
    (repo / "README.md").write_text("not vllm\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    with pytest.raises(PreflightError, match=f"says commit {head}.*pins"):
        _resolve(load_recipe("vllm-qwen35"), str(repo))


def test_offline_without_cache_reports_the_fix(fresh_cache):
    report = run_preflight(OFFLINE, load_recipe("vllm-qwen35"))
    assert report.status == "failed"
    source = report.checks[0]
    assert source.status == "failed" and "offline" in source.reason and "--source" in source.reason
    assert [c.status for c in report.checks[1:]] == ["skipped"] * 5


def test_wheel_is_read_through_ranges_without_downloading_it(fresh_cache):
    tree = _resolve(load_recipe("vllm-qwen35-wheels"), None)
    assert tree.kind == "wheel" and tree.commit_id == "4ba787ec9" and tree.version == "0.33.0"
    assert tree.exists("vllm/_C_stable_libtorch.abi3.so")  # from the wheel's listing
    assert "Requires-Dist: torch==2.14.0" in (tree.wheel_metadata() or "")
    size = sum(p.stat().st_size for p in fresh_cache.rglob("*") if p.is_file())
    assert size < 5_000_000  # a 333 MB wheel, a few hundred kB fetched


def _tiny_archive(path: Path) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for i in range(200):
            data = f"file {i}\n".encode()
            info = tarfile.TarInfo(f"top-dir/sub/f{i}.txt")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _extract_in_child(args: tuple[str, str, str]) -> str:
    import os

    archive, sha, cache = args
    os.environ["SPARKFORGE_CACHE"] = cache
    return str(extract_archive(Path(archive), sha))


def test_concurrent_extractions_agree_and_leave_no_partial_files(tmp_path):
    archive = tmp_path / "a.tar.gz"
    _tiny_archive(archive)
    cache = tmp_path / "shared-cache"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        roots = pool.map(_extract_in_child, [(str(archive), "ab" * 32, str(cache))] * 3)
    assert len(set(roots)) == 1
    root = Path(roots[0])
    assert sorted(p.name for p in (root / "sub").iterdir())[:2] == ["f0.txt", "f1.txt"]
    assert len(list((root / "sub").iterdir())) == 200
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".tmp-")]


def test_small_helpers():
    assert read_version_py(
        "__commit_id__ = commit_id = 'gdb9527a46'\n__version__ = version = '0.31.0'\n"
    ) == (
        "0.31.0",
        "db9527a46",
    )
    assert same_commit("db9527a46", COMMITS["0.31.0"]) and not same_commit("db9527a", "db9527b")
    assert not same_commit("db95", "db9527a46")  # too short to mean anything
    assert (
        github_archive_url("http://mirror.local/gh/", "https://github.com/vllm-project/vllm.git", "ab" * 20)
        == f"http://mirror.local/gh/vllm-project/vllm/archive/{'ab' * 20}.tar.gz"
    )
