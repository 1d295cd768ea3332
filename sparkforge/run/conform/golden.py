"""Golden token ids: `--record` stores the greedy ids of the prompt set with what produced them (image digest,
model revision, tokenizer fingerprint, vLLM version); a later run compares exactly and names the first
divergence. A golden of another model or tokenizer is refused before anything is started or stopped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.boundary import list_files, read_bytes, read_json, write_output
from sparkforge.errors import InputError, RunError
from sparkforge.report import Check
from sparkforge.run.conform.client import Completion, OpenAIClient
from sparkforge.run.conform.context import ConformOptions, ConformRun
from sparkforge.run.conform.served_checks import first_divergence

FORMAT = "sparkforge-golden/1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")
FINGERPRINT_TEXT = "golden 0 1 2 3 the quick brown fox ?"
MAX_GOLDEN_BYTES = 8 << 20  # the prompt set's ids: ~100 KiB; a 20 MB "golden" is not one
MAX_MODEL_FILE = 64 << 20  # a config or tokenizer file (tokenizer.json of a 250k vocabulary is ~20 MiB)
MAX_TOKEN_ID = 1 << 31


@dataclass(frozen=True)
class Golden:
    path: Path
    data: dict[str, Any]

    @property
    def token_ids(self) -> list[list[int]]:
        return [list(ids) for ids in self.data["token_ids"]]


def model_revision(model_dir: Path | None, model: str) -> dict[str, str]:
    """What the weights are: for a model directory, sha256 of its config and tokenizer files and weight sizes."""
    if model_dir is None or not model_dir.is_dir():
        return {"model": model, "revision": "unknown (served from the Hugging Face cache)"}
    config = hashlib.sha256()
    tokenizer = hashlib.sha256()
    # The folder's own files only (no subfolder), each read through the boundary (no FIFO, no system file).
    for item in list_files(model_dir, "--model-dir"):
        if item.name in TOKENIZER_FILES:
            tokenizer.update(item.name.encode() + read_bytes(item, "--model-dir", MAX_MODEL_FILE))
        elif item.suffix == ".json":
            config.update(item.name.encode() + read_bytes(item, "--model-dir", MAX_MODEL_FILE))
        elif item.suffix in (".safetensors", ".bin"):
            config.update(f"{item.name}:{item.stat().st_size}".encode())
    return {"model": model, "revision": config.hexdigest(), "tokenizer_sha256": tokenizer.hexdigest()}


def read_golden(path: Path, model: str, revision: dict[str, str]) -> Golden:
    """The golden file, refused when it is not one or was recorded for another model or tokenizer."""
    if not path.exists() and not path.is_symlink():
        raise RunError(
            f"golden file {path} does not exist; nothing was started or stopped; fix: record one first with "
            "'invoke conform ... --record' on the image you trust"
        )
    try:  # the boundary: a regular file (no FIFO, /dev/zero), 8 MiB, strict JSON (no NaN, no key twice)
        data = read_json(path, "--golden", max_bytes=MAX_GOLDEN_BYTES, expect=None)
    except InputError as exc:
        raise RunError(
            f"{str(exc).rpartition('; fix:')[0]}; nothing was started or stopped; fix: record it again with --record"
        ) from None
    ids = data.get("token_ids") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or not isinstance(ids, list)
        or not all(isinstance(row, list) and all(_token_id(i) for i in row) for row in ids)
        or not isinstance(data.get("model") or {}, dict)
    ):
        raise RunError(
            f"golden file {path} is not a sparkforge golden ({FORMAT}); nothing was started or stopped; fix: record it with --record"
        )
    recorded = data.get("model") or {}
    if recorded.get("model") != model:
        raise RunError(
            f"golden file {path} was recorded for model {recorded.get('model')!r}, this profile serves {model!r}; "
            "nothing was started or stopped; fix: pass the golden of this model (--golden) or record one with --record"
        )
    for key in ("tokenizer_sha256", "revision"):
        mine, theirs = revision.get(key), recorded.get(key)
        if key == "tokenizer_sha256" and mine and theirs and mine != theirs:
            raise RunError(
                f"golden file {path} was recorded with another tokenizer (sha256 {theirs[:12]}, this model directory's "
                f"is {mine[:12]}): token ids cannot be compared; nothing was started or stopped; fix: record a golden for "
                "this tokenizer with --record"
            )
    return Golden(path, data)


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TOKEN_ID


def tokenizer_fingerprint(client: OpenAIClient) -> list[int]:
    return client.tokenize(FINGERPRINT_TEXT)


def record(path: Path, prompts: list[str], outputs: list[Completion], provenance: dict[str, Any]) -> Check:
    data = {
        "format": FORMAT,
        **provenance,
        "prompts": prompts,
        "token_ids": [list(c.token_ids) for c in outputs],
    }
    write_output(path, json.dumps(data, indent=1) + "\n", "--golden")  # atomic; never through a planted link
    tokens = sum(len(c.token_ids) for c in outputs)
    return Check(
        "golden",
        "passed",
        f"recorded {len(prompts)} prompts, {tokens} token ids to {path}",
        {"path": str(path), "tokens": tokens},
    )


def compare(
    golden: Golden,
    prompts: list[str],
    outputs: list[Completion],
    provenance: dict[str, Any],
    client: OpenAIClient,
) -> Check:
    """Exact comparison with the recorded ids; the first divergence named, with what differs in provenance."""
    details: dict[str, Any] = {"path": str(golden.path)}
    differs = {
        k: {"golden": golden.data.get(k), "now": v} for k, v in provenance.items() if golden.data.get(k) != v
    }
    details["differs"] = differs
    if golden.data.get("prompts") != prompts:
        return Check(
            "golden",
            "failed",
            f"{golden.path} holds another prompt set; fix: record it again with --record",
            details,
        )
    if golden.data.get("tokenizer_ids") and provenance.get("tokenizer_ids") != golden.data["tokenizer_ids"]:
        return Check(
            "golden",
            "failed",
            f"the served tokenizer differs from the golden's ({golden.path}): ids cannot be compared",
            details,
        )
    found = first_divergence(golden.token_ids, [list(c.token_ids) for c in outputs])
    changed = ", ".join(sorted(differs)) or "nothing recorded"
    if found is None:
        return Check(
            "golden",
            "passed",
            f"{len(prompts)} prompts identical to {golden.path} (differs: {changed})",
            details,
        )
    details.update(
        {
            "prompt": found.prompt,
            "position": found.position,
            "golden": list(found.left),
            "now": list(found.right),
        }
    )
    return Check(
        "golden",
        "failed",
        found.describe(("the golden", "this run"), client) + f" (differs: {changed})",
        details,
    )


def golden_input(
    options: ConformOptions, profile: str, model: str, revision: dict[str, str]
) -> Golden | None:
    """The golden file a comparing run reads, refused before anything starts; None when there is none to read."""
    path = options.golden or Path("golden") / f"{profile}.json"
    if options.record or not (options.explicit_golden or path.exists()):
        return None
    return read_golden(path, model, revision)


def golden_row(run: ConformRun) -> None:
    """`--record` stores the reference pass; otherwise it is compared with the golden file (skipped: none)."""
    path = run.options.golden or Path("golden") / f"{run.profile.name}.json"
    image = run.options.launch.image if run.options.launch else run.options.image_ref
    provenance = {
        "profile": run.profile.name,
        "model": run.inputs["revision"],
        "image": {"ref": image, "id": run.engines[0].image_id(image) if image else None},
        "vllm": run.report.extra["vllm"],
        "tokenizer_ids": tokenizer_fingerprint(run.client),
    }
    golden = run.inputs.get("golden")
    if run.options.record:
        run.timed("golden", lambda: record(path, run.prompts, run.reference, provenance))
    elif golden is not None:
        run.timed("golden", lambda: compare(golden, run.prompts, run.reference, provenance, run.client))
    else:
        run.report.add(Check("golden", "skipped", f"no golden at {path}; fix: record one with --record"))
