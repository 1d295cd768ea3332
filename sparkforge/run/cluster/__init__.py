"""Several nodes as one: the cluster launch (up, down, logs), the doctor and its stages, the fabric (RDMA devices,
twins, GID choice, link tests) and the reach checks between nodes."""
