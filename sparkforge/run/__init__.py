"""Running built images: the nodes and their jobs, the launch plan; sub-packages by job: serve (one node, and
the start of any plan), cluster (launch on several nodes, doctor, fabric), weights, conform, bench, memory."""
