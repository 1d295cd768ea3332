"""Reproducible builds without an engine: the epoch rule, BuildKit's argv with timestamp rewriting, the refusal
for a recipe hash the checkout lacks, and the file-by-file comparison of two real `docker save`-shaped archives
(layer tars written here with tarfile, as Docker writes them)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from sparkforge.context import Session
from sparkforge.engine import Engine
from sparkforge.errors import SparkforgeError
from sparkforge.imagebuild import epoch, layerdiff
from sparkforge.imagebuild.buildkit import BuildRequest, build_command, load_command
from sparkforge.imagebuild.rebuild import RebuildRefused, find_recipe
from sparkforge.recipe.loader import load_recipe

ARGS = {"SOURCE_DATE_EPOCH": "1767225600"}


def _never_read(ref: str) -> str:
    raise AssertionError(f"$SOURCE_DATE_EPOCH wins: {ref} must not be read")


def test_epoch_parses_docker_times_and_honours_the_environment(monkeypatch):
    assert epoch.parse_created("2026-01-01T00:00:00Z") == 1767225600
    assert epoch.parse_created("2026-01-01T00:00:00.123456789Z") == 1767225600
    assert epoch.parse_created("2026-01-01T01:00:00.5+01:00") == 1767225600
    assert epoch.Epoch(1767225600, "x").iso == "2026-01-01T00:00:00Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    assert epoch.source_date_epoch(["never-read:1"], _never_read).seconds == 1767225600
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(SparkforgeError, match=r"not a whole number of seconds.*fix:"):
        epoch.source_date_epoch(["never-read:1"], _never_read)


def _argv(driver: str, **kw: object) -> tuple[str, ...]:
    req = BuildRequest(Path("/ctx/app"), "linux/amd64", "runtime", ("t:1",), build_args=ARGS, **kw)  # type: ignore[arg-type]
    return build_command(Engine("docker", "buildx", "26.1.5", driver), req).argv


def test_buildx_rewrites_layer_timestamps():
    docker_driver = _argv("docker")
    assert "type=docker,dest=/ctx/.app-runtime.image.tar,rewrite-timestamp=true" in docker_driver
    assert "--load" not in docker_driver and "SOURCE_DATE_EPOCH=1767225600" in docker_driver
    req = BuildRequest(Path("/ctx/app"), "linux/amd64", "runtime", ("t:1",), build_args=ARGS)
    load = load_command(Engine("docker", "buildx", "26.1.5", "docker"), req)
    assert load is not None and load.argv == ("docker", "load", "--input", "/ctx/.app-runtime.image.tar")
    assert "type=docker,rewrite-timestamp=true" in _argv("docker-container")
    pushed = _argv("docker-container", push_by_digest="r.example/x")
    assert any(a.endswith("push=true,rewrite-timestamp=true") for a in pushed)
    # Docker 26's own exporter refuses the rewrite on a push: the push (and its local twin) keep the exporter.
    assert not any("rewrite" in a for a in _argv("docker", push_by_digest="r.example/x"))
    assert "--load" in _argv("docker", rewrite_timestamps=False)
    classic = build_command(
        Engine("docker", "buildkit", "20.10"),
        BuildRequest(Path("/ctx/app"), "linux/amd64", "runtime", build_args=ARGS),
    ).argv
    assert "--output" not in classic and "SOURCE_DATE_EPOCH=1767225600" in classic


def test_rebuild_refuses_a_recipe_hash_not_in_the_checkout():
    with pytest.raises(RebuildRefused) as refused:
        find_recipe("0" * 64, "vllm-qwen35-wheels")
    message = str(refused.value)
    assert "hash 000000000000" in message and "not in this checkout" in message and "recipes/" in message
    assert "fix:" in message and "\n" not in message
    assert find_recipe(load_recipe("vllm-qwen35").hash, "x").name == "vllm-qwen35"


def _layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, (data, mtime) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _saved(path: Path, layers: list[bytes], steps: list[str]) -> Path:
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    config = json.dumps(
        {
            "created": "2026-01-01T00:00:00Z",
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created_by": s} for s in steps],
        }
    ).encode()
    manifest = [{"Config": "config.json", "Layers": [f"{i}/layer.tar" for i in range(len(layers))]}]
    with tarfile.open(path, "w") as tar:
        for name, data in [("config.json", config), ("manifest.json", json.dumps(manifest).encode())] + [
            (f"{i}/layer.tar", layer) for i, layer in enumerate(layers)
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_layerdiff_names_files_packages_and_content(tmp_path):
    site = "opt/venv/lib/python3.11/site-packages"
    base = _layer({"var/lib/dpkg/info/tzdata.list": (b"/usr/share/zoneinfo/UTC\n", 1)})
    record = b"stamp/__init__.py,,\nstamp/when.txt,,\n"
    common = {f"{site}/stamp-1.0.dist-info/RECORD": (record, 5), f"{site}/stamp/__init__.py": (b"x = 1\n", 5)}
    a = _layer({**common, f"{site}/stamp/when.txt": (b"built 1\nsame\n", 5), "etc/gone": (b"", 5)})
    b = _layer(
        {**common, f"{site}/stamp/when.txt": (b"built 2\nsame\n", 5), "usr/share/zoneinfo/UTC": (b"z", 9)}
    )
    steps = ["debootstrap", "RUN pip install stamp"]
    original = layerdiff.read_saved(_saved(tmp_path / "a.tar", [base, a], steps))
    rebuilt = layerdiff.read_saved(_saved(tmp_path / "b.tar", [base, b], steps))
    (layer,) = layerdiff.compare_images(original, rebuilt)
    assert layer.index == 1 and layer.step == "RUN pip install stamp"
    files = {f.path: f for f in layer.files}
    assert set(files) == {"etc/gone", f"{site}/stamp/when.txt", "usr/share/zoneinfo/UTC"}
    changed = files[f"{site}/stamp/when.txt"]
    assert changed.differs == ("content",) and changed.package == "python:stamp"
    assert "-built 1" in changed.diff and "+built 2" in changed.diff
    assert files["etc/gone"].differs == ("only in original",)
    assert files["usr/share/zoneinfo/UTC"].package == "debian:tzdata"
    assert layerdiff.config_differences(original.config, rebuilt.config) == []


def test_a_layer_only_one_image_has_is_listed_file_by_file(tmp_path):
    """A file planted in an extra layer of a copy (`FROM image` + `COPY`) is named, and the layers after an
    extra one in the middle still pair with their twins (only the extra one is reported)."""
    base = _layer({"etc/os-release": (b"bookworm\n", 1)})
    app = _layer({"opt/app/run.py": (b"print(1)\n", 5)})
    planted = _layer({"opt/sparkforge/planted.txt": (b"not from the recipe\n", 7), "opt/x/y": (b"", 7)})
    steps = ["debootstrap", "RUN install app"]
    original = layerdiff.read_saved(
        _saved(tmp_path / "a.tar", [base, planted, app], ["debootstrap", "COPY planted", "RUN install app"])
    )
    rebuilt = layerdiff.read_saved(_saved(tmp_path / "b.tar", [base, app], steps))
    (layer,) = layerdiff.compare_images(original, rebuilt)
    assert layer.index == 1 and layer.step == "COPY planted" and layer.rebuilt is None
    assert [(f.path, f.differs) for f in layer.files] == [
        ("opt/sparkforge/planted.txt", ("only in original",)),
        ("opt/x/y", ("only in original",)),
    ]
    # Appended at the end (the plain copy case): the same listing, from the rebuild's side too.
    tail = layerdiff.read_saved(_saved(tmp_path / "c.tar", [base, app, planted], [*steps, "COPY planted"]))
    (extra,) = layerdiff.compare_images(rebuilt, tail)
    assert extra.index == 2 and extra.original is None and extra.step == "COPY planted"
    assert {f.path for f in extra.files} == {"opt/sparkforge/planted.txt", "opt/x/y"}
    assert all(f.differs == ("only in rebuild",) for f in extra.files)


def _git(root: Path, *args: str) -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_template_drift_is_named_with_both_revisions(tmp_path):
    """A template committed after the image's revision refuses the rebuild naming REV, HEAD and the file;
    --allow-template-drift turns the refusal into a note; a change elsewhere is no drift."""
    from sparkforge.commands import Runner
    from sparkforge.imagebuild import drift

    root = tmp_path / "repo"
    (root / "dockerfiles").mkdir(parents=True)
    (root / "dockerfiles" / "vllm.Dockerfile.j2").write_text("FROM x\n")
    (root / "README.md").write_text("a\n")
    _git(root.parent, "init", "-q", str(root))
    for key, value in (("user.email", "t@example.com"), ("user.name", "t")):
        _git(root, "config", key, value)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "built here")
    built = _git(root, "rev-parse", "HEAD")
    session = Session(echo=print, runner=Runner(stream=False))
    (root / "README.md").write_text("b\n")
    _git(root, "commit", "-qam", "docs only")
    same = drift.template_check(session, built, False, root)
    assert same.status == "passed" and same.details["changed"] == []
    (root / "dockerfiles" / "vllm.Dockerfile.j2").write_text("FROM x\nRUN date > /t\n")
    _git(root, "commit", "-qam", "template change")
    head = _git(root, "rev-parse", "HEAD")
    with pytest.raises(drift.TemplateDrift) as refused:
        drift.template_check(session, built, False, root)
    message = str(refused.value)
    assert f"the image was built at {built[:12]}, this checkout is at {head[:12]}" in message
    assert "dockerfiles/vllm.Dockerfile.j2" in message and "\n" not in message
    assert f"fix: check out {built[:12]} or pass --allow-template-drift" in message
    allowed = drift.template_check(session, built, True, root)
    assert allowed.status == "skipped" and allowed.details["changed"] == ["dockerfiles/vllm.Dockerfile.j2"]
    # A revision this checkout does not hold cannot be compared: refused as well, saying so.
    with pytest.raises(drift.TemplateDrift, match="does not hold that revision"):
        drift.template_check(session, "f" * 40, False, root)
    assert drift.template_check(session, None, False, root).status == "skipped"


def test_base_override_and_step_drift_are_named():
    from sparkforge.imagebuild import drift
    from sparkforge.recipe import plan

    recipe = load_recipe("vllm-qwen35-wheels")
    pinned = plan.bases(recipe)
    local = "sparkforge-base/debian-bookworm:arm64"
    labels = {plan.BASE_LABELS["builder"]: local, plan.BASE_LABELS["runtime"]: local}
    check = drift.bases_check(recipe, labels)
    assert check.details["override"] and "base override recorded in the labels" in check.reason
    assert pinned.runtime in check.reason and local in check.reason
    as_pinned = {plan.BASE_LABELS["builder"]: pinned.builder, plan.BASE_LABELS["runtime"]: pinned.runtime}
    assert not drift.bases_check(recipe, as_pinned).details["override"]
    a = {"history": [{"created_by": "FROM x"}, {"created_by": "RUN date > /t"}, {"created_by": "LABEL a"}]}
    b = {"history": [{"created_by": "FROM x"}, {"created_by": "LABEL a"}]}
    assert drift.steps_check(a, a, "abc") is None
    steps = drift.steps_check(a, b, "0123456789abcdef")
    assert steps is not None and steps.status == "failed" and "template drift" in steps.reason
    assert steps.details["steps"] == [{"side": "original", "index": 1, "step": "RUN date > /t"}]
    assert "only in the original: RUN date > /t" in steps.reason and "0123456789ab" in steps.reason
    shell = "RUN |2 DEBIAN_FRONTEND=noninteractive SOURCE_DATE_EPOCH=1 /bin/sh -c date > /t"
    assert drift.short_step(shell) == "RUN date > /t" and drift.short_step("LABEL a=b") == "LABEL a=b"
    bash = "RUN |1 A=b /bin/bash -o pipefail -c sh -c 'cp /x /y' # buildkit"
    assert drift.short_step(bash) == "RUN sh -c 'cp /x /y'"
