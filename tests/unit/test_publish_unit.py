"""Publishing logic without a registry: CI matrix, tag expansion, digest records, index parsing, argv."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from invoke import Context

from sparkforge import oci
from sparkforge.commands import Runner
from sparkforge.engine import Engine
from sparkforge.errors import PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import load_recipe
from sparkforge.registry import manifests, pull
from sparkforge.registry import matrix as ci
from sparkforge.registry import publish as pub
from sparkforge.registry import pushed as pushed_records
from sparkforge.verify import verified
from tests import registry_calls as calls
from tests.recipe_files import SMOKE, write_recipe_file

DAY = dt.date(2026, 11, 29)
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


def _variant(tmp_path: Path, body: str, name: str = "variant") -> Path:
    path = tmp_path / name / "smoke-multiarch.yaml"  # same name: only what the body changes differs
    return write_recipe_file(path, body, extends=SMOKE)


# ---- CI matrix ----------------------------------------------------------------------------------


def test_matrix_native_runners_per_platform(tmp_path: Path) -> None:
    native = load_recipe(_variant(tmp_path, "publish:\n  qemu: false\n"))
    entries = ci.ci_matrix([native])
    assert [(e["platform"], e["runner"], e["qemu"]) for e in entries] == [
        ("linux/amd64", "ubuntu-24.04", False),
        ("linux/arm64", "ubuntu-24.04-arm", False),
    ]


def test_matrix_qemu_only_where_the_recipe_allows_it() -> None:
    smoke, source = load_recipe(SMOKE), load_recipe("vllm-qwen35")
    entries = ci.ci_matrix([smoke, source])
    by_key = {(e["recipe"], e["arch"]): e for e in entries}
    assert set(by_key) == {
        ("smoke-multiarch", "amd64"),
        ("smoke-multiarch", "arm64"),
        ("vllm-qwen35", "arm64"),
    }
    assert by_key[("smoke-multiarch", "arm64")]["qemu"] is True
    assert by_key[("smoke-multiarch", "arm64")]["runner"] == "ubuntu-24.04"
    assert by_key[("smoke-multiarch", "amd64")]["qemu"] is False
    assert by_key[("vllm-qwen35", "arm64")]["runner"] == "ubuntu-24.04-arm"
    assert by_key[("vllm-qwen35", "arm64")]["qemu"] is False
    # --recipe takes a name for recipes/ and a repository path for anything else.
    assert by_key[("vllm-qwen35", "arm64")]["path"] == "vllm-qwen35"
    assert by_key[("smoke-multiarch", "amd64")]["path"] == "tests/recipes/smoke-multiarch.yaml"
    json.dumps(entries)  # the workflow reads it as JSON


def test_matrix_build_cache_none_for_published_refs_and_own_for_others() -> None:
    recipes = [load_recipe(SMOKE), load_recipe("vllm-qwen35"), load_recipe("vllm-qwen35-wheels")]
    for ref in ("refs/heads/main", "refs/tags/v1.2.3"):  # published: no cache another ref could have written
        assert all(e["cache_from"] == e["cache_to"] == "" for e in ci.ci_matrix(recipes, ref))
    entries = ci.ci_matrix(recipes, "refs/heads/feature/x")
    caches = [e["cache_to"].split(",")[1] for e in entries]
    assert len(set(caches)) == len(entries)
    for entry in entries:  # a branch reads and writes only its own cache
        ref = f"ref={entry['repository']}:buildcache-{entry['recipe']}-{entry['arch']}-heads-feature-x"
        assert entry["cache_from"] == f"type=registry,{ref}"
        assert entry["cache_to"].startswith(f"type=registry,{ref},mode=max")


def test_ci_matrix_task_writes_github_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sparkforge.cli.publish import ci_matrix

    out = tmp_path / "github_output"
    ci_matrix(Context(), recipe=["vllm-qwen35", str(SMOKE)], github_output=str(out))
    lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
    matrix = json.loads(lines["matrix"])
    assert len(matrix["include"]) == 3
    assert json.loads(lines["recipes"]) == [
        {"name": "vllm-qwen35", "path": "vllm-qwen35"},
        {"name": "smoke-multiarch", "path": str(SMOKE)},
    ]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == matrix


# ---- tags and references ------------------------------------------------------------------------


def test_tag_scheme_expansion() -> None:
    recipe = load_recipe(SMOKE)
    tags = plan.final_tags(recipe, DAY)
    repo = recipe.model.publish.repository
    assert tags.immutable == (f"{repo}:0.33.0-{recipe.hash[:12]}", f"{repo}:0.33.0-cu130-20261129")
    assert tags.moving == (f"{repo}:latest",)
    assert plan.expand_tag(recipe, "{recipe}-{torch}-{date}", DAY) == "smoke-multiarch-2.14.0-20261129"


def test_default_pull_tag_is_the_first_without_a_date(tmp_path: Path) -> None:
    recipe = load_recipe(_variant(tmp_path, 'publish:\n  tags: ["{vllm}-{date}", "{vllm}-{hash}"]\n'))
    assert pull.default_tag(recipe) == f"0.33.0-{recipe.hash[:12]}"
    dated = load_recipe(_variant(tmp_path, 'publish:\n  tags: ["{date}"]\n  moving_tags: []\n', "dated"))
    with pytest.raises(PublishError, match=r"every tag carries \{date\}.*--tag"):
        pull.default_tag(dated)


def test_reference_for_tags_and_digests() -> None:
    recipe = load_recipe(SMOKE)
    repo = recipe.model.publish.repository
    assert pull.reference_for(recipe, "latest") == f"{repo}:latest"
    assert pull.reference_for(recipe, D1) == f"{repo}@{D1}"
    assert pull.reference_for(recipe) == f"{repo}:0.33.0-{recipe.hash[:12]}"
    for bad in ("two words", "sha256:abc", "-leading"):
        with pytest.raises(PublishError, match="neither a tag nor"):
            pull.reference_for(recipe, bad)


def test_local_registries_are_insecure_only_on_loopback() -> None:
    assert oci.is_local_registry("localhost:5000/a/b")
    assert oci.is_local_registry("127.0.0.1:5123/a")
    assert oci.is_local_registry("localhost/a")
    assert not oci.is_local_registry("ghcr.io/sparkforge/vllm")
    assert not oci.is_local_registry("localhost.example.com:5000/a")
    assert not oci.is_local_registry("sparkforge/vllm")


# ---- labels, indexes, records -------------------------------------------------------------------


def test_label_drift_names_each_differing_label(tmp_path: Path) -> None:
    recipe = load_recipe(SMOKE)
    labels = plan.labels(recipe)
    assert plan.label_drift(recipe, labels) == {}
    other = load_recipe(_variant(tmp_path, "components:\n  torch:\n    version: 2.13.0\n"))
    drift = plan.label_drift(other, labels)
    assert drift["dev.sparkforge.pin.torch"] == ("2.14.0", "2.13.0")
    assert drift["dev.sparkforge.recipe-hash"] == (recipe.hash, other.hash)
    assert set(drift) == {"dev.sparkforge.pin.torch", "dev.sparkforge.recipe-hash"}
    missing = {k: v for k, v in labels.items() if k != "dev.sparkforge.gpu"}
    assert plan.label_drift(recipe, missing) == {"dev.sparkforge.gpu": (None, "sm_121")}


def test_index_platforms_skips_attestations() -> None:
    # The shape buildx pushes: an image manifest per platform plus provenance/SBOM attestation manifests.
    index = {
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"digest": D1, "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": D2, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {
                "digest": D3,
                "platform": {"os": "unknown", "architecture": "unknown"},
                "annotations": {"vnd.docker.reference.type": "attestation-manifest"},
            },
        ],
    }
    assert manifests.index_platforms(index) == [("linux/amd64", D1), ("linux/arm64", D2)]
    assert manifests.index_platforms({"config": {}, "layers": []}) == []


def test_publish_refuses_missing_extra_and_malformed_before_any_engine_work() -> None:
    recipe = load_recipe(SMOKE)
    with pytest.raises(
        PublishError, match=r"no image for linux/arm64 .*have: linux/amd64.*nothing was tagged"
    ):
        calls.publish(recipe, {"linux/amd64": D1})
    with pytest.raises(
        PublishError,
        match=r"'invoke build --recipe tests/recipes/smoke-multiarch\.yaml --platform linux/arm64'",
    ):
        calls.publish(recipe, {"linux/amd64": D1})
    with pytest.raises(PublishError, match="unexpected or repeated linux/s390x"):
        calls.publish(recipe, {"linux/amd64": D1, "linux/arm64": D2, "linux/s390x": D3})
    with pytest.raises(PublishError, match="not sha256 digests"):
        calls.publish(recipe, {"linux/amd64": D1, "linux/arm64": "latest"})


def test_digest_records_round_trip_and_refuse_stale(tmp_path: Path) -> None:
    recipe = load_recipe(SMOKE)
    repo = recipe.model.publish.repository
    for platform, digest in (("linux/amd64", D1), ("linux/arm64", D2)):
        pushed_records.PushedImage(recipe.name, recipe.hash, platform, repo, digest).write(tmp_path)
    pushed_records.PushedImage("other-recipe", "0" * 64, "linux/amd64", "x/y", D3).write(tmp_path)  # ignored
    assert pushed_records.load_digests(recipe, tmp_path) == {"linux/amd64": D1, "linux/arm64": D2}
    assert pushed_records.load_digests(recipe, tmp_path / "absent") == {}
    pushed_records.PushedImage(recipe.name, "f" * 64, "linux/arm64", repo, D3).write(
        tmp_path
    )  # overwrites arm64
    with pytest.raises(
        PublishError, match=r"smoke-multiarch-arm64\.json: written for recipe hash ffffffffffff"
    ):
        pushed_records.load_digests(recipe, tmp_path)
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(PublishError, match="not a digest record"):
        pushed_records.load_digests(recipe, tmp_path)


def test_push_from_buildx_metadata_needs_a_verify_record(tmp_path: Path) -> None:
    recipe = load_recipe(SMOKE)
    metadata = tmp_path / "metadata.json"
    config = "sha256:" + "c" * 64  # the image ID verify saw (BuildKit's containerimage.config.digest)
    metadata.write_text(json.dumps({"containerimage.digest": D2, "containerimage.config.digest": config}))
    evidence = tmp_path / "verified"
    kw = {
        "metadata_file": metadata,
        "digests_dir": tmp_path / "d",
        "echo": lambda _: None,
        "evidence_dir": evidence,
    }
    with pytest.raises(PublishError, match="no verify record"):
        calls.push(recipe, "linux/arm64", **kw)  # type: ignore[arg-type]
    assert not (tmp_path / "d").exists()
    verified.write_record(config, {"status": "failed"}, evidence)
    with pytest.raises(PublishError, match="latest verify FAILED"):
        calls.push(recipe, "linux/arm64", **kw)  # type: ignore[arg-type]
    verified.write_record(config, {"status": "passed", "base_override": True}, evidence)
    with pytest.raises(PublishError, match="--allow-base-override"):
        calls.push(recipe, "linux/arm64", **kw)  # type: ignore[arg-type]
    verified.write_record(config, {"status": "passed", "base_override": False}, evidence)
    pushed = calls.push(recipe, "linux/arm64", **kw)  # type: ignore[arg-type]
    assert pushed.reference == f"{recipe.model.publish.repository}@{D2}"
    assert json.loads((tmp_path / "d" / "smoke-multiarch-arm64.json").read_text())["digest"] == D2
    assert verified.record_for_digest(D2, evidence)["image_id"] == config  # publish follows this link
    metadata.write_text("{}")
    with pytest.raises(PublishError, match=r"containerimage\.digest"):
        calls.push(recipe, "linux/arm64", metadata_file=metadata, digests_dir=None)
    with pytest.raises(PublishError, match=r"--platform linux/s390x: recipe .* builds"):
        calls.push(recipe, "linux/s390x", metadata_file=metadata)


def test_push_unverified_is_loud_and_links_nothing(tmp_path: Path) -> None:
    recipe = load_recipe(SMOKE)
    metadata = tmp_path / "metadata.json"
    metadata.write_text(json.dumps({"containerimage.digest": D1, "containerimage.config.digest": D3}))
    said: list[str] = []
    calls.push(
        recipe, "linux/amd64", metadata_file=metadata, digests_dir=None, echo=said.append,
        allow_unverified=True, evidence_dir=tmp_path,
    )  # fmt: skip
    assert any("WARNING (--unverified)" in line for line in said)
    assert verified.record_for_digest(D1, tmp_path) is None  # so publish refuses it without --unverified too


# ---- the commands each engine gets --------------------------------------------------------------


def test_buildx_merges_with_imagetools(tmp_path: Path) -> None:
    lines: list[str] = []
    tools = manifests.Manifests(
        Engine("docker", "buildx", "28.2.2"), Runner(dry=True, echo=lines.append), "ghcr.io/o/r"
    )
    assert tools.create(["ghcr.io/o/r:1", "ghcr.io/o/r:2"], [f"ghcr.io/o/r@{D1}", f"ghcr.io/o/r@{D2}"]) == ""
    assert lines == [
        f"docker buildx imagetools create --tag ghcr.io/o/r:1 --tag ghcr.io/o/r:2 ghcr.io/o/r@{D1} ghcr.io/o/r@{D2}"
    ]


def test_engine_without_buildx_uses_docker_manifest_insecure_only_for_local() -> None:
    lines: list[str] = []
    local = manifests.Manifests(
        Engine("/usr/bin/docker", "buildkit", "20.10.24"),
        Runner(dry=True, echo=lines.append),
        "localhost:5000/a",
    )
    local.create(["localhost:5000/a:1"], [f"localhost:5000/a@{D1}"])
    assert lines[0].endswith(
        f"/usr/bin/docker manifest create --insecure localhost:5000/a:1 localhost:5000/a@{D1}"
    )
    assert lines[1].endswith("/usr/bin/docker manifest push --insecure --purge localhost:5000/a:1")
    remote = manifests.Manifests(
        Engine("/usr/bin/docker", "buildkit", "20.10.24"), Runner(dry=True), "ghcr.io/o/r"
    )
    assert "--insecure" not in remote._cmd("push", "ghcr.io/o/r:1", insecure=True).argv


def test_json_in_tolerates_warnings_around_the_manifest() -> None:
    text = 'WARNING: experimental\n{"schemaVersion": 2, "manifests": []}\ntrailing'
    assert manifests._json_in(text, "x") == {"schemaVersion": 2, "manifests": []}
    with pytest.raises(PublishError, match="expected a manifest"):
        manifests._json_in("no such thing", "x")


def test_a_step_logs_under_the_recipe_unless_the_session_runner_logs_or_is_dry(tmp_path: Path) -> None:
    recipe, eng, said = load_recipe("vllm-qwen35"), Engine("docker", "buildx", "27.0"), []
    plain = calls.session(None, eng, said.append)  # what the tasks and the keyword forms hand down
    tools = pub.session_tools(plain, recipe, "publish")
    assert tools.engine is eng and tools.repository == recipe.model.publish.repository
    assert tools.runner is not plain.runner and tools.runner.log_dir == plan.log_dir(recipe, "publish")
    assert not tools.runner.dry and tools.runner.echo == said.append  # the step's runner speaks through echo
    dry = calls.session(Runner(dry=True), eng, said.append)  # --dry: printed, never run, no log folder
    assert pub.session_tools(dry, recipe, "publish").runner is dry.runner
    logging = calls.session(Runner(log_dir=tmp_path), eng, said.append)
    assert pub.session_tools(logging, recipe, "promote").runner is logging.runner
