"""The launch flags of `serve`, `conform`, `bench` (and `cluster.up`) declared once, in option families: a task
body declares `flags: LaunchFlags` and names the families it takes (`@launch_flags(IMAGE, NODE, ...)`); Invoke
is shown their options in its place, and the body gets one typed LaunchFlags (sparkforge/run/launchplan.py) built
from their values (a flag the task lacks keeps LaunchFlags' default). Nothing is checked here: plan_task checks
every flag once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkforge.cli import Whole
from sparkforge.cli.families import Family, Option

if TYPE_CHECKING:
    from sparkforge.run.launchplan import LaunchFlags

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file (its image and pinned vLLM)"
PROFILE_HELP = "serve profile name in profiles/ or path to a profile file"
NODES_HELP = (
    "nodes, head first: unix://, tcp://, ssh://user@host or a docker context, each optionally =LINK_ADDRESS"
)
IFACE_HELP = "the cluster-link interface on every node (sets VLLM_HOST_IP, NCCL/GLOO_SOCKET_IFNAME, ...)"
FORCE_HELP = "start even when the memory plan says the profile does not fit (the plan is still printed)"

IMAGE = Family(
    "image",
    (
        Option(
            "image",
            "",
            "image reference to run (default: the recipe's local build, else the digest 'invoke pull' verified)",
        ),
        Option(
            "allow_unverified",
            False,
            "run an --image of a registry that 'invoke pull' did not verify (a loud warning)",
        ),
    ),
)
NODE = Family("node", (Option("node", "", "the engine to run on (default: the local one)"),))
NODES = Family(
    "nodes",
    (
        Option("nodes", "", NODES_HELP),
        Option("interface", "", IFACE_HELP),
        Option("master_port", Whole(29501), "rendezvous port of a multi-node launch (--master-port)"),
    ),
)
MOUNTS = Family(
    "mounts",
    (
        Option(
            "model_dir",
            "",
            "a directory holding the model (the same path on every node), mounted read-only; default: the HF cache",
        ),
        Option(
            "hf_token_file",
            "",
            "file holding a Hugging Face token, mounted read-only (never on a command line or in docker inspect)",
        ),
        Option(
            "cache_dir",
            "/var/cache/sparkforge",
            "host directory (on every node) for the HF, vLLM, FlashInfer and Triton caches",
        ),
    ),
)
SERVER = Family(
    "server",
    (
        Option("port", Whole(8000), "the OpenAI API port on the head (default 8000)"),
        Option(
            "gpus",
            "all",
            "all (default) or none (no GPU: vLLM stops at device detection; for testing the launch)",
        ),
        Option(
            "ulimit",
            None,
            "container ulimits instead of GB10's (memlock=-1, stack=67108864, nofile=1048576); repeatable",
        ),
        Option(
            "hf_endpoint",
            "",
            "the hub the download phase (and its token) talks to (default: your HF_ENDPOINT, else the Hugging Face hub; never a profile's)",
        ),
        Option(
            "allow_unpinned_model",
            False,
            "serve a profile whose model has no pinned revision (args.revision, 40 hex): the hub's current files",
        ),
    ),
)
START = Family(
    "start",
    (
        Option(
            "weights",
            "each",
            "each (default): download the weights on every node before the health wait; shared: once, on the head, then streamed to the peers over the fabric link (resumable); skip: leave it to vLLM",
        ),
        Option(
            "trust_remote_code",
            False,
            "let vLLM run Python code from the model's repository (never from a profile; printed)",
        ),
        Option("no_preflight", False, "skip checking the profile's flags against the pinned vLLM"),
    ),
)
FORCE = Family("force", (Option("force", False, FORCE_HELP),))
ITERABLE = ["ulimit"]  # the repeatable launch flags (Invoke's `iterable=`)


def launch_flags(*families: Family) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`fn(c, session, ..., flags: LaunchFlags)` as Invoke sees it: `flags` replaced by the families' options."""
    return typed_options(_launch_flags, "flags", *families)


def _launch_flags(**given: Any) -> LaunchFlags:
    from sparkforge.run.launchplan import LaunchFlags  # at call time: loading tasks.py imports no library

    return LaunchFlags(**given)


def typed_options(
    make: Callable[..., Any], param: str, *families: Family
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`fn(..., <param>)` as Invoke sees it: `param` replaced by the families' options (after the task's own);
    the body gets `make(**their values)`, one frozen object (a field no family names keeps its default)."""
    shared = [o for family in families for o in family.options]
    names = {o.name for o in shared}

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        own = [p for name, p in signature.parameters.items() if name != param]
        extra = [
            inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o.default)
            for o in shared
        ]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
            if "ulimit" in given:  # Invoke's iterable: a list, or None when never given
                given["ulimit"] = tuple(given["ulimit"] or ())
            return fn(*args, **{param: make(**given)}, **kwargs)

        call.__signature__ = signature.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        del call.__wrapped__  # Invoke reads __signature__; inspect must not unwrap to the body
        return call

    return wrap


def flag_help(*families: Family) -> dict[str, str]:
    """The families' help lines, for a task's `help=`."""
    return {o.name: o.help for family in families for o in family.options}
