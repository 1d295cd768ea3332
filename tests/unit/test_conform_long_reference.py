"""The reference's long continuation (conform.reference.long_tokens): asked of the server with top-5 logprobs and
the long decode's prompt, capped by the profile's max-model-len, off at 0; against a real HTTP server."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import yaml
from conform_http import conform_run, http_server

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.conform.session import long_reference

PROFILE = REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform.yaml"
ASKED: list[dict] = []


class _Server(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ASKED.append({"path": self.path, **body})
        if self.path == "/tokenize":
            doc = {"tokens": [7, 8]}
        else:
            n = body["max_tokens"]
            doc = {"choices": [{"text": "x" * n, "finish_reason": "length", "token_ids": [9] * n,
                                "logprobs": {"top_logprobs": [{"token_id:9": -0.1}] * n}}]}  # fmt: skip
        raw = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


def _profile(tmp_path: Path, max_model_len: int | None, long_tokens: int | None) -> Path:
    doc = yaml.safe_load(PROFILE.read_text())
    if max_model_len is None:
        doc["args"].pop("max-model-len")
    else:
        doc["args"]["max-model-len"] = max_model_len
    if long_tokens is not None:
        doc["conform"]["reference"] = {"long_tokens": long_tokens}
    path = tmp_path / f"cpu-tiny-long-{max_model_len}-{long_tokens}.yaml".lower()
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_long_continuation_is_asked_with_logprobs_and_capped_by_max_model_len(tmp_path: Path) -> None:
    with http_server(_Server) as base:
        for max_len, wanted, expect in (
            (None, None, 1024),
            (4800, None, 1024),
            (600, 1024, 598),
            (4800, 0, 0),
        ):
            ASKED.clear()
            run = conform_run(_profile(tmp_path, max_len, wanted), base)
            got = long_reference(run.client, run.profile, run.settings)
            if not expect:
                assert got == {} and ASKED == [], (max_len, wanted)
                continue
            asked = ASKED[-1]
            assert asked["path"] == "/v1/completions" and asked["max_tokens"] == expect, (
                max_len,
                wanted,
                asked,
            )
            assert asked["prompt"] == run.settings.long_decode.prompt and asked["logprobs"] == 5
            assert asked["ignore_eos"] is True
            assert got["long_prompt_ids"] == [7, 8] and len(got["long_served"].token_ids) == expect
            assert got["long_served"].top[0] == {9: -0.1}
