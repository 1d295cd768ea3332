"""The launch flags of `serve`, `conform`, `bench` (and `cluster.up`) declared once, in groups: a task names the
groups it takes in one value family (`@task(families=(DRY, launch(IMAGE, NODE, ...)))`, cli/families.py) and its
body declares `flags: LaunchFlags`: Invoke is shown the groups' options in its place, and the body gets one typed
LaunchFlags (sparkforge/run/launchplan.py) built from their values. Nothing is checked here: plan_task checks every
flag once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkforge.cli import Whole
from sparkforge.cli.families import Family, Option

if TYPE_CHECKING:
    from sparkforge.run.launchplan import LaunchFlags

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file (its image and pinned vLLM)"
PROFILE_HELP = "serve profile name in profiles/ or path to a profile file"
LAUNCH_HELP = {"recipe": RECIPE_HELP, "profile": PROFILE_HELP}  # a launch task's own --recipe and --profile
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


def launch(*groups: Family) -> Family:
    """The value family of a launch task: the groups' options, the body's `flags` a LaunchFlags of their values
    (a flag the task does not take keeps LaunchFlags' default)."""
    return Family("launch", tuple(o for g in groups for o in g.options), "flags", _launch_flags)


def _launch_flags(**given: Any) -> LaunchFlags:
    """LaunchFlags, imported when a task runs (loading tasks.py imports no library module)."""
    from sparkforge.run.launchplan import LaunchFlags

    if "ulimit" in given:  # Invoke's iterable: a list, or None when never given
        given["ulimit"] = tuple(given["ulimit"] or ())
    return LaunchFlags(**given)
