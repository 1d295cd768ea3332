"""Running built images: the nodes and their jobs, the launch plan, serve on one node; sub-packages by job:
cluster (launch on several nodes, doctor, fabric), weights, conform, bench, memory."""
