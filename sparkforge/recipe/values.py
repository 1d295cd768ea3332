"""The value allow-list: what a JSON-valued flag's fields and a variable's value may be, judged by value.

A flag's name says little when its value is JSON vLLM turns into a config class: `--compilation-config`'s
`backend` is an import path, `--structured-outputs-config`'s `reasoning_parser_plugin` a file vLLM imports,
`--kv-transfer-config`'s `kv_connector_module_path` a module. So every JSON-valued flag (whole, or dotted:
`-cc.x=y`, `--speculative-config.method m`) is parsed and each field judged against the kind the pinned vLLM's
own config class gives it (sparkforge/recipe/vllmvalues.py, read from vllm/config/*.py by preflight's reader,
sparkforge/preflight/configvalues.py): booleans, numbers and the class's own enums pass when the value has that
type; a nested config class is judged field by field; any other field (free text, a dict, a callable) passes
only with a reviewed grammar (REVIEWED_FIELDS), else it is refused when its name says it takes code, a file, an
endpoint or another repository, or needs attention. The same for variables: a vLLM variable passes only when
vllm/envs.py reads it as a number, a boolean or one of its own choices, or it has a reviewed grammar; a library
variable of the resource list only with its grammar (RESOURCE_GRAMMAR). Never "any string".

Each field is its own entry: an opt-in (`--allow compilation-config.backend=REASON`) covers that field alone,
and an opt-in for the flag covers none of its fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from sparkforge.boundary import parse_json
from sparkforge.errors import InputError
from sparkforge.recipe import vllmvalues
from sparkforge.recipe.pins import HEX40, HUB_ID, is_hub_id, lora_items

MAX_DEPTH = 4
# Field names that say what a free-text field takes: (pattern, what it would do). The first match names it.
_RISKY = (
    (
        re.compile(
            r".*(module|cls|class|plugin|qualname|import|backend|connector|callable|func|hook|_fn$).*"
        ),
        "names code vLLM imports or instantiates (an import path, class, module, plugin or backend)",
    ),
    (
        re.compile(r".*(path|dir|file|folder|root|cache|template|location|stream).*"),
        "a file or folder the container reads or writes, chosen by the recipe",
    ),
    (
        re.compile(r".*(url|uri|endpoint|host|ip|addr|address|socket|server).*"),
        "an endpoint on the network, chosen by the recipe",
    ),
    (
        re.compile(r".*(model|tokenizer|revision|repo|adapter|lora|draft|auto_map).*"),
        "another repository or revision: every artefact a profile reaches is pinned by the profile itself",
    ),
)
_OP = r"[A-Za-z0-9_]+"
# Free-text fields reviewed with a grammar: (class, field) -> (pattern, what it allows).
REVIEWED_FIELDS: dict[tuple[str, str], tuple[str, str]] = {
    ("CompilationConfig", "backend"): (r"|inductor|eager", "torch.compile's built-in backends only"),
    ("CompilationConfig", "custom_ops"): (
        r"[+-]?(all|none|" + _OP + ")",
        "custom op names, +enabled or -disabled",
    ),
    ("CompilationConfig", "splitting_ops"): (_OP + r"::" + _OP + r"(\.[a-z]+)?", "torch op names (ns::op)"),
    ("StructuredOutputsConfig", "reasoning_parser"): (_OP, "a reasoning parser's registered name"),
    # The drafter: a Hub repository listed under the profile's repositories: (sparkforge/recipe/pins.py), or a
    # folder of the owner's /models mount.
    ("SpeculativeConfig", "model"): (
        HUB_ID.pattern + r"|/models(/[A-Za-z0-9_.-]{1,128}){0,8}",
        "a Hugging Face repository pinned under repositories:, or a folder of the owner's /models",
    ),
}
# Enum values that load code although the class lists them: (class, field) -> value -> why.
REFUSED_VALUES: dict[tuple[str, str], dict[str, str]] = {
    ("SpeculativeConfig", "method"): {"custom_class": "imports the drafter class named by `model`"},
}
# Keys of free-form JSON flags (no config class: vLLM hands the dict on) reviewed with a kind.
REVIEWED_KEYS: dict[str, dict[str, str]] = {
    "hf-overrides": {
        "max_position_embeddings": "int",
        "rope_theta": "float",
        "rope_scaling": "dict:float",
        "rope_parameters": "dict:float",
        "num_experts_per_tok": "int",
        "sliding_window": "int",
        "max_window_layers": "int",
        "use_sliding_window": "bool",
        "tie_word_embeddings": "bool",
    },
    "limit-mm-per-prompt": {"image": "int", "video": "int", "audio": "int"},
    "override-generation-config": {
        "temperature": "float",
        "top_p": "float",
        "top_k": "int",
        "min_p": "float",
        "repetition_penalty": "float",
        "presence_penalty": "float",
        "frequency_penalty": "float",
        "max_new_tokens": "int",
    },
    "default-chat-template-kwargs": {
        "enable_thinking": "bool",
        "thinking": "bool",
        "reasoning_effort": "str:low|medium|high",
    },
    "mm-processor-kwargs": {"max_pixels": "int", "min_pixels": "int", "fps": "float", "num_frames": "int"},
}
_WORD = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_IFNAME = r"[=^]?[A-Za-z0-9_.:-]{1,32}(,[=^]?[A-Za-z0-9_.:-]{1,32}){0,15}"
_INT = r"-?[0-9]{1,12}"
_BOOL = r"0|1|true|false|True|False|TRUE|FALSE|yes|no"
# Library variables of the resource list (allowlist.RESOURCE_ENV): the grammar their values follow.
RESOURCE_GRAMMAR = {
    "NCCL_SOCKET_IFNAME": _IFNAME,
    "GLOO_SOCKET_IFNAME": _IFNAME,
    "TP_SOCKET_IFNAME": _IFNAME,
    "UCX_NET_DEVICES": r"all|" + _IFNAME,
    "NCCL_IB_HCA": _IFNAME,
    "NCCL_DEBUG": r"(?i:version|warn|info|trace|abort)",
    "NCCL_DEBUG_SUBSYS": r"\^?[A-Za-z]{2,10}(,[A-Za-z]{2,10}){0,15}",
    "NCCL_ALGO": r"\^?[A-Za-z]{2,12}(,[A-Za-z]{2,12}){0,7}",
    "NCCL_PROTO": r"\^?[A-Za-z0-9]{2,12}(,[A-Za-z0-9]{2,12}){0,7}",
    "NCCL_P2P_LEVEL": r"LOC|NVL|PIX|PXB|PHB|SYS|[0-9]",
    "NCCL_NET_GDR_LEVEL": r"LOC|PIX|PXB|PHB|SYS|[0-9]",
    "CUDA_VISIBLE_DEVICES": r"[0-9]{1,2}(,[0-9]{1,2}){0,15}|GPU-[0-9a-f-]{8,40}",
    "CUDA_DEVICE_ORDER": r"FASTEST_FIRST|PCI_BUS_ID",
    "CUDA_MODULE_LOADING": r"LAZY|EAGER",
    "PYTORCH_CUDA_ALLOC_CONF": r"[a-z_]{3,40}:[A-Za-z0-9.]{1,20}(,[a-z_]{3,40}:[A-Za-z0-9.]{1,20}){0,7}",
    "PYTORCH_ALLOC_CONF": r"[a-z_]{3,40}:[A-Za-z0-9.]{1,20}(,[a-z_]{3,40}:[A-Za-z0-9.]{1,20}){0,7}",
    "TOKENIZERS_PARALLELISM": _BOOL,
}
# vLLM variables vllm/envs.py reads as free text, reviewed with a grammar.
REVIEWED_ENV = {
    "VLLM_LOGGING_LEVEL": r"(?i:debug|info|warning|error|critical)",
    "VLLM_REQUEST_BODY_LOG_LEVEL": r"(?i:debug|info|warning|error|critical)",
    "VLLM_LOGGING_COLOR": r"auto|0|1",
    "VLLM_VIDEO_LOADER_BACKEND": r"opencv|opencv_dynamic|identity|pyav",
    "VLLM_CPU_OMP_THREADS_BIND": r"auto|nobind|[0-9]{1,4}(-[0-9]{1,4})?([,|][0-9]{1,4}(-[0-9]{1,4})?){0,63}",
    "VLLM_PP_LAYER_PARTITION": r"[0-9]{1,4}(,[0-9]{1,4}){0,63}",
    "VLLM_DISABLED_KERNELS": r"[A-Za-z0-9_]{1,64}(,[A-Za-z0-9_]{1,64}){0,31}",
    "VLLM_MOE_ROUTING_SIMULATION_STRATEGY": r"[a-z_]{0,32}",
}


@dataclass(frozen=True)
class Finding:
    """One field of a JSON value (or a variable's value) off the list: its entry, status and why."""

    entry: str  # the opt-in key: flag.field.sub (the flag without dashes), or the variable
    status: str  # "refused" or "unknown"
    reason: str
    final: bool = False  # no opt-in lets it through (a path into the secrets, a branch ref)
    value: object = None  # the field's value (what an opt-in reviews)


def json_value(key: str, value: object) -> tuple[str, object] | None:
    """A profile arg (`compilation-config`, `compilation-config.pass_config.x`, `cc`...) -> (flag, the JSON it
    becomes), or None when the flag is not JSON-valued. A value that is no JSON stays text (vLLM's own reading
    of a dotted value: JSON when it parses, else the word)."""
    flag, _, tail = key.replace("_", "-").partition(".") if "." in key else (key.replace("_", "-"), "", "")
    if "." in key:
        flag = key.split(".", 1)[0].replace("_", "-")
        tail = key.split(".", 1)[1]
    if flag not in vllmvalues.FLAGS:
        return None
    parsed: object = value
    if isinstance(value, str):
        try:  # through the boundary: finite numbers, no key twice, bounded depth (else it stays text)
            parsed = parse_json(value, f"--{flag}")
        except InputError:
            parsed = value
    for part in reversed(tail.split(".")) if tail else ():
        parsed = {part: parsed}
    return flag, parsed


def _typed(kind: str, value: object) -> bool:
    """Whether `value` (parsed JSON) has the simple kind `kind`."""
    if kind == "bool":
        return isinstance(value, bool) or value in ("true", "false", "True", "False")
    if kind == "int":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and re.fullmatch(_INT, value) is not None
        )
    if kind == "float":
        return (isinstance(value, int | float) and not isinstance(value, bool)) or (
            isinstance(value, str)
            and re.fullmatch(r"-?[0-9]{1,12}(\.[0-9]{1,12})?([eE][+-]?[0-9]{1,3})?", value) is not None
        )
    if kind.startswith(("enum:", "str:")):
        return (
            isinstance(value, str | int) and not isinstance(value, bool) and str(value) in kind[4:].split("|")
        )
    if kind.startswith("list:"):
        return isinstance(value, list) and len(value) <= 256 and all(_typed(kind[5:], v) for v in value)
    if kind.startswith("dict:"):
        return (
            isinstance(value, dict)
            and len(value) <= 32
            and all(_WORD.fullmatch(str(k)) and _typed(kind[5:], v) for k, v in value.items())
        )
    return False


def _free(entry: str, field: str, why_unknown: str, value: object = None) -> Finding:
    if isinstance(value, str) and _private(value):
        return Finding(
            entry,
            "refused",
            f"{value[:80]} points into the secrets, the caches or the model snapshot",
            final=True,
        )
    for rule, why in _RISKY:
        if rule.fullmatch(field.lower()):
            return Finding(entry, "refused", why)
    return Finding(entry, "unknown", why_unknown)


def _judge(entry: str, cls: str, value: object, depth: int) -> Iterator[Finding]:
    if depth > MAX_DEPTH:
        yield Finding(entry, "unknown", f"nested deeper than {MAX_DEPTH} levels")
        return
    if cls == "dict":
        yield from _judge_free_dict(entry, value)
        return
    fields = vllmvalues.CLASSES.get(cls)
    if fields is None or not isinstance(value, dict):
        what = "a JSON object" if fields is not None else "a reviewed value"
        yield Finding(entry, "unknown", f"not {what} of vLLM {vllmvalues.VERSION}'s {cls}")
        return
    for name, item in value.items():
        name = str(name)
        sub = f"{entry}.{name}"
        kind = fields.get(name)
        if kind is None:
            yield _free(sub, name, f"not a field of vLLM {vllmvalues.VERSION}'s {cls} (vllm/config)")
        elif kind.startswith("class:"):
            yield from _judge(sub, kind[6:], item, depth + 1)
        elif kind in ("bool", "int", "float") or kind.startswith(
            ("enum:", "list:int", "list:float", "list:bool", "list:enum:")
        ):
            if not _typed(kind, item):
                yield Finding(
                    sub, "unknown", f"{str(item)[:60]!r} is not the {kind[:80]} vLLM's {cls}.{name} takes"
                )
            elif (why := REFUSED_VALUES.get((cls, name), {}).get(str(item))) is not None:
                yield Finding(sub, "refused", f"{cls}.{name}={item}: {why}")
        elif (cls, name) in REVIEWED_FIELDS:
            pattern, what = REVIEWED_FIELDS[(cls, name)]
            items = item if isinstance(item, list) else [item]
            if not (
                isinstance(item, list | str)
                and len(items) <= 256
                and all(isinstance(i, str) and re.fullmatch(pattern, i) for i in items)
            ):
                yield Finding(
                    sub,
                    "refused" if _free(sub, name, "").status == "refused" else "unknown",
                    f"{str(item)[:60]!r} is outside the reviewed grammar of {cls}.{name} ({what})",
                )
        else:
            yield _free(
                sub, name, f"vLLM's {cls}.{name} takes free text or a structure ({kind}): not reviewed", item
            )


def _judge_free_dict(entry: str, value: object) -> Iterator[Finding]:
    flag = entry.split(".", 1)[0]
    reviewed = REVIEWED_KEYS.get(flag, {})
    if not isinstance(value, dict):
        yield Finding(entry, "unknown", "not a JSON object")
        return
    for name, item in value.items():
        kind = reviewed.get(str(name))
        sub = f"{entry}.{name}"
        if kind is None:
            yield _free(
                sub, str(name), f"a key of free-form --{flag} (vLLM hands the dict on): not reviewed", item
            )
        elif not _typed(kind, item):
            yield Finding(sub, "unknown", f"{str(item)[:60]!r} is not the {kind} the reviewed key takes")


def flag_findings(key: str, value: object) -> list[Finding]:
    """Every field of a JSON-valued flag's value that is off the list (none for other flags)."""
    found = json_value(key, value)
    if found is None:
        return []
    flag, parsed = found
    cls = vllmvalues.FLAGS[flag]
    if not isinstance(parsed, dict):
        if cls == "CompilationConfig" and _typed("int", parsed):
            return []  # `--compilation-config 3`: the optimisation level
        return [Finding(flag, "unknown", f"{str(parsed)[:60]!r} is not a JSON object for vLLM's {cls}")]
    return [replace(f, value=_at(parsed, f.entry.split(".")[1:])) for f in _judge(flag, cls, parsed, 0)]


def _at(value: object, path: list[str]) -> object:
    """The part of a JSON value a finding names (its entry's path below the flag)."""
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def env_finding(name: str, value: str, resource: Mapping[str, str]) -> Finding | None:
    """A variable's value against its grammar (None when it follows it); `resource`: the reviewed library
    variables. Names outside both vLLM's list and `resource` are the name list's business (allowlist)."""
    if name in resource:
        pattern = RESOURCE_GRAMMAR.get(name, _INT + "|" + _BOOL)
        if re.fullmatch(pattern, value):
            return None
        return Finding(name, "unknown", f"{value[:60]!r} is not the value grammar of {name} ({pattern[:80]})")
    kind = vllmvalues.ENV.get(name)
    if kind is None:
        return None
    if name in REVIEWED_ENV:
        pattern = REVIEWED_ENV[name]
    elif kind == "bool01":
        pattern = r"0|1"
    elif kind == "int":
        pattern = _INT
    elif kind == "float":
        pattern = r"-?[0-9]{1,12}(\.[0-9]{0,12})?"
    elif kind.startswith(("enum:", "truthy:")):
        choices = kind.split(":", 1)[1].split("|")
        pattern = "|".join(re.escape(c) for c in choices) + (
            "|0|false|False" if kind.startswith("truthy:") else ""
        )
        pattern = "(?i:" + pattern + ")"
    elif kind.startswith("set:"):
        one = "|".join(re.escape(c) for c in kind[4:].split("|"))
        pattern = f"({one})(,({one}))*"
    else:
        return _free(
            name,
            name.lower().removeprefix("vllm_"),
            f"vLLM {vllmvalues.VERSION} reads any text from it (vllm/envs.py): no reviewed value grammar",
        )
    if re.fullmatch(pattern, value):
        return None
    return Finding(
        name, "unknown", f"{value[:60]!r} is not what vllm/envs.py reads from {name} ({kind[:80]})"
    )


REVISION_FLAGS = ("revision", "code-revision", "tokenizer-revision")
# Flags whose value is another repository (or a local copy of one): a Hub repository passes here and is pinned
# under the profile's repositories: (sparkforge/recipe/pins.py); a folder passes only under the owner's /models.
REPOSITORY_FLAGS = {
    "tokenizer": "loads the tokenizer (and its code, with remote code) from outside the Hub and the owner's /models",
    "hf-config-path": "reads the model's config from outside the Hub and the owner's /models",
    "lora-modules": "loads LoRA adapters from outside the Hub and the owner's /models",
    "spec-model": "loads a drafter from outside the Hub and the owner's /models",
}
# Flags whose value is a file the container reads: the recipe never picks one (files live beside the profile).
PATH_FLAGS = {
    "chat-template": r"[^/]*\{[\s\S]*",  # an inline template passes; a path does not
    "generation-config": r"auto|vllm",
    "mm-encoder-fp8-scale-path": r"(?!)",
    "root-path": r"/[A-Za-z0-9_./-]{0,64}",  # an URL prefix of the API, not a file
}
# Files import's own check places beside the profile (mounted read-only at a fixed path): here only a path into
# the secrets, the caches or the snapshot is refused.
BESIDE_PROFILE = ("chat-template",)
_OWNER_MODELS = re.compile(
    r"/models(/[A-Za-z0-9_.-]{1,128}){0,8}"
)  # the owner's --model-dir (run.launch.MODEL_MOUNT)
# Where no recipe-chosen path may point: the token mount, the caches (the HF snapshot holds the repository's
# own files), the home folder. Refused whatever the opt-ins say.
_PRIVATE = re.compile(
    r"/run/secrets(/.*)?|/root(/.*)?|/home(/.*)?|.*/(snapshots|blobs|models--[^/]*|\.cache)(/.*)?|/proc(/.*)?"
)


def plain_findings(key: str, value: object, args: Mapping[str, object]) -> list[Finding]:
    """A non-JSON flag's value: revisions are full commits agreeing with the profile's pin, repositories and
    files are never the recipe's choice."""
    return [replace(f, value=value) for f in _plain(key, value, args)]


def _plain(key: str, value: object, args: Mapping[str, object]) -> list[Finding]:
    flag = key.replace("_", "-")
    text = value if isinstance(value, str) else None
    if flag in REVISION_FLAGS:
        if text is None or not HEX40.fullmatch(text):
            return [
                Finding(
                    flag,
                    "refused",
                    f"{str(value)[:60]!r} is a branch, tag or PR ref, not a full "
                    "commit: the repository's owner can change what it names",
                    final=True,
                )
            ]
        pin = args.get("revision")
        if flag != "revision" and isinstance(pin, str) and text != pin:
            return [
                Finding(
                    flag,
                    "refused",
                    f"{text} is not the profile's pinned revision {pin}: every "
                    "revision is derived from the pin",
                    final=True,
                )
            ]
        return []
    if flag in REPOSITORY_FLAGS:
        places = [p for _, p in lora_items(value)] if flag == "lora-modules" else [text]
        off = [p for p in places if not (is_hub_id(p) or _owner_folder(p))]
        if not off:
            return []  # Hub repositories (pinned by the profile's repositories:) or the owner's /models folders
        why = REPOSITORY_FLAGS[flag]
        if any(model_finding(str(p)) for p in off):
            why = (
                f"{str(off[0])[:80]}: a URI the loader fetches from elsewhere, where no commit pins anything"
            )
        return [Finding(flag, "refused", why)]
    pattern = PATH_FLAGS.get(flag)
    if flag.split(".", 1)[0] in vllmvalues.FLAGS:
        return []  # a JSON value: judged field by field (flag_findings)
    if pattern is None and not re.fullmatch(r".*(path|file|dir|template).*", flag):
        return []
    if text is not None and pattern is not None and re.fullmatch(pattern, text):
        return []
    words = value if isinstance(value, list) else [value]
    for word in (str(w) for w in words):
        if _private(word):
            return [
                Finding(
                    flag,
                    "refused",
                    f"{word[:80]} points into the secrets, the caches or the model snapshot",
                    final=True,
                )
            ]
    if flag in BESIDE_PROFILE:
        return []  # whether the file exists in the container is import's file check (files beside the profile)
    return [
        Finding(
            flag,
            "unknown",
            f"{str(value)[:80]!r}: a file the recipe picks inside the container; "
            "the files a profile needs live beside it",
        )
    ]


def _owner_folder(text: str | None) -> bool:
    """A folder of the owner's --model-dir mount, not a repository."""
    return text is not None and _OWNER_MODELS.fullmatch(text) is not None and ".." not in text.split("/")


def _private(word: str) -> bool:
    """Whether a path-like word points into the secrets, the caches, the snapshot or a home folder."""
    import posixpath

    norm = posixpath.normpath(word) if word.startswith(("/", "~", ".")) else word
    return norm.startswith("~") or _PRIVATE.fullmatch(norm) is not None


def model_finding(model: str) -> Finding | None:
    """A model that is not a Hugging Face id (or a path the owner mounts): `s3://...`, `gs://...`, any URI."""
    if "://" in model or re.match(r"[a-z0-9]+:", model):
        return Finding(
            "model",
            "refused",
            f"{model[:80]}: not a Hugging Face repository id (a URI the loader "
            "fetches from elsewhere, where a 40-hex revision pins nothing)",
        )
    return None
