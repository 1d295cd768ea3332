"""Values inside the files sparkforge reads, typed at the boundary: a file's JSON (read by boundary.read_json:
finite numbers, no key twice, bounded size) is validated by a strict pydantic model whose fields carry the
bounds that make sense for them (layers, heads, sizes, probabilities, counts), before any arithmetic. A refusal
names the file, the key, the value and the fix, as one paragraph.

One reader per format; each format's model lives beside the code that uses it (run/memory/configtypes.py ...).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from sparkforge.errors import InputError

M = TypeVar("M", bound=BaseModel)

# Strict: a string is not a number, a float is not a whole number, a number is not a bool. Keys the model does
# not name are the file's other readers' (vLLM reads dozens in a config.json): left alone, never used.
STRICT = ConfigDict(strict=True, extra="ignore", frozen=True)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def refusal(exc: ValidationError, where: str, fix: str) -> InputError:
    """The first of pydantic's errors said in the project's words: where, which key, what value, why, the fix."""
    error = exc.errors(include_url=False)[0]
    key = ".".join(str(part) for part in error["loc"])
    reason = error["msg"].removeprefix("Value error, ")
    if not key:  # a rule over the whole file
        return InputError(f"{where}: {reason}; fix: {fix}")
    if error["type"] == "missing":
        return InputError(f"{where}: key '{key}' is missing; fix: {fix}")
    value = error.get("input")
    if (
        isinstance(value, dict | list) and error["type"] == "value_error"
    ):  # a rule between keys: the rule says it
        return InputError(f"{where}: key '{key}': {reason}; fix: {fix}")
    return InputError(f"{where}: key '{key}' is {_shown(value)}: {reason}; fix: {fix}")


def typed(model: type[M], data: Any, where: str, fix: str) -> M:
    """`data` (parsed JSON) as `model`, or an InputError naming `where`, the key, the value and `fix`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise refusal(exc, where, fix) from None
