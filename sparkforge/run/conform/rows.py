"""Conform's rows, declared once: name, one line of help, the function that runs it, the profile key that
configures it. `--checks`, the task's help, the names a profile's `conform.checks` may give (judged by
run/conform/session.profile_checks before anything starts) and the table in docs/run.md come from it.

A row is `row(run: ConformRun) -> None` (sparkforge/run/conform/conformrun.py): it asks the served model and adds
its checks to `run.report`. Rows run in this order on the server as profiled; `equivalence` runs last because
its server variants replace that server; `speculative-acceptance` after it (it judges the counts read as the
server as profiled stopped); `reference` last, once the servers are stopped. Adding a row: its module and one line here.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry
from sparkforge.run.conform.apisurface import api_row
from sparkforge.run.conform.conformrun import ConformRun
from sparkforge.run.conform.golden import golden_row
from sparkforge.run.conform.known_answers import known_answers, sampled_answers
from sparkforge.run.conform.reference import reference_conform_row
from sparkforge.run.conform.served_checks import determinism_row, long_decode_row, prefix_cache_row
from sparkforge.run.conform.spec_acceptance import speculative_acceptance
from sparkforge.run.conform.variants import equivalence

Row = Callable[[ConformRun], None]

ROWS: Registry[Row] = Registry(
    "conform",
    "--checks",
    [
        Entry(
            "determinism",
            "the prompt set twice greedy, then twice with seeded sampling: identical token ids",
            determinism_row,
            key="conform.seed",
        ),
        Entry(
            "long-decode",
            "a long greedy decode: no loop, no U+FFFD, no diversity collapse (and the known "
            "answer where the profile has one)",
            long_decode_row,
            key="conform.long_decode",
        ),
        Entry(
            "known-answers",
            "the shipped probe set (arithmetic, copying, recall, counting, ordering, format) "
            "as greedy chats: accuracy's Wilson 95 % lower bound at the floor",
            known_answers,
            key="conform.known_answers",
        ),
        Entry(
            "sampled-answers",
            "the same probes sampled as users serve (temperature, top-p, a seed each): the sampling path, "
            "which greedy rows never take (a rejection sampler garbling sampled drafts)",
            sampled_answers,
            key="conform.known_answers.sampled",
        ),
        Entry(
            "prefix-cache",
            "a repeated long prefix registers hits in vLLM's /metrics counters",
            prefix_cache_row,
            key="conform.long_prompt_words",
        ),
        Entry(
            "api",
            "/v1/models, max_tokens, stop; image, tool call and reasoning where the profile enables them",
            api_row,
            key="conform.image_prompt",
        ),
        Entry(
            "golden", "the reference pass against the recorded golden file (--record stores it)", golden_row
        ),
        Entry(
            "equivalence",
            "streaming, concurrency, then server variants (prefix caching, chunked prefill, "
            "speculative decoding) give the reference pass's answers (the logprobs rule)",
            equivalence,
            key="conform.concurrency",
        ),
        Entry(
            "speculative-acceptance",
            "the share of draft tokens the server as profiled accepted (vLLM's spec-decode counters, read "
            "before it stops) at the profile's floor; skipped without speculative decoding",
            speculative_acceptance,
            key="conform.speculative.min_acceptance",
        ),
        Entry(
            "reference",
            "every served token scored by Hugging Face transformers of the same image, teacher-forced, on the "
            "same weights or --reference-model-dir: the served token's and both top-5 lists' logprobs within the "
            "tolerance, after the servers stop",
            reference_conform_row,
            key="conform.reference.tolerance",
        ),
    ],
    RunError,
)
