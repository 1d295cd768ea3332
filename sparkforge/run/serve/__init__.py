"""Serving a profile: on one node (`serve`: model class looked up, weights, health, one answer), and the start
of any launch plan on its nodes (workers, then the head, health, a failure explained and everything removed)
that `serve` and `cluster.up` share."""
