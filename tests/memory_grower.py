"""A real process whose memory grows step by step (printing each step): what the watchdog tests stop."""

from __future__ import annotations


def grower(step_mib: int, pause_s: float, steps: int) -> str:
    """A `python3 -c` program holding `step_mib` more MiB every `pause_s` seconds, `steps` times, then saying so."""
    return (
        "import time\nheld = []\n"
        f"for step in range(1, {steps + 1}):\n"
        f"    held.append(bytearray({step_mib} * 1024 * 1024))\n"
        f"    print(f'allocated {{{step_mib} * step}} MiB', flush=True)\n"
        f"    time.sleep({pause_s})\n"
        "print('never reached the end', flush=True)\n"
    )
