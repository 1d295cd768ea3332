"""Running built images: serve, cluster launch, the cluster doctor, nodes and their jobs."""
