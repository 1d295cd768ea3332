"""A golden file's values typed before a comparison reads them: token ids in range, logprobs that are log
probabilities (finite, at most 0: a +1e308 'logprob' is no probability), no token twice in one position's top
list (a duplicate would be merged silently), one top list per generated token."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, Strict, model_validator

from sparkforge.recipe.typedfile import STRICT, typed

TokenId = Annotated[int, Strict(), Field(ge=0, lt=1 << 31)]
# vLLM writes a masked token's -inf as -9999.0; a real log probability is at most 0 (a rounding hair above).
LogProb = Annotated[float, Strict(), Field(ge=-1e5, le=1e-3, allow_inf_nan=False)]
Pair = Annotated[tuple[TokenId, LogProb], Strict(False)]  # a JSON [id, logprob] pair; its items stay strict
Step = Annotated[list[Pair], Field(max_length=64)]
MAX_PROMPTS = 10_000
MAX_TOKENS = 1 << 16
PromptTops = Annotated[list[Step], Field(max_length=MAX_TOKENS)]

GOLDEN_FIX = "record it again with 'invoke conform ... --record'"


class GoldenFile(BaseModel):
    """sparkforge-golden/1, as far as the comparison reads it (the record's provenance keys are left as they are)."""

    model_config = STRICT

    format: Literal["sparkforge-golden/1"]
    token_ids: Annotated[
        list[Annotated[list[TokenId], Field(max_length=MAX_TOKENS)]], Field(max_length=MAX_PROMPTS)
    ]
    top_logprobs: Annotated[list[PromptTops], Field(max_length=MAX_PROMPTS)] | None = None
    model: dict[str, Any] | None = None

    @model_validator(mode="after")
    def one_top_list_per_token(self) -> GoldenFile:
        if self.top_logprobs is None:
            return self
        if len(self.top_logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.top_logprobs)} top_logprobs lists for {len(self.token_ids)} prompts")
        for p, (top, ids) in enumerate(zip(self.top_logprobs, self.token_ids, strict=True)):
            if len(top) != len(ids):
                raise ValueError(f"prompt {p}: {len(top)} top lists for {len(ids)} tokens")
            for t, step in enumerate(top):
                seen = [token for token, _ in step]
                if len(set(seen)) != len(seen):
                    raise ValueError(f"prompt {p}, token {t}: a token id appears twice in its top list")
        return self


def check_golden(data: Any, where: str) -> GoldenFile:
    """A parsed golden file typed; InputError naming `where`, the key, the value and the fix."""
    return typed(GoldenFile, data, where, GOLDEN_FIX)
