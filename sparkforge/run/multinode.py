"""The flags that place one node in a multi-node launch on vLLM's multiprocessing backend (pure: argv out).

Two rendezvous of vLLM 0.32's own, chosen from the layout: a model replica that spans nodes (TP x PP > 1) meets
over torch.distributed (`--nnodes/--node-rank/--master-addr/--master-port`, every node but the head
`--headless`); data-parallel replicas meet over the DP handshake (`--data-parallel-address/--data-parallel-rpc-port`
on every node; the head runs the API and DP rank 0, each other node runs headless with
`--data-parallel-start-rank`, vllm/entrypoints/cli/serve.py run_headless). Both at once where a replica spans
nodes: vLLM infers each node's place in its replica from --node-rank (ParallelConfig.node_rank_within_dp), and
the start rank names the replica. The address is the head's link address; the DP port is derived from the
master port, so that two launches given two master ports do not collide.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkforge.errors import RunError

DP_RPC_OFFSET = 1  # the DP handshake listens on --master-port + 1 on the head


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of one launch meet: `nodes` in --nodes order (the head first), `dp` replicas of
    nodes // dp each, contiguous."""

    nodes: int
    head: str
    master_port: int
    dp: int = 1

    def __post_init__(self) -> None:
        if self.dp < 1 or self.nodes % self.dp:
            raise RunError(
                f"data-parallel-size {self.dp} does not divide the {self.nodes} nodes; fix: TP x PP x DP = the "
                "node count (one GB10 each)"
            )
        if self.dp > 1 and self.rpc_port > 65535:
            raise RunError(
                f"--master-port {self.master_port}: the data-parallel handshake takes the next port, "
                f"{self.rpc_port}, past 65535; fix: a lower --master-port"
            )

    @property
    def width(self) -> int:
        """The nodes one replica spans (TP x PP with one GPU each)."""
        return self.nodes // self.dp

    @property
    def rpc_port(self) -> int:
        return self.master_port + DP_RPC_OFFSET

    def replica(self, rank: int) -> int:
        """The DP rank node `rank` serves (vLLM: node_rank // nodes per replica)."""
        return rank // self.width

    def flags(self, rank: int) -> list[str]:
        """Node `rank`'s rendezvous flags (nothing for one node); --headless/--host/--port are the caller's."""
        out: list[str] = []
        if self.width > 1:
            out += ["--nnodes", str(self.nodes), "--node-rank", str(rank)]
            out += ["--master-addr", self.head, "--master-port", str(self.master_port)]
        if self.dp > 1:
            # One engine per node: vLLM would infer it with --nnodes, not without it (then it takes every replica).
            out += ["--data-parallel-size-local", "1"]
            out += ["--data-parallel-address", self.head, "--data-parallel-rpc-port", str(self.rpc_port)]
            # Not on the head: a start rank there switches vLLM to hybrid load balancing (arg_utils.py).
            out += ["--data-parallel-start-rank", str(self.replica(rank))] if rank > 0 else []
        return out

    def listens(self) -> list[str]:
        """What the rendezvous opens on the head, for the plan's 'listens' lines."""
        out = []
        if self.width > 1:
            out.append(
                f"vLLM internode: rendezvous {self.head}:{self.master_port} (--master-addr), engine and NCCL "
                "traffic on each node's link address (VLLM_HOST_IP, the fabric plan's interface)"
            )
        if self.dp > 1:
            out.append(
                f"vLLM data parallel: handshake {self.head}:{self.rpc_port} (--data-parallel-rpc-port); the head's "
                "DP coordinator, request queues and Gloo DP group bind further ports on that address, chosen by "
                "the kernel at start"
            )
        return out
