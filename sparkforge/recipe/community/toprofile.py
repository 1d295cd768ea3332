"""A community recipe -> a sparkforge serve profile, and a list of everything it could not carry as is.

The serve command becomes vLLM's argv (vllmargv), then the profile's `args` in the same order; the flags
sparkforge sets itself (--host, --port, --served-model-name, --trust-remote-code, the multi-node ones) are
taken out and named. The result also holds the argv the source recipe runs, canonical (each flag spelled as
vLLM's long name, the flags sparkforge places itself at the end in its order), so that a test or a user can
compare it token by token with what `invoke serve --dry` prints for the profile.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from sparkforge.boundary import write_output
from sparkforge.errors import RecipeError, SparkforgeError
from sparkforge.recipe.allowlist import (
    Verdict,
    env_value_verdict,
    flag_verdict,
    opt_in_reason,
    owner_only,
    value_verdicts,
    verdicts,
)
from sparkforge.recipe.community.formats import CommunityRecipe
from sparkforge.recipe.community.vllmargv import (
    Option,
    comment_line,
    option_value,
    parse_serve,
    split_command,
)
from sparkforge.recipe.pins import PIN_FIX, reached
from sparkforge.recipe.profile import FILE_FLAGS, PROFILE_NAME, file_refusal, load_profile, names_a_file
from sparkforge.recipe.serveargs import check_env, check_flag, check_value, norm_flag
from sparkforge.recipe.values import HEX40, model_finding

SPARKFORGE_HOST = "0.0.0.0"
_BUILD_ARG_HINTS = {
    "--tf5": "transformers 5: pin components.transformers.version to a 5.x release the recipe's vLLM accepts",
    "--pre-tf": "transformers 5: pin components.transformers.version to a 5.x release the recipe's vLLM accepts",
    "--exp-mxfp4": "the runner's MXFP4 Dockerfile: use a recipe whose vLLM has the MXFP4 kernels (audit sm_121)",
    "--use-wheels": "prebuilt wheels: that is a recipe with components.vllm.source: wheel",
    "--vllm-ref": "a vLLM branch or commit: pin components.vllm.commit (and version) in the recipe",
    "--apply-vllm-pr": "an upstream PR: save its diff as patches/vllm/NNNN-prNNNN.patch in components.vllm.patches",
}
# Flags sparkforge writes itself at the end of the argv (the launch plan's order).
_PLACED = ("port", "host", "served-model-name", "trust-remote-code", "distributed-executor-backend")
_CLUSTER_FLAGS = (
    "nnodes",
    "node-rank",
    "master-addr",
    "master-port",
    "headless",
    "data-parallel-address",
    # the data-parallel rendezvous cluster.up derives from the nodes (run/cluster/parallel.py DP_PLANNED)
    "data-parallel-size-local",
    "data-parallel-start-rank",
    "data-parallel-rank",
    "data-parallel-rpc-port",
)


@dataclass(frozen=True)
class Attention:
    """Something the profile does not carry as the source has it: where, and what to do."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(frozen=True)
class Imported:
    name: str
    document: dict[str, object]  # the profile file's keys, in order
    port: int
    trust_remote_code: bool
    backend: str  # the multi-node backend that reproduces the source's argv ("mp" or "ray")
    source_argv: tuple[str, ...]  # canonical: ["serve", MODEL, ...] as the source runs it
    attention: tuple[Attention, ...]
    recipe: CommunityRecipe
    # Entries off the allow-list that load code or change trust, without an opt-in: never carried, each named.
    refused: tuple[Attention, ...] = ()
    # Flags naming a file the container would not have (a chat template on the source's disk): left out, named.
    unmountable: tuple[Attention, ...] = ()

    def next_command(self, recipe: str = "R", profile: str = "") -> str:
        """What to run after the import: serve for one node, cluster.up with as many nodes for more (`profile`:
        how to name the written profile, its path when it is not in profiles/)."""
        nodes = int(self.document.get("nodes", 1))  # type: ignore[call-overload]
        ref = f"--recipe {recipe} --profile {profile or self.name}"
        args = self.document.get("args") or {}
        extra = f" --port {self.port}" if self.port != 8000 else ""
        extra += " --trust-remote-code" if self.trust_remote_code else ""
        extra += "" if "revision" in args else " --allow-unpinned-model"  # type: ignore[operator]
        if nodes == 1:
            return f"invoke serve {ref}{extra}"
        names = ",".join(f"NODE{i}" for i in range(nodes))
        extra += " --backend ray" if self.backend == "ray" else ""
        return (
            f"invoke cluster.up {ref} --nodes {names} --interface IFACE{extra}  (NODE0: this machine's engine, "
            "e.g. unix:///var/run/docker.sock; the others ssh://user@host; IFACE: the cluster link; check them "
            "first with invoke cluster.doctor)"
        )

    def text(self, recipe: str = "R") -> str:
        """The profile file: a header naming the source, how to serve it and what needs attention, then YAML."""
        head = [
            f"# Imported by sparkforge from {self.recipe.where} ({self.recipe.format} format).",
            f"# Next: {self.next_command(recipe)}",
        ]
        head += [f"# left out: {a}" for a in self.unmountable]
        head += [f"# refused, left out: {a}" for a in self.refused]
        head += [f"# needs attention: {a}" for a in self.attention]
        body = yaml.safe_dump(self.document, sort_keys=False, allow_unicode=False, width=4096)
        return "\n".join(comment_line(line) for line in head) + "\n" + body


def _int(option: Option | None, where: str, default: int = 1) -> int:
    if option is None:
        return default
    if len(option.values) != 1 or not re.fullmatch(r"[1-9][0-9]{0,3}", option.values[0]):
        raise RecipeError(
            f"{where}: --{option.flag} {' '.join(option.values)!r} is not a whole number; fix: e.g. 2"
        )
    return int(option.values[0])


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    line = "".join(c for c in line if ord(c) >= 32 and ord(c) != 127)
    return (line[:297] + "...") if len(line) > 300 else line or "imported community recipe"


def profile_name(recipe: CommunityRecipe, given: str | None = None) -> str:
    """A valid profile name from the recipe's file name (or `given`)."""
    stem = given or Path(recipe.where.rstrip("/").rsplit("/", 1)[-1]).stem
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:64]
    if not PROFILE_NAME.fullmatch(name):
        raise RecipeError(
            f"{recipe.where}: no profile name can be made from {stem!r}; fix: pass --out NAME.yaml"
        )
    return name


def _mods(recipe: CommunityRecipe) -> list[Attention]:
    out = []
    for index, mod in enumerate(recipe.mods):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", mod.rstrip("/").rsplit("/", 1)[-1]) or "mod"
        out.append(
            Attention(
                recipe.at("mods", str(index))
                if recipe.format == "eugr"
                else f"{recipe.where}: runtime_config.mods",
                f"mod {mod!r} patches the running container (the runner copies it in at launch); sparkforge bakes "
                f"patches into the image instead; fix: put the mod's change as a unified diff against the pinned "
                f"vLLM in patches/vllm/NNNN-{name}.patch, list it in the recipe's components.vllm.patches (source: "
                "git) and run 'invoke preflight' (it checks the patch applies); scripts that install packages "
                "become recipe requirements",
            )
        )
    return out


def _build_args(recipe: CommunityRecipe) -> list[Attention]:
    out = []
    for index, arg in enumerate(recipe.build_args):
        hint = _BUILD_ARG_HINTS.get(
            arg.split("=", 1)[0], "a build-and-copy.sh option: express it in the recipe"
        )
        where = (
            recipe.at("build_args", str(index)) if recipe.format == "eugr" else f"{recipe.where}: build_args"
        )
        out.append(
            Attention(
                where, f"build option {arg!r} is not a serve setting; the recipe decides the image: {hint}"
            )
        )
    return out


@dataclass
class _Launch:
    """What the flags sparkforge sets itself said in the source."""

    port: int = 8000
    host: str = SPARKFORGE_HOST
    served: str | None = None
    trust: bool = False
    backend: str = "mp"


def _take_launch_flag(
    option: Option, nodes: int, launch: _Launch, attention: list[Attention], where: str
) -> bool:
    """Record a flag sparkforge places itself (port, host, served name, trust, backend, cluster plan): True if taken."""
    flag, value = option.flag.split(".", 1)[0], " ".join(option.values)
    note = ""
    if flag == "port":
        launch.port = int(value) if re.fullmatch(r"\d{1,5}", value) else -1
        if not 1 <= launch.port <= 65535:
            raise RecipeError(f"{where}: --port {value!r} is not a port; fix: a whole number from 1 to 65535")
    elif flag == "host":
        launch.host = value
        note = (
            "" if value == SPARKFORGE_HOST else f"--host {value}: sparkforge binds the head's API to 0.0.0.0"
        )
    elif flag == "served-model-name":
        launch.served = option.values[0] if option.values else None
        note = "" if len(option.values) == 1 else "--served-model-name with several names: a profile has one"
    elif flag == "trust-remote-code":
        launch.trust = True
        note = (
            "--trust-remote-code runs the model repository's Python code; a profile never grants it: pass "
            "--trust-remote-code to 'invoke serve' / 'invoke cluster.up' when you trust the repository"
        )
    elif flag == "distributed-executor-backend":
        if nodes == 1:
            note = (
                f"--distributed-executor-backend {value}: dropped on one node, as the runner's solo mode does"
            )
        elif value == "ray":
            launch.backend = "ray"
            note = (
                "--distributed-executor-backend ray: sparkforge's cluster.up runs vLLM's own multi-node backend (mp: "
                "--nnodes/--node-rank/--master-addr, no Ray cluster to start and keep alive) by default; "
                "'invoke cluster.up --backend ray' reproduces the recipe's Ray launch exactly"
            )
        elif value != "mp":
            note = f"--distributed-executor-backend {value}: sparkforge launches mp or ray only; dropped"
    elif flag in _CLUSTER_FLAGS or flag == "config":
        note = (
            f"--{option.flag}: set by sparkforge's cluster plan (or a config file it does not read); dropped"
        )
    else:
        return False
    if note:
        attention.append(Attention(where, note))
    return True


def import_recipe(
    recipe: CommunityRecipe,
    *,
    aliases: Mapping[str, str],
    negatable: frozenset[str] | None = None,
    extra: Sequence[str] = (),
    name: str | None = None,
    allow: Mapping[str, str] | None = None,
) -> Imported:
    """The profile a community recipe becomes; RecipeError when the command cannot be vLLM's argv.

    Every flag and variable goes through the allow-list: refused ones (code loading, trust settings) are left
    out and land in `refused` (the import task exits non-zero), unknown ones are dropped and named; an entry in
    `allow` (entry -> the reviewer's reason) is carried and the opt-in written into the profile."""
    allow = dict(allow or {})
    refused: list[Attention] = []
    unmountable: list[Attention] = []
    used: set[str] = set()

    def listed(verdict: Verdict, where: str) -> bool:
        """True when the entry may be carried; otherwise it is named (refused or needs attention)."""
        used.add(verdict.allow_key)
        if verdict.status == "allowed" or (
            verdict.allow_key in allow and not owner_only(verdict.allow_key) and not verdict.final
        ):
            return True
        if verdict.status == "refused":
            refused.append(Attention(where, verdict.message()))
        else:
            attention.append(Attention(where, f"dropped: {verdict.message()}"))
        return False

    where = recipe.at("command")
    argv = parse_serve([*split_command(recipe.command, where), *extra], aliases, where)
    attention: list[Attention] = []
    tp = _int(argv.get("tensor-parallel-size"), where)
    pp = _int(argv.get("pipeline-parallel-size"), where)
    dp = _int(argv.get("data-parallel-size"), where)
    nodes = tp * pp * dp  # one GPU per Spark: each DP replica its own TP x PP nodes (docs/clusters.md)
    if recipe.cluster_only and nodes < 2:
        attention.append(
            Attention(recipe.at("cluster_only"), f"cluster_only, but TP x PP = {nodes}: one node")
        )
    if recipe.solo_only and nodes > 1:
        attention.append(Attention(recipe.at("solo_only"), f"solo_only, but TP x PP = {nodes} nodes"))
    if dp > 1:
        attention.append(
            Attention(
                where,
                f"--data-parallel-size {dp}: the profile places {dp} replicas of TP x PP nodes ({nodes} nodes); "
                "cluster.up derives the data-parallel rendezvous flags itself",
            )
        )
    launch = _Launch()
    args: dict[str, object] = {}
    kept: list[Option] = []  # the source's options in its order, the ones sparkforge places itself apart
    for option in argv.options:
        if _take_launch_flag(option, nodes, launch, attention, where):
            kept += [] if option.flag.split(".", 1)[0] in _PLACED else [option]
            continue
        key, value = option_value(option, negatable)
        problem = check_flag(key) or check_value(key, value)
        kept.append(option)
        if not problem and not listed(flag_verdict(key), where):
            continue
        # Each field of a JSON value on its own: the flag is carried only when every field is on the list.
        if not problem and not all([listed(v, where) for v in value_verdicts(key, value)]):
            continue
        if problem:
            attention.append(Attention(where, f"--{option.flag} dropped: {problem}"))
            if "secret" in problem:  # the source's argv is printed: never its secret
                kept[-1] = Option(option.flag, tuple("***" for _ in option.values), option.spelled)
            continue
        if norm_flag(key) in FILE_FLAGS and names_a_file(value):
            beside = Path("<the profile's folder>") / "profile.yaml"
            unmountable.append(Attention(where, file_refusal(beside, norm_flag(key), str(value))))
            continue
        args[key] = value
        attention += _flag_notes(option, where)
    env: dict[str, str] = {}
    for key, raw in recipe.env.items():
        value = str(raw)
        shell = '$`"\\' if recipe.format == "eugr" else "$"  # the runner's export K="..."; sparkrun's ${VAR}
        problem = check_env(str(key), value) or (
            f"{' '.join(sorted(set(shell) & set(value)))} in the value: the source tool expands it on its own machine"
            if set(shell) & set(value)
            else ""
        )
        if problem:
            attention.append(Attention(recipe.at("env", str(key)), f"dropped: {problem}"))
        elif listed(env_value_verdict(str(key), value), recipe.at("env", str(key))):
            env[str(key)] = value
    if recipe.model and recipe.model != argv.model:
        attention.append(
            Attention(
                recipe.at("model"),
                f"{recipe.model!r} differs from the command's model {argv.model!r}, which is what runs",
            )
        )
    if argv.model.startswith("/"):
        attention.append(Attention(where, f"the model is a path ({argv.model}): serve it with --model-dir"))
    if (uri := model_finding(argv.model)) is not None:
        listed(Verdict("flag", "model", "refused", uri.reason), where)
    # Every revision is derived from the one pin (the recipe's model_revision, else a full-commit --revision);
    # a --revision, --code-revision or --tokenizer-revision that says otherwise is refused, never carried.
    pin = recipe.model_revision if HEX40.fullmatch(recipe.model_revision or "") else args.get("revision")
    # Every other repository the args reach is listed with its commit: the source's full-commit
    # --tokenizer-revision for a tokenizer of its own, else none yet (the profile then waits for it).
    repositories: dict[str, str | None] = {r.repo: None for r in reached(args, argv.model)}
    tokenizer, given = args.get("tokenizer"), args.get("tokenizer-revision")
    if tokenizer in repositories and isinstance(given, str) and HEX40.fullmatch(given):
        repositories[str(tokenizer)] = given
        # The model's pin in its place (serve passes the tokenizer's snapshot folder, which the pin names).
        args["tokenizer-revision"] = pin if isinstance(pin, str) else args.pop("tokenizer-revision")
    for flag in ("revision", "tokenizer-revision", "code-revision"):
        given = args.get(flag)
        if given is not None and given != pin:
            refused.append(
                Attention(
                    where,
                    f"--{flag} {given}: refused: not the pinned model_revision {pin}; fix: remove it "
                    "(every revision is derived from the profile's pin)",
                )
            )
            del args[flag]
            kept = [o for o in kept if o.flag != flag]
        if isinstance(pin, str):  # --revision alone leaves the others at main (GHSA-3ww4-5jv9-j5gm)
            args[flag] = pin
            if not any(o.flag == flag for o in kept):
                kept.append(Option(flag, (pin,), "model_revision"))
    for reach in reached(args, argv.model):
        if repositories[reach.repo] is None:
            refused.append(
                Attention(
                    where,
                    f"--{reach.flag}: {reach.repo} ({reach.what}): refused until pinned: another repository at no "
                    f"commit, written under repositories: as null; fix: {PIN_FIX.format(repo=reach.repo)}",
                )
            )
    attention += _mods(recipe) + _build_args(recipe)
    attention += [
        Attention(
            recipe.at(*k.split(".")),
            "not run by sparkforge (lifecycle hooks, builders and benchmarks are the source tool's); dropped",
        )
        for k in recipe.uncarried
    ]
    attention += [Attention(recipe.at(*k.split(".")), note) for k, note in recipe.notes]
    document: dict[str, object] = {
        "description": _one_line(recipe.description),
        "model": argv.model,
        "nodes": nodes,
    }
    document["args"] = args
    if env:
        document["env"] = env
    if repositories:
        document["repositories"] = repositories
    if launch.served:
        document["served_model_name"] = launch.served
    stale = sorted(set(allow) - used)
    if stale:
        raise RecipeError(
            f"{recipe.where}: --allow {', '.join(stale)}: the recipe sets no such flag or variable; nothing was "
            "written; fix: name entries as the refusal does (a flag without dashes, or the variable)"
        )
    if bad := sorted(k for k in allow if owner_only(k)):
        raise RecipeError(f"{recipe.where}: --allow {', '.join(bad)}: {owner_only(bad[0])}")
    # The opt-ins the written profile needs: an entry left out for another of its fields needs none.
    needed = {v.allow_key: v.value for v in verdicts(args, env) if v.status != "allowed"}
    needed.update({"model": argv.model} if model_finding(argv.model) is not None else {})
    # Each opt-in records the digest of the value reviewed: a later change of the value voids it.
    kept_allow = {k: opt_in_reason(allow[k], needed[k]) for k in sorted(allow) if k in needed}
    document.update({"allow": kept_allow} if kept_allow else {})
    source = ["serve", argv.model, *(t for o in kept for t in o.tokens())]
    source += ["--served-model-name", launch.served] if launch.served else []
    source += ["--trust-remote-code"] if launch.trust else []
    source += ["--distributed-executor-backend", "ray"] if launch.backend == "ray" else []
    source += ["--host", launch.host, "--port", str(launch.port)]
    return Imported(
        profile_name(recipe, name),
        document,
        launch.port,
        launch.trust,
        launch.backend,
        tuple(source),
        tuple(attention),
        recipe,
        tuple(refused),
        tuple(unmountable),
    )


def _flag_notes(option: Option, where: str) -> list[Attention]:
    value = " ".join(option.values)
    if option.flag == "load-format" and value == "fastsafetensors":
        return [
            Attention(where, "--load-format fastsafetensors needs the fastsafetensors package in the image")
        ]
    return []


def write_profile(imported: Imported, out: Path, *, force: bool = False, recipe: str = "R") -> Path:
    """Validate the profile exactly as a hand-written one (load_profile), then write it; nothing on failure."""
    if out.suffix != ".yaml" or out.is_dir():
        raise RecipeError(
            f"{out}: a profile is a NAME.yaml file; nothing was written; fix: --out profiles/NAME.yaml"
        )
    if out.exists() and not force:
        raise RecipeError(
            f"{out}: already exists; nothing was written; fix: choose another --out or pass --force"
        )
    text = imported.text(recipe)
    with tempfile.TemporaryDirectory(prefix="sparkforge-import-") as tmp:
        trial = Path(tmp) / f"{out.stem}.yaml"
        write_output(trial, text, "import's trial")
        try:
            load_profile(trial)
        except SparkforgeError as exc:
            raise RecipeError(
                f"{imported.recipe.where}: the imported profile does not validate ({str(exc).replace(str(trial), str(out))}); "
                "nothing was written; fix: correct the recipe's command or env"
            ) from None
    write_output(out, text, "--out")
    return out
