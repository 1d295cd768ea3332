"""BuildKit's provenance read as pull reads it: a real statement that buildx 0.13.1 (Docker 26, docker driver)
wrote for `--provenance mode=max` (tests/unit/fixtures/buildkit-provenance-v0.2.json: a two-line Dockerfile FROM
the offline Debian base, SPARKFORGE_REVISION=1234567890abcdef), and the label comparison."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from sparkforge.registry.buildprov import facts_of, label_problems

STATEMENT = json.loads((Path(__file__).parent / "fixtures" / "buildkit-provenance-v0.2.json").read_text())
BASE = "sparkforge-base/debian-bookworm:amd64"
BASE_DIGEST = "sha256:bf7bb30384e2b3d3c2d3159eb009e158e240ec9c9430c3194d196dadb1ad390d"
HASH = "ab" * 32


def _with_hash(statement: dict, recipe_hash: str) -> dict:
    """The statement with its recorded Dockerfile carrying a recipe-hash label line (as rendered Dockerfiles do)."""
    out = json.loads(json.dumps(statement))
    info = out["predicate"]["metadata"]["https://mobyproject.org/buildkit@v1#metadata"]["source"]["infos"][0]
    text = base64.b64decode(info["data"]).decode() + f'LABEL dev.sparkforge.recipe-hash="{recipe_hash}"\n'
    info["data"] = base64.b64encode(text.encode()).decode()
    return out


def test_facts_of_a_real_statement() -> None:
    facts = facts_of(STATEMENT["predicate"])
    assert facts.revision == "1234567890abcdef"
    assert facts.bases == ((BASE, BASE_DIGEST),)
    assert facts.recipe_hashes == ()  # its Dockerfile names no 64-hex recipe hash
    assert facts_of(_with_hash(STATEMENT, HASH)["predicate"]).recipe_hashes == (HASH,)


def test_label_problems_name_each_disagreement() -> None:
    facts = facts_of(_with_hash(STATEMENT, HASH)["predicate"])
    labels = {
        "org.opencontainers.image.revision": "1234567890abcdef",
        "dev.sparkforge.recipe-hash": HASH,
        "dev.sparkforge.base.builder": BASE,
        "dev.sparkforge.base.runtime": f"sparkforge-base/debian-bookworm@{BASE_DIGEST}",
    }
    assert label_problems(facts, labels) == []
    wrong = {
        **labels,
        "org.opencontainers.image.revision": "0" * 40,
        "dev.sparkforge.recipe-hash": "cd" * 32,
        "dev.sparkforge.base.runtime": "nvcr.io/nvidia/pytorch@sha256:" + "1" * 64,
    }
    problems = label_problems(facts, wrong)
    assert len(problems) == 3
    assert problems[0].startswith("it names source revision 1234567890abcdef, the label")
    assert "recipe hash abababababab, the label says cdcdcdcdcdcd" in problems[1]
    assert "the runtime base nvcr.io/nvidia/pytorch@sha256:1111" in problems[2]


def test_materials_pinned_by_digest() -> None:
    predicate = {
        "materials": [
            {
                "uri": "pkg:docker/localhost%3A5000/t/base?digest=sha256:"
                + "2" * 64
                + "&platform=linux%2Famd64",
                "digest": {"sha256": "2" * 64},
            }
        ]
    }
    assert facts_of(predicate).bases == ((f"localhost:5000/t/base@sha256:{'2' * 64}", f"sha256:{'2' * 64}"),)
