"""Two signed releases in a real registry: `diff` names what changed, the tag's history is kept in the
registry, rollback moves latest back only to a GPU-verified predecessor, and pull verifies what it names
(tests/engine/history_fixtures.py builds the releases; a GB10 verify record is the one thing mocked)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from history_fixtures import GB10, Releases, attest_gpu

from sparkforge import engine
from sparkforge.errors import PublishError
from sparkforge.imagebuild.hostsetup import base_image_name
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.registry import releases as release_info
from sparkforge.registry import tagtrust
from sparkforge.registry.diff import format_table
from tests import registry_calls as calls

pytestmark = pytest.mark.engine
QUIET = {"echo": lambda _: None}


def _latest(r: Releases) -> str | None:
    found = r.registry.manifest("sparkforge/history", "latest")
    return found[0] if found else None


def _rollback(r: Releases):
    return calls.rollback(
        r.old.recipe, "latest", runner=r.runner, eng=r.eng, evidence_dir=r.evidence, **QUIET
    )


def test_history_lists_both_releases_with_their_signed_evidence(releases: Releases) -> None:
    found = release_info.history_view(releases.new.recipe, releases.tools(), "latest")
    entries = found["entries"]
    assert [e["digest"] for e in entries[-2:]] == [releases.new.index, releases.old.index]
    assert entries[-1]["previous"] is None and entries[-2]["previous"] == releases.old.index
    newest = entries[-2]["platforms"]["linux/amd64"]
    assert newest["verify"] == {"status": "passed", "gpu_used": True, "devices": ["NVIDIA GB10"]}
    assert newest["kernels"]["by_verdict"]["family"] == 1  # release 2: _moe_C is sm_120f only
    assert entries[-1]["platforms"]["linux/amd64"]["kernels"]["by_verdict"]["native"] == 2
    # Anyone who can pull the tag can read its history: signed TUF metadata in the same repository.
    tags = releases.registry.tags("sparkforge/history")
    assert (
        "tuf-timestamp" in tags and "tuf-root-1" in tags and any(t.startswith("tuf-targets-") for t in tags)
    )


def test_diff_names_the_changed_vllm_and_the_library_that_lost_native(releases: Releases) -> None:
    repo = releases.repository
    report = calls.diff(f"{repo}@{releases.old.digest}", f"{repo}@{releases.new.digest}", **QUIET)
    rows = {(c["section"], c["item"]): c for c in report.to_dict()["changes"]}
    assert rows[("versions", "vllm")]["a"].startswith("0.33.0") and rows[("versions", "vllm")][
        "b"
    ].startswith("0.34.0")
    assert rows[("kernels", "vllm/_moe_C.abi3.so")]["change"] == "lost native sm_121"
    assert ("kernels", "vllm/_C.abi3.so") not in rows
    assert ("labels", "dev.sparkforge.recipe-hash") in rows
    assert ("lock", "components.vllm.version") in rows
    compared = {c["name"]: c["status"] for c in report.to_dict()["checks"]}
    assert compared["size"] == compared["packages"] == compared["verify"] == "passed"  # read, not skipped
    table = format_table(report)
    assert "lost native sm_121" in table and not table.startswith("WARNING")
    with pytest.raises(PublishError, match=r"registry has no such digest.*fix:"):
        calls.diff(f"{repo}@sha256:{'0' * 64}", f"{repo}@{releases.new.digest}", **QUIET)
    with pytest.raises(PublishError, match="no sparkforge metadata"):
        calls.diff(base_image_name("linux/amd64"), f"{repo}@{releases.new.digest}", **QUIET)


def test_rollback_needs_a_gpu_verified_predecessor_then_moves_latest_back(releases: Releases) -> None:
    assert _latest(releases) == releases.new.index
    # Release 1's newest signed claim: a run on no GPU (rollback reads the signed claims, from any clone)
    attest_gpu(releases.old, None, releases.runner, releases.keys)
    with pytest.raises(
        PublishError, match=r"refusing to roll back .*:latest: no earlier index .*no GPU was used"
    ):
        _rollback(releases)
    assert _latest(releases) == releases.new.index  # nothing moved
    attest_gpu(releases.old, GB10, releases.runner, releases.keys)  # newest: GPU-verified on a GB10
    moved = _rollback(releases)
    assert moved.index == releases.old.index and moved.tags == ("latest",)
    assert _latest(releases) == releases.old.index
    last = tagtrust.read_log(releases.old.recipe, releases.tools(), "latest").entries[-1]
    assert (last.action, last.digest, last.previous) == ("rollback", releases.old.index, releases.new.index)
    # pull verifies what latest names now: signature, provenance of release 1's recipe, signed GPU claim
    pulled = calls.pull(releases.old.recipe, "latest", platform="linux/amd64", runner=releases.runner,
                          eng=releases.eng, warn=lambda _: None, **QUIET)  # fmt: skip
    assert pulled.image.endswith(releases.old.digest) and pulled.trust["verified"]["status"] == "passed"
    # rolled back from release 2: a second rollback never returns to it
    with pytest.raises(PublishError, match="refusing to roll back"):
        _rollback(releases)


def test_pull_by_digest_verifies_an_earlier_release_and_names_it(releases: Releases) -> None:
    recipe = releases.new.recipe
    pulled = calls.pull(recipe, releases.new.index, platform="linux/amd64", runner=releases.runner,
                          eng=releases.eng, warn=lambda _: None, **QUIET)  # fmt: skip
    assert pulled.trust["top"] == releases.new.index and pulled.trust["unsigned"] is False
    shown = release_info.pulled(calls.session(releases.runner), recipe, pulled.image, releases.new.index)
    assert shown["history"]["tag"] == "latest" and shown["kernels"]["by_verdict"]["family"] == 1
    assert "usable backends" in shown["lines"][0]
    carried = release_info.carried_with_kernels(recipe, pulled.image)  # what 'invoke verify --image' adds
    assert carried.status == "passed" and "kernel report: sm_121: native 1, family 1" in carried.reason
    labels = engine.image_labels(pulled.image)
    assert labels["dev.sparkforge.pin.vllm"].startswith("0.34.0")


def test_a_tag_without_history_is_a_one_paragraph_error(releases: Releases) -> None:
    with pytest.raises(PublishError, match=r":0\.33\.0 has no history .*fix:"):
        release_info.history_view(releases.old.recipe, releases.tools(), "0.33.0")
    with pytest.raises(PublishError, match=r"--rollback 0\.33\.0: not a moving tag .*fix:"):
        calls.rollback(releases.old.recipe, "0.33.0", runner=releases.runner, eng=releases.eng,
                          evidence_dir=releases.evidence, **QUIET)  # fmt: skip


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "invoke", *args]
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_the_commands_print_history_diff_and_refuse_a_bad_digest(releases: Releases, tmp_path) -> None:
    recipe = str(releases.new.recipe.path)
    shown = _invoke("history", "--recipe", recipe, "--json", str(tmp_path / "h.json"))  # each moving tag
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert releases.new.index in shown.stdout and "signed verify passed on GPU" in shown.stdout
    assert "kernels: native 1, family 1" in shown.stdout  # release 2's signed kernel report
    assert [v["tag"] for v in json.loads((tmp_path / "h.json").read_text())] == ["latest"]
    repo = releases.repository
    a, b = f"{repo}@{releases.old.digest}", f"{repo}@{releases.new.digest}"
    changed = _invoke("diff", a, b, "--json", str(tmp_path / "d.json"))
    assert changed.returncode == 0 and "lost native sm_121" in changed.stdout
    assert json.loads((tmp_path / "d.json").read_text())["command"] == "diff"
    bad = _invoke("pull", "--recipe", recipe, "--digest", "sha256:nothex")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--digest 'sha256:nothex' is not a digest" in bad.stderr and "fix:" in bad.stderr
