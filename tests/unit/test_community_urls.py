"""Community recipes over https: a real TLS server on 127.0.0.1 (a certificate made here, trusted through
SPARKFORGE_CA_BUNDLE as a proxy's would be) serves a recipe, an archive of a recipe repository, a missing file and
an oversized one."""

from __future__ import annotations

import functools
import http.server
import shutil
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkforge.errors import RecipeError
from sparkforge.preflight.catalog import PinnedVllm, catalog_refs, import_with, read_source, run_catalog
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.community.toprofile import write_profile
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.profile import load_profile
from tests.prerequisites import skip_or_fail

FIXTURES = Path(__file__).parent / "fixtures" / "community"
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"


@pytest.fixture(scope="module")
def https_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    if shutil.which("openssl") is None:
        skip_or_fail("openssl is not installed (Debian package openssl)")
    tmp = tmp_path_factory.mktemp("https")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    www = tmp / "www"
    shutil.copytree(FIXTURES, www / "repo-main" / "recipes")
    (www / "repo-main" / ".github").mkdir()
    (www / "repo-main" / ".github" / "ci.yml").write_text("on: push\n")  # not a recipe: outside recipes/
    with tarfile.open(www / "repo.tar.gz", "w:gz") as tar:
        tar.add(www / "repo-main", arcname="repo-main")
    (www / "big.yaml").write_text("#" * (300 * 1024))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()


def test_import_and_catalog_over_https(https_root, tmp_path: Path, monkeypatch) -> None:
    base, cert = https_root
    pinned = PinnedVllm(load_recipe(str(CI_RECIPE)), make_fetcher())
    pinned.surface(), pinned.registry()  # read (PyPI, cached) before the trust store changes below
    # requests prefers REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE over a session's own bundle: only ours here.
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARKFORGE_CA_BUNDLE", str(cert))
    fetcher = make_fetcher(timeout=10, retries=0)
    url = f"{base}/repo-main/recipes/eugr-qwen35-122b-tp2.yaml"
    doc, where = read_source(url, fetcher)
    imported = import_with(pinned, (doc, where))
    profile = load_profile(write_profile(imported, tmp_path / "tp2.yaml"))
    assert profile.model.nodes == 2 and imported.text().startswith(
        f"# Imported by sparkforge from {url} (eugr"
    )

    refs = catalog_refs(f"{base}/repo.tar.gz", fetcher)
    assert [shown for _, shown in refs] == [
        f"{base}/repo.tar.gz!/{p.name}" for p in sorted(FIXTURES.glob("*.yaml"))
    ]
    rows, _ = run_catalog(refs, pinned, fetcher, None)
    assert {r.status for r in rows} == {"imports cleanly", "needs attention"}

    with pytest.raises(
        RecipeError, match=r"missing\.yaml: the URL does not answer with a recipe \(.*HTTP 404"
    ):
        read_source(f"{base}/missing.yaml", fetcher)
    with pytest.raises(
        RecipeError, match=r"big\.yaml.*declares 307200 bytes, more than 262144"
    ):  # capped while read
        read_source(f"{base}/big.yaml", fetcher)
