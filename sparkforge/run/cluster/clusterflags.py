"""The cluster tasks' own flags as the command line gave them: plain frozen data, nothing imported, so that the
Invoke layer can declare them without loading the library (clusterplan.py checks them; clusterrun.py uses them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterFlags:
    """The cluster's flags as given (cluster.doctor, cluster.up, cluster.fabric; a task that lacks one keeps its
    default): the link (`fabric_settings` checks those), the split, the doctor's --quick."""

    gid_index: str = ""  # pin NCCL_IB_GID_INDEX (empty: NCCL picks)
    nccl: str = "image"  # image or host (each node's own libnccl bind-mounted over the image's)
    layout: str = ""  # the declared cabling (topology.LAYOUTS)
    min_busbw: str = ""  # GB/s floor of the transport stage (empty: 80 % of the port rate; 0: off)
    tp: int = 0  # tensor-parallel-size over the nodes (0: the profile's)
    pp: int = 0  # pipeline-parallel-size over the nodes (0: the profile's)
    dp: int = 0  # data-parallel-size: replicas of TP x PP nodes each (0: the profile's)
    quick: bool = False  # the doctor's cheap stages only


@dataclass(frozen=True)
class Bringing:
    """`cluster.up`'s own choices beyond the launch: the image's distribution, the health wait, the answer."""

    distribute: bool = False  # stream the local image to the nodes whose image ID differs
    health_timeout: int = 1800  # seconds, counted from when the weights are on disk
    down_on_fail: bool = False  # remove the deployment when the answer check fails
