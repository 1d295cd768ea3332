"""Verifying an image: the in-image suite runner, the one GPU-verified rule, verify records, the image filesystem reader, the size report."""
