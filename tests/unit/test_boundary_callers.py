"""The modules that left the boundary test's allow-list (issue 59) refuse hostile files through the boundary:
what a container printed, the probe's object paths, a pipe where a library was, a damaged cache entry. Docker
cannot run here: the image is stood in for by the files it would hold (engine.read_image_file's answers)."""

from __future__ import annotations

import json
import math
import os

import pytest

from sparkforge import engine
from sparkforge.audit.fatbin import read_fatbin_file
from sparkforge.errors import AuditError, EngineError
from sparkforge.imagebuild import probe
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.verify import selection, suite


def _image(monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes]) -> None:
    monkeypatch.setattr(engine, "read_image_file", lambda image, path: files.get(path))


def test_probe_results_keep_their_objects_inside_the_output_folder(tmp_path, monkeypatch) -> None:
    base = probe.IMAGE_DIR
    good = {"units": [{"name": "a", "object": "objects/a.o"}]}
    _image(monkeypatch, {f"{base}/probe.json": json.dumps(good).encode(), f"{base}/objects/a.o": b"\x7fELF"})
    assert probe._fetch_results("img", tmp_path / "out") == good
    assert (tmp_path / "out" / "objects" / "a.o").read_bytes() == b"\x7fELF"
    for hostile in ("../../outside.o", "/etc/cron.d/x", "objects/../../x.o"):
        doc = {"units": [{"name": "a", "object": hostile}]}
        _image(monkeypatch, {f"{base}/probe.json": json.dumps(doc).encode(), f"{base}/{hostile}": b"x"})
        with pytest.raises(EngineError, match=r"probe.json names the object .*fix: rebuild the probe stage"):
            probe._fetch_results("img", tmp_path / "out2")
    assert not (tmp_path / "outside.o").exists()
    for bad in (b'{"units": [1]}', b'{"units": NaN}', b'{"units": [], "units": []}'):
        _image(monkeypatch, {f"{base}/probe.json": bad})
        with pytest.raises(Exception, match=r"probe.json.*fix: rebuild the probe stage"):
            probe._fetch_results("img", tmp_path / "out3")


def test_the_suite_report_keeps_nan_but_refuses_what_is_not_json() -> None:
    doc = (
        '{"checks": [{"name": "gpu-matmul", "status": "passed", "reason": "ok", "details": {"tflops": NaN}}]}'
    )
    checks, _ = suite.parse_suite_output(doc)
    assert [c.name for c in checks][:1] == ["gpu-matmul"] and math.isnan(checks[0].details["tflops"])
    for bad in ('{"checks": [], "checks": []}', "[" * 200 + "]" * 200, "not json"):
        checks, _ = suite.parse_suite_output(bad)
        assert [(c.name, c.status) for c in checks] == [("image-suite", "failed")]
        assert "the suite's report is not readable" in checks[0].reason


def test_an_image_lock_that_is_not_json_fails_the_lock_check() -> None:
    recipe = load_recipe(REPO_ROOT / "recipes" / "vllm-qwen35.yaml")
    good = suite.check_lock(recipe, json.dumps({"recipe_hash": recipe.hash}).encode())
    assert good.status == "passed"
    for bad in (b"{", b'{"recipe_hash": Infinity}', b"[]"):
        check = suite.check_lock(recipe, bad)
        assert check.status == "failed" and "rebuild" in check.reason


def test_a_pipe_where_a_library_was_is_an_audit_error_not_a_hang(tmp_path) -> None:
    pipe = tmp_path / "libfake.so"
    os.mkfifo(pipe)
    with pytest.raises(AuditError, match="not a regular file"):
        read_fatbin_file(pipe)


def test_a_damaged_selection_cache_entry_is_asked_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(engine, "inspect_image", lambda image: {"Id": "sha256:" + "a" * 64})
    answers = []

    class Ran:
        exit_code, stderr = 0, ""
        stdout = selection.MARKER + json.dumps({"layers": {"attention": "FLASH_ATTN"}}) + "\n"

    def run_container(*args, **kwargs):
        answers.append(1)
        return Ran()

    monkeypatch.setattr(engine, "run_container", run_container)
    config = {"architectures": ["Qwen3ForCausalLM"]}
    first = selection.run_selection("img", "sm_121", config, {})
    assert selection.run_selection("img", "sm_121", config, {}) == first and len(answers) == 1  # cached
    for entry in (tmp_path / "cache").rglob("*.json"):
        entry.write_text('{"layers": NaN')  # damaged: read again from the image, never a traceback
    assert selection.run_selection("img", "sm_121", config, {}) == first and len(answers) == 2
    Ran.stdout = selection.MARKER + '{"layers": {}, "layers": {}}\n'
    with pytest.raises(selection.SelectionError, match="vLLM's selection in img: cannot read it as JSON"):
        selection.run_selection("img", "sm_121", config, {}, use_cache=False)
