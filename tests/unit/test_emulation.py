"""The in-image suite under qemu-user: thread settings and a longer limit only when the image's architecture
is not the host's (an arm64 image on x86); a native run (an arm64 image on a Spark) gets nothing added."""

from __future__ import annotations

from sparkforge.verify import emulation


def test_emulated_runs_get_one_openmp_thread_and_native_runs_nothing():
    assert emulation.is_emulated("linux/arm64", "x86_64")
    assert emulation.suite_environment("linux/arm64", "x86_64")["OMP_NUM_THREADS"] == "1"
    assert emulation.suite_timeout("linux/arm64", 1800, "x86_64") == 1800 * emulation.TIMEOUT_FACTOR
    # On a Spark (aarch64) the same image runs natively: nothing is set, the limit is the plain one.
    assert not emulation.is_emulated("linux/arm64", "aarch64")
    assert emulation.suite_environment("linux/arm64", "aarch64") == {}
    assert emulation.suite_timeout("linux/arm64", 1800, "aarch64") == 1800
    assert emulation.suite_environment("linux/amd64", "x86_64") == {}
    assert emulation.suite_environment(None, "x86_64") == {}
    assert emulation.is_emulated("linux/amd64", "aarch64")
