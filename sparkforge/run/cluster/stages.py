"""The doctor's node-level stages: paths on each node, the link MTU (both ways, don't-fragment), host drivers and
RemoveIPC, the NCCL library each image really loads, and the transport NCCL chose with its bus bandwidth."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sparkforge.report import Check
from sparkforge.run.cluster.pitfalls import ClusterFacts, judge
from sparkforge.run.facts import DoctorOptions, NodeFacts
from sparkforge.run.jobs import Job, Outcome, first_event, probe_mounts, run_jobs
from sparkforge.run.nodes import NodeEngine

# Published figures (benchmarks/cluster.md): NCCL all_gather bus bandwidth over one CX-7 port ~19-24 GB/s.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def no_rdma(facts: Sequence[NodeFacts]) -> str | None:
    """'no RDMA devices on node X' for the first node without any (None when every node has some)."""
    bare = [f.label for f in facts if not f.rdma]
    return f"no RDMA devices on {', '.join(bare)}" if bare else None


def paths(
    check: Check, facts: Sequence[NodeFacts], probes: Sequence[Outcome], options: DoctorOptions
) -> None:
    """The token file, model directory and caches as each node sees them (a bind mount of a missing path would
    make Docker create an empty root-owned directory there)."""
    if not options.paths:
        check.status, check.reason = "skipped", "no token file, model directory or cache directory given"
        return
    problems, notes = [], []
    for outcome in probes:
        event = first_event(outcome, "probe") or {}
        label = outcome.job.engine.node.label
        entries = list(event.get("paths", []))
        check.details[label] = entries
        for entry in entries:
            kind, path = entry["kind"], entry["path"]
            if not entry.get("mounted"):
                problems.append(f"{label}: the probe could not see the node's filesystem to look for {path}")
            elif kind == "hf-token-file" and not entry.get("file"):
                problems.append(
                    f"{label}: the Hugging Face token file {path} is not there ({'a directory' if entry.get('directory') else 'missing'}); "
                    "fix: copy the token file to that path on the node (mode 600), or pass the node's own path"
                )
            elif kind == "model-dir" and not entry.get("config"):
                what = "holds no config.json" if entry.get("directory") else "does not exist"
                problems.append(
                    f"{label}: the model directory {path} {what}; fix: put the model at that path on every node "
                    "(the same path everywhere), or leave --model-dir out to download into the cache"
                )
            elif kind == "cache-dir" and not entry.get("exists"):
                notes.append(f"{label}: {path} will be created by Docker (root-owned)")
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    else:
        check.reason = "every given path is in place on every node" + (
            f" ({'; '.join(notes)})" if notes else ""
        )


def mtu(check: Check, facts: Sequence[NodeFacts], df: dict[str, Any]) -> None:
    """The link interface's MTU is the same on every node, and a full-MTU packet with don't-fragment set gets
    through in both directions (the reach stage sent them: MTU-28 bytes of UDP, like `ping -M do -s MTU-28`)."""
    mtus = {}
    for fact in facts:
        found = fact.interface_of(fact.address)
        mtus[fact.label] = {"interface": fact.interface, "mtu": found.get("mtu") if found else None}
    check.details = {"interfaces": mtus, "dont_fragment": df}
    values = {v["mtu"] for v in mtus.values()}
    if len(values) > 1:
        listing = ", ".join(f"{label} {v['interface']} {v['mtu']}" for label, v in mtus.items())
        check.status = "failed"
        check.reason = (
            f"MTU differs across the link ({listing}): large transfers stall or fail (IBV_WC_RETRY_EXC_ERR); "
            "fix: set the same MTU on every node's link interface in its netplan file (mtu: 9000, then 'netplan apply'; "
            "'ip link set IF mtu 9000' and nmcli edits are lost at the next CX-7 firmware reboot)"
        )
        return
    lost = [f"{way} ({r.get('error')})" for way, r in df.items() if not r.get("ok")]
    if lost:
        check.status = "failed"
        check.reason = (
            f"a full-MTU packet with don't-fragment set does not get through: {'; '.join(lost)}; fix: set the "
            "same MTU on both ends and on anything between them (a switch port), then rerun the doctor"
        )
        return
    sizes = sorted({r["size"] for r in df.values()})
    check.reason = f"MTU {values.pop()} on every node's link interface" + (
        f"; {len(df)} don't-fragment probes of {'/'.join(map(str, sizes))} bytes got through" if df else ""
    )


def host(check: Check, facts: Sequence[NodeFacts]) -> None:
    """Host driver versions (reported; a difference is named), the host kernel against the known-bad list
    (run/cluster/pitfalls.py: a match fails the stage) and logind's RemoveIPC (yes: a warning)."""
    check.details = {f.label: f.host for f in facts}
    kernels = tuple(str(f.host.get("kernel")) for f in facts)
    refused, _ = judge(ClusterFacts(nodes=len(facts), kernels=kernels))
    if refused:
        on = ", ".join(f"{f.label} {f.host.get('kernel')}" for f in facts)
        check.status, check.reason = "failed", f"host kernels ({on}): " + "; ".join(refused)
        return
    notes = []
    for key in ("kernel", "nvidia", "mlx5_core"):
        seen = {str(f.host.get(key)) for f in facts}
        if len(seen) > 1:
            notes.append(f"{key} differs ({', '.join(f'{f.label} {f.host.get(key)}' for f in facts)})")
    removing = [f for f in facts if str(f.host.get("remove_ipc", "yes")) not in ("no", "false", "0")]
    if removing:
        notes.append(
            "RemoveIPC=yes on "
            + ", ".join(f"{f.label} ({f.host.get('remove_ipc_source')})" for f in removing)
            + ": logind deletes a user's semaphores and shared memory when their last session closes, and a "
            "worker started over ssh then loses them (the head blocks); fix: RemoveIPC=no in "
            "/etc/systemd/logind.conf (then restart systemd-logind) or 'loginctl enable-linger USER'"
        )
    first = facts[0].host if facts else {}
    check.reason = (
        f"kernel {first.get('kernel')}, nvidia {first.get('nvidia')}, mlx5_core {first.get('mlx5_core')}"
    )
    if notes:
        check.reason += "; warning: " + "; ".join(notes)


NcclFound = tuple[dict[str, dict[str, Any]], list[str]]  # nccl_probe's answer: per node, and the problems


def nccl_probe(
    engines: Sequence[NodeEngine],
    options: DoctorOptions,
    mounts: dict[int, list[str]],
    *,
    host_root: bool = False,
    cancel: threading.Event | None = None,
) -> NcclFound:
    """Per node the libnccl the image's torch loads; with `host_root`, the node's own (`host`) read beside it.

    `cancel`: set to stop waiting and remove the probes (the doctor starts this probe early, in the background)."""
    extra = probe_mounts() if host_root else ()
    outcomes = run_jobs(
        [Job(e, ("nccl-library",), mounts=(*mounts.get(e.node.rank, ()), *extra)) for e in engines],
        options.image,
        "nccl",
        options.deadlines.sanity,
        cancel=cancel,
    )
    return library_answers(outcomes)


def library_answers(outcomes: Sequence[Outcome]) -> NcclFound:
    """Each node's `nccl-library` event (from the probe, or a sanity rank that reported it before its gate)."""
    found: dict[str, dict[str, Any]] = {}
    problems = []
    for outcome in outcomes:
        label = outcome.job.engine.node.label
        event = first_event(outcome, "nccl-library")
        if outcome.node_lost or event is None:
            tail = outcome.node_lost or outcome.last_lines.replace("\n", " | ")[-400:]
            problems.append(f"{label}: the NCCL probe gave no answer ({tail})")
            continue
        found[label] = {k: event.get(k) for k in ("path", "version", "sha256", "torch", "error", "host")}
        found[label]["seconds"] = event.get("seconds", outcome.seconds)  # mostly the torch import
    return found, problems


@dataclass(frozen=True)
class NcclSource:
    """Which libnccl a launch loads on one node; for --nccl host, the bind mount and its ABI (soname) check:
    passed, failed (`reason` names the node and the fix) or skipped (nothing to check, or the image not read)."""

    source: Literal["image", "host"]
    host: Mapping[str, Any] | None = None  # the node's own library: path, version, soname, sha256
    image: str | None = None  # the path the image's torch loads (None: not read, or none)
    status: Literal["passed", "failed", "skipped"] = "skipped"
    reason: str = ""

    @property
    def mount(self) -> str | None:
        """The launch's bind mount (host:image:ro) when the check passed."""
        if self.status != "passed" or not self.host or not self.image:
            return None
        return f"{self.host['path']}:{self.image}:ro"

    def to_dict(self) -> dict[str, Any]:
        loads = self.host if self.source == "host" and self.host else None
        return {
            "source": self.source,
            "library": loads["path"] if loads else self.image,
            "version": loads.get("version") if loads else None,
            "soname": loads.get("soname") if loads else None,
            "sha256": loads.get("sha256") if loads else None,
            "replaces": self.image if self.source == "host" else None,
            "mount": self.mount,
            "abi": {"status": self.status, "reason": self.reason},
        }


def host_source(label: str, host: Mapping[str, Any] | None, image: Mapping[str, Any] | None) -> NcclSource:
    """--nccl host on one node: the node's own libnccl over the path the image's torch loads (`image`: the
    nccl-library probe's answer; None: the image was not read); refused where the node has none or its ABI
    (soname major) differs."""
    path = str(image.get("path") or "") if image is not None else None
    if not host:
        why = (
            "the node has no NCCL library (looked for libnccl.so.2.X.Y in /usr/lib/<arch>-linux-gnu, /usr/lib, "
            "/usr/local/lib, /usr/local/cuda/lib64); fix: install the node's libnccl2 package (DGX OS ships it) "
            "or leave --nccl out to use the image's"
        )
        return NcclSource("host", None, path or None, "failed", f"{label}: --nccl host, but {why}")
    mine = f"the node's {host['path']} ({host['soname']})"
    if path is None:
        return NcclSource(
            "host",
            host,
            None,
            "skipped",
            (
                f"{label}: the image was not read, so {mine} is not checked against the libnccl its torch loads; "
                "'invoke cluster.fabric --nodes A,B --recipe R --nccl host' (or cluster.doctor) reads it on each node"
            ),
        )
    if not path:
        return NcclSource(
            "host",
            host,
            None,
            "failed",
            (
                f"{label}: --nccl host, but the image's torch loads no libnccl to replace; fix: use an image whose "
                "torch is built with CUDA (it loads libnccl), or leave --nccl out"
            ),
        )
    if not path.rsplit("/", 1)[-1].startswith(str(host["soname"])):
        return NcclSource(
            "host",
            host,
            path,
            "failed",
            (
                f"{label}: --nccl host: {mine} is another ABI than the image's {path}; fix: install a libnccl with "
                "the image's soname or leave --nccl out"
            ),
        )
    return NcclSource(
        "host",
        host,
        path,
        "passed",
        (
            f"{label}: {mine}, NCCL {host.get('version')}, bind-mounted read-only over the image's {path}: same ABI"
        ),
    )


def host_mounts(
    facts: Sequence[NodeFacts], found: dict[str, dict[str, Any]]
) -> tuple[dict[int, list[str]], list[str]]:
    """--nccl host: each node's bind mount (host_source), or the problems where it is refused."""
    mounts: dict[int, list[str]] = {}
    problems = []
    for fact in facts:
        chosen = host_source(fact.label, fact.host.get("nccl"), found.get(fact.label, {}))
        if chosen.mount:
            mounts[fact.rank] = [chosen.mount]
        else:
            problems.append(chosen.reason)
    return mounts, problems


def nccl_library(
    check: Check,
    engines: Sequence[NodeEngine],
    options: DoctorOptions,
    facts: Sequence[NodeFacts] = (),
    probed: NcclFound | None = None,
) -> dict[int, list[str]]:
    """Path, version and sha256 of the libnccl each node's image really loads (torch imported, /proc/self/maps),
    beside the node's own NCCL; with --nccl host, the node's library bind-mounted over it and proven loaded.
    Returns each node's (rank's) mounts of the launch: --nccl host's bind mount, else none.

    `probed`: the image's libnccl already read (the doctor probes it in the background during the cheap
    stages: the torch import is most of this stage's time)."""
    found, problems = probed if probed is not None else nccl_probe(engines, options, {})
    hosts = {f.label: f.host.get("nccl") for f in facts}
    check.details = {label: {**v, "host": hosts.get(label)} for label, v in found.items()}
    mounts: dict[int, list[str]] = {}
    if not problems and options.nccl_source == "host":
        mounts, problems = host_mounts(facts, found)
        if not problems:
            found, problems = nccl_probe(engines, options, mounts)
            for fact in facts:
                got, host = found.get(fact.label, {}), hosts.get(fact.label) or {}
                check.details.setdefault(fact.label, {})["loaded_host"] = got.get("sha256") == host.get(
                    "sha256"
                )
                if got.get("sha256") != host.get("sha256"):
                    problems.append(
                        f"{fact.label}: with the node's NCCL mounted, torch still loads {got.get('path')}"
                    )
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
        return mounts
    if all(not v.get("path") for v in found.values()):
        check.status = "skipped"
        check.reason = (
            "torch loads no NCCL library in this image (" + str(next(iter(found.values())).get("error")) + ")"
        )
        return mounts
    identities = {(v.get("version"), v.get("sha256")) for v in found.values()}
    if len(identities) > 1:
        listing = "; ".join(
            f"{label}: {v['path']} {v['version']} sha256 {str(v['sha256'])[:16]}"
            for label, v in found.items()
        )
        check.status = "failed"
        check.reason = (
            f"the nodes load different NCCL libraries ({listing}): a TP=2 run hangs or crashes at init even when "
            "the version strings agree (vllm-project/vllm#42354); fix: run one image everywhere ('invoke "
            "cluster.up --distribute') and drop any NCCL from LD_LIBRARY_PATH/LD_PRELOAD on the nodes"
        )
        return mounts
    one = next(iter(found.values()))
    source = "the nodes' own (--nccl host)" if options.nccl_source == "host" else "the image"
    check.reason = (
        f"NCCL {one['version']} from {one['path']} (sha256 {str(one['sha256'])[:16]}, {source}) on every node"
    )
    notes = [
        f"{label}: the host's {h['path']} is NCCL {h['version']} too but other bytes (sha256 {str(h['sha256'])[:16]}): "
        "the field's fix for a TP=2 hang was the host's library (vllm#42354); 'invoke cluster.up --nccl host' "
        "bind-mounts it into the containers"
        for label, h in hosts.items()
        if h
        and options.nccl_source != "host"
        and h.get("version") == one.get("version")
        and h.get("sha256") != one.get("sha256")
    ]
    tp, pp = options.parallel
    # NCCL's own faults matter where the ranks run it: with GPUs (the CPU twin's ranks use Gloo only)
    refused, warned = (
        judge(ClusterFacts(len(found), tp, pp, str(one.get("version")), options.cuda_graphs))
        if options.gpus
        else ([], [])
    )
    pin = options.nccl_pin or {}
    if pin.get("sha256") and pin["sha256"] != one.get("sha256"):
        refused.insert(
            0,
            f"every node loads {one['path']} sha256 {str(one.get('sha256'))[:16]}, but the recipe pins NCCL "
            f"{pin.get('version')} sha256 {str(pin['sha256'])[:16]} (runtime.nccl.sha256): the image is not the one "
            "the recipe built; fix: rebuild and distribute the image, or correct the pin ('invoke verify' "
            "checks it)",
        )
    if refused:
        check.status = "failed"
        check.reason += "; " + "; ".join(refused)
        return mounts
    notes += warned
    if notes:
        check.reason += "; warning: " + "; ".join(notes)
    return mounts


# NCCL's own transports (NET/IB, NET/Socket) and its net plugins (NET/IBext_v11, NET/IBext...); "Using network X".
_USING = re.compile(r"NET/(IB\w*|Socket|[A-Za-z]\w*)\s*:\s*Using\s+(.*)")
_NETWORK = re.compile(r"Using network (\S+)")
_NO_VERBS = re.compile(r"Failed to open libibverbs")
FLOOR_SHARE = 0.8  # the default --min-busbw: this share of the port rate sysfs reports


def port_floor(fact: NodeFacts) -> float | None:
    """80 % of the sysfs rate of the port the node's link interface sits on, in GB/s (None: not an RDMA port)."""
    from sparkforge.run.cluster.fabric import parse_node

    port = parse_node(fact.label, fact.fabric).port_of(fact.interface or "")
    return round(port.rate_gbps / 8 * FLOOR_SHARE, 2) if port and port.rate_gbps else None


def transport_kind(lines: Sequence[str]) -> tuple[str | None, list[str]]:
    """'IB' (NCCL's IB verbs transport or an IB net plugin), 'Socket' or None, and the devices NCCL named."""
    used = [m for line in lines if (m := _USING.search(line))]
    names = [m.group(1) for m in used] + [m.group(1) for line in lines if (m := _NETWORK.search(line))]
    kind = "IB" if any(n.startswith("IB") for n in names) else ("Socket" if names else None)
    return kind, [m.group(2) for m in used]


def transport(
    check: Check, facts: Sequence[NodeFacts], sanity: dict[str, Any], options: DoctorOptions
) -> None:
    """From the sanity run's NCCL_DEBUG=INFO lines: NET/IB (or an IB plugin) or NET/Socket, which devices; the
    bus bandwidth floor (--min-busbw, default 80 % of the port rate; 0 disables)."""
    missing = no_rdma(facts)
    if missing:
        check.status, check.reason = "skipped", missing
        return
    ranks: dict[str, Any] = sanity.get("ranks", {})
    if not ranks or not any(
        any(s.get("stage") == "nccl-allreduce" and s.get("event") == "done" for s in r["stages"])
        for r in ranks.values()
    ):
        check.status, check.reason = "skipped", "NCCL did not run (no GPUs given: --gpus all runs it)"
        return
    problems = []
    by_label = {f.label: f for f in facts}
    for label, rank in ranks.items():
        lines = rank.get("nccl_lines", [])
        kind, devices = transport_kind(lines)
        done = next((s for s in rank["stages"] if s.get("stage") == "nccl-allreduce"), {})
        busbw, clocks = done.get("busbw_GBps"), done.get("gpu_clocks")
        fact = by_label.get(label)
        floor = options.min_busbw if options.min_busbw is not None else (port_floor(fact) if fact else None)
        check.details[label] = {
            "transport": kind,
            "devices": devices,
            "busbw_GBps": busbw,
            "floor_GBps": floor,
            "gpu_clocks": clocks,  # comparable figures need the clocks they ran at
        }
        if kind != "IB":
            why = (
                "NCCL could not open libibverbs (the image lacks the RDMA userspace); fix: pin runtime.rdma in "
                "the recipe (recipes/_gb10.yaml) and rebuild"
                if any(_NO_VERBS.search(line) for line in lines)
                else "fix: check that the containers see /dev/infiniband and NCCL_IB_HCA names the ACTIVE twins "
                "('invoke cluster.fabric')"
            )
            problems.append(f"{label}: NCCL used NET/{kind or '?'} (TCP sockets), not RDMA; {why}")
        elif floor and (busbw or 0) < floor:
            problems.append(
                f"{label}: NCCL all-reduce bus bandwidth {busbw} GB/s is below the floor {floor:g} GB/s "
                f"({'--min-busbw' if options.min_busbw is not None else '80 % of the port rate sysfs reports'}); "
                "fix: both twins in NCCL_IB_HCA, the same MTU on both ends, an approved cable "
                "('invoke cluster.fabric --test' measures each link; --min-busbw 0 disables the floor)"
            )
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    else:
        check.reason = "; ".join(
            f"{label}: NET/IB {v['devices']}, {v['busbw_GBps']} GB/s" for label, v in check.details.items()
        )
