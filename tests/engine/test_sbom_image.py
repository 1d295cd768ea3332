"""The SBOM of the real CI wheels image (vLLM 0.33.0, torch 2.14.0, ~8 GB), read from its layers and checked
against what the image itself answers when run (dpkg-query, importlib.metadata, sha256sum), and `diff` between
it and an image with one distribution changed.

The image comes from the `vllm_image` fixture (a cached rebuild of tests/recipes/ci-wheels-amd64.yaml, shared
with the cluster and serve tests); reading its SBOM takes ~2 s, each container below ~2 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from signing_fixtures import docker_build

from sparkforge import engine
from sparkforge.registry.diff import compare, sbom_rows
from sparkforge.registry.sides import recipe_side
from sparkforge.verify.sbom import Sbom, image_sbom, lock_problems, normalise

pytestmark = pytest.mark.engine
DOCKER = "/usr/bin/docker"
VENV = "/opt/venv/bin/python"
# Every distribution importlib.metadata finds on the interpreter's path and in folders below it that hold
# distributions of their own (setuptools/_vendor): vendored copies are code in the image too.
DISTS = """
import importlib.metadata as m, json, os, sys
roots = [p for p in sys.path if os.path.isdir(p)]
below = {r for p in roots for r, ds, _ in os.walk(p) if r != p and any(d.endswith((".dist-info", ".egg-info")) for d in ds)}
found = {(d.metadata["Name"], d.version, str(d._path.parent)) for d in m.distributions(path=roots + sorted(below))}
print(json.dumps(sorted(found)))
"""


def _run(image: str, *argv: str) -> str:
    return subprocess.run(
        [DOCKER, "run", "--rm", "--network", "none", "--entrypoint", argv[0], image, *argv[1:]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture(scope="module")
def ci_sbom(vllm_image: str) -> Sbom:
    return image_sbom(vllm_image)


def test_sbom_lists_the_dpkg_database_exactly(vllm_image: str, ci_sbom: Sbom) -> None:
    query = _run(
        vllm_image, "dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}\t${db:Status-Abbrev}\n"
    )
    installed = {
        tuple(line.split("\t")[:3]) for line in query.splitlines() if line.split("\t")[3].startswith("ii")
    }
    listed = {(p.name, p.version, p.location) for p in ci_sbom.packages if p.kind == "deb"}
    assert listed == installed and len(listed) > 100


def test_sbom_lists_every_python_distribution_and_the_lock_exactly(vllm_image: str, ci_sbom: Sbom) -> None:
    ran = json.loads(_run(vllm_image, VENV, "-c", DISTS)) + json.loads(
        _run(vllm_image, "/usr/bin/python3", "-c", DISTS)
    )
    seen = {(normalise(n), v, loc.lstrip("/")) for n, v, loc in ran}
    listed = {(normalise(p.name), p.version, p.location) for p in ci_sbom.packages if p.kind == "python"}
    assert listed == seen, listed ^ seen
    lock = ci_sbom.lock
    assert lock["recipe_hash"] == engine.image_labels(vllm_image)["dev.sparkforge.recipe-hash"]
    assert lock_problems(ci_sbom, lock) == []
    for name, component in lock["components"].items():  # each pin: exactly one distribution, that version
        found = [
            p for p in ci_sbom.packages if normalise(p.name) == normalise(component.get("package", name))
        ]
        assert [p.version for p in found] == [component["version"]], name
    vllm = next(p for p in ci_sbom.packages if p.kind == "python" and p.name == "vllm")
    record = f"/{vllm.location}/vllm-{vllm.version}.dist-info/RECORD"
    assert _run(vllm_image, "sha256sum", record).split()[0] == vllm.sha256
    assert ci_sbom.vllm is not None and ci_sbom.vllm.commit == lock["components"]["vllm"]["commit"]
    assert list(ci_sbom.vllm.arch_list) == lock["build"]["torch_cuda_arch_list"]
    cublas = next(c for c in ci_sbom.cuda if c.path.endswith("/libcublas.so.13"))
    assert (
        _run(vllm_image, "sha256sum", "/" + cublas.path).split()[0] == cublas.sha256
    )  # RECORD's hash is true


def test_sbom_task_writes_spdx(vllm_image: str, ci_sbom: Sbom, tmp_path: Path) -> None:
    out = tmp_path / "sbom.spdx.json"
    cli = subprocess.run(
        [sys.executable, "-m", "invoke", "sbom", "--image", vllm_image, "--json", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(out.read_text())
    assert doc == ci_sbom.to_spdx()
    names = {p["name"] for p in doc["packages"]}
    assert {"vllm", "torch", "bash", "libcublas.so.13"} <= names
    assert f"vLLM 0.33.0 commit {ci_sbom.vllm.commit}" in cli.stdout  # type: ignore[union-attr]


def test_diff_names_exactly_the_changed_distribution(vllm_image: str, ci_sbom: Sbom, tmp_path: Path) -> None:
    dist = next(p for p in ci_sbom.packages if p.kind == "python" and p.name == "agent-detector")
    info = f"/{dist.location}/agent_detector-{dist.version}.dist-info/METADATA"
    changed = "sparkforge-test/sbom-one-changed:latest"
    docker_build(
        f"FROM {vllm_image}\nRUN sed -i 's/^Version: {dist.version}$/Version: {dist.version}.post1/' {info}\n",
        "linux/amd64",
        changed,
        tmp_path / "changed",
    )
    try:
        other = image_sbom(changed)
        rows = sbom_rows(ci_sbom, other)
        assert [(r["item"], r["change"]) for r in rows] == [("python agent-detector", "changed")]
        assert rows[0]["a"].startswith(dist.version + " ") and rows[0]["b"].startswith(
            f"{dist.version}.post1 "
        )
        # diff's report carries them in its sbom section (sides as image_side makes them)
        side = recipe_side(str(Path(__file__).parents[1] / "recipes" / "ci-wheels-amd64.yaml"))
        report = compare(replace(side, sbom=ci_sbom), replace(side, sbom=other))
        check = next(c for c in report.checks if c.name == "sbom")
        assert [r["item"] for r in check.details["changes"]] == ["python agent-detector"]
        # the release notes from the two images' SBOMs, through the task: that one package and nothing else
        notes = tmp_path / "notes.md"
        done = subprocess.run(
            [sys.executable, "-m", "invoke", "sbom", "--image", changed, "--since", vllm_image, "--notes", str(notes)],
            cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        text = notes.read_text()
        assert "### Python distributions (1)" in text and "| agent-detector | changed |" in text
        assert "Debian packages" not in text and "CUDA libraries" not in text
    finally:
        engine.remove_image(changed)


def test_export_reader_agrees_with_the_layer_reader(base_amd64: str) -> None:
    # The export stream is the reader where the layer store is not readable (the buildx engine's containerd
    # snapshotter, a remote engine): the same image, the same document.
    layers, export = image_sbom(base_amd64), image_sbom(base_amd64, reader="export")
    assert export.to_spdx() == layers.to_spdx() and len(layers.packages) > 100
