"""A serve profile's `conform` settings: what `invoke conform` asks the served model and how it judges.

Every key has a default that a Spark owner can run as is; a profile states only what differs (its prompt set,
the long-decode length, a known answer). Unknown keys are errors, like everywhere in a profile.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

# A row's name as a profile spells it; which rows exist is conform's registry's (sparkforge/run/conform/rows.py,
# above recipe/): `run/conform/session.py` checks the names against it before anything starts.
RowName = Annotated[StrictStr, Field(pattern=r"^[a-z0-9]+([-._][a-z0-9]+)*$", max_length=64)]
DEFAULT_PROMPTS = (
    "The capital of France is",
    "List the first ten prime numbers:",
    "def fibonacci(n):",
    "Explain in one paragraph why the sky is blue.",
)


def plain_prompt(value: str) -> str:
    """A prompt is text: line breaks and tabs, never a NUL, a terminal escape or another control character (it is
    printed in reports and logs, and sent to the model)."""
    bad = next((c for c in value if not c.isprintable() and c not in "\n\t"), None)
    if bad is not None:
        raise ValueError(f"holds the control character {bad!r}; fix: write the prompt as plain text")
    return value


Prompt = Annotated[StrictStr, AfterValidator(plain_prompt)]
# Strict: a profile's numbers are numbers and its flags true/false, never "2" or "yes" coerced.
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class KnownAnswer(BaseModel):
    """A model trained to a checkable task: `progression` continues the prompt's last two numbers mod M."""

    model_config = STRICT

    kind: Literal["progression"]
    modulus: Annotated[int, Field(ge=2, le=100000)]


class SampledAnswers(BaseModel):
    """The `sampled-answers` row: the known-answer probes asked again the way users serve (sampling: this
    temperature and top-p, a seed per probe); the Wilson 95 % lower bound of the share right must reach `floor`.
    Greedy rows cannot see a fault of the sampling path (a rejection sampler that garbles sampled drafts)."""

    model_config = STRICT

    # Qwen3's recommended sampling for its thinking-off chats (temperature 0.7, top-p 0.8) is near this; a
    # competent model answers these probes right at it.
    temperature: Annotated[float, Field(gt=0, le=2)] = 0.6
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    floor: Annotated[float, Field(gt=0, le=1)] = 0.8


class KnownAnswers(BaseModel):
    """The `known-answers` row: which shipped probe set, how many probes from which seed, and the accuracy the
    Wilson 95 % interval's lower bound must reach. `probes`: `instruct` (the default: worded for a real instruction
    model, sparkforge/run/conform/instruct_probes.py) or `twin` (the words the committed tiny model learnt,
    sparkforge/run/conform/probes.py)."""

    model_config = STRICT

    probes: Literal["instruct", "twin"] = "instruct"
    seed: Annotated[int, Field(ge=0, le=2**31)] = 0
    # 120 probes right to the last: a lower bound of 0.97; one wrong in 120: 0.95.
    count: Annotated[int, Field(ge=6, le=2000)] = 120
    floor: Annotated[float, Field(gt=0, le=1)] = 0.9
    max_tokens: Annotated[int, Field(ge=4, le=1024)] = 48
    # Filler sentences between the fact and the question of a recall probe (up to this many, at least half).
    recall_span: Annotated[int, Field(ge=2, le=2000)] = 12
    sampled: SampledAnswers = Field(default_factory=SampledAnswers)


class Speculative(BaseModel):
    """The `speculative-acceptance` row: the share of draft tokens vLLM's counters say the served configuration
    accepted must reach `min_acceptance` (unset: the share is reported, only drafting is required)."""

    model_config = STRICT

    min_acceptance: Annotated[float, Field(gt=0, le=1)] | None = None


class ReferenceRule(BaseModel):
    """The `reference` row: transformers scores the served continuation teacher-forced; every served token's
    logprob must lie within `tolerance` nats of the reference's, every other top-5 token's within
    `top_tolerance` (run/conform/teacher.py). The default `tolerance` is 4 x the largest delta measured between a
    cached decode and a teacher-forced pass on a GPU in bf16 (benchmarks/conform-gpu.md); the tail's, 4 x the
    largest measured on the CPU twin (benchmarks/conform.md). A profile whose two sides compute differently
    (another dtype, a quantized served checkpoint against its unquantized reference) states its own, measured:
    the row reports the deltas it saw."""

    model_config = STRICT

    # nats: 4 x 0.053, the largest noise measured on a GPU (benchmarks/conform-gpu.md)
    tolerance: Annotated[float, Field(gt=0, le=20)] = 0.212
    # nats, for the other tokens of either top-k: their logprobs lie far from 0, where a logit's rounding error is
    # not cancelled (the twin's clean bf16 server against float32 transformers: up to 0.23 nats)
    top_tolerance: Annotated[float, Field(gt=0, le=20)] = 1.0
    # One long served continuation scored too: the long decode's prompt, this many tokens (at most what the
    # profile's max-model-len leaves), top-5 logprobs at every position. A fault at long positions (the KV cache
    # past its first blocks, RoPE far out) moves the values there and nowhere in the short prompt set. 0: off.
    long_tokens: Annotated[int, Field(ge=0, le=262144)] = 1024


class LongDecode(BaseModel):
    model_config = STRICT

    prompt: Annotated[Prompt, Field(min_length=1, max_length=20000)] = (
        "Write a long, detailed history of computing, chapter by chapter."
    )
    # The field sees corruption past ~12k tokens on GB10; 4096 is the floor a CI can afford.
    tokens: Annotated[int, Field(ge=16, le=262144)] = 4096
    # vLLM's extension: decode all `tokens` even past an end-of-sequence (a real model may stop early).
    ignore_eos: bool = True
    max_period: Annotated[int, Field(ge=1, le=512)] = 16
    loop_tail: Annotated[int, Field(ge=16, le=100000)] = 128
    window: Annotated[int, Field(ge=16, le=100000)] = 256
    collapse_ratio: Annotated[float, Field(gt=0, lt=1)] = 0.25


class ConformSettings(BaseModel):
    """What `invoke conform` runs against this profile (and what `serve --conform` would ask)."""

    model_config = STRICT

    prompts: Annotated[list[Prompt], Field(min_length=1, max_length=64)] = Field(
        default_factory=lambda: list(DEFAULT_PROMPTS)
    )
    max_tokens: Annotated[int, Field(ge=1, le=32768)] = 64
    concurrency: Annotated[int, Field(ge=2, le=256)] = 4
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 1234  # vLLM's sampling seed: a 32-bit signed int
    # A prompt longer than max-num-batched-tokens, so that chunked prefill really splits it (words repeated).
    long_prompt_words: Annotated[int, Field(ge=0, le=100000)] = 600
    long_decode: LongDecode = Field(default_factory=LongDecode)
    # The text beside the api row's image (where the profile enables image input).
    image_prompt: Annotated[Prompt, Field(min_length=1, max_length=2000)] = (
        "What is in this image? Answer in one word."
    )
    known_answer: KnownAnswer | None = None
    known_answers: KnownAnswers = Field(default_factory=KnownAnswers)
    speculative: Speculative = Field(default_factory=Speculative)
    reference: ReferenceRule = Field(default_factory=ReferenceRule)
    checks: list[RowName] = Field(
        default_factory=list, description="the rows `invoke conform` runs; empty: every default row"
    )
