"""The doctor's probe mounts only what it reads of a node, read-only, and creates nothing there."""

from __future__ import annotations

from sparkforge.run.jobs import HOST_READS, HOST_ROOT, probe_mounts
from sparkforge.run.nodes import ContainerSpec, run_argv


def test_the_probe_mounts_only_what_it_reads_read_only() -> None:
    argv = run_argv(ContainerSpec("probe", "img", mounts=probe_mounts(["/models/qwen"])))
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a in ("--mount", "--volume")]
    assert [argv[i] for i, a in enumerate(argv) if a in ("--mount", "--volume")] == ["--mount"] * 3
    assert mounts == [
        f"type=bind,source={p},target={HOST_ROOT}{p},readonly" for p in (*HOST_READS, "/models/qwen")
    ]
    assert not any(m.startswith("/:") or "source=/," in m for m in mounts)  # never the node's whole /


def test_what_the_in_image_reader_reads_is_under_the_mounts() -> None:
    import importlib.util

    from sparkforge.run.jobs import FACTS_SCRIPT

    spec = importlib.util.spec_from_file_location("cluster_facts", FACTS_SCRIPT)
    assert spec is not None and spec.loader is not None
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    assert facts.HOST_ROOT == HOST_ROOT
    read = [*facts.NCCL_DIRS, "/etc/systemd/logind.conf", "/etc/systemd/logind.conf.d"]
    assert all(any(p == m or p.startswith(m + "/") for m in HOST_READS) for p in read)
