"""Leftovers of test clusters whose run was killed before its teardown (tests/engine/cluster.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal

import cluster_cpus
from cluster import PREFIX, RUN_ROOT, STATE_ROOT, TestCluster, sh


def _owner_alive(name: str) -> bool:
    """A cluster's names carry its creator's pid (sfrun<pid>, sfrunx<pid>...): is that process still running?"""
    match = re.match(rf"{PREFIX}[a-z]*(\d+)", name)
    if not match:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Leftovers of a run that was killed before its teardown: namespaces and state dirs whose creating process is
    gone (and their cgroups). Clusters of runs still alive (another checkout's tests on the same machine) are left alone."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX) and not _owner_alive(name):
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", name, check=False)
    for root in (RUN_ROOT, STATE_ROOT):
        if not root.is_dir():
            continue
        for entry in root.iterdir():
            if entry.name.startswith(PREFIX) and not _owner_alive(entry.name):
                TestCluster._unmount_under(entry)
                sh("rm", "-rf", "--one-file-system", str(entry), check=False, timeout=900)
    for name in cluster_cpus.leftovers(PREFIX):
        if not _owner_alive(name):
            cluster_cpus.release(name)
