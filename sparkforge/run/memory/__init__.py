"""Memory that fits: the per-node memory plan of a serve profile (checkpoint config -> weights, KV cache, reserves
-> verdict), the refusal before anything starts, and the watchdog while serving (docs/run.md, "Memory")."""
